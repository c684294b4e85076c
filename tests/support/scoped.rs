//! A namespace-scoped install as a real cluster has it: a ServiceAccount in the operator's
//! own namespace with the shipped leader-election Role there, the shipped Role
//! (config/rbac/role.yaml) and a RoleBinding in each watched namespace, and a kubeconfig holding a token the TokenRequest API issued for that
//! ServiceAccount (not admin credentials, not a client certificate named like it). Plus the
//! operator binary run with that kubeconfig, as a child process of the test.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{Value, json};

use super::{TestNamespace, eventually, log_dir, wait_until};

pub const ACCOUNT: &str = "mw-operator";
/// The operator's Lease permissions, granted in its own namespace only.
pub const LEADER_ELECTION_ROLE: &str = "config/rbac/leader-election-role.yaml";
const MANAGER: &str = "install-test";

/// The shipped manifest at `path` (relative to the repository), as JSON.
pub fn manifest(path: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

/// The shipped operator Role with `edit` applied to it (to take a permission away).
pub fn operator_role(edit: impl FnOnce(&mut Value)) -> Role {
    let mut role = manifest("config/rbac/role.yaml");
    edit(&mut role);
    serde_json::from_value(role).expect("config/rbac/role.yaml is a Role")
}

/// The ServiceAccount, its Roles and RoleBindings, and a token kubeconfig for it.
pub struct ScopedInstall {
    pub home: String,
    pub namespaces: Vec<String>,
    pub kubeconfig: PathBuf,
    /// The ServiceAccount token, so tests can assert it is never printed.
    pub token: String,
    /// A client authenticated with that token.
    pub client: Client,
}

impl ScopedInstall {
    /// Install in `home` for `watched`, with the shipped Role unchanged.
    pub async fn new(home: &TestNamespace, watched: &[&TestNamespace]) -> Self {
        Self::with_role(home, watched, operator_role(|_| {})).await
    }

    /// With `role` in each watched namespace, and the shipped leader-election Role in `home`.
    pub async fn with_role(home: &TestNamespace, watched: &[&TestNamespace], role: Role) -> Self {
        Self::with_roles(home, watched, role, true).await
    }

    /// With `role` in each watched namespace, and the leader-election Role in `home` if `lease`.
    pub async fn with_roles(home: &TestNamespace, watched: &[&TestNamespace], role: Role, lease: bool) -> Self {
        let admin = home.client.clone();
        let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}});
        apply::<ServiceAccount>(&Api::namespaced(admin.clone(), &home.name), ACCOUNT, &account).await;
        if lease {
            let election = manifest(LEADER_ELECTION_ROLE);
            let name = election["metadata"]["name"].as_str().expect("its name").to_string();
            apply::<Role>(&Api::namespaced(admin.clone(), &home.name), &name, &election).await;
            let binding = json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": home.name}],
            });
            apply::<RoleBinding>(&Api::namespaced(admin.clone(), &home.name), &name, &binding).await;
        }
        for ns in watched {
            set_role(&admin, &ns.name, &role).await;
            let binding = json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": ACCOUNT},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
                "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": home.name}],
            });
            apply::<RoleBinding>(&Api::namespaced(admin.clone(), &ns.name), ACCOUNT, &binding).await;
        }
        let token = token_for(&admin, &home.name, ACCOUNT).await;
        let kubeconfig = write_token_kubeconfig(&format!("sa-{}", home.name), &token, None);
        let client = client_for(&kubeconfig).await;
        let install = ScopedInstall {
            home: home.name.clone(),
            namespaces: watched.iter().map(|n| n.name.clone()).collect(),
            kubeconfig,
            token,
            client,
        };
        // The API server's RBAC cache sees new bindings a moment later; the operator checks
        // its access at start-up and rightly exits on a denial.
        for ns in &install.namespaces {
            eventually("the RoleBinding to take effect", Duration::from_secs(30), || async {
                if install.can(Some(ns), "list", "opensource-server.mieweb.org", "managedworkloads").await {
                    Ok(())
                } else {
                    Err("not allowed yet".into())
                }
            })
            .await;
        }
        install
    }

    /// `kubectl auth can-i` as the ServiceAccount itself (SelfSubjectAccessReview).
    pub async fn can(&self, namespace: Option<&str>, verb: &str, group: &str, resource: &str) -> bool {
        can(&self.client, namespace, verb, group, resource).await
    }

    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{ACCOUNT}", self.home)
    }
}

/// A token the TokenRequest API issues for ServiceAccount `namespace/name` (an hour long).
pub async fn token_for(admin: &Client, namespace: &str, name: &str) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a TokenRequest for {namespace}/{name}: {e}"));
    issued.status.and_then(|s| s.token).expect("the issued token")
}

