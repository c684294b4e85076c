//! The production install, proven: the operator's image (hack/image.py, built without a
//! container engine) imported into the real node's containerd, and the Helm chart installed on
//! the local control plane as a cluster admin would, its Pods on the real node with the
//! kubelet running their probes and the API server reached through in-cluster configuration.
//!
//! - Cluster-wide: two replicas elect a leader; a workload (port, Service, disk) runs and
//!   answers HTTP; `kubectl exec deploy/… -- mw-operator check` passes; `/metrics` answers
//!   through the chart's Service; the bridge, enabled against a PostgreSQL the Pod reaches,
//!   syncs a row; deleting the leading Pod hands over to the standby and work goes on; `helm
//!   upgrade` to a new image tag rolls the operator and leaves every workload alone (the audit
//!   log shows no write, the workload's Pod is the same); `helm uninstall` and the documented
//!   CRD removal leave nothing but what is kept on purpose.
//! - Namespace-scoped: the same chart with `watchNamespaces`, serving its namespace only.
//! - The CRD upgraded from the previous copy keeps every stored workload valid.
//!
//! Serial (`#[ignore]`d): hack/test.sh runs them with `--ignored --test-threads=1` once the
//! shared host-process operator is stopped (a cluster-wide release is an operator of every
//! namespace) and while the real node still runs. The image is MW_TEST_IMAGE_REPOSITORY with
//! tags `test-1` and `test-2` (one image under two names), which hack/test.sh imports.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::{Value, json};
use support::helm::helm;
use support::manager::{ManagerDb, PgServer};
use support::realnode::{HTTPD_1, HTTPD_2, REAL_NODE, answers_at, real_node_namespace};
use support::scoped::{apply_crd, ensure_crd};
use support::storage::Storage;
use support::workload::{apply, wait_ready};
use support::{TestNamespace, audit, documents, eventually, wait_until};

const CHART: &str = "charts/mw-operator";
const CRD: &str = "managedworkloads.opensource-server.mieweb.org";
/// Pods start on the real node (image unpacked, probes passing) in seconds; an upgrade rolls
/// two replicas one after the other, each waiting for readiness.
const TIMEOUT: Duration = Duration::from_secs(180);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: `make test` sets it (hack/test.sh)"))
}

/// `kubectl ARGS…` against the test control plane: (success, stdout, stderr).
fn kubectl(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env("MW_TEST_KUBECTL"))
        .arg("--kubeconfig")
        .arg(env("MW_TEST_KUBECONFIG"))
        .args(args)
        .output()
        .expect("running kubectl");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// One Helm release of the chart, installed with the image under test. Uninstalled when
/// dropped (a failed test too): its ClusterRoles would outlive the namespace.
struct Release {
    name: String,
    namespace: String,
    client: Client,
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = support::helm::run_helm(&self.helm_args("uninstall"));
    }
}

impl Release {
    /// `helm install` (waiting for every Deployment to be available: the kubelet's readiness
    /// probes have passed) with the image `test-1` and `values`.
    fn install(home: &TestNamespace, name: &str, values: &[String]) -> Release {
        let release = Release { name: name.into(), namespace: home.name.clone(), client: home.client.clone() };
        let mut args = release.helm_args("install");
        args.extend(["--set".into(), format!("image.repository={}", env("MW_TEST_IMAGE_REPOSITORY"))]);
        args.extend(["--set".into(), "image.tag=test-1".into(), "--set".into(), "image.pullPolicy=Never".into()]);
        args.extend(values.iter().cloned());
        helm(&args);
        release
    }

    fn helm_args(&self, verb: &str) -> Vec<String> {
        let mut args: Vec<String> = vec![verb.into(), self.name.clone()];
        if verb != "uninstall" {
            args.push(CHART.into());
        }
        args.extend(["-n".into(), self.namespace.clone(), "--kubeconfig".into(), env("MW_TEST_KUBECONFIG")]);
        args.extend(["--wait".into(), "--timeout".into(), format!("{}s", TIMEOUT.as_secs())]);
        args
    }

    /// The operator's Deployment (and ServiceAccount): the chart's full name.
    fn fullname(&self) -> String {
        format!("{}-mw-operator", self.name)
    }

