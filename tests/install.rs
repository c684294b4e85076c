//! Install-time trust, against the local control plane:
//!
//! - `mw-operator check` with a real ServiceAccount token and the shipped Role: everything
//!   passes; one permission taken away: exactly that line fails; a server certificate from
//!   an unknown CA: a TLS error that says so; the bridge's own check.
//! - Serial (`#[ignore]`d here; hack/test.sh runs them with `--ignored` after the main suite,
//!   once the shared cluster-wide operator is stopped, because they need to be the only
//!   operator, or remove the CRD every other test relies on): the namespace-scoped operator
//!   run for real with its ServiceAccount token, and uninstalling in either order.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use mw_operator::check::{Component, GROUP, lease_required, required};
use mw_operator::metrics::DEFAULT_LEASE;
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::{Value, json};
use support::scoped::{
    ACCOUNT, Operator, ScopedInstall, ensure_crd, operator_role, run_binary, set_role, token_for, write_kubeconfig,
    write_token_kubeconfig,
};
use support::workload::{TIMEOUT, apply, wait_ready};
use support::{TestNamespace, eventually, wait_until};

const CRD: &str = "managedworkloads.opensource-server.mieweb.org";

/// The shipped Role without `verb` on `resource`.
fn without(resource: &str, verb: &str) -> Role {
    operator_role(|role| {
        for rule in role["rules"].as_array_mut().expect("rules") {
            if rule["resources"].as_array().is_some_and(|r| r.iter().any(|x| x == resource)) {
                rule["verbs"].as_array_mut().expect("verbs").retain(|v| v != verb);
            }
        }
    })
}

fn json_report(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("check --output json printed no JSON ({e}):\n{stdout}"))
}

fn lines_with<'a>(out: &'a str, prefix: &str, needle: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix) && l.contains(needle)).collect()
}

#[tokio::test]
async fn check_passes_with_the_shipped_role_and_names_a_namespace_without_it() {
    let home = TestNamespace::new("check-home").await;
    let a = TestNamespace::new("check-a").await;
    let b = TestNamespace::new("check-b").await;
    let c = TestNamespace::new("check-c").await;
    let install = ScopedInstall::new(&home, &[&a, &b]).await;
    let kubeconfig = install.kubeconfig.to_str().unwrap();
    let both = format!("{},{}", a.name, b.name);

    let lease = ["--lease-namespace", home.name.as_str()];
    let (ok, out, err) =
        run_binary(&[&["check", "--kubeconfig", kubeconfig, "--namespace", &both], &lease[..]].concat()).await;
    assert!(ok, "check failed with the shipped Role:\n{out}\n{err}");
    assert!(out.contains("Kubernetes v1.36") && out.contains("server certificate verified"), "{out}");
    assert!(out.contains(&format!("authenticated as {}", install.user())), "{out}");
    assert!(out.contains(&format!("{CRD} served at v1alpha1, with its status subresource")), "{out}");
    // Asked as `run` asks it, in the first namespace: 1.36 streams lists.
    assert!(out.contains("[ok  ] lists                    lists streamed as watch events\n"), "{out}");
    let needed = required(Component::Operator).unwrap();
    for ns in [&a.name, &b.name] {
        assert_eq!(lines_with(&out, "[ok  ] rbac ", ns).len(), needed.len(), "{out}");
        assert_eq!(
            lines_with(&out, "[ok  ] least-privilege ", ns).len(),
            3,
            "no Secrets, no Lease but its own, no cluster-admin: {out}"
        );
        assert!(lines_with(&out, "[ok  ] rbac ", ns).iter().all(|l| !l.contains("leases")), "{out}");
    }
    // The Lease permissions, asked where the Lease lives and only there.
    let leases = lease_required(Component::Operator, DEFAULT_LEASE).unwrap();
    assert_eq!(lines_with(&out, "[ok  ] rbac ", &home.name).len(), leases.len(), "{out}");
    assert!(lines_with(&out, "[ok  ] rbac ", &home.name).iter().all(|l| l.contains("leases.coordination.k8s.io")));
    assert!(!out.contains(&install.token) && !err.contains(&install.token), "the token was printed");

    let (ok, out, _) =
        run_binary(&[&["check", "--kubeconfig", kubeconfig, "-n", &both, "--output", "json"], &lease[..]].concat())
            .await;
    assert!(ok);
    let report = json_report(&out);
    assert_eq!(report["ok"], true);
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 4 + 2 * (needed.len() + 3) + leases.len(), "{out}");
    assert!(checks.iter().all(|c| c["status"] == "pass"), "{out}");

    // Nothing is granted in c, and the checklist says so, permission by permission.
    let (ok, out, err) =
        run_binary(&[&["check", "--kubeconfig", kubeconfig, "--namespace", &c.name], &lease[..]].concat()).await;
    assert!(!ok, "check passed in a namespace without the Role:\n{out}");
    assert!(err.contains("the install check failed"), "{err}");
    let missing = lines_with(&out, "[FAIL] rbac ", &format!("missing in namespace {}", c.name));
    assert_eq!(missing.len(), needed.len(), "{out}");
    for p in &needed {
        assert!(missing.iter().any(|l| l.contains(&format!("{p}: missing"))), "no line for {p}:\n{out}");
    }
}

