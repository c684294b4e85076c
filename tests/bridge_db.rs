//! The bridge's database layer against real databases, no cluster: the queries read
//! Manager's real schema alike on both engines, incremental reads follow `updatedAt`, and the
//! write-back writes only when a value changes, only to the same container, and reports a
//! unique-constraint violation as a row error.

mod support;

use k8s_openapi::jiff::Timestamp;
use mw_operator::bridge::db::{Database, Target, WriteBackError, parse_timestamp};
use mw_operator::bridge::env;
use mw_operator::bridge::error::{BridgeError, RowError};
use mw_operator::bridge::mapping::{self, Context};
use mw_operator::bridge::rows::{Grants, RowState};
use mw_operator::election::ElectionArgs;
use support::manager::{Engine, ManagerDb, now};

async fn open(db: &ManagerDb) -> Database {
    let password = db.password_file.as_ref().map(|f| std::fs::read_to_string(f).unwrap().trim().to_string());
    Database::connect(&Target { url: db.url.clone(), password }).expect("a valid URL")
}

async fn reads_and_writes(engine: Engine) {
    let manager = ManagerDb::new(engine).await;
    manager.set_default_env(r#"[{"key":"WAZUH_MANAGER","value":"wazuh","description":""}]"#).await;
    let db = open(&manager).await;

    let nodes = db.kubernetes_nodes().await.unwrap();
    assert_eq!(nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["k8s-lab-1"]);
    let node = nodes[0].id;
    let rows = db.containers(&[node], None).await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.hostname.as_str()).collect::<Vec<_>>(),
        ["team-wiki", "pg-analytics", "akumar-dev"]
    );
    let grants = Grants::from_rows(db.approved_grants().await.unwrap());
    let defaults = env::parse_defaults(&db.default_env_setting().await.unwrap().unwrap()).unwrap();
    assert_eq!(defaults.vars["WAZUH_MANAGER"], "wazuh");
    // The same rows map to the same CRs on either engine, timestamps aside.
    let cx = Context {
        namespace: "ns",
        field_manager: "mw-bridge",
        defaults: &defaults,
        grants: &grants,
        requests_percent: 100,
        rootfs: &Default::default(),
        service: &Default::default(),
        system_images: &Default::default(),
        isolation: &None,
    };
    let pg = mapping::desired(&rows[1], &cx).unwrap();
    assert_eq!(
        pg.workload.spec.resources.as_ref().unwrap().limits.as_ref().unwrap().memory.as_ref().unwrap().0,
        "8192Mi"
    );
    assert!(parse_timestamp(&rows[0].created_at).is_some(), "{}", rows[0].created_at);

    // Incremental: only rows updated at or after the bound.
    let latest = rows.iter().filter_map(|r| parse_timestamp(&r.updated_at)).max().unwrap();
    assert!(
        db.containers(&[node], Some(latest.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(1)).unwrap()))
            .await
            .unwrap()
            .is_empty()
    );
    manager
        .exec(&format!(
            r#"UPDATE "Containers" SET entrypoint = 'sh', "updatedAt" = '{}' WHERE hostname = 'akumar-dev'"#,
            now()
        ))
        .await;
    let changed = db
        .containers(&[node], Some(latest.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(1)).unwrap()))
        .await
        .unwrap();
    assert_eq!(changed.iter().map(|r| r.hostname.as_str()).collect::<Vec<_>>(), ["akumar-dev"]);
    let fingerprint = db.fingerprint(&[node]).await.unwrap();
    assert_eq!(fingerprint.containers, 3);

    // Services: http and transport ones read with their protocol, dns ones not; a change to
    // them shows in the fingerprint (Manager does not touch the container's row for it).
    let wiki_id = manager.id_of("team-wiki").await;
    let at = now();
    manager
        .exec(&format!(
            r#"INSERT INTO "Services" ("containerId", type, "internalPort", "createdAt", "updatedAt")
                 VALUES ({wiki_id}, 'http', 80, '{at}', '{at}'), ({wiki_id}, 'transport', 5353, '{at}', '{at}'),
                        ({wiki_id}, 'dns', 53, '{at}', '{at}');
               INSERT INTO "TransportServices" ("serviceId", protocol, "externalPort", "createdAt", "updatedAt")
                 VALUES ((SELECT id FROM "Services" WHERE "containerId" = {wiki_id} AND "internalPort" = 5353),
                         'udp', 2053, '{at}', '{at}');"#
        ))
        .await;
    let with_services = db.containers_with_services(&[node], None).await.unwrap();
    let wiki_services = &with_services.iter().find(|r| r.hostname == "team-wiki").unwrap().services;
    let read: Vec<_> =
        wiki_services.iter().map(|s| (s.kind.as_str(), s.internal_port, s.protocol.as_deref())).collect();
    assert_eq!(read, [("http", 80, None), ("transport", 5353, Some("udp"))]);
    assert!(with_services.iter().filter(|r| r.hostname != "team-wiki").all(|r| r.services.is_empty()));
    let mapped = mapping::desired(with_services.iter().find(|r| r.hostname == "team-wiki").unwrap(), &cx).unwrap();
    assert_eq!(mapped.workload.spec.ports.len(), 2);
    assert!(mapped.workload.spec.service.is_some());
    let after_services = db.fingerprint(&[node]).await.unwrap();
    assert_ne!(after_services.services_updated, fingerprint.services_updated);
    manager.exec(r#"DELETE FROM "TransportServices""#).await;
    assert_ne!(db.fingerprint(&[node]).await.unwrap().services_updated, after_services.services_updated);

    // Write-back: written once, then nothing (the row already holds it).
    let wiki = &rows[0];
    let state = RowState {
        container_id: Some("ns/team-wiki".into()),
        ipv4_address: Some("10.244.0.10".into()),
        mac_address: None,
    };
    // Stamped by the database's clock: between its clock read just before and just after.
    let before = parse_timestamp(&db.fingerprint(&[node]).await.unwrap().db_now).expect("the database's clock");
    let written = db.write_back(wiki, &state).await.unwrap();
    let stamp = written.expect("a first write");
    let after = parse_timestamp(&db.fingerprint(&[node]).await.unwrap().db_now).unwrap();
    let stamped = parse_timestamp(&stamp).unwrap_or_else(|| panic!("{stamp}"));
    assert!(before <= stamped && stamped <= after, "{before} <= {stamped} <= {after}");
    assert!(
        Timestamp::now().duration_since(stamped).abs().as_secs() < 60,
        "the database's clock is this machine's: {stamped}"
    );
    assert!(db.write_back(wiki, &state).await.unwrap().is_none(), "no change, no write");
    // A replica that does not lead writes nothing back: refused, the row unchanged.
    let election = ElectionArgs {
        no_leader_election: false,
        lease_name: None,
        lease_namespace: "ns".into(),
        identity: Some("bridge-0".into()),
        lease_duration: 15,
        lease_grace: 5,
    };
    let election = election.election("mw-bridge", || unreachable!()).unwrap().expect("election on");
    let standby = open(&manager).await.fenced(election.leadership());
    let moved = RowState { ipv4_address: Some("10.244.0.99".into()), ..state.clone() };
    match standby.write_back(wiki, &moved).await {
        Err(WriteBackError::Bridge(BridgeError::NotLeading(refused))) => {
            assert!(refused.to_string().contains("does not lead"), "{refused}")
        }
        other => panic!("expected the write-back refused, got {other:?}"),
    }
    assert_eq!(
        manager.written("team-wiki").await.unwrap(),
        (Some("ns/team-wiki".into()), Some("10.244.0.10".into()), None)
    );
    let reread = db.containers(&[node], None).await.unwrap();
    let updated = &reread.iter().find(|r| r.hostname == "team-wiki").unwrap().updated_at;
    assert_eq!(updated, &stamp, "updatedAt is written in the form the engine reads back");
    if engine == Engine::Sqlite {
        assert!(stamp.ends_with(" +00:00") && stamp.len() == "2026-11-30 04:22:29.155 +00:00".len(), "{stamp}");
    }

    // Another container under the same id (a re-used SQLite id): never written.
    let mut impostor = wiki.clone();
    impostor.created_at = "2020-01-01 00:00:00.000 +00:00".into();
    let other = RowState { ipv4_address: None, ..state.clone() };
    assert!(db.write_back(&impostor, &other).await.unwrap().is_none());

    // An IP another row holds: a row error (unique constraint), not a crash.
    let pg_row = &rows[1];
    let clash = RowState {
        container_id: Some("ns/pg-analytics".into()),
        ipv4_address: Some("10.244.0.10".into()),
        mac_address: None,
    };
    match db.write_back(pg_row, &clash).await {
        Err(WriteBackError::Row(RowError::UniqueWriteBack { .. })) => {}
        other => panic!("expected a unique violation, got {other:?}"),
    }
    manager.close().await;
}