    /// The API user the operator's Pods act as.
    fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.fullname())
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The operator's Pods, by the chart's selector labels.
    async fn pods(&self) -> Vec<Pod> {
        let selector = format!("app.kubernetes.io/instance={},app.kubernetes.io/name=mw-operator", self.name);
        self.api::<Pod>().list(&ListParams::default().labels(&selector)).await.unwrap().items
    }

    /// Who holds Lease `lease` in the release namespace.
    async fn holder(&self, lease: &str) -> Option<String> {
        self.api::<Lease>().get_opt(lease).await.unwrap()?.spec?.holder_identity.filter(|h| !h.is_empty())
    }

    /// Wait until one of the operator's running, ready Pods with image tag `tag` leads.
    async fn wait_leader(&self, tag: &str, not: Option<&str>) -> String {
        eventually(&format!("a ready {tag} Pod to hold the Lease"), TIMEOUT, || async {
            let holder = self.holder("mw-operator").await.ok_or("no holder")?;
            let pods = self.pods().await;
            let pod =
                pods.iter().find(|p| p.name_any() == holder).ok_or(format!("{holder} is no Pod of the release"))?;
            if not == Some(holder.as_str()) {
                return Err(format!("{holder} still holds it"));
            }
            if pod.metadata.deletion_timestamp.is_some() || !ready(pod) || !image_of(pod).ends_with(&format!(":{tag}"))
            {
                return Err(format!("{holder} is not a ready {tag} Pod"));
            }
            Ok(())
        })
        .await;
        // Nothing takes the Lease from a live, ready leader: the holder seen is still it.
        self.holder("mw-operator").await.expect("the leader just seen")
    }
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn image_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default()
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum())
}