#[tokio::test]
async fn check_names_the_one_permission_taken_away() {
    let home = TestNamespace::new("check-less-home").await;
    let a = TestNamespace::new("check-less").await;
    let install = ScopedInstall::with_role(&home, &[&a], without("deployments", "patch")).await;
    let kubeconfig = install.kubeconfig.to_str().unwrap();
    let lease = ["--lease-namespace", home.name.as_str()];

    let (ok, out, _) =
        run_binary(&[&["check", "--kubeconfig", kubeconfig, "--namespace", &a.name], &lease[..]].concat()).await;
    assert!(!ok, "check passed without patch on deployments:\n{out}");
    let failed: Vec<_> = out.lines().filter(|l| l.starts_with("[FAIL]")).collect();
    assert_eq!(failed.len(), 1, "{out}");
    assert!(failed[0].starts_with(&format!("[FAIL] rbac {}", a.name)), "{out}");
    assert!(
        failed[0].ends_with(&format!(
            "patch deployments.apps: missing in namespace {} (cannot patch deployments.apps)",
            a.name
        )),
        "{out}"
    );
    assert!(out.contains("1 failed"), "{out}");

    let (ok, out, _) = run_binary(
        &[&["check", "--kubeconfig", kubeconfig, "--namespace", &a.name, "--output", "json"], &lease[..]].concat(),
    )
    .await;
    assert!(!ok);
    let report = json_report(&out);
    assert_eq!(report["ok"], false);
    let failed: Vec<_> = report["checks"].as_array().unwrap().iter().filter(|c| c["status"] == "fail").collect();
    assert_eq!(failed.len(), 1, "{out}");
    assert_eq!(failed[0]["check"], "rbac");
    assert_eq!(failed[0]["namespace"], a.name.as_str());
    assert!(failed[0]["detail"].as_str().unwrap().starts_with("patch deployments.apps: missing"), "{out}");
}

#[tokio::test]
async fn check_asks_for_the_lease_in_the_lease_namespace_only() {
    let home = TestNamespace::new("check-lease-home").await;
    let a = TestNamespace::new("check-lease-a").await;
    // The shipped Role in a, and no leader-election Role anywhere.
    let install = ScopedInstall::with_roles(&home, &[&a], operator_role(|_| {}), false).await;
    let kubeconfig = install.kubeconfig.to_str().unwrap();
    let leases = lease_required(Component::Operator, DEFAULT_LEASE).unwrap();

    let (ok, out, _) =
        run_binary(&["check", "--kubeconfig", kubeconfig, "-n", &a.name, "--lease-namespace", &home.name]).await;
    assert!(!ok, "check passed without the Lease permissions:\n{out}");
    let failed: Vec<_> = out.lines().filter(|l| l.starts_with("[FAIL]")).collect();
    assert_eq!(failed.len(), leases.len(), "only the Lease lines fail: {out}");
    for p in &leases {
        let line = format!("{p}: missing in namespace {} (cannot {p})", home.name);
        assert!(
            failed.iter().any(|l| l.starts_with(&format!("[FAIL] rbac {}", home.name)) && l.ends_with(&line)),
            "{line}:\n{out}"
        );
    }
    assert!(out.contains("get leases.coordination.k8s.io named mw-operator"), "{out}");

    // Granted in home, the same check passes; without leader election nothing is asked.
    let election = support::scoped::manifest(support::scoped::LEADER_ELECTION_ROLE);
    let admin = home.client.clone();
    let roles: Api<Role> = Api::namespaced(admin.clone(), &home.name);
    roles.create(&Default::default(), &serde_json::from_value(election).unwrap()).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "mw-operator-leader-election"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mw-operator-leader-election"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": home.name}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin, &home.name).create(&Default::default(), &binding).await.unwrap();
    eventually("check to pass with the Lease granted", Duration::from_secs(30), || async {
        let (ok, out, _) =
            run_binary(&["check", "--kubeconfig", kubeconfig, "-n", &a.name, "--lease-namespace", &home.name]).await;
        if ok { Ok(()) } else { Err(out) }
    })
    .await;
    let (ok, out, _) = run_binary(&["check", "--kubeconfig", kubeconfig, "-n", &a.name, "--no-leader-election"]).await;
    assert!(ok, "{out}");
    assert!(!out.contains("leases.coordination.k8s.io named"), "{out}");
}

