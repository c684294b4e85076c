//! The bridge end to end, on both of Manager's engines: real SQLite files and a real
//! PostgreSQL (over TLS with verify-full), built from Manager's own schema, against the local
//! control plane with the operator running. Each test has its own database, namespace and
//! bridge process.

mod support;

use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

use mw_operator::names::{APPROVE_DELETION_ANNOTATION, ENV_DIGEST_ANNOTATION, PROVIDER_LABEL, SYNCED_BY_LABEL};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::json;
use support::bridge::Bridge;
use support::manager::{Engine, ManagerDb, now};
use support::workload::{TIMEOUT, apply_with_labels, phase_of, wait_ready};
use support::{TestNamespace, audit, eventually, wait_until};

const SAMPLES: [&str; 3] = ["team-wiki", "pg-analytics", "akumar-dev"];
const DEFAULT_ENV: &str = r#"[{"key":"WAZUH_MANAGER","value":"wazuh.lab.internal","description":"Wazuh manager"},
  {"key":"WAZUH_REGISTRATION_PASSWORD","value":"reg-s3cret","description":"secret"}]"#;

/// Wait until the row of `hostname` holds the CR's provider id and (when `ip`) its Pod IP.
async fn wait_row(db: &ManagerDb, api: &Api<ManagedWorkload>, hostname: &str, want_ip: bool) -> Option<String> {
    let ns = api.get(hostname).await.expect("the CR").namespace().unwrap();
    let ns = ns.as_str();
    eventually(&format!("row {hostname} to be written back"), TIMEOUT, || async move {
        let mw = api.get(hostname).await.map_err(|e| e.to_string())?;
        let running = phase_of(&mw) == Some(Phase::Running);
        if want_ip && !running {
            return Err(format!("CR not Running yet: {:?}", phase_of(&mw)));
        }
        let pod_ip = mw.status.as_ref().and_then(|s| s.pod_ip.clone());
        let expected = (Some(format!("{ns}/{hostname}")), if want_ip { pod_ip } else { None }, None);
        let row = db.written(hostname).await.ok_or("no row")?;
        if row == expected { Ok(()) } else { Err(format!("row holds {row:?}, want {expected:?}")) }
    })
    .await;
    db.written(hostname).await.and_then(|(_, ip, _)| ip)
}