/// Every Pod of the release runs on the real node, ready, never restarted (the kubelet's
/// liveness probe has not failed), with image tag `tag`; there are `count` of them.
///
/// Waited for, not sampled: `helm install --wait` returns once each Deployment was available,
/// and a leading bridge's readiness then follows its sync passes, so a first pass that fails
/// (and is retried) makes its Pod unready for a moment. Should one stay unready, the panic
/// carries the Pods' logs, which a clean CI machine keeps nowhere else.
async fn running_on_the_real_node<F, Fut>(pods: F, count: usize, tag: &str)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<Pod>>,
{
    let all_ready = || async {
        let pods = pods().await;
        let live: Vec<&Pod> = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        if live.len() != count {
            return Err(format!("{} Pods, not {count}", live.len()));
        }
        match live.iter().find(|p| !ready(p)) {
            Some(pod) => Err(format!("{} is not Ready: {:?}", pod.name_any(), pod.status)),
            None => Ok(()),
        }
    };
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match all_ready().await {
            Ok(()) => break,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                let logs: Vec<String> =
                    pods().await.iter().map(|p| format!("--- {}\n{}", p.name_any(), pod_logs(p))).collect();
                panic!("the release's Pods are not all Ready after {TIMEOUT:?}: {last}\n{}", logs.join("\n"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    let pods = pods().await;
    assert_eq!(pods.len(), count, "{:?}", pods.iter().map(|p| p.name_any()).collect::<Vec<_>>());
    for pod in &pods {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        assert_eq!(node.as_deref(), Some(REAL_NODE), "{} runs on {node:?}", pod.name_any());
        assert_eq!(restarts(pod), 0, "{} restarted: {:?}\n{}", pod.name_any(), pod.status, pod_logs(pod));
        assert!(image_of(pod).ends_with(&format!(":{tag}")), "{} runs {}", pod.name_any(), image_of(pod));
    }
}

/// A Pod's log, through kubectl (as an operations team would read it).
fn pod_logs(pod: &Pod) -> String {
    let (_, out, err) = kubectl(&["-n", &pod.namespace().unwrap_or_default(), "logs", &pod.name_any()]);
    format!("{out}{err}")
}

/// The workload's Service address answers HTTP with `body` (kube-proxy on the real node
/// routes this host's connection to the Pod).
async fn answers(mw: &ManagedWorkload, body: &str) {
    let address =
        mw.status.as_ref().and_then(|s| s.address.clone()).unwrap_or_else(|| panic!("no address: {:?}", mw.status));
    answers_at(&address, body).await;
}

/// The single Pod of workload `name`.
async fn pod_of(ns: &TestNamespace, name: &str) -> Pod {
    let selector = format!("app.kubernetes.io/instance={name}");
    let pods = ns.api::<Pod>().list(&ListParams::default().labels(&selector)).await.unwrap().items;
    let live: Vec<Pod> = pods.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    assert_eq!(live.len(), 1, "{name}: {:?}", live.iter().map(|p| p.name_any()).collect::<Vec<_>>());
    live.into_iter().next().unwrap()
}

async fn create_secret(ns: &str, client: &Client, name: &str, data: &[(&str, String)]) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns).create(&PostParams::default(), &secret).await.unwrap();
}

/// Where the real node's Pods reach this host's loopback `port` (hack/realnode.sh node-expose).
fn expose_to_pods(port: u16) -> String {
    let out = std::process::Command::new("bash")
        .args(["hack/controlplane.sh", "node-expose", &support::controlplane::cluster(), &port.to_string()])
        .output()
        .expect("running hack/controlplane.sh node-expose");
    assert!(out.status.success(), "node-expose: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The bridge's database, as the Pod reaches it: the test's PostgreSQL database behind the
/// node's DNAT, with verify-full against the server's CA (its certificate names 10.88.0.1).
async fn bridge_database(home: &TestNamespace, db: &ManagerDb, server: &PgServer) -> Vec<String> {
    // postgres://USER@127.0.0.1:PORT/DATABASE?…
    let rest = db.url.strip_prefix("postgres://").expect("a postgres:// URL");
    let (user, rest) = rest.split_once('@').expect("a user in the URL");
    let (host, rest) = rest.split_once('/').expect("a database in the URL");
    let database = rest.split('?').next().unwrap_or_default();
    let port: u16 = host.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("a port in the URL");
    let reachable = expose_to_pods(port);
    let pod_url = format!("postgres://{user}@{reachable}/{database}?sslmode=verify-full&sslrootcert=/etc/mw/ca.crt");
    let password = std::fs::read_to_string(&server.password_file).unwrap().trim().to_string();
    let ca = std::fs::read_to_string(&server.ca).unwrap();
    create_secret(&home.name, &home.client, "manager-db", &[("url", pod_url), ("password", password), ("ca.crt", ca)])
        .await;
    [
        "bridge.database.urlSecret.name=manager-db",
        "bridge.database.passwordSecret.name=manager-db",
        "bridge.database.caSecret.name=manager-db",
    ]
    .iter()
    .flat_map(|v| ["--set".to_string(), v.to_string()])
    .collect()
}

/// Objects of the release left anywhere, by its instance label: "kind namespace/name".
async fn release_leftovers(client: &Client, release: &str) -> Vec<String> {
    let params = ListParams::default().labels(&format!("app.kubernetes.io/instance={release}"));
    let mut left = Vec::new();
    macro_rules! collect {
        ($($kind:ty),*) => {$(
            for o in Api::<$kind>::all(client.clone()).list(&params).await.unwrap().items {
                left.push(format!("{} {}/{}", <$kind as k8s_openapi::Resource>::KIND, o.namespace().unwrap_or_default(), o.name_any()));
            }
        )*};
    }
    collect!(
        Deployment,
        Pod,
        Service,
        ServiceAccount,
        Secret,
        ConfigMap,
        Role,
        RoleBinding,
        ClusterRole,
        ClusterRoleBinding
    );
    left
}

/// Once `helm uninstall` has returned, nothing of the release is left (its Pods go by garbage
/// collection, after their grace period).
async fn nothing_of_the_release_left(client: &Client, release: &str) {
    eventually("nothing of the release to be left", TIMEOUT, || async {
        let left = release_leftovers(client, release).await;
        if left.is_empty() { Ok(()) } else { Err(format!("left behind: {left:?}")) }
    })
    .await;
}

/// A workload with a port, a ClusterIP Service and a disk, on the real node.
fn web(image: &str, state: &str, class: &str) -> Value {
    json!({
        "image": image,
        "state": state,
        "ports": [{"containerPort": 8080, "name": "http"}],
        "service": {"type": "ClusterIP"},
        "volumes": [{"name": "data", "mountPath": "/data", "size": "1Gi", "storageClassName": class}],
    })
}

#[tokio::test]
#[ignore = "serial, on the real node: hack/test.sh runs it once the shared operator is stopped"]
async fn the_chart_runs_on_the_real_node_hands_over_upgrades_and_uninstalls() {
    let home = real_node_namespace("release-home").await;
    let apps = real_node_namespace("release-apps").await;
    let bridged = TestNamespace::new("release-bridged").await;
    let storage = Storage::new(&apps, 1, "1Gi").await;
    let server = PgServer::shared();
    let db = ManagerDb::postgres(&server).await;
    db.insert_node("k8s-release").await;
    let mut values = bridge_database(&home, &db, &server).await;
    for v in [
        "bridge.enabled=true".to_string(),
        "bridge.nodes[0].node=k8s-release".into(),
        format!("bridge.nodes[0].namespace={}", bridged.name),
        // The bridged container needs no disk here (the disk is the apps workload's part).
        "bridge.rootfs.mountPath=".into(),
    ] {
        values.extend(["--set".into(), v]);
    }

    // Install: `helm install --wait` returns once both Deployments are available, i.e. the
    // kubelet's readiness probes passed (caches synced) on two replicas of each.
    let release = Release::install(&home, "prod", &values);
    running_on_the_real_node(|| release.pods(), 2, "test-1").await;
    let bridge_pods = || async {
        let selector = "app.kubernetes.io/instance=prod,app.kubernetes.io/name=mw-bridge";
        home.api::<Pod>().list(&ListParams::default().labels(selector)).await.unwrap().items
    };
    running_on_the_real_node(bridge_pods, 2, "test-1").await;
    let first_leader = release.wait_leader("test-1", None).await;

    // A workload with a port, a Service and a disk reaches Running and answers.
    let workloads = apps.api::<ManagedWorkload>();
    apply(&workloads, "web", web(HTTPD_1, "Running", &storage.class)).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    answers(&mw, "mw-test httpd v1").await;

    // `mw-operator check` in the running Pod, with its own in-cluster credentials.
    let deploy = format!("deploy/{}", release.fullname());
    let (ok, out, err) = kubectl(&["-n", &home.name, "exec", &deploy, "--", "mw-operator", "check"]);
    assert!(ok && out.contains(" 0 failed"), "check in the Pod:\n{out}\n{err}");

    // /metrics through the chart's Service (kube-proxy picks either replica).
    let metrics = release.api::<Service>().get(&format!("{}-metrics", release.fullname())).await.unwrap();
    let ip = metrics.spec.and_then(|s| s.cluster_ip).expect("a cluster IP");
    let address: std::net::SocketAddr = format!("{ip}:8080").parse().unwrap();
    eventually("/metrics through the chart's Service", Duration::from_secs(30), || async {
        let (status, body) = support::operator::http_get(address, "/metrics").await.ok_or("no answer")?;
        if status == 200 && body.contains("leader_election_master_status") && body.contains("mw_operator_") {
            Ok(())
        } else {
            Err(format!("{status}: {}", body.lines().take(5).collect::<Vec<_>>().join(" | ")))
        }
    })
    .await;

    // The bridge, in its Pod, syncs a row into a workload and writes its address back.
    db.insert_container("k8s-release", "bridged-one", Some("docker.io/library/redis:7"), None).await;
    let bridged_workloads = bridged.api::<ManagedWorkload>();
    wait_until(&bridged_workloads, "bridged-one", "the bridge's workload", TIMEOUT, |mw| mw.is_some()).await;
    wait_ready(&bridged_workloads, "bridged-one", Phase::Running).await;
    eventually("the row's provider id and address", TIMEOUT, || async {
        match db.written("bridged-one").await {
            Some((Some(id), Some(_), _)) if id == format!("{}/bridged-one", bridged.name) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The leading Pod goes: the standby takes over (the leader releases the Lease on SIGTERM)
    // and work goes on.
    release.api::<Pod>().delete(&first_leader, &DeleteParams::default()).await.unwrap();
    let second_leader = release.wait_leader("test-1", Some(&first_leader)).await;
    assert_ne!(second_leader, first_leader);
    apply(&workloads, "web", web(HTTPD_2, "Running", &storage.class)).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    answers(&mw, "mw-test httpd v2").await;

    // Upgrade to a new image tag: the operator's Pods roll; the workloads are left alone.
    let user = release.user();
    let settled: Vec<Vec<audit::Write>> =
        futures::future::join_all([&apps, &bridged].map(|ns| audit::settled_writes_by(&user, &ns.name))).await;
    let web_pod = pod_of(&apps, "web").await;
    let mut upgrade = release.helm_args("upgrade");
    upgrade.extend(["--reuse-values".into(), "--set".into(), "image.tag=test-2".into()]);
    helm(&upgrade);
    eventually("the operator's Pods to be the test-2 ones", TIMEOUT, || async {
        let pods: Vec<Pod> =
            release.pods().await.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        let new = pods.iter().filter(|p| image_of(p).ends_with(":test-2") && ready(p)).count();
        if pods.len() == 2 && new == 2 { Ok(()) } else { Err(format!("{new} of {} ready on test-2", pods.len())) }
    })
    .await;
    release.wait_leader("test-2", None).await;
    for (ns, before) in [&apps, &bridged].iter().zip(&settled) {
        let after = audit::settled_writes_by(&user, &ns.name).await;
        assert_eq!(
            &after,
            before,
            "the upgraded operator wrote in {}: {:?}",
            ns.name,
            &after[before.len().min(after.len())..]
        );
    }
    let web_pod_after = pod_of(&apps, "web").await;
    assert_eq!(web_pod_after.uid(), web_pod.uid(), "the workload's Pod was replaced by the upgrade");
    assert_eq!(restarts(&web_pod_after), restarts(&web_pod), "the workload's container restarted");
    // The positive control: the upgraded leader acts on a change, and the audit log shows it.
    audit::stop_and_see_a_write_by(&user, &workloads, &apps.name, "web", settled[0].len()).await;
    wait_ready(&workloads, "web", Phase::Stopped).await;

    // Uninstall, then the CRD as docs/install.md says: nothing of the release is left, the
    // workloads' objects go by garbage collection, and what is kept on purpose is listed.
    helm(&release.helm_args("uninstall"));
    let (ok, out, err) = kubectl(&["delete", "-f", "crds/", "--wait=true", "--timeout=120s"]);
    assert!(ok, "kubectl delete -f crds/: {out}\n{err}");
    let crds: Api<CustomResourceDefinition> = Api::all(home.client.clone());
    wait_until(&crds, CRD, "the CRD to be gone", TIMEOUT, |c| c.is_none()).await;
    nothing_of_the_release_left(&home.client, "prod").await;
    for ns in [&apps, &bridged] {
        eventually(&format!("the workloads' objects in {} to be collected", ns.name), TIMEOUT, || async {
            let d = ns.api::<Deployment>().list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.len();
            let s = ns.api::<Service>().list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.len();
            let p = ns.api::<Pod>().list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.len();
            if d + s + p == 0 { Ok(()) } else { Err(format!("{d} Deployment(s), {s} Service(s), {p} Pod(s)")) }
        })
        .await;
    }
    // Kept on purpose (docs/install.md, "Uninstall"): the disk (retentionPolicy Retain, the
    // default) and, in the release namespace, the two Leases the replicas held.
    let claim = apps.api::<PersistentVolumeClaim>().get("web-data").await.expect("the retained claim");
    assert_eq!(claim.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    let leases: BTreeSet<String> =
        release.api::<Lease>().list(&ListParams::default()).await.unwrap().items.iter().map(|l| l.name_any()).collect();
    assert_eq!(leases, BTreeSet::from(["mw-bridge".to_string(), "mw-operator".to_string()]));
    ensure_crd(&home.client).await;
    db.close().await;
}

#[tokio::test]
#[ignore = "serial, on the real node: hack/test.sh runs it once the shared operator is stopped"]
async fn the_namespace_scoped_chart_serves_its_namespace_only() {
    let home = real_node_namespace("scoped-home").await;
    let watched = TestNamespace::new("scoped-watched").await;
    let other = TestNamespace::new("scoped-other").await;
    let release = Release::install(&home, "scoped", &["--set".into(), format!("watchNamespaces={{{}}}", watched.name)]);
    running_on_the_real_node(|| release.pods(), 2, "test-1").await;
    release.wait_leader("test-1", None).await;

    let in_other = other.api::<ManagedWorkload>();
    apply(&in_other, "not-mine", json!({"image": "nginx:1.27"})).await.unwrap();
    let workloads = watched.api::<ManagedWorkload>();
    apply(&workloads, "mine", json!({"image": "nginx:1.27"})).await.unwrap();
    wait_ready(&workloads, "mine", Phase::Running).await;

    let deploy = format!("deploy/{}", release.fullname());
    let (ok, out, err) =
        kubectl(&["-n", &home.name, "exec", &deploy, "--", "mw-operator", "check", "--namespace", &watched.name]);
    assert!(ok && out.contains(" 0 failed"), "check in the Pod:\n{out}\n{err}");
    // Nothing cluster-wide was granted, so the Pod's own check of everything fails.
    let (ok, out, _) = kubectl(&["-n", &home.name, "exec", &deploy, "--", "mw-operator", "check"]);
    assert!(!ok && out.contains("[FAIL]"), "a cluster-wide check from a namespace-scoped install:\n{out}");

    // The workload in the other namespace was never touched (the operator cannot even see it:
    // it has no rights there); the one it serves went all the way to Running meanwhile.
    let untouched = in_other.get("not-mine").await.unwrap();
    assert!(untouched.status.is_none(), "{:?}", untouched.status);
    assert!(other.api::<Deployment>().list(&ListParams::default()).await.unwrap().items.is_empty());

    helm(&release.helm_args("uninstall"));
    nothing_of_the_release_left(&home.client, "scoped").await;
}

/// The previous copy of the CRD (tests/fixtures/crd-previous.yaml: at each release, the
/// released one) with every sample stored under it, then the current CRD: each stored
/// workload is still served, decodes, and passes the current schema as a new object would
/// (a dry-run create: no ratcheting there, every rule applies).
#[tokio::test]
#[ignore = "serial: replaces the CRD every other test relies on"]
async fn the_crd_upgraded_from_the_previous_copy_keeps_every_stored_workload_valid() {
    let ns = TestNamespace::new("crd-upgrade").await;
    let admin = ns.client.clone();
    apply_crd(&admin, "tests/fixtures/crd-previous.yaml").await;

    let mut names = Vec::new();
    for entry in std::fs::read_dir("config/samples").unwrap() {
        let path = entry.unwrap().path();
        for doc in documents(&std::fs::read_to_string(&path).unwrap()) {
            match doc["kind"].as_str() {
                Some("ManagedWorkload") => {
                    let name = doc["metadata"]["name"].as_str().unwrap().to_string();
                    apply(&ns.api(), &name, doc["spec"].clone())
                        .await
                        .unwrap_or_else(|e| panic!("{}: the previous CRD refuses it: {e}", path.display()));
                    names.push(name);
                }
                Some("Secret") => {
                    let secret: Secret = serde_json::from_value(doc).unwrap();
                    ns.api::<Secret>().create(&PostParams::default(), &secret).await.unwrap();
                }
                other => panic!("{}: unexpected kind {other:?}", path.display()),
            }
        }
    }
    assert!(names.len() >= 7, "{names:?}");

    ensure_crd(&admin).await;
    let workloads = ns.api::<ManagedWorkload>();
    for name in &names {
        let stored = workloads.get(name).await.unwrap_or_else(|e| panic!("{name} after the upgrade: {e}"));
        let mut copy = ManagedWorkload::new(&format!("{name}-copy"), stored.spec.clone());
        copy.metadata.labels = stored.metadata.labels.clone();
        workloads
            .create(&PostParams { dry_run: true, ..Default::default() }, &copy)
            .await
            .unwrap_or_else(|e| panic!("{name}, as stored, fails the current CRD: {e}"));
        // And the stored object itself takes an ordinary update.
        let label = json!({"metadata": {"labels": {"mw-test/upgraded": "yes"}}});
        workloads.patch(name, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    }
}

/// `python3 hack/image.py ARGS…`, which must succeed.
fn image_py(args: &[&str]) -> String {
    let out = std::process::Command::new("python3").arg("hack/image.py").args(args).output().expect("running python3");
    assert!(out.status.success(), "image.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into()
}

/// The entries of an OCI archive's blob `digest` (a gzip'd layer), by `tar -tvz`.
fn layer_listing(dir: &std::path::Path, digest: &str) -> String {
    let blob = dir.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
    let out = std::process::Command::new("tar").arg("-tvzf").arg(&blob).output().expect("running tar");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into()
}

/// An architecture the image cannot be labelled with (a 32-bit ARM ELF header) is refused,
/// naming the ones it can.
#[test]
fn the_image_refuses_other_architectures() {
    let dir = std::env::temp_dir().join(format!("mw-image-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut header = vec![0u8; 64];
    header[..6].copy_from_slice(b"\x7fELF\x01\x01"); // 32-bit, little-endian
    header[18] = 40; // e_machine: EM_ARM
    let binary = dir.join("arm");
    std::fs::write(&binary, header).unwrap();
    let out = std::process::Command::new("python3")
        .arg("hack/image.py")
        .args(["--binary", binary.to_str().unwrap(), "--name", "mw-operator:9.9.9", "--out"])
        .arg(dir.join("image.tar"))
        .output()
        .expect("running python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("x86_64 (amd64), aarch64 (arm64) only"), "{stderr}");
    assert!(!dir.join("image.tar").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `make image`'s recipe, on a small dynamically linked binary (the recipe does not depend on
/// which): the same inputs give the same bytes, and the image holds the binary, the libraries
/// the loader opens for it, the CA bundle, the users and the licences, runs as 65532, and is
/// named as containerd's CRI looks it up.
#[test]
fn the_image_is_reproducible_and_holds_only_what_the_binary_needs() {
    let dir = std::env::temp_dir().join(format!("mw-image-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let archive = |n: u32| dir.join(format!("image-{n}.tar")).to_string_lossy().into_owned();
    let binary = "/usr/bin/true";
    for n in [1, 2] {
        image_py(&["--binary", binary, "--name", "mw-operator:9.9.9", "--revision", "abc", "--out", &archive(n)]);
    }
    let (one, two) = (std::fs::read(archive(1)).unwrap(), std::fs::read(archive(2)).unwrap());
    assert!(one == two, "two builds from the same inputs differ");

    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let status =
        std::process::Command::new("tar").arg("-xf").arg(archive(1)).arg("-C").arg(&unpacked).status().unwrap();
    assert!(status.success());
    let read_json =
        |path: std::path::PathBuf| -> Value { serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap() };
    let index = read_json(unpacked.join("index.json"));
    let manifest_desc = &index["manifests"][0];
    assert_eq!(manifest_desc["annotations"]["io.containerd.image.name"], "docker.io/library/mw-operator:9.9.9");
    let blob = |desc: &Value| {
        unpacked.join("blobs/sha256").join(desc["digest"].as_str().unwrap().trim_start_matches("sha256:"))
    };
    let manifest = read_json(blob(manifest_desc));
    let config = read_json(blob(&manifest["config"]));
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(config["config"]["Entrypoint"], json!(["/usr/local/bin/mw-operator"]));
    assert_eq!(config["config"]["Cmd"], json!(["run"]));
    assert_eq!(config["config"]["Labels"]["org.opencontainers.image.revision"], "abc");
    assert_eq!(config["config"]["Labels"]["org.opencontainers.image.licenses"], "MIT");
    // Labelled with the binary's architecture, as OCI names it (/usr/bin/true is this machine's).
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("hack/image.py builds no image on {other}"),
    };
    assert_eq!((config["architecture"].as_str(), config["os"].as_str()), (Some(arch), Some("linux")));
    assert_eq!(manifest_desc["platform"]["architecture"], arch);
    // `docker load` reads Docker's manifest.json beside the OCI layout.
    let docker = read_json(unpacked.join("manifest.json"));
    assert_eq!(docker[0]["RepoTags"], json!(["docker.io/library/mw-operator:9.9.9"]));

    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2, "a base layer and the binary's");
    let base = layer_listing(&unpacked, layers[0]["digest"].as_str().unwrap());
    let app = layer_listing(&unpacked, layers[1]["digest"].as_str().unwrap());
    for path in [
        "lib/x86_64-linux-gnu/libc.so.6",
        "lib64/ld-linux-x86-64.so.2",
        "etc/ssl/certs/ca-certificates.crt",
        "etc/passwd",
        "usr/share/doc/libc6/copyright",
        "usr/share/doc/ca-certificates/copyright",
    ] {
        assert!(base.lines().any(|l| l.ends_with(&format!(" {path}"))), "the base layer lacks {path}:\n{base}");
    }
    assert!(base.lines().any(|l| l.contains("65532/65532") && l.ends_with(" home/nonroot/")), "{base}");
    assert!(!base.contains("bin/sh") && !base.contains("busybox"), "a shell in the image:\n{base}");
    assert!(
        app.lines().any(|l| l.starts_with("-rwxr-xr-x root/root") && l.ends_with(" usr/local/bin/mw-operator")),
        "{app}"
    );
    assert!(app.lines().any(|l| l.ends_with(" usr/share/doc/mw-operator/LICENSE")), "{app}");
    // Every entry carries the same time: nothing of the build's moment leaks into the digest.
    assert!(base.lines().chain(app.lines()).all(|l| l.contains("1970-01-01")), "{base}\n{app}");
    std::fs::remove_dir_all(&dir).unwrap();
}