/// A certificate authority the control plane has never heard of.
fn foreign_ca(name: &str) -> std::path::PathBuf {
    let admin = std::env::var("MW_TEST_KUBECONFIG").unwrap();
    let cert = std::path::Path::new(&admin).with_file_name(format!("{name}.crt"));
    let key = cert.with_extension("key");
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=not-the-cluster-ca", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running openssl");
    assert!(status.success(), "openssl could not make a CA");
    cert
}

#[tokio::test]
async fn check_refuses_a_server_certificate_from_an_unknown_ca() {
    let ns = TestNamespace::new("check-tls").await;
    // A real credential, so "never printed" means something.
    let token = token_for(&ns.client, &ns.name, "default").await;
    let ca = foreign_ca(&format!("foreign-ca-{}", ns.name));
    let kubeconfig = write_token_kubeconfig(&format!("wrong-ca-{}", ns.name), &token, Some(&ca));
    let kubeconfig = kubeconfig.to_str().unwrap();

    let (ok, out, err) = run_binary(&["check", "--kubeconfig", kubeconfig, "--namespace", &ns.name]).await;
    assert!(!ok, "check passed against a server it cannot verify:\n{out}");
    let lines: Vec<_> = out.lines().collect();
    assert_eq!(lines.len(), 2, "only the connection line and the count: {out}");
    assert!(lines[0].starts_with("[FAIL] connect"), "{out}");
    assert!(
        lines[0].contains("TLS: the API server's certificate is not signed by a CA this kubeconfig trusts"),
        "{out}"
    );
    assert!(lines[0].contains("UnknownIssuer"), "the underlying reason is kept: {out}");
    assert!(!out.contains(&token) && !err.contains(&token), "the token was printed");

    // The controller refuses the same way, at once, rather than retrying forever.
    let (ok, out, err) = run_binary(&["run", "--kubeconfig", kubeconfig, "--namespace", &ns.name]).await;
    assert!(!ok);
    assert!(err.contains("TLS: the API server's certificate is not signed"), "{out}{err}");
    assert!(!out.contains(&token) && !err.contains(&token), "the token was printed");

    // Turning verification off is not a way around it.
    let admin = kube::config::Kubeconfig::read_from(std::env::var("MW_TEST_KUBECONFIG").unwrap()).unwrap();
    let url = admin.clusters[0].cluster.as_ref().unwrap().server.clone().unwrap();
    let insecure = write_kubeconfig(
        &format!("insecure-{}", ns.name),
        json!({"server": url, "insecure-skip-tls-verify": true}),
        &token,
    );
    let (ok, out, err) = run_binary(&["check", "--kubeconfig", insecure.to_str().unwrap()]).await;
    assert!(!ok);
    assert!(out.starts_with("[FAIL] connect") && out.contains("insecure-skip-tls-verify"), "{out}");
    assert!(!out.contains(&token) && !err.contains(&token), "the token was printed");
}