/// Replace the operator's Role in `namespace` (server-side apply of the whole rule list).
pub async fn set_role(admin: &Client, namespace: &str, role: &Role) {
    let mut body = serde_json::to_value(role).expect("a Role serializes");
    body["metadata"] = json!({"name": ACCOUNT});
    apply::<Role>(&Api::namespaced(admin.clone(), namespace), ACCOUNT, &body).await;
}

pub async fn can(client: &Client, namespace: Option<&str>, verb: &str, group: &str, resource: &str) -> bool {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: namespace.map(String::from),
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("a SelfSubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

async fn apply<K>(api: &Api<K>, name: &str, body: &Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(body))
        .await
        .unwrap_or_else(|e| panic!("applying {name}: {e}"));
}

/// The test control plane's server URL and CA file, from the admin kubeconfig.
fn cluster() -> (String, String) {
    let path = std::env::var("MW_TEST_KUBECONFIG").expect("MW_TEST_KUBECONFIG");
    let kubeconfig = Kubeconfig::read_from(&path).expect("the admin kubeconfig");
    let cluster = kubeconfig.clusters[0].cluster.clone().expect("a cluster entry");
    (cluster.server.expect("a server URL"), cluster.certificate_authority.expect("a CA file"))
}

/// A kubeconfig that authenticates with `token`, trusting `ca` (the cluster's CA when None),
/// written beside the admin kubeconfig (run state the control plane's teardown removes).
pub fn write_token_kubeconfig(name: &str, token: &str, ca: Option<&Path>) -> PathBuf {
    let (server, cluster_ca) = cluster();
    let ca = ca.map(|p| p.display().to_string()).unwrap_or(cluster_ca);
    write_kubeconfig(name, json!({"server": server, "certificate-authority": ca}), token)
}

/// A kubeconfig with this `cluster` entry and `token` as its user (JSON is YAML).
pub fn write_kubeconfig(name: &str, cluster: Value, token: &str) -> PathBuf {
    let admin = std::env::var("MW_TEST_KUBECONFIG").expect("MW_TEST_KUBECONFIG");
    let path = Path::new(&admin).with_file_name(format!("{name}.kubeconfig"));
    let body = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "sa"}}],
        "current-context": "test",
    });
    std::fs::write(&path, body.to_string()).expect("writing a kubeconfig");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    }
    path
}

pub async fn client_for(kubeconfig: &Path) -> Client {
    let parsed = Kubeconfig::read_from(kubeconfig).expect("reading the kubeconfig");
    let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default()).await.expect("its config");
    Client::try_from(config).expect("a client")
}

/// The CRD from crds/, applied and Established (tests that uninstall it put it back).
pub async fn ensure_crd(admin: &Client) {
    for entry in std::fs::read_dir("crds").expect("crds/") {
        let path = entry.expect("a crds/ entry").path();
        apply_crd(admin, path.to_str().expect("a UTF-8 path")).await;
    }
}

/// Apply the CRD in the file at `path` and wait until it is Established.
pub async fn apply_crd(admin: &Client, path: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let crd = manifest(path);
    let name = crd["metadata"]["name"].as_str().expect("a CRD name").to_string();
    apply(&crds, &name, &crd).await;
    wait_until(&crds, &name, "the CRD to be Established", Duration::from_secs(60), |c| {
        c.and_then(|c| c.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
    })
    .await;
}

/// `mw-operator ARGS…`, to completion: (exit success, stdout, stderr).
pub async fn run_binary(args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mw-operator"))
        .args(args)
        .env("RUST_LOG", "info,kube=warn")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("running mw-operator");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `mw-operator run` as a child process, logging to a file in the log directory.
pub struct Operator {
    child: tokio::process::Child,
    pub log: PathBuf,
}

impl Operator {
    /// Watching `namespaces`, its Lease in `home` (where the install grants leader election).
    pub fn start(kubeconfig: &Path, namespaces: &[String], home: &str) -> Operator {
        let log = PathBuf::from(log_dir()).join(format!("operator-{home}.log"));
        let file = std::fs::File::create(&log).expect("creating the operator log");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mw-operator"))
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--namespace")
            .arg(namespaces.join(","))
            // Its Lease in its own namespace, the only one where it may write Leases.
            .arg("--lease-namespace")
            .arg(home)
            // Probes on a free port: the default 0.0.0.0:8080 may be taken on a shared machine.
            .arg("--metrics-address")
            .arg(super::operator::free_address().to_string())
            .env("RUST_LOG", "info,kube=warn")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("the log file"))
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("starting mw-operator run");
        Operator { child, log }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Still running? (It only exits on a signal or a fatal start-up error.)
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}
