//! Operator processes a test starts itself (failover, shutdown, faults, redaction), each under
//! an identity of its own so the audit log tells their writes apart, plus their probe and
//! metrics endpoints.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::TestNamespace;

/// The operator binary `make test` built.
pub fn binary() -> PathBuf {
    std::env::var_os("MW_TEST_OPERATOR_BIN").map(PathBuf::from).unwrap_or_else(|| "target/debug/mw-operator".into())
}

/// A free loopback port (bound, read and released: the operator binds it right after).
pub fn free_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address")
}

/// A ServiceAccount `name` in the test namespace bound (RoleBinding, that namespace only) to the
/// operator's shipped ClusterRole and leader-election Role (its Lease in the test namespace,
/// `--lease-namespace`), and a kubeconfig that authenticates as it with a bearer
/// token from the TokenRequest API. Returns the kubeconfig path, the token and the audit
/// user name.
pub async fn service_account_kubeconfig(ns: &TestNamespace, name: &str) -> (PathBuf, String, String) {
    let accounts: Api<ServiceAccount> = ns.api();
    let apply = PatchParams::apply("integration-test").force();
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
    accounts.patch(name, &apply, &Patch::Apply(&sa)).await.expect("creating the ServiceAccount");
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": format!("{name}-operator")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "mw-operator"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns.name}],
    });
    let bindings: Api<RoleBinding> = ns.api();
    bindings
        .patch(&format!("{name}-operator"), &apply, &Patch::Apply(&binding))
        .await
        .expect("binding the operator's ClusterRole");
    let account = json!({"kind": "ServiceAccount", "name": name, "namespace": ns.name});
    grant_leader_election(ns, &format!("{name}-leader-election"), account).await;
    let token = token_for(ns, name).await;
    let path = write_kubeconfig(&ns.name, name, json!({"token": token}));
    (path, token, format!("system:serviceaccount:{}:{name}", ns.name))
}

/// The shipped leader-election Role (config/rbac/leader-election-role.yaml) in the test
/// namespace, and a RoleBinding `binding` of it to `subject` (a RoleBinding subject).
pub async fn grant_leader_election(ns: &TestNamespace, binding: &str, subject: Value) {
    let apply = PatchParams::apply("integration-test").force();
    let text = std::fs::read_to_string("config/rbac/leader-election-role.yaml").expect("the leader-election Role");
    let role: Value = serde_saphyr::from_str(&text).expect("parsing the leader-election Role");
    let name = role["metadata"]["name"].as_str().expect("its name").to_string();
    let roles: Api<Role> = ns.api();
    roles.patch(&name, &apply, &Patch::Apply(&role)).await.expect("creating the leader-election Role");
    let body = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [subject],
    });
    let bindings: Api<RoleBinding> = ns.api();
    bindings.patch(binding, &apply, &Patch::Apply(&body)).await.expect("binding the leader-election Role");
}

pub async fn token_for(ns: &TestNamespace, name: &str) -> String {
    let accounts: Api<ServiceAccount> = ns.api();
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    });
    let issued: Value =
        accounts.create_subresource("token", name, &PostParams::default(), &request).await.expect("a TokenRequest");
    issued["status"]["token"].as_str().expect("the issued token").to_string()
}

/// A kubeconfig for the test control plane with `user` as its credentials.
pub fn write_kubeconfig(namespace: &str, name: &str, user: Value) -> PathBuf {
    let admin = std::env::var("MW_TEST_KUBECONFIG").expect("MW_TEST_KUBECONFIG");
    let text = std::fs::read_to_string(&admin).expect("reading the admin kubeconfig");
    let admin: Value = serde_saphyr::from_str(&text).expect("parsing the admin kubeconfig");
    let cluster = admin["clusters"][0]["cluster"].clone();
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": name}}],
        "current-context": "local",
    });
    let dir = PathBuf::from(super::log_dir()).join("test-operators");
    std::fs::create_dir_all(&dir).expect("creating the test operators' directory");
    let path = dir.join(format!("{namespace}-{name}.kubeconfig"));
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).expect("writing a kubeconfig");
    path
}

/// An operator process. Killed when dropped.
pub struct Operator {
    child: tokio::process::Child,
    pub pid: u32,
    pub log: PathBuf,
    pub metrics: SocketAddr,
}

impl Operator {
    /// `mw-operator run` with this kubeconfig, JSON logs into a file of its own, probes on a
    /// free port, and `extra` arguments.
    pub fn start(label: &str, kubeconfig: &Path, extra: &[String]) -> Operator {
        let metrics = free_address();
        let mut args: Vec<String> = vec![
            "run".into(),
            "--log-format=json".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--metrics-address={metrics}"),
        ];
        args.extend_from_slice(extra);
        Operator::spawn(label, &args, &[], metrics)
    }

    /// The binary with exactly these arguments and environment (RUST_LOG defaults to debug).
    pub fn spawn(label: &str, args: &[String], env: &[(&str, &str)], metrics: SocketAddr) -> Operator {
        let dir = PathBuf::from(super::log_dir()).join("test-operators");
        std::fs::create_dir_all(&dir).expect("creating the test operators' directory");
        let log = dir.join(format!("{label}.log"));
        let file = std::fs::File::create(&log).expect("creating the operator's log");
        let mut command = tokio::process::Command::new(binary());
        command
            .args(args)
            .env("RUST_LOG", "debug")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("a second handle on the log"))
            .stderr(file)
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", binary().display()));
        let pid = child.id().expect("a running child");
        Operator { child, pid, log, metrics }
    }

    /// GET `path` on the probe/metrics server: (status, body), None when it does not answer.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.metrics, path).await
    }

    /// The value of the metric sample whose line starts with `series` (name and labels).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").await?;
        sample(&body, series)
    }

    pub async fn wait_ready(&self, timeout: Duration) {
        super::eventually("the operator's /readyz to answer 200", timeout, || async {
            match self.get("/readyz").await {
                Some((200, _)) => Ok(()),
                other => Err(format!("{other:?}; log: {}", self.log.display())),
            }
        })
        .await;
    }

    pub async fn wait_leader(&self, lease: &str, timeout: Duration) {
        let series = format!("leader_election_master_status{{name=\"{lease}\"}}");
        super::eventually("the operator to lead", timeout, || async {
            match self.metric(&series).await {
                Some(1.0) => Ok(()),
                other => Err(format!("{series} = {other:?}; log: {}", self.log.display())),
            }
        })
        .await;
    }

    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill").args([format!("-{signal}"), self.pid.to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {}", self.pid);
    }

    /// Wait for the process to exit; None on timeout.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait()).await.ok().map(|r| r.expect("waiting for the operator"))
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The value of the first sample line starting with `series` in a Prometheus text exposition.
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| line.strip_prefix(series)?.trim().split(' ').next()?.parse().ok())
}

/// A minimal HTTP/1.0 GET (the probe server speaks HTTP/1.1; 1.0 closes after the answer).
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange).await.ok().flatten()
}