#[tokio::test]
async fn sqlite_reads_and_writes() {
    reads_and_writes(Engine::Sqlite).await;
}

#[tokio::test]
async fn postgres_reads_and_writes() {
    reads_and_writes(Engine::Postgres).await;
}

#[tokio::test]
async fn postgres_refuses_an_unverified_server() {
    // verify-full against the test server without its CA: a TLS error, never a fallback.
    let server = support::manager::PgServer::shared();
    let url = server.url.clone() + "?sslmode=verify-full";
    let password = std::fs::read_to_string(&server.password_file).unwrap().trim().to_string();
    let db = Database::connect(&Target { url, password: Some(password) }).unwrap();
    let err = db.kubernetes_nodes().await.expect_err("an untrusted certificate must fail");
    let text = format!("{err:?}");
    assert!(text.to_lowercase().contains("certificate") || text.to_lowercase().contains("tls"), "{text}");
}

#[tokio::test]
async fn postgres_password_is_used_as_given_never_decoded() {
    // A password that looks percent-encoded ("%41" is "A" in a URL) and has URL delimiters:
    // from the file (or MW_DATABASE_PASSWORD) it is the password itself, byte for byte.
    let manager = ManagerDb::new(Engine::Postgres).await;
    let role = format!("mw_pct_{}", std::process::id());
    let password = "p%41ss:w@rd/?#%zz";
    manager
        .exec(&format!(r#"CREATE ROLE {role} LOGIN PASSWORD '{password}'; GRANT SELECT ON "Nodes" TO {role}"#))
        .await;
    let url = manager.url.replacen("postgres://mw@", &format!("postgres://{role}@"), 1);
    let db = Database::connect(&Target { url: url.clone(), password: Some(password.into()) }).unwrap();
    db.kubernetes_nodes().await.expect("the password as given logs in");
    let decoded = Database::connect(&Target { url, password: Some("pAss:w@rd/?#%zz".into()) }).unwrap();
    assert!(decoded.kubernetes_nodes().await.is_err(), "the decoded form is another password");
    manager.exec(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await;
    manager.close().await;
}