#[tokio::test]
async fn check_as_cluster_admin_warns_about_privileges_nobody_needs() {
    let ns = TestNamespace::new("check-admin").await;
    let admin = std::env::var("MW_TEST_KUBECONFIG").unwrap();
    let (ok, out, _) = run_binary(&["check", "--kubeconfig", &admin, "--namespace", &ns.name]).await;
    assert!(ok, "more permission than needed is a warning, not a failure:\n{out}");
    let warnings = lines_with(&out, "[WARN] least-privilege ", &ns.name);
    assert_eq!(warnings.len(), 3, "{out}");
    assert!(warnings.iter().any(|l| l.contains("get secrets: granted")), "{out}");
    assert!(warnings.iter().any(|l| l.contains("patch leases.coordination.k8s.io: granted")), "{out}");
    assert!(out.contains("authenticated as mw-admin (groups: system:masters"), "{out}");
}

#[tokio::test]
async fn check_bridge_checks_the_bridge_role() {
    let granted = TestNamespace::new("check-bridge").await;
    let bare = TestNamespace::new("check-bridge-bare").await;
    support::bridge::grant(&granted).await;
    let admin = std::env::var("MW_TEST_KUBECONFIG").unwrap();
    let kubeconfig = std::path::Path::new(&admin).with_file_name("bridge.kubeconfig");
    let kubeconfig = kubeconfig.to_str().unwrap();
    // Its Lease in the namespace it serves (grant gives it the Lease Role there).
    let check = |namespace: &str, output: &str| {
        let args = ["check", "--bridge", "--kubeconfig", kubeconfig, "-n", namespace, "--lease-namespace", namespace];
        let args: Vec<String> = args.iter().chain(&["--output", output]).map(|a| a.to_string()).collect();
        async move { run_binary(&args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    let (ok, out, _) = check(&granted.name, "text").await;
    assert!(ok, "{out}");
    assert!(out.contains("authenticated as mw-bridge"), "{out}");
    let needed = required(Component::Bridge).unwrap().len();
    let lease = lease_required(Component::Bridge, "mw-bridge").unwrap().len();
    assert_eq!(lines_with(&out, "[ok  ] rbac ", &granted.name).len(), needed + lease, "{out}");
    assert!(lines_with(&out, "[ok  ] rbac ", "create secrets").len() == 1, "the bridge needs Secrets: {out}");

    let (ok, out, _) = check(&bare.name, "json").await;
    assert!(!ok);
    let report = json_report(&out);
    assert_eq!(report["component"], "bridge");
    let failed = report["checks"].as_array().unwrap().iter().filter(|c| c["status"] == "fail").count();
    assert_eq!(failed, needed + lease, "every permission, the Lease's too: {out}");
}

// ---- serial -------------------------------------------------------------------------------

/// Create → Running (with its provider id), stop, start, roll out an env change, delete.
async fn lifecycle(ns: &TestNamespace) {
    let workloads = ns.api::<ManagedWorkload>();
    let spec = |state: &str, greeting: &str| json!({"image": "nginx:latest", "state": state, "env": [{"name": "GREETING", "value": greeting}]});
    apply(&workloads, "web", spec("Running", "hello")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    let status = mw.status.unwrap();
    assert_eq!(status.provider_id, Some(format!("{}/web", ns.name)));
    assert!(status.pod_ip.is_some());

    apply(&workloads, "web", spec("Stopped", "hello")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Stopped).await;
    assert_eq!(ns.api::<Deployment>().get("web").await.unwrap().spec.unwrap().replicas, Some(0));

    apply(&workloads, "web", spec("Running", "hello")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;

    apply(&workloads, "web", spec("Running", "bonjour")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let pods = ns.api::<Pod>().list(&ListParams::default().labels("app.kubernetes.io/instance=web")).await.unwrap();
    let live: Vec<_> = pods.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    assert_eq!(live.len(), 1, "one Pod once rolled out");
    let env = live[0].spec.as_ref().unwrap().containers[0].env.clone().unwrap();
    assert!(env.iter().any(|e| e.name == "GREETING" && e.value.as_deref() == Some("bonjour")));

    workloads.delete("web", &DeleteParams::background()).await.unwrap();
    wait_until(&ns.api::<Deployment>(), "web", "the Deployment to be collected", TIMEOUT, |d| d.is_none()).await;
}

fn forbidden(err: kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 403)
}

#[tokio::test]
#[ignore = "serial: run by hack/test.sh after the main suite, with the shared operator stopped"]
async fn namespace_scoped_operator_runs_on_its_service_account_token_alone() {
    let home = TestNamespace::new("scoped-home").await;
    ensure_crd(&home.client).await;
    let a = TestNamespace::new("scoped-a").await;
    let b = TestNamespace::new("scoped-b").await;
    let c = TestNamespace::new("scoped-c").await;
    let install = ScopedInstall::new(&home, &[&a, &b]).await;

    // What the token may do, asked as the token (`kubectl auth can-i --token`).
    assert!(install.can(Some(&a.name), "create", "apps", "deployments").await);
    for (ns, verb, group, resource) in [
        (Some(&c.name), "list", GROUP, "managedworkloads"),
        (Some(&c.name), "create", "apps", "deployments"),
        (Some(&a.name), "get", "", "secrets"),
        (Some(&a.name), "list", "", "secrets"),
        (Some(&a.name), "delete", "apps", "deployments"),
        (Some(&a.name), "update", GROUP, "managedworkloads"),
        (None, "list", GROUP, "managedworkloads"),
        (None, "*", "*", "*"),
        // Leases: only the one named in its own namespace (any name is asked here).
        (Some(&a.name), "create", "coordination.k8s.io", "leases"),
        (Some(&home.name), "patch", "coordination.k8s.io", "leases"),
        (Some(&home.name), "delete", "coordination.k8s.io", "leases"),
        (None, "create", "coordination.k8s.io", "leases"),
        (Some(&"kube-node-lease".to_string()), "patch", "coordination.k8s.io", "leases"),
    ] {
        assert!(!install.can(ns.map(String::as_str), verb, group, resource).await, "{verb} {resource} in {ns:?}");
    }
    // And for real: the API server refuses.
    let secrets: Api<Secret> = Api::namespaced(install.client.clone(), &a.name);
    assert!(forbidden(secrets.list(&ListParams::default()).await.unwrap_err()), "reading Secrets");
    let elsewhere: Api<ManagedWorkload> = Api::namespaced(install.client.clone(), &c.name);
    assert!(forbidden(elsewhere.list(&ListParams::default()).await.unwrap_err()), "listing in a third namespace");

    // A workload in c, which this operator must leave alone (no other operator runs now).
    apply(&c.api(), "web", json!({"image": "nginx:latest"})).await.unwrap();

    let mut operator = Operator::start(&install.kubeconfig, &install.namespaces, &home.name);
    tokio::join!(lifecycle(&a), lifecycle(&b));
    assert!(operator.alive(), "the operator exited: {}", operator.log.display());

    let untouched = c.api::<ManagedWorkload>().get("web").await.unwrap();
    assert!(untouched.status.is_none(), "the operator wrote status in a namespace it does not watch");
    assert!(c.api::<Deployment>().get_opt("web").await.unwrap().is_none());
    assert!(!operator.output().contains(&c.name), "the operator touched {}", c.name);

    // A permission taken away at runtime: an Event on the workload and a log line naming
    // it, retries with backoff, no exit; and recovery once it is back.
    set_role(&home.client, &b.name, &without("deployments", "create")).await;
    eventually("the Role change to take effect", Duration::from_secs(30), || async {
        if install.can(Some(&b.name), "create", "apps", "deployments").await {
            Err("still allowed".into())
        } else {
            Ok(())
        }
    })
    .await;
    apply(&b.api(), "late", json!({"image": "nginx:latest"})).await.unwrap();
    let events = b.api::<Event>();
    let denial =
        format!("cannot create resource \"deployments\" in API group \"apps\" in the namespace \"{}\"", b.name);
    eventually("a Forbidden event on the workload", TIMEOUT, || async {
        let list = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let found = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("Forbidden")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("late")
                && e.note.as_deref().is_some_and(|n| n.contains(&denial) && n.contains(&install.user()))
        });
        if found { Ok(()) } else { Err(format!("{} events, none Forbidden for late", list.items.len())) }
    })
    .await;
    let output = operator.output();
    assert!(
        output.lines().any(|l| l.contains("reconcile failed") && l.contains(&denial)),
        "no log line names the missing permission: {}",
        operator.log.display()
    );
    assert!(operator.alive(), "the operator exited on a denial");

    set_role(&home.client, &b.name, &operator_role(|_| {})).await;
    wait_ready(&b.api(), "late", Phase::Running).await;
    assert!(operator.alive());
    assert_eq!(operator.output().matches("starting ManagedWorkload controller").count(), 1, "started once");
    operator.stop().await;
}

#[derive(Clone, Copy, Debug)]
enum Order {
    /// `kubectl delete mw --all`, then the operator and its RBAC, then the CRD.
    WorkloadsFirst,
    /// The operator and its RBAC first, then the CRD with the workloads still there.
    OperatorFirst,
}

async fn delete_install(admin: &Client, install: &ScopedInstall, operator: Operator) {
    operator.stop().await;
    for ns in &install.namespaces {
        Api::<RoleBinding>::namespaced(admin.clone(), ns).delete(ACCOUNT, &DeleteParams::default()).await.unwrap();
        Api::<Role>::namespaced(admin.clone(), ns).delete(ACCOUNT, &DeleteParams::default()).await.unwrap();
    }
    Api::<ServiceAccount>::namespaced(admin.clone(), &install.home)
        .delete(ACCOUNT, &DeleteParams::default())
        .await
        .unwrap();
}

async fn nothing_left(ns: &TestNamespace) {
    let deployments = ns.api::<Deployment>();
    let pods = ns.api::<Pod>();
    eventually("the Deployments and Pods to be garbage collected", TIMEOUT, || async {
        let d = deployments.list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.len();
        let p = pods.list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.len();
        if d + p == 0 { Ok(()) } else { Err(format!("{d} Deployment(s), {p} Pod(s) left")) }
    })
    .await;
}

async fn uninstall(order: Order) {
    let home = TestNamespace::new("uninstall-home").await;
    let admin = home.client.clone();
    ensure_crd(&admin).await;
    let ns = TestNamespace::new("uninstall").await;
    let install = ScopedInstall::new(&home, &[&ns]).await;
    let operator = Operator::start(&install.kubeconfig, &install.namespaces, &home.name);
    let workloads = ns.api::<ManagedWorkload>();
    // One after the other: an operator that starts with several workloads already listed
    // reconciles only one of them (a start-up defect found here, reported separately), and
    // this test is about uninstalling, not about that.
    for name in ["one", "two"] {
        apply(&workloads, name, json!({"image": "nginx:latest"})).await.unwrap();
        wait_ready(&workloads, name, Phase::Running).await;
    }

    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    match order {
        Order::WorkloadsFirst => {
            workloads.delete_collection(&DeleteParams::background(), &ListParams::default()).await.unwrap();
            // No finalizer: the CRs go at once, and their Deployments by garbage collection,
            // while the operator still runs (and must not bring them back).
            assert!(workloads.list(&ListParams::default()).await.unwrap().items.is_empty(), "a CR is stuck");
            nothing_left(&ns).await;
            delete_install(&admin, &install, operator).await;
            crds.delete(CRD, &DeleteParams::default()).await.unwrap();
        }
        Order::OperatorFirst => {
            delete_install(&admin, &install, operator).await;
            // With no operator, deleting the CRD removes the CRs; garbage collection their
            // Deployments and Pods.
            crds.delete(CRD, &DeleteParams::default()).await.unwrap();
            nothing_left(&ns).await;
        }
    }
    wait_until(&crds, CRD, "the CRD to be gone", TIMEOUT, |c| c.is_none()).await;

    // check says what is missing.
    let kubeconfig = std::env::var("MW_TEST_KUBECONFIG").unwrap();
    let (ok, out, _) = run_binary(&["check", "--kubeconfig", &kubeconfig, "--namespace", &ns.name]).await;
    assert!(!ok, "{out}");
    assert!(out.contains("[FAIL] crd") && out.contains(&format!("{CRD} is not installed")), "{out}");

    // Nothing holds the namespace back: its deletion completes.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces.delete(&ns.name, &DeleteParams::background()).await.unwrap();
    wait_until(&namespaces, &ns.name, "the namespace to be deleted", TIMEOUT, |n| n.is_none()).await;
    ensure_crd(&admin).await;
}

#[tokio::test]
#[ignore = "serial: run by hack/test.sh after the main suite, with the shared operator stopped"]
async fn uninstall_workloads_first_leaves_nothing_behind() {
    uninstall(Order::WorkloadsFirst).await;
}

#[tokio::test]
#[ignore = "serial: run by hack/test.sh after the main suite, with the shared operator stopped"]
async fn uninstall_operator_first_leaves_nothing_behind() {
    uninstall(Order::OperatorFirst).await;
}