async fn end_to_end(engine: Engine) {
    let ns = TestNamespace::new(&format!("bridge-e2e-{engine:?}")).await;
    let db = ManagerDb::new(engine).await;
    db.set_default_env(DEFAULT_ENV).await;
    let workloads = ns.api::<ManagedWorkload>();
    let secrets = ns.api::<Secret>();
    let deployments = ns.api::<Deployment>();

    // A CR nobody's bridge made, carrying Manager-looking labels: never touched.
    let foreign = apply_with_labels(
        &workloads,
        "hand-made",
        json!({"opensource-server.mieweb.org/node-id": "1", "opensource-server.mieweb.org/container-id": "999"}),
        json!({"image": "nginx:latest"}),
    )
    .await
    .expect("applying a hand-made CR");

    let bridge = Bridge::start(&ns, &db, &[]).await;

    // Rows → CRs and Secrets → Running → provider id and Pod IP in the rows.
    for name in SAMPLES {
        wait_ready(&workloads, name, Phase::Running).await;
        // The Secret is written before its CR, then given it as owner, both by the bridge's
        // apply: no other write (a merge patch would be an `Update` of the bridge's) touched it.
        let secret = secrets.get(&format!("{name}-manager-env")).await.unwrap();
        assert_eq!(secret.labels()[SYNCED_BY_LABEL], "mw-bridge");
        let owner = secret.owner_references().first().map(|o| (o.kind.as_str(), o.name.as_str()));
        assert_eq!(owner, Some(("ManagedWorkload", name)), "{name}'s Secret is owned by its CR");
        let writers: Vec<_> = secret
            .managed_fields()
            .iter()
            .map(|m| (m.manager.as_deref().unwrap_or(""), m.operation.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(writers, [("mw-bridge", "Apply")], "{name}'s Secret was written by the bridge's applies alone");
        let ip = wait_row(&db, &workloads, name, true).await;
        assert!(ip.is_some(), "{name} runs with an IP");
    }
    let pg = workloads.get("pg-analytics").await.unwrap();
    let data = secrets.get("pg-analytics-manager-env").await.unwrap().data.unwrap();
    assert_eq!(data["POSTGRES_PASSWORD"].0, b"s3cr3t-change-me");
    assert_eq!(data["WAZUH_REGISTRATION_PASSWORD"].0, b"reg-s3cret");
    let cr_text = serde_json::to_string(&pg).unwrap();
    for secret in ["s3cr3t-change-me", "reg-s3cret"] {
        assert!(!cr_text.contains(secret), "an env value leaked into the CR: {cr_text}");
    }
    // The approved 8192 MB request applies; cpus default to Manager's 4.
    let limits = pg.spec.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!((limits.cpu.as_ref().unwrap().0.as_str(), limits.memory.as_ref().unwrap().0.as_str()), ("4", "8192Mi"));
    assert_eq!(pg.spec.command, ["docker-entrypoint.sh", "postgres"]);

    // The row's env changes → the Secret and the pod template change → a rollout to Running.
    let wiki = workloads.get("team-wiki").await.unwrap();
    let digest = wiki.spec.pod_annotations[ENV_DIGEST_ANNOTATION].clone();
    db.exec(&format!(
        r#"UPDATE "Containers" SET "environmentVars" = '{{"TZ":"UTC","GREETING":"hello"}}', "updatedAt" = '{}'
           WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    let updated = wait_until(&workloads, "team-wiki", "the new env digest", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| mw.spec.pod_annotations.get(ENV_DIGEST_ANNOTATION) != Some(&digest))
    })
    .await
    .unwrap();
    assert!(updated.metadata.generation > wiki.metadata.generation);
    let data = secrets.get("team-wiki-manager-env").await.unwrap().data.unwrap();
    assert_eq!(data["GREETING"].0, b"hello");
    assert!(!data.contains_key("NGINX_VERSION"), "a variable removed from the row leaves the Secret");
    wait_ready(&workloads, "team-wiki", Phase::Running).await;
    let template = deployments.get("team-wiki").await.unwrap().spec.unwrap().template;
    assert_eq!(
        template.metadata.unwrap().annotations.unwrap().get(ENV_DIGEST_ANNOTATION),
        updated.spec.pod_annotations.get(ENV_DIGEST_ANNOTATION)
    );
    wait_row(&db, &workloads, "team-wiki", true).await;

    // A Secret left without its owner (as by a bridge stopped between the two writes of a new
    // row) gets its CR as owner again, by the next pass.
    let unowned = json!({"metadata": {"ownerReferences": null}});
    secrets.patch("team-wiki-manager-env", &PatchParams::default(), &Patch::Merge(&unowned)).await.unwrap();
    eventually("team-wiki's Secret to be owned by its CR again", TIMEOUT, || async {
        let secret = secrets.get("team-wiki-manager-env").await.map_err(|e| e.to_string())?;
        match secret.owner_references().first() {
            Some(owner) if Some(&owner.uid) == updated.metadata.uid.as_ref() => Ok(()),
            other => Err(format!("owner {other:?}")),
        }
    })
    .await;

    // A hostname changes (or a node is mapped elsewhere): the new CR runs, the old one goes.
    db.exec(&format!(
        r#"UPDATE "Containers" SET hostname = 'pg-renamed', "updatedAt" = '{}' WHERE hostname = 'pg-analytics'"#,
        now()
    ))
    .await;
    wait_ready(&workloads, "pg-renamed", Phase::Running).await;
    wait_until(
        &workloads,
        "pg-analytics",
        "the CR of the old hostname to go",
        TIMEOUT,
        |mw: Option<&ManagedWorkload>| mw.is_none(),
    )
    .await;
    wait_row(&db, &workloads, "pg-renamed", true).await;

    // Stopped by hand (as Manager's backend or kubectl would): later syncs leave it stopped,
    // and the row's IP goes NULL.
    workloads
        .patch(
            "team-wiki",
            &PatchParams::apply("manager-backend"),
            &Patch::Apply(json!({
            "apiVersion": "opensource-server.mieweb.org/v1alpha1", "kind": "ManagedWorkload",
            "spec": {"state": "Stopped"}})),
        )
        .await
        .expect("stopping the workload");
    wait_ready(&workloads, "team-wiki", Phase::Stopped).await;
    wait_row(&db, &workloads, "team-wiki", false).await;
    // Touch the row and wait out two full resyncs: the bridge re-applies but keeps the stop.
    db.exec(&format!(
        r#"UPDATE "Containers" SET entrypoint = 'nginx', "updatedAt" = '{}' WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    wait_until(&workloads, "team-wiki", "the new entrypoint", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| mw.spec.command == ["nginx"])
    })
    .await;
    bridge.wait_for_more(&["full resync done"], 2, TIMEOUT).await;
    let stopped = wait_ready(&workloads, "team-wiki", Phase::Stopped).await;
    assert_eq!(stopped.spec.state, Some(mw_operator::resource::DesiredState::Stopped));
    assert_eq!(db.written("team-wiki").await.unwrap().1, None);

    // GPUs requested in Manager (`nvidiaRequested`) → one GPU in the CR → the Pod requests the
    // extended resource; no node here has one, so the rollout waits, saying why.
    db.exec(&format!(
        r#"UPDATE "Containers" SET "nvidiaRequested" = true, "updatedAt" = '{}' WHERE hostname = 'akumar-dev'"#,
        now()
    ))
    .await;
    wait_until(&workloads, "akumar-dev", "one GPU in the spec", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| mw.spec.resources.as_ref().and_then(|r| r.gpus) == Some(1))
    })
    .await;
    let unschedulable = wait_until(&workloads, "akumar-dev", "Reconciling: Unschedulable", TIMEOUT, |mw| {
        mw.and_then(|mw: &ManagedWorkload| mw.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Reconciling" && c.reason == "Unschedulable"))
    })
    .await
    .unwrap();
    assert_eq!(phase_of(&unschedulable), Some(Phase::Updating), "a wait, the old Pod still serving");
    let template = deployments.get("akumar-dev").await.unwrap().spec.unwrap().template.spec.unwrap();
    let limits = template.containers[0].resources.as_ref().unwrap().limits.clone().unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "1");

    // The row is deleted → CR, Secret, Deployment and Pods go.
    db.exec(r#"UPDATE "Containers" SET "creationJobId" = NULL WHERE hostname = 'akumar-dev'"#).await;
    db.exec(r#"DELETE FROM "Containers" WHERE hostname = 'akumar-dev'"#).await;
    let pods = ns.api::<Pod>();
    eventually("akumar-dev's CR, Secret, Deployment and Pods to go", TIMEOUT, || async {
        let left = (
            workloads.get_opt("akumar-dev").await.map_err(|e| e.to_string())?.is_some(),
            secrets.get_opt("akumar-dev-manager-env").await.map_err(|e| e.to_string())?.is_some(),
            deployments.get_opt("akumar-dev").await.map_err(|e| e.to_string())?.is_some(),
            pods.list(&ListParams::default().labels("app.kubernetes.io/instance=akumar-dev"))
                .await
                .map_err(|e| e.to_string())?
                .items
                .len(),
        );
        if left == (false, false, false, 0) {
            Ok(())
        } else {
            Err(format!("still there (cr, secret, deployment, pods): {left:?}"))
        }
    })
    .await;

    // The hand-made CR: same object, never written by the bridge.
    let still = workloads.get("hand-made").await.expect("the hand-made CR is still there");
    assert_eq!(still.uid(), foreign.uid());
    assert_eq!(still.labels().get(SYNCED_BY_LABEL), None);
    let bridge_writes = audit::writes_by("mw-bridge", &ns.name);
    assert!(
        !bridge_writes.iter().any(|w| w.name.as_deref() == Some("hand-made")),
        "the bridge wrote to a CR it does not own: {bridge_writes:?}"
    );
    assert!(!bridge_writes.iter().any(|w| w.resource == "deployments" || w.resource == "pods"));
    let output = bridge.output();
    for secret in ["s3cr3t-change-me", "reg-s3cret", "hello"] {
        assert!(!output.contains(secret), "the bridge logged an env value");
    }
    bridge.stop().await;
    db.close().await;
}

#[tokio::test]
async fn sqlite_end_to_end() {
    end_to_end(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_end_to_end() {
    end_to_end(Engine::Postgres).await;
}

/// The statements docs/bridge.md gives an administrator to create the bridge's PostgreSQL
/// role, read from the page itself, for `role` with `password` on `database`.
fn documented_grant(role: &str, password: &str, database: &str) -> String {
    let page = std::fs::read_to_string("docs/bridge.md").expect("reading docs/bridge.md");
    let start = page.find("A role with only what the bridge needs").expect("docs/bridge.md's database role");
    let open = start + page[start..].find("```sql").expect("its SQL block") + "```sql".len();
    let sql = &page[open..open + page[open..].find("```").expect("the block's end")];
    // The page's placeholders: the role, its password, Manager's database.
    for placeholder in ["mw_bridge", "'…'", "cluster_manager"] {
        assert!(sql.contains(placeholder), "docs/bridge.md's grant no longer says {placeholder}: {sql}");
    }
    sql.replace("'…'", &format!("'{password}'")).replace("mw_bridge", role).replace("cluster_manager", database)
}

/// docs/bridge.md's least-privilege PostgreSQL role is enough, and no more than the page says:
/// under exactly its statements the bridge reads every table it needs (a container with http
/// and transport services among them) and writes every row back, and the role cannot change
/// a column it was not granted. (The page once left out "Services" and "TransportServices",
/// and an administrator following it got "permission denied".)
#[tokio::test]
async fn postgres_under_the_documented_grant() {
    let ns = TestNamespace::new("bridge-grant").await;
    let db = ManagerDb::new(Engine::Postgres).await;
    let wiki = db.id_of("team-wiki").await;
    let at = now();
    db.exec(&format!(
        r#"INSERT INTO "Services" ("containerId", type, "internalPort", "createdAt", "updatedAt")
             VALUES ({wiki}, 'http', 80, '{at}', '{at}'), ({wiki}, 'transport', 5353, '{at}', '{at}');
           INSERT INTO "TransportServices" ("serviceId", protocol, "externalPort", "createdAt", "updatedAt")
             VALUES ((SELECT id FROM "Services" WHERE "containerId" = {wiki} AND "internalPort" = 5353),
                     'udp', 2053, '{at}', '{at}');"#
    ))
    .await;

    let path = db.url.split('?').next().unwrap_or_default();
    let database = path.rsplit_once('/').map(|(_, name)| name).expect("the database name");
    let role = format!("mw_bridge_doc_{}", std::process::id());
    let password = format!("grant-{}-{}", std::process::id(), Timestamp::now().as_millisecond());
    db.exec(&documented_grant(&role, &password, database)).await;
    let dir = std::path::PathBuf::from(support::log_dir());
    std::fs::create_dir_all(&dir).expect("the log directory");
    let password_file = dir.join(format!("{role}.password"));
    std::fs::write(&password_file, &password).expect("writing the role's password file");
    let mut as_role = db.clone();
    as_role.url = db.url.replacen("postgres://mw@", &format!("postgres://{role}@"), 1);
    assert_ne!(as_role.url, db.url, "the test database's URL names its admin user mw");
    as_role.password_file = Some(password_file.display().to_string());

    // The role is as narrow as the page says: a column it was not granted is refused.
    let options = sqlx::postgres::PgConnectOptions::from_str(&as_role.url).expect("the role's URL").password(&password);
    let conn = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("logging in as the role");
    let refused = sqlx::query(r#"UPDATE "Containers" SET hostname = hostname"#).execute(&conn).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.to_string().contains("permission denied")),
        "the documented role may update Containers.hostname: {refused:?}"
    );
    conn.close().await;

    let workloads = ns.api::<ManagedWorkload>();
    let bridge = Bridge::start(&ns, &as_role, &[]).await;
    for name in SAMPLES {
        wait_ready(&workloads, name, Phase::Running).await;
        let (workloads, db, ns) = (&workloads, &db, &ns);
        eventually(&format!("row {name} written back under the documented grant"), TIMEOUT, || async move {
            let mw = workloads.get(name).await.map_err(|e| e.to_string())?;
            let address = mw.status.and_then(|s| s.address).ok_or("no status.address yet")?;
            let want = (Some(format!("{}/{name}", ns.name)), Some(address), None);
            let row = db.written(name).await.ok_or("no row")?;
            if row == want { Ok(()) } else { Err(format!("row holds {row:?}, want {want:?}")) }
        })
        .await;
    }
    let wiki = workloads.get("team-wiki").await.unwrap();
    assert_eq!(wiki.spec.ports.len(), 2, "team-wiki's services were read: {:?}", wiki.spec.ports);
    let output = bridge.output();
    assert!(!output.contains("permission denied"), "the bridge was refused something: {}", bridge.log.display());
    bridge.stop().await;
    db.exec(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await;
    db.close().await;
}

/// Bad rows: each is reported with its id and reason, counted, and every other row syncs.
/// A fixed row syncs at once; a row blocked by someone else's CR syncs once that CR goes.
/// A node handed to Manager's own provider (integrations/manager) half-way: its workload and
/// Secret carry the provider's label beside the bridge's own, and the node is still in the
/// bridge's `--node` list. The bridge must not fight Manager's jobs: no update when the row
/// changes, no deletion when it goes, nothing written back.
/// Issue 41, item 1: a bridge Secret left under a new container's name (an earlier
/// container's, its CR gone and garbage collection behind, or one whose CR was never made)
/// holds someone else's env. It is deleted and written anew with the new row's env before the
/// new CR exists, so no Pod of the new workload can start with the old values (not even keys
/// another writer put there), and owned by the new CR.
#[tokio::test]
async fn a_new_container_never_starts_with_an_earlier_ones_env() {
    let ns = TestNamespace::new("bridge-earlier-env").await;
    let db = ManagerDb::new(Engine::Sqlite).await;
    let workloads = ns.api::<ManagedWorkload>();
    let secrets = ns.api::<Secret>();
    let mut leftover = Secret::default();
    leftover.metadata.name = Some("team-wiki-manager-env".into());
    leftover.metadata.labels = Some([(SYNCED_BY_LABEL.to_string(), "mw-bridge".to_string())].into());
    leftover.string_data = Some([("EARLIER_TOKEN".to_string(), "the earlier container's".to_string())].into());
    secrets.create(&Default::default(), &leftover).await.unwrap();

    let bridge = Bridge::start(&ns, &db, &[]).await;
    wait_ready(&workloads, "team-wiki", Phase::Running).await;
    let mw = workloads.get("team-wiki").await.unwrap();
    let secret = secrets.get("team-wiki-manager-env").await.unwrap();
    let keys: Vec<_> = secret.data.unwrap_or_default().into_keys().collect();
    assert!(!keys.iter().any(|k| k == "EARLIER_TOKEN"), "the earlier container's env is still there: {keys:?}");
    let owners: Vec<_> = secret.metadata.owner_references.unwrap_or_default().into_iter().map(|o| o.uid).collect();
    assert_eq!(owners, vec![mw.uid().unwrap()], "owned by the new CR alone");
    // The order of the bridge's accepted writes: the Secret's rewrite before the CR's create.
    let writes = audit::timed_accepted_writes_by("mw-bridge", &ns.name);
    let first = |resource: &str, name: &str| {
        writes.iter().position(|(_, w)| w.resource == resource && w.name.as_deref() == Some(name))
    };
    let (secret_at, cr_at) = (first("secrets", "team-wiki-manager-env"), first("managedworkloads", "team-wiki"));
    assert!(secret_at.is_some() && secret_at < cr_at, "Secret at {secret_at:?}, CR at {cr_at:?}: {writes:?}");
    bridge.stop().await;
    db.close().await;
}

/// Issue 41, item 7: a node mapped to another namespace moves nothing by itself. The sample
/// rows' containerIds name namespace `default`, where their workloads ran before; the node is
/// now mapped to this test's namespace, where they would start on empty disks. Each such row
/// is held (`node_moved`), the rest sync, and a row whose containerId the administrator
/// cleared (having moved the container) is created.
#[tokio::test]
async fn a_node_mapped_to_another_namespace_holds_its_containers() {
    use support::manager::SAMPLE_PROVIDER_IDS;
    let ns = TestNamespace::new("bridge-node-moved").await;
    let db = ManagerDb::new(Engine::Sqlite).await;
    db.exec(SAMPLE_PROVIDER_IDS).await;
    let workloads = ns.api::<ManagedWorkload>();
    let bridge = Bridge::start(&ns, &db, &[]).await;
    wait_ready(&workloads, "akumar-dev", Phase::Running).await;
    for name in ["team-wiki", "pg-analytics"] {
        bridge.wait_for_line(&["row not synced", &format!("hostname={name}"), "reason=node_moved"], TIMEOUT).await;
        assert!(workloads.get_opt(name).await.unwrap().is_none(), "{name} was created on an empty disk");
    }
    let held = bridge.lines(&["reason=node_moved", "hostname=team-wiki"]).remove(0);
    assert!(held.contains("default/team-wiki") && held.contains("clear the row's containerId"), "{held}");
    let (id, address, _) = db.written("team-wiki").await.expect("the row");
    assert_eq!(
        (id.as_deref(), address.as_deref()),
        (Some("default/team-wiki"), Some("10.15.10.141")),
        "the row still says where it runs, and how Manager's agent reaches it"
    );

    // Moved by the administrator: the old workload deleted, the row's containerId cleared.
    db.exec(&format!(
        r#"UPDATE "Containers" SET "containerId" = NULL, "updatedAt" = '{}' WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    wait_ready(&workloads, "team-wiki", Phase::Running).await;
    assert!(workloads.get_opt("pg-analytics").await.unwrap().is_none(), "still held");
    bridge.stop().await;
    db.close().await;
}

#[tokio::test]
async fn a_workload_handed_to_managers_provider_is_never_touched() {
    let ns = TestNamespace::new("bridge-provider").await;
    let db = ManagerDb::new(Engine::Sqlite).await;
    let workloads = ns.api::<ManagedWorkload>();
    let secrets = ns.api::<Secret>();
    let bridge = Bridge::start(&ns, &db, &[]).await;
    for name in SAMPLES {
        wait_ready(&workloads, name, Phase::Running).await;
    }
    wait_row(&db, &workloads, "team-wiki", true).await;

    let label = Patch::Merge(json!({"metadata": {"labels": {PROVIDER_LABEL: "manager"}}}));
    let handed = workloads.patch("team-wiki", &PatchParams::default(), &label).await.unwrap();
    let secret = secrets.patch("team-wiki-manager-env", &PatchParams::default(), &label).await.unwrap();
    let touched = || {
        audit::writes_by("mw-bridge", &ns.name)
            .into_iter()
            .filter(|w| matches!(w.name.as_deref(), Some("team-wiki" | "team-wiki-manager-env")))
            .count()
    };
    let before = touched();

    // Its row changes: reported, not applied.
    db.exec(&format!(
        r#"UPDATE "Containers" SET "environmentVars" = '{{"GREETING":"hello"}}', "updatedAt" = '{}' WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    bridge.wait_for_line(&["row not synced", "hostname=team-wiki", "reason=name_taken"], TIMEOUT).await;
    // Its row goes, and with it another row changes: once that one is applied and a full
    // resync (which collects orphans) has finished after it, the bridge has had its chance.
    let pg = workloads.get("pg-analytics").await.unwrap();
    db.exec(r#"UPDATE "Containers" SET "creationJobId" = NULL WHERE hostname = 'team-wiki'"#).await;
    db.exec(&format!(
        r#"DELETE FROM "Containers" WHERE hostname = 'team-wiki';
           UPDATE "Containers" SET "environmentVars" = '{{"PG_MAJOR":"16","MARK":"1"}}', "updatedAt" = '{}'
           WHERE hostname = 'pg-analytics'"#,
        now()
    ))
    .await;
    wait_until(&workloads, "pg-analytics", "the marker change", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| mw.metadata.generation > pg.metadata.generation)
    })
    .await
    .unwrap();
    let resyncs = || bridge.output().matches("full resync done").count();
    let seen = resyncs();
    eventually("a full resync after the deletion", TIMEOUT, || async {
        if resyncs() > seen { Ok(()) } else { Err("none yet".to_string()) }
    })
    .await;

    let still = workloads.get("team-wiki").await.expect("the handed-over workload is still there");
    assert_eq!((still.uid(), still.metadata.generation), (handed.uid(), handed.metadata.generation));
    let still_secret = secrets.get("team-wiki-manager-env").await.expect("its Secret is still there");
    assert_eq!(still_secret.data, secret.data, "its env is Manager's now");
    assert_eq!(touched(), before, "the bridge wrote to a workload Manager's provider holds");
    bridge.stop().await;
    db.close().await;
}

async fn bad_rows(engine: Engine) {
    let ns = TestNamespace::new(&format!("bridge-bad-{engine:?}")).await;
    let db = ManagerDb::new(engine).await;
    let workloads = ns.api::<ManagedWorkload>();
    db.insert_node("k8s-unmapped").await;
    // (node, hostname, template, environmentVars, the reason it is reported with)
    type BadRow = (&'static str, &'static str, Option<&'static str>, Option<&'static str>, &'static str);
    let bad: [BadRow; 6] = [
        ("k8s-lab-1", "no-image", None, None, "missing_image"),
        ("k8s-lab-1", "proxmox-tpl", Some("local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"), None, "bad_image"),
        ("k8s-lab-1", "bad-env-key", Some("docker.io/library/nginx:1.27"), Some(r#"{"1BAD":"x"}"#), "bad_env_key"),
        ("k8s-lab-1", "bad-json", Some("docker.io/library/nginx:1.27"), Some("{not json"), "bad_env_json"),
        ("k8s-unmapped", "elsewhere", Some("docker.io/library/nginx:1.27"), None, "unmapped_node"),
        ("k8s-lab-1", "taken", Some("docker.io/library/nginx:1.27"), None, "name_taken"),
    ];
    for (node, host, template, env, _) in bad {
        db.insert_container(node, host, template, env).await;
    }
    let foreign = support::workload::apply(&workloads, "taken", json!({"image": "nginx:latest"})).await.unwrap();
    // PostgreSQL: the same hostname in another site, whose node maps to the same namespace.
    // (SQLite's hostname is unique across the whole table, so this cannot happen there.)
    let second_node = format!("--node=k8s-other-site={}", ns.name);
    let mut extra = vec![];
    if engine == Engine::Postgres {
        db.exec(&format!(
            r#"INSERT INTO "Sites" ("name", "internalDomain", "dhcpRange", "subnetMask", "gateway", "dnsForwarders",
                 "createdAt", "updatedAt") VALUES ('other-site', 'other.internal', '10.16.0.100,10.16.0.200',
                 '255.255.255.0', '10.16.0.1', '1.1.1.1', '{0}', '{0}');
               INSERT INTO "Nodes" ("name", "nodeType", "siteId", "imageStorage", "volumeStorage", "networkBridge",
                 "nvidiaAvailable", "createdAt", "updatedAt") VALUES ('k8s-other-site', 'kubernetes',
                 (SELECT "id" FROM "Sites" WHERE "name" = 'other-site'), 'local', 'local-lvm', 'vmbr0', false, '{0}', '{0}');
               INSERT INTO "Containers" ("hostname", "username", "nodeId", "siteId", "aiContainer", "template",
                 "nvidiaRequested", "createdAt", "updatedAt") VALUES ('team-wiki', 'other',
                 (SELECT "id" FROM "Nodes" WHERE "name" = 'k8s-other-site'), (SELECT "id" FROM "Sites" WHERE "name" = 'other-site'),
                 'N', 'docker.io/library/nginx:1.27', false, '{0}', '{0}')"#,
            now()
        ))
        .await;
        extra.push(second_node.as_str());
    }
    let bridge = Bridge::start(&ns, &db, &extra).await;
    if engine == Engine::Postgres {
        let id = db.count(r#"SELECT CAST(MAX(id) AS BIGINT) FROM "Containers" WHERE hostname = 'team-wiki'"#).await;
        bridge
            .wait_for_line(&["row not synced", &format!("Containers.id={id} "), "reason=hostname_collision"], TIMEOUT)
            .await;
        assert_eq!(bridge.metric("mw_bridge_row_errors_total{reason=\"hostname_collision\"}").await, Some(1.0));
        let wiki =
            wait_until(&workloads, "team-wiki", "the first container's CR", TIMEOUT, |mw: Option<&ManagedWorkload>| {
                mw.is_some()
            })
            .await
            .unwrap();
        assert_ne!(
            wiki.labels()["opensource-server.mieweb.org/container-id"],
            id.to_string(),
            "the first container keeps its name"
        );
    }

    for (_, host, _, _, reason) in bad {
        let id = db.id_of(host).await;
        let line = bridge
            .wait_for_line(&["row not synced", &format!("Containers.id={id} "), &format!("reason={reason}")], TIMEOUT)
            .await;
        assert!(!line.contains("s3cr3t"), "{line}");
    }
    // Every good row syncs regardless.
    for name in SAMPLES {
        wait_ready(&workloads, name, Phase::Running).await;
    }
    for (_, host, ..) in bad.iter().filter(|b| b.1 != "taken") {
        assert!(workloads.get_opt(host).await.unwrap().is_none(), "{host} must have no CR");
    }
    let untouched = workloads.get("taken").await.unwrap();
    assert_eq!((untouched.uid(), untouched.metadata.generation), (foreign.uid(), foreign.metadata.generation));
    let writes = audit::writes_by("mw-bridge", &ns.name);
    assert!(!writes.iter().any(|w| w.name.as_deref() == Some("taken")), "someone else's CR was written: {writes:?}");

    // A fixed row syncs (incremental poll), the freed name is taken over (retried).
    db.exec(&format!(
        r#"UPDATE "Containers" SET template = 'docker.io/library/nginx:1.27', "updatedAt" = '{}' WHERE hostname = 'no-image'"#,
        now()
    ))
    .await;
    wait_ready(&workloads, "no-image", Phase::Running).await;
    workloads.delete("taken", &Default::default()).await.unwrap();
    wait_until(&workloads, "taken", "the bridge's own CR for row 'taken'", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| mw.labels().get(SYNCED_BY_LABEL).is_some())
    })
    .await;
    bridge.wait_for_line(&["row synced again", "hostname=no-image"], TIMEOUT).await;
    // The counter by reason, once per row and reason.
    for (_, _, _, _, reason) in bad {
        let sample = format!("mw_bridge_row_errors_total{{reason=\"{reason}\"}}");
        assert_eq!(bridge.metric(&sample).await, Some(1.0), "{sample}");
    }
    let (status, _) = bridge.http_get("/readyz").await;
    assert_eq!(status, 200, "bad rows do not make the bridge unready");
    // Counted once per row and reason, not once per poll.
    let output = bridge.output();
    let reports = output.lines().filter(|l| l.contains("row not synced") && l.contains("hostname=bad-json")).count();
    assert_eq!(reports, 1, "a row stuck on one error is reported once");
    bridge.stop().await;
    db.close().await;
}

#[tokio::test]
async fn sqlite_bad_rows() {
    bad_rows(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_bad_rows() {
    bad_rows(Engine::Postgres).await;
}

/// The database goes away for 30 s while the cluster side changes; when it is back the
/// bridge converges with nothing lost and nothing duplicated, without a restart.
async fn database_outage(engine: Engine) {
    const OUTAGE: Duration = Duration::from_secs(30);
    let ns = TestNamespace::new(&format!("bridge-outage-{engine:?}")).await;
    let own = (engine == Engine::Postgres).then(|| support::manager::OwnPgServer::start("outage"));
    let db = match &own {
        Some(own) => ManagerDb::postgres(&own.server).await,
        None => ManagerDb::new(Engine::Sqlite).await,
    };
    let workloads = ns.api::<ManagedWorkload>();
    let mut bridge = Bridge::start(&ns, &db, &[]).await;
    for name in SAMPLES {
        wait_ready(&workloads, name, Phase::Running).await;
        wait_row(&db, &workloads, name, true).await;
    }

    let stop = || async {
        workloads
            .patch("team-wiki", &PatchParams::default(), &Patch::Merge(json!({"spec": {"state": "Stopped"}})))
            .await
            .expect("stopping team-wiki");
    };
    let insert =
        support::manager::insert_container_sql("k8s-lab-1", "late-arrival", Some("docker.io/library/redis:7"), None);
    match &own {
        Some(server) => {
            server.pause();
            stop().await;
            tokio::time::sleep(OUTAGE).await;
            server.resume();
            db.exec(&insert).await;
        }
        None => {
            // The lock is taken first; the CR stops while the bridge cannot read or write.
            let (locked, lock_held) = tokio::sync::oneshot::channel();
            let hold = db.lock_sqlite_for(OUTAGE, &insert, locked);
            let change = async {
                lock_held.await.expect("the write lock taken");
                stop().await;
            };
            tokio::join!(hold, change);
        }
    }
    bridge.wait_for_line(&["sync pass failed"], TIMEOUT).await;
    assert!(bridge.alive(), "the bridge exited during the outage");

    wait_ready(&workloads, "late-arrival", Phase::Running).await;
    wait_row(&db, &workloads, "late-arrival", true).await;
    wait_ready(&workloads, "team-wiki", Phase::Stopped).await;
    wait_row(&db, &workloads, "team-wiki", false).await;
    bridge.wait_for_line(&["sync recovered"], TIMEOUT).await;
    // One CR per row, exactly.
    let names: Vec<String> =
        workloads.list(&ListParams::default()).await.unwrap().items.iter().map(|w| w.name_any()).collect();
    let rows = db.count(r#"SELECT CAST(COUNT(*) AS BIGINT) FROM "Containers""#).await;
    assert_eq!(names.len() as i64, rows, "CRs {names:?} vs {rows} rows");
    let creates = audit::writes_by("mw-bridge", &ns.name)
        .into_iter()
        .filter(|w| w.resource == "managedworkloads" && w.name.as_deref() == Some("late-arrival"))
        .count();
    assert_eq!(creates, 1, "late-arrival's CR was written more than once");
    assert!(bridge.alive());
    bridge.stop().await;
    db.close().await;
}

#[tokio::test]
async fn sqlite_database_outage() {
    database_outage(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_database_outage() {
    database_outage(Engine::Postgres).await;
}

/// The API server goes away for 30 s (connections reset, new ones refused) while Manager's
/// rows change; when it is back, the bridge converges without a restart.
#[tokio::test]
async fn api_server_outage() {
    const OUTAGE: Duration = Duration::from_secs(30);
    let ns = TestNamespace::new("bridge-api-outage").await;
    let db = ManagerDb::new(Engine::Sqlite).await;
    let workloads = ns.api::<ManagedWorkload>();
    let proxy = support::proxy::Proxy::start(support::proxy::api_server()).await;
    let kubeconfig = std::path::PathBuf::from(support::log_dir()).join(format!("bridge-{}.kubeconfig", ns.name));
    proxy.kubeconfig(&support::bridge::kubeconfig(), &kubeconfig);
    let mut bridge = Bridge::start_with(&ns, &db, kubeconfig.to_str().unwrap(), &[]).await;
    for name in SAMPLES {
        wait_ready(&workloads, name, Phase::Running).await;
    }

    proxy.cut();
    db.insert_container("k8s-lab-1", "while-away", Some("docker.io/library/redis:7"), None).await;
    db.exec(&format!(
        r#"UPDATE "Containers" SET "environmentVars" = '{{"CHANGED":"yes"}}', "updatedAt" = '{}' WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    bridge.wait_for_line(&["sync pass failed", "Kubernetes API"], TIMEOUT).await;
    let (status, _) = bridge.http_get("/readyz").await;
    assert_eq!(status, 503, "unready while the API server is unreachable");
    tokio::time::sleep(OUTAGE).await;
    assert!(bridge.alive(), "the bridge exited while the API server was away");
    proxy.restore();

    wait_ready(&workloads, "while-away", Phase::Running).await;
    wait_row(&db, &workloads, "while-away", true).await;
    wait_until(&workloads, "team-wiki", "the env change made while away", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| mw.spec.env.iter().any(|e| e.name == "CHANGED"))
    })
    .await;
    recovered_from_api_outage(&bridge).await;
    eventually("/readyz to answer 200 again", TIMEOUT, || async {
        let (status, _) = bridge.http_get("/readyz").await;
        if status == 200 { Ok(()) } else { Err(format!("{status}")) }
    })
    .await;
    // The status watch came back too: a stop made now reaches the row.
    workloads
        .patch("team-wiki", &PatchParams::default(), &Patch::Merge(json!({"spec": {"state": "Stopped"}})))
        .await
        .unwrap();
    wait_ready(&workloads, "team-wiki", Phase::Stopped).await;
    wait_row(&db, &workloads, "team-wiki", false).await;
    bridge.stop().await;
    db.close().await;
}

/// After the API server was unreachable: within its term the loop logs its recovery; an
/// outage longer than the Lease's renew deadline ends the term instead (the bridge cannot
/// renew), and the bridge leads again, starting with a full resync. Either is recovery.
async fn recovered_from_api_outage(bridge: &Bridge) {
    eventually("the bridge to recover, or to lead again", TIMEOUT, || async {
        let log = bridge.output();
        let led_again = log.contains("leadership ended") && log.matches("became leader").count() >= 2;
        if log.contains("sync recovered") || led_again { Ok(()) } else { Err("neither yet".to_string()) }
    })
    .await;
}

/// A Sequelize-form timestamp `offset_s` seconds from now (negative: in the past).
fn stamp(offset_s: i64) -> String {
    let at = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(offset_s);
    format!("{} +00:00", at.strftime("%Y-%m-%d %H:%M:%S%.3f"))
}

/// Wait until the row of `hostname` holds exactly `want` (containerId, ipv4Address, macAddress).
async fn wait_written(db: &ManagerDb, hostname: &str, want: (Option<String>, Option<String>, Option<String>)) {
    eventually(&format!("row {hostname} to hold {want:?}"), TIMEOUT, || async {
        let row = db.written(hostname).await.ok_or("no row")?;
        if row == want { Ok(()) } else { Err(format!("row holds {row:?}")) }
    })
    .await;
}

/// Issue 17, item 4: a row keeps no address its workload does not have. A row whose workload
/// is gone gets NULL; a row in error still follows the workload that runs for it.
async fn dead_addresses(engine: Engine) {
    let ns = TestNamespace::new(&format!("bridge-dead-ip-{engine:?}")).await;
    let db = ManagerDb::new(engine).await;
    let workloads = ns.api::<ManagedWorkload>();
    // A bad row carrying an address (an imported container): nothing serves it.
    db.insert_container("k8s-lab-1", "never-ran", None, None).await;
    db.exec(r#"UPDATE "Containers" SET "ipv4Address" = '10.15.10.199' WHERE hostname = 'never-ran'"#).await;
    let bridge = Bridge::start(&ns, &db, &[]).await;
    wait_ready(&workloads, "team-wiki", Phase::Running).await;
    wait_row(&db, &workloads, "team-wiki", true).await;
    bridge.wait_for_line(&["row not synced", "hostname=never-ran", "reason=missing_image"], TIMEOUT).await;
    wait_written(&db, "never-ran", (None, None, None)).await;

    // team-wiki's row goes bad; its workload runs on, made from the last good row.
    db.exec(&format!(
        r#"UPDATE "Containers" SET template = 'local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst', "updatedAt" = '{}'
           WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    bridge.wait_for_line(&["row not synced", "hostname=team-wiki", "reason=bad_image"], TIMEOUT).await;
    let set_state = |state: &'static str| {
        let workloads = workloads.clone();
        async move {
            workloads
                .patch("team-wiki", &PatchParams::default(), &Patch::Merge(json!({"spec": {"state": state}})))
                .await
                .expect("setting spec.state");
        }
    };
    // Stopped: the row in error loses the address; started again: it gets the new one.
    set_state("Stopped").await;
    wait_ready(&workloads, "team-wiki", Phase::Stopped).await;
    wait_row(&db, &workloads, "team-wiki", false).await;
    set_state("Running").await;
    wait_ready(&workloads, "team-wiki", Phase::Running).await;
    // The Pod IP reaches the status a little after the phase (details wait in transition).
    eventually("team-wiki's row to hold its new Pod IP", TIMEOUT, || async {
        let mw = workloads.get("team-wiki").await.map_err(|e| e.to_string())?;
        let pod_ip = mw.status.as_ref().and_then(|s| s.pod_ip.clone()).ok_or("no Pod IP in the status yet")?;
        let row = db.written("team-wiki").await.ok_or("no row")?;
        if phase_of(&mw) == Some(Phase::Running) && row.1.as_deref() == Some(pod_ip.as_str()) {
            Ok(())
        } else {
            Err(format!("row holds {row:?}, the CR {:?} {pod_ip}", phase_of(&mw)))
        }
    })
    .await;
    // The workload is deleted: the row keeps its provider id, not the dead address, and a
    // row in error is not re-created until it is fixed.
    workloads.delete("team-wiki", &Default::default()).await.expect("deleting team-wiki");
    wait_written(&db, "team-wiki", (Some(format!("{}/team-wiki", ns.name)), None, None)).await;
    // The write-back that cleared the address would have made a good row's workload again
    // (it was synced long ago); two full resyncs since compared every row with the cluster.
    bridge.wait_for_more(&["full resync done"], 2, TIMEOUT).await;
    assert!(workloads.get_opt("team-wiki").await.unwrap().is_none(), "a row in error was re-created");
    // Fixed, it is.
    db.exec(&format!(
        r#"UPDATE "Containers" SET template = 'docker.io/library/nginx:1.27', "updatedAt" = '{}' WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    wait_until(&workloads, "team-wiki", "the fixed row's CR", TIMEOUT, |mw: Option<&ManagedWorkload>| mw.is_some())
        .await;
    bridge.stop().await;
    db.close().await;
}

#[tokio::test]
async fn sqlite_dead_addresses() {
    dead_addresses(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_dead_addresses() {
    dead_addresses(Engine::Postgres).await;
}

/// Issue 17, item 5: a row stamped in the future (a writer whose clock runs ahead, as the
/// bridge's own stamps did with a fast clock) must not hide the edits that follow it until
/// the next full resync (an hour here: only the incremental poll can see them).
async fn future_stamps(engine: Engine) {
    let ns = TestNamespace::new(&format!("bridge-clock-{engine:?}")).await;
    let db = ManagerDb::new(engine).await;
    let workloads = ns.api::<ManagedWorkload>();
    let bridge = Bridge::start(&ns, &db, &["--resync-interval", "1h"]).await;
    let command = |name: &'static str, want: &'static [&'static str]| {
        let workloads = workloads.clone();
        async move {
            wait_until(&workloads, name, &format!("command {want:?}"), TIMEOUT, |mw: Option<&ManagedWorkload>| {
                mw.is_some_and(|mw| mw.spec.command == want)
            })
            .await;
        }
    };
    command("akumar-dev", &["/sbin/init"]).await;
    // A row stamped 30 s ahead of the database's clock (and of this machine's). A row in
    // error, so that no write-back re-stamps it: the bridge reads it and reports it.
    let insert = support::manager::insert_container_sql("k8s-lab-1", "from-the-future", None, None);
    db.exec(&format!(
        r#"BEGIN; {insert}; UPDATE "Containers" SET "updatedAt" = '{}' WHERE hostname = 'from-the-future'; COMMIT"#,
        stamp(30)
    ))
    .await;
    bridge.wait_for_line(&["row not synced", "hostname=from-the-future", "reason=missing_image"], TIMEOUT).await;
    // Read at least twice more with its future stamp.
    bridge.wait_for_more(&["incremental poll"], 2, TIMEOUT).await;
    // An edit Manager makes now, stamped by a correct clock.
    db.exec(&format!(
        r#"UPDATE "Containers" SET entrypoint = 'nginx', "updatedAt" = '{}' WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    let started = std::time::Instant::now();
    command("team-wiki", &["nginx"]).await;
    assert!(started.elapsed() < Duration::from_secs(20), "seen after {:?}", started.elapsed());
    // The bridge's own stamps are the database's clock: never in the future.
    let future = db
        .count(&format!(
            r#"SELECT CAST(COUNT(*) AS BIGINT) FROM "Containers" WHERE hostname <> 'from-the-future' AND "updatedAt" > '{}'"#,
            stamp(2)
        ))
        .await;
    assert_eq!(future, 0, "a row written back carries a stamp from the future");
    bridge.stop().await;
    db.close().await;
}

#[tokio::test]
async fn sqlite_future_stamps() {
    future_stamps(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_future_stamps() {
    future_stamps(Engine::Postgres).await;
}

/// The token a held deletion's log line gives for approving exactly that set.
fn approval_token(line: &str) -> String {
    let after = line.split("approve-deletion=").nth(1).expect("the line gives the approval token");
    after.chars().take_while(char::is_ascii_hexdigit).collect()
}

/// Annotate CRs of this bridge (`names`) with an approval token, as an administrator would.
async fn approve(workloads: &Api<ManagedWorkload>, names: &[String], token: &str) {
    for name in names {
        let patch = json!({"metadata": {"annotations": {APPROVE_DELETION_ANNOTATION: token}}});
        workloads.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("annotating a CR");
    }
}

/// Issue 17, item 6, and issue 22, item 8: pointed at another Manager database (a staging
/// copy, a new install) with a node of the same name, the bridge deletes (or replaces) none of
/// what it made: the deletions wait for a second read that agrees, then, beyond the share, for
/// an administrator's approval of the whole set. It says so and counts them, and meanwhile
/// syncs and writes back everything else.
async fn wrong_database(engine: Engine) {
    let ns = TestNamespace::new(&format!("bridge-wrong-db-{engine:?}")).await;
    let right = ManagerDb::new(engine).await;
    let workloads = ns.api::<ManagedWorkload>();
    let first = Bridge::start(&ns, &right, &[]).await;
    let mut made = Vec::new();
    for name in SAMPLES {
        let mw = wait_until(&workloads, name, "the bridge's CR", TIMEOUT, |mw: Option<&ManagedWorkload>| mw.is_some())
            .await
            .unwrap();
        made.push(mw);
    }
    first.stop().await;

    // The same hostnames and ids, but other containers (other createdAt), and one more.
    let wrong = ManagerDb::new(engine).await;
    wrong.exec(r#"UPDATE "Containers" SET "createdAt" = '2026-11-01 00:00:00.000 +00:00'"#).await;
    wrong.insert_container("k8s-lab-1", "staging-only", Some("docker.io/library/redis:7"), None).await;
    let second = Bridge::start(&ns, &wrong, &[]).await;
    second.wait_for_line(&["rows are gone", "deleted once a second full read agrees", "count=3"], TIMEOUT).await;
    // Confirmed by the next read, and three of four is more than half: held, all of it.
    let held = second.wait_for_line(&["holding back the deletion of 3 of the bridge's 4"], TIMEOUT).await;
    let token = approval_token(&held);
    // The pass that held them went on to its end.
    second.wait_for_more(&["full resync done"], 1, TIMEOUT).await;
    let unchanged = || async {
        for mw in &made {
            let now = workloads.get(&mw.name_any()).await.expect("the CR is still there");
            assert_eq!(now.uid(), mw.uid(), "{} was replaced", mw.name_any());
        }
    };
    unchanged().await;
    assert_eq!(second.metric("mw_bridge_deletions_pending{stage=\"approval\"}").await, Some(3.0));
    // Everything else goes on: the new row's CR is made and its row written back, the rows
    // whose CR is held say why, and the bridge stays ready.
    wait_until(&workloads, "staging-only", "the new row's CR", TIMEOUT, |mw: Option<&ManagedWorkload>| mw.is_some())
        .await;
    let provider_id = Some(format!("{}/staging-only", ns.name));
    eventually("staging-only's row to be written back", TIMEOUT, || async {
        let row = wrong.written("staging-only").await.ok_or("no row")?;
        if row.0 == provider_id { Ok(()) } else { Err(format!("row holds {row:?}")) }
    })
    .await;
    second.wait_for_line(&["row not synced", "hostname=team-wiki", "reason=awaiting_deletion"], TIMEOUT).await;
    let (status, _) = second.http_get("/readyz").await;
    assert_eq!(status, 200, "held deletions do not stop the bridge");

    // Approving part of the set deletes none of it.
    let names: Vec<String> = made.iter().map(|mw| mw.name_any()).collect();
    approve(&workloads, &names[..1], &token).await;
    second.wait_for_more(&["full resync done"], 2, TIMEOUT).await;
    unchanged().await;
    assert!(second.lines(&["deleting its ManagedWorkload"]).is_empty(), "a partly approved set was deleted");
    // Approving all of it, as the log says (every CR of the bridge, by its label): deleted,
    // and the new containers' CRs made.
    let all: Vec<String> = workloads
        .list(&ListParams::default().labels(&format!("{SYNCED_BY_LABEL}=mw-bridge")))
        .await
        .unwrap()
        .items
        .iter()
        .map(|mw| mw.name_any())
        .collect();
    approve(&workloads, &all, &token).await;
    for mw in &made {
        wait_until(
            &workloads,
            &mw.name_any(),
            "the CR of the new container",
            TIMEOUT,
            |now: Option<&ManagedWorkload>| now.is_some_and(|now| now.uid() != mw.uid()),
        )
        .await;
    }
    assert_eq!(second.metric("mw_bridge_deletions_pending{stage=\"approval\"}").await, Some(0.0));
    second.stop().await;
    right.close().await;
    wrong.close().await;
}

#[tokio::test]
async fn sqlite_wrong_database() {
    wrong_database(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_wrong_database() {
    wrong_database(Engine::Postgres).await;
}

/// Issue 17, item 3 (the bridge's part): an API server connection that hangs without
/// failing (a black hole, not a refusal) pins no pass: the pass is abandoned at its time
/// limit, the bridge reports not ready but stays alive, and converges once it clears.
#[tokio::test]
async fn hung_api_server() {
    let ns = TestNamespace::new("bridge-hung-api").await;
    let db = ManagerDb::new(Engine::Sqlite).await;
    let workloads = ns.api::<ManagedWorkload>();
    let proxy = support::proxy::Proxy::start(support::proxy::api_server()).await;
    let kubeconfig = std::path::PathBuf::from(support::log_dir()).join(format!("bridge-{}.kubeconfig", ns.name));
    proxy.kubeconfig(&support::bridge::kubeconfig(), &kubeconfig);
    let mut bridge = Bridge::start_with(&ns, &db, kubeconfig.to_str().unwrap(), &["--pass-timeout", "5s"]).await;
    for name in SAMPLES {
        wait_ready(&workloads, name, Phase::Running).await;
    }

    proxy.black_hole();
    db.exec(&format!(
        r#"UPDATE "Containers" SET "environmentVars" = '{{"CHANGED":"yes"}}', "updatedAt" = '{}' WHERE hostname = 'team-wiki'"#,
        now()
    ))
    .await;
    bridge.wait_for_line(&["sync pass failed", "did not finish within 5s"], Duration::from_secs(60)).await;
    eventually("/readyz to answer 503", Duration::from_secs(30), || async {
        let (status, _) = bridge.http_get("/readyz").await;
        if status == 503 { Ok(()) } else { Err(format!("{status}")) }
    })
    .await;
    let (status, body) = bridge.http_get("/healthz").await;
    assert_eq!(status, 200, "the loop goes on (it retries), so it is alive: {body}");
    assert!(bridge.alive());
    proxy.heal();

    wait_until(&workloads, "team-wiki", "the env change made while hung", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| mw.spec.env.iter().any(|e| e.name == "CHANGED"))
    })
    .await;
    recovered_from_api_outage(&bridge).await;
    eventually("/readyz to answer 200 again", TIMEOUT, || async {
        let (status, _) = bridge.http_get("/readyz").await;
        if status == 200 { Ok(()) } else { Err(format!("{status}")) }
    })
    .await;
    // The status watch came back too: a stop made now reaches the row.
    workloads
        .patch("team-wiki", &PatchParams::default(), &Patch::Merge(json!({"spec": {"state": "Stopped"}})))
        .await
        .unwrap();
    wait_ready(&workloads, "team-wiki", Phase::Stopped).await;
    wait_row(&db, &workloads, "team-wiki", false).await;
    bridge.stop().await;
    db.close().await;
}

/// Issue 17, item 6, between full resyncs: rows whose ids now name other containers (other
/// `createdAt`, as a database swapped under the bridge would show them) would have every CR
/// replaced by the incremental poll. The guard holds that too (a full read is made at once
/// to start it); with `--max-delete-percent 100` the confirmed set goes.
#[tokio::test]
async fn mass_replacement_between_resyncs_is_held() {
    let ns = TestNamespace::new("bridge-mass-replace").await;
    let db = ManagerDb::new(Engine::Sqlite).await;
    let workloads = ns.api::<ManagedWorkload>();
    let bridge = Bridge::start(&ns, &db, &["--resync-interval", "1h"]).await;
    let mut made = Vec::new();
    for name in SAMPLES {
        let mw = wait_until(&workloads, name, "the bridge's CR", TIMEOUT, |mw: Option<&ManagedWorkload>| mw.is_some())
            .await
            .unwrap();
        made.push(mw);
    }
    bridge.wait_for_line(&["full resync done"], TIMEOUT).await;
    db.exec(&format!(
        r#"UPDATE "Containers" SET "createdAt" = '2026-11-01 00:00:00.000 +00:00', "updatedAt" = '{}'"#,
        now()
    ))
    .await;
    bridge.wait_for_line(&["row not synced", "reason=awaiting_deletion"], TIMEOUT).await;
    bridge.wait_for_line(&["holding back the deletion of 3 of the bridge's 3"], TIMEOUT).await;
    bridge.wait_for_more(&["full resync done"], 1, TIMEOUT).await;
    for mw in &made {
        let now = workloads.get(&mw.name_any()).await.expect("the CR is still there");
        assert_eq!(now.uid(), mw.uid(), "{} was replaced", mw.name_any());
    }
    bridge.stop().await;

    // The flag's way: the set is still confirmed by two reads, then deleted and replaced.
    let bridge = Bridge::start(&ns, &db, &["--resync-interval", "1h", "--max-delete-percent", "100"]).await;
    for mw in &made {
        wait_until(
            &workloads,
            &mw.name_any(),
            "the CR of the new container",
            TIMEOUT,
            |now: Option<&ManagedWorkload>| now.is_some_and(|now| now.uid() != mw.uid()),
        )
        .await;
    }
    let found = bridge.lines(&["rows are gone", "count=3"]);
    assert_eq!(found.len(), 1, "found once, then confirmed: {found:?}");
    bridge.stop().await;
    db.close().await;
}

/// Issue 22, item 8: a row that is gone from one full read and back in the next (a database
/// in flux: a restore under way, a failover to a lagging replica) costs its workload nothing;
/// a row that stays gone is deleted once a second read agrees, even the one row of a small
/// install's share.
#[tokio::test]
async fn a_deletion_waits_for_a_second_read_that_agrees() {
    let ns = TestNamespace::new("bridge-confirm").await;
    let db = ManagerDb::new(Engine::Sqlite).await;
    let workloads = ns.api::<ManagedWorkload>();
    // Reads 20 s apart confirm: time for the row to come back in between.
    let bridge = Bridge::start(&ns, &db, &["--resync-interval", "20s"]).await;
    let before =
        wait_until(&workloads, "akumar-dev", "the bridge's CR", TIMEOUT, |mw: Option<&ManagedWorkload>| mw.is_some())
            .await
            .unwrap();
    bridge.wait_for_line(&["full resync done"], TIMEOUT).await;

    // Gone from the node's rows (moved to a node the bridge does not serve), then back.
    db.insert_node("k8s-elsewhere").await;
    let move_to = |node: &'static str| {
        format!(
            r#"UPDATE "Containers" SET "nodeId" = (SELECT id FROM "Nodes" WHERE name = '{node}') WHERE hostname = 'akumar-dev'"#
        )
    };
    db.exec(&move_to("k8s-elsewhere")).await;
    let found = bridge.wait_for_line(&["rows are gone", "deleted once a second full read agrees"], TIMEOUT).await;
    assert!(found.contains(&format!("{}/akumar-dev", ns.name)), "{found}");
    db.exec(&move_to("k8s-lab-1")).await;
    bridge.wait_for_line(&["no ManagedWorkload is to be deleted any more"], TIMEOUT).await;
    let kept = workloads.get("akumar-dev").await.expect("the CR is still there");
    assert_eq!(kept.uid(), before.uid());
    assert!(bridge.lines(&["deleting its ManagedWorkload"]).is_empty());
    let (status, _) = bridge.http_get("/readyz").await;
    assert_eq!(status, 200);

    // Deleted for real: one of three goes (below the minimum), after a second read agrees.
    db.exec(r#"UPDATE "Containers" SET "creationJobId" = NULL WHERE hostname = 'akumar-dev'"#).await;
    db.exec(r#"DELETE FROM "Containers" WHERE hostname = 'akumar-dev'"#).await;
    wait_until(&workloads, "akumar-dev", "the CR of the deleted row to go", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_none_or(|mw| mw.metadata.deletion_timestamp.is_some())
    })
    .await;
    let log = bridge.output();
    let found = log.rfind("rows are gone").expect("found by a first read");
    let deleted = log.rfind("row is gone; deleting its ManagedWorkload").expect("deleted");
    assert!(found < deleted);
    assert!(log[found..deleted].contains("full resync done"), "deleted by the read that found it");
    bridge.stop().await;
    db.close().await;
}

/// Issue 15: a row's http and transport services become the workload's ports and Service; the
/// row gets the Service's stable address, which no rollout or Pod deletion takes away or moves.
async fn services_and_the_stable_address(engine: Engine) {
    use k8s_openapi::api::core::v1::Service;
    let ns = TestNamespace::new(&format!("bridge-svc-{engine:?}")).await;
    let db = ManagerDb::new(engine).await;
    let workloads = ns.api::<ManagedWorkload>();
    let services = ns.api::<Service>();
    let pods = ns.api::<Pod>();
    db.insert_container("k8s-lab-1", "svc-web", Some("docker.io/library/nginx:1.27"), Some(r#"{"A":"1"}"#)).await;
    let id = db.id_of("svc-web").await;
    let at = now();
    // As Manager's API stores them: an http service (its HTTPServices row names the public
    // hostname, which the bridge does not need), a tcp and a udp transport service.
    db.exec(&format!(
        r#"INSERT INTO "Services" ("containerId", type, "internalPort", "createdAt", "updatedAt")
             VALUES ({id}, 'http', 80, '{at}', '{at}'), ({id}, 'transport', 5432, '{at}', '{at}'),
                    ({id}, 'transport', 5353, '{at}', '{at}');
           INSERT INTO "TransportServices" ("serviceId", protocol, "externalPort", "createdAt", "updatedAt")
             VALUES ((SELECT id FROM "Services" WHERE "containerId" = {id} AND "internalPort" = 5432), 'tcp', 2000, '{at}', '{at}'),
                    ((SELECT id FROM "Services" WHERE "containerId" = {id} AND "internalPort" = 5353), 'udp', 2001, '{at}', '{at}');"#
    ))
    .await;
    let bridge = Bridge::start(&ns, &db, &[]).await;

    let mw = wait_ready(&workloads, "svc-web", Phase::Running).await;
    let ports: Vec<_> = mw.spec.ports.iter().map(|p| (p.container_port, p.name.clone().unwrap())).collect();
    assert_eq!(ports, [(80, "http-80".to_string()), (5353, "udp-5353".to_string()), (5432, "tcp-5432".to_string())]);
    assert!(mw.spec.service.is_some(), "a Service, as the bridge's default asks");
    let svc = services.get("svc-web").await.expect("the workload's Service");
    let cluster_ip = svc.spec.unwrap().cluster_ip.expect("a cluster IP");
    wait_written(&db, "svc-web", (Some(format!("{}/svc-web", ns.name)), Some(cluster_ip.clone()), None)).await;

    // Watch the row from here on: the address must never go or change.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let watching = {
        let (seen, db) = (seen.clone(), db.clone());
        tokio::spawn(async move {
            loop {
                let ip = db.written("svc-web").await.and_then(|(_, ip, _)| ip);
                seen.lock().unwrap().push(ip);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // The row's env changes: a rollout (Updating) to a new Pod.
    let before = mw.status.as_ref().and_then(|s| s.pod_ip.clone());
    db.exec(&format!(
        r#"UPDATE "Containers" SET "environmentVars" = '{{"A":"2"}}', "updatedAt" = '{}' WHERE hostname = 'svc-web'"#,
        now()
    ))
    .await;
    wait_until(&workloads, "svc-web", "a rollout to a new Pod", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| {
            support::workload::condition_current(mw, "Ready", "True")
                && mw.status.as_ref().is_some_and(|s| s.pod_ip.is_some() && s.pod_ip != before)
        })
    })
    .await;
    // kubectl delete pod: Creating again on a new Pod.
    let selector = ListParams::default().labels("app.kubernetes.io/instance=svc-web");
    let mut deleted = Vec::new();
    for pod in pods.list(&selector).await.unwrap().items {
        pods.delete(&pod.name_any(), &Default::default()).await.unwrap();
        deleted.push(pod.name_any());
    }
    // The replacement is Ready, and the workload Running again. (Waiting on the workload
    // alone could read the Running it had before the operator saw the deletion.)
    eventually("a replacement Pod Ready", TIMEOUT, || async {
        let ready = pods.list(&selector).await.unwrap().items.into_iter().any(|p| {
            !deleted.contains(&p.name_any())
                && p.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready { Ok(()) } else { Err("not yet".to_string()) }
    })
    .await;
    support::workload::wait_phase(&workloads, "svc-web", Phase::Running).await;
    // Two passes since (each ends in a write-back) saw that status, and the watcher a read since.
    bridge.wait_for_more(&["incremental poll"], 2, TIMEOUT).await;
    let samples = seen.lock().unwrap().len();
    eventually("the watcher to read the row again", TIMEOUT, || async {
        if seen.lock().unwrap().len() > samples { Ok(()) } else { Err("no new read".to_string()) }
    })
    .await;
    watching.abort();
    let mut distinct = seen.lock().unwrap().clone();
    distinct.dedup();
    assert_eq!(distinct, [Some(cluster_ip)], "ipv4Address through a rollout and a Pod deletion");

    // A service removed in Manager: the port goes from the workload and its Service.
    db.exec(&format!(r#"DELETE FROM "Services" WHERE "containerId" = {id} AND "internalPort" = 5353"#)).await;
    wait_until(&services, "svc-web", "the udp port gone from the Service", TIMEOUT, |s: Option<&Service>| {
        let ports = s.and_then(|s| s.spec.as_ref()?.ports.clone()).unwrap_or_default();
        ports.iter().map(|p| p.port).collect::<Vec<_>>() == [80, 5432]
    })
    .await;
    bridge.stop().await;
    db.close().await;
}

#[tokio::test]
async fn sqlite_services_and_the_stable_address() {
    services_and_the_stable_address(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_services_and_the_stable_address() {
    services_and_the_stable_address(Engine::Postgres).await;
}

/// Issue 15: with `--service-type LoadBalancer` a row gets its load balancer's address, and
/// only once the load balancer has given one (never the cluster IP, which an nginx outside the
/// cluster cannot reach); a bridge run with `--ipv4-address pod` writes the Pod IP instead.
#[tokio::test]
async fn sqlite_load_balancer_address_and_the_pod_address_setting() {
    use k8s_openapi::api::core::v1::Service;
    let ns = TestNamespace::new("bridge-lb").await;
    let db = ManagerDb::new(Engine::Sqlite).await;
    let workloads = ns.api::<ManagedWorkload>();
    let services = ns.api::<Service>();
    db.insert_container("k8s-lab-1", "lb-web", Some("docker.io/library/nginx:1.27"), None).await;
    let id = db.id_of("lb-web").await;
    let at = now();
    db.exec(&format!(
        r#"INSERT INTO "Services" ("containerId", type, "internalPort", "createdAt", "updatedAt")
             VALUES ({id}, 'http', 80, '{at}', '{at}')"#
    ))
    .await;
    let bridge = Bridge::start(&ns, &db, &["--service-type", "LoadBalancer"]).await;
    let provider_id = Some(format!("{}/lb-web", ns.name));
    // Waiting for the load balancer: the Pod available, the workload not Ready. (Which step it
    // waits on, `WaitingForLoadBalancer`, is a status detail written later: docs/resource.md.)
    support::workload::wait_pod_available(&ns.client, &ns.name, "lb-web").await;
    wait_until(&workloads, "lb-web", "waiting for the load balancer", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.and_then(|mw| mw.status.as_ref()).is_some_and(|s| {
            s.phase == Some(Phase::Creating)
                && s.conditions.iter().any(|c| c.type_ == "Reconciling" && c.status == "True")
        })
    })
    .await;
    wait_written(&db, "lb-web", (provider_id.clone(), None, None)).await;
    // Two passes (each ends in a write-back) since the workload waited for its load balancer.
    bridge.wait_for_more(&["incremental poll"], 2, TIMEOUT).await;
    assert_eq!(db.written("lb-web").await.unwrap().1, None, "not the cluster IP meanwhile");

    // The test as the cloud controller.
    let ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.50"}]}}});
    services.patch_status("lb-web", &PatchParams::default(), &Patch::Merge(&ingress)).await.unwrap();
    wait_ready(&workloads, "lb-web", Phase::Running).await;
    wait_written(&db, "lb-web", (provider_id.clone(), Some("192.0.2.50".into()), None)).await;
    bridge.stop().await;

    // The same rows under a bridge that writes Pod IPs.
    let bridge = Bridge::start(&ns, &db, &["--service-type", "LoadBalancer", "--ipv4-address", "pod"]).await;
    let pod_ip = workloads.get("lb-web").await.unwrap().status.and_then(|s| s.pod_ip).expect("a Pod IP");
    wait_written(&db, "lb-web", (provider_id, Some(pod_ip), None)).await;
    bridge.stop().await;
    db.close().await;
}

/// Issue 22, item 8: the bridge's own write-backs (stamped by the database's clock) do not
/// move its watermark. With Manager's clock a minute behind the database's, an edit Manager
/// makes after a write-back carries an older stamp than the write-back; the incremental poll
/// (the full resync is an hour away) must still see it. Nor does the bridge re-read its own
/// writes as changes: they cost no apply.
async fn write_backs_do_not_move_the_watermark(engine: Engine) {
    let ns = TestNamespace::new(&format!("bridge-watermark-{engine:?}")).await;
    let db = ManagerDb::new(engine).await;
    let workloads = ns.api::<ManagedWorkload>();
    let bridge = Bridge::start(&ns, &db, &["--resync-interval", "1h"]).await;
    for name in SAMPLES {
        wait_ready(&workloads, name, Phase::Running).await;
        wait_row(&db, &workloads, name, true).await;
    }
    // The write-backs are read back by the polls that follow (all rows, each poll: Manager's
    // stamps are months old, so the watermark is too).
    let applied = bridge.metric("mw_bridge_writes_total{kind=\"workload_apply\"}").await;
    bridge.wait_for_more(&["incremental poll", "rows=3"], 3, TIMEOUT).await;
    assert_eq!(
        bridge.metric("mw_bridge_writes_total{kind=\"workload_apply\"}").await,
        applied,
        "the bridge re-read its own write-backs as changes"
    );

    // Manager's edit, stamped by its clock, a minute behind the database's.
    db.exec(&format!(
        r#"UPDATE "Containers" SET entrypoint = 'postgres -c max_connections=50', "updatedAt" = '{}'
           WHERE hostname = 'pg-analytics'"#,
        stamp(-60)
    ))
    .await;
    wait_until(
        &workloads,
        "pg-analytics",
        "the edit Manager made",
        Duration::from_secs(30),
        |mw: Option<&ManagedWorkload>| mw.is_some_and(|mw| mw.spec.command == ["postgres", "-c", "max_connections=50"]),
    )
    .await;
    assert!(bridge.lines(&["full resync done"]).len() == 1, "seen by the incremental poll, not by a full resync");
    // The counter moves once the apply's answer is back in the bridge, which may be after this
    // test's own watch has shown the change.
    support::eventually("the edit's apply to be counted", TIMEOUT, || async {
        let now = bridge.metric("mw_bridge_writes_total{kind=\"workload_apply\"}").await;
        if now > applied { Ok(()) } else { Err(format!("workload_apply {now:?}, as before the edit")) }
    })
    .await;
    bridge.stop().await;
    db.close().await;
}

#[tokio::test]
async fn sqlite_write_backs_do_not_move_the_watermark() {
    write_backs_do_not_move_the_watermark(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_write_backs_do_not_move_the_watermark() {
    write_backs_do_not_move_the_watermark(Engine::Postgres).await;
}

/// Issue 22, item 8: the bridge's writes never take over a ManagedWorkload or Secret someone
/// made by hand, even one made between the bridge's look and its write (a race no end-to-end
/// run hits on cue, so its writes are made here directly, under the bridge's identity): a
/// create where one exists, even with every field the same, is refused (409) and leaves it
/// as it was; so is an update for a UID the object does not have. And the API server's clock
/// is what the bridge reads as the time of the Secrets' creationTimestamp.
#[tokio::test]
async fn the_bridges_writes_never_take_over_a_hand_made_object() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use mw_operator::bridge::cluster::{Cluster, CreateStep};
    use mw_operator::bridge::metrics::Metrics;
    use mw_operator::write::{Write, found_another};
    let ns = TestNamespace::new("bridge-create-only").await;
    support::bridge::grant(&ns).await;
    let workloads = ns.api::<ManagedWorkload>();
    let secrets = ns.api::<Secret>();
    // Hand-made, with the very spec and Secret data the bridge's objects will carry.
    let hand_made =
        support::workload::apply(&workloads, "app", json!({"image": "docker.io/library/nginx:1.27"})).await.unwrap();
    let mut secret = Secret::default();
    secret.metadata.name = Some("app-manager-env".into());
    secret.string_data = Some([("TZ".to_string(), "UTC".to_string())].into());
    let hand_made_secret = secrets.create(&Default::default(), &secret).await.unwrap();

    let connection =
        mw_operator::client::ConnectionArgs { kubeconfig: Some(support::bridge::kubeconfig().into()), context: None };
    let clients = mw_operator::client::connect_all(&connection).await.expect("the bridge's clients");
    let metrics = Metrics::register(&mut Default::default());
    let cluster = Cluster::start(&clients, std::slice::from_ref(&ns.name), "mw-bridge", Default::default(), metrics)
        .await
        .expect("the bridge's view of the namespace");
    cluster.ready().await;

    let mut desired: ManagedWorkload = serde_json::from_value(json!({
        "apiVersion": "opensource-server.mieweb.org/v1alpha1", "kind": "ManagedWorkload",
        "metadata": {"name": "app", "namespace": ns.name, "labels": {SYNCED_BY_LABEL: "mw-bridge"}},
        "spec": {"image": "docker.io/library/nginx:1.27"}}))
    .unwrap();
    // Refused as another object than the write was for, which the bridge reads again.
    let refused = |result: Result<_, kube::Error>| match result {
        Err(err) => assert!(found_another(&err), "{err:?}"),
        Ok(()) => panic!("not refused"),
    };
    refused(cluster.apply(&desired, Write::Create, "workload_apply").await.map(|_| ()));
    // An update of the bridge's object of that name, read before this one was made.
    desired.metadata.uid = Some("4a6f1c9e-0000-4000-8000-000000000000".into());
    refused(cluster.apply(&desired, Write::Update { uid: None }, "workload_apply").await.map(|_| ()));
    let mut bridge_secret = secret.clone();
    bridge_secret.metadata.namespace = Some(ns.name.clone());
    bridge_secret.metadata.labels = Some([(SYNCED_BY_LABEL.to_string(), "mw-bridge".to_string())].into());
    refused(cluster.apply(&bridge_secret, Write::Create, "secret_apply").await.map(|_| ()));
    // Nor is an update of the bridge's Secret of that name, read before this one was made.
    let read_before = "5b7f2d0a-0000-4000-8000-000000000000";
    refused(cluster.apply(&bridge_secret, Write::Update { uid: Some(read_before) }, "secret_apply").await.map(|_| ()));

    // (The operator writes its status: the bridge, nothing.)
    let now = workloads.get("app").await.unwrap();
    assert_eq!(now.uid(), hand_made.uid());
    assert_eq!(now.labels().get(SYNCED_BY_LABEL), None);
    let managers: Vec<_> = now.managed_fields().iter().filter_map(|f| f.manager.clone()).collect();
    assert!(!managers.iter().any(|m| m == "mw-bridge"), "the bridge manages fields of the hand-made CR: {managers:?}");
    let now = secrets.get("app-manager-env").await.unwrap();
    assert_eq!(now.metadata.resource_version, hand_made_secret.metadata.resource_version);

    // Where nothing exists, the create creates (the precondition is for stored objects only).
    let mut fresh = desired.clone();
    fresh.metadata.uid = None;
    fresh.metadata.name = Some("fresh".into());
    let created = cluster.apply(&fresh, Write::Create, "workload_apply").await.expect("creating where none exists");
    assert_eq!(created.labels()[SYNCED_BY_LABEL], "mw-bridge");
    // The audit log, up to that accepted write, holds no accepted write to the hand-made ones.
    let accepted = || audit::timed_accepted_writes_by("mw-bridge", &ns.name).into_iter().map(|(_, w)| w);
    eventually("the audit log to hold the accepted create", TIMEOUT, || async {
        if accepted().any(|w| w.name.as_deref() == Some("fresh")) { Ok(()) } else { Err("not yet".to_string()) }
    })
    .await;
    let taken: Vec<_> = accepted().filter(|w| w.name.as_deref() != Some("fresh")).collect();
    assert!(taken.is_empty(), "{taken:?}");

    // The API server's clock: what it stamps on what it creates, to the second.
    let mut marker = ConfigMap::default();
    marker.metadata.name = Some("clock".into());
    let stamped = ns.api::<ConfigMap>().create(&Default::default(), &marker).await.unwrap();
    let server_now = cluster.server_time().await.expect("the API server's clock");
    let created_at = stamped.metadata.creation_timestamp.unwrap().0;
    let apart = (server_now - created_at).get_seconds().abs();
    assert!(apart <= 2, "the API server's Date {server_now} vs the creationTimestamp {created_at}");

    // A new row's Secret is written before its CR: where a Secret of that name turns out to
    // be someone else's (made after the bridge looked), no CR is made, so nothing of the row
    // ever starts with their values, and their Secret stays as it was.
    let mut late_secret = secret.clone();
    late_secret.metadata.name = Some("late-manager-env".into());
    let hand_made_late = secrets.create(&Default::default(), &late_secret).await.unwrap();
    let mut late = fresh.clone();
    late.metadata.name = Some("late".into());
    bridge_secret.metadata.name = Some("late-manager-env".into());
    match cluster.create_with_secret(&late, bridge_secret.clone(), None).await {
        Err((CreateStep::Secret, err)) => assert!(found_another(&err), "{err:?}"),
        other => panic!("the Secret's write was not refused: {other:?}"),
    }
    let made_for_late = audit::timed_accepted_writes_by("mw-bridge", &ns.name)
        .into_iter()
        .map(|(_, w)| w)
        .filter(|w| w.name.as_deref() == Some("late"))
        .collect::<Vec<_>>();
    assert!(made_for_late.is_empty(), "a CR was made for someone else's Secret: {made_for_late:?}");
    assert!(workloads.get_opt("late").await.unwrap().is_none());
    assert!(ns.api::<Deployment>().get_opt("late").await.unwrap().is_none(), "no Deployment");
    let pods = ns.api::<Pod>().list(&Default::default()).await.unwrap();
    assert!(pods.items.iter().all(|p| !p.name_any().starts_with("late-")), "no Pod");
    let now = secrets.get("late-manager-env").await.unwrap();
    assert_eq!(now.metadata.resource_version, hand_made_late.metadata.resource_version);
}
