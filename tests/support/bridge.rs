//! Runs `mw-operator bridge` for one test: its own process, database and namespace, under
//! the bridge's own identity (user mw-bridge, bound in the test namespace to the shipped
//! config/rbac/bridge-cluster-role.yaml only).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};

use super::TestNamespace;
use super::manager::ManagerDb;

/// Poll and resync fast so tests see each behaviour within seconds.
pub const POLL: &str = "300ms";
pub const RESYNC: &str = "4s";

pub struct Bridge {
    child: tokio::process::Child,
    pub log: PathBuf,
}

/// Kubeconfig of user mw-bridge, written by hack/controlplane.sh beside the admin's.
pub fn kubeconfig() -> String {
    let admin = std::env::var("MW_TEST_KUBECONFIG").expect("MW_TEST_KUBECONFIG");
    let dir = std::path::Path::new(&admin).parent().expect("kubeconfig directory");
    dir.join("bridge.kubeconfig").display().to_string()
}

/// Grant user mw-bridge the bridge's ClusterRole in this namespace only, and its
/// leader-election Role (config/rbac/bridge-leader-election-role.yaml) here too: each test's
/// bridge keeps its Lease in its own namespace (`--lease-namespace`, see `spawn`).
pub async fn grant(ns: &TestNamespace) {
    let election: Role = serde_saphyr::from_str(include_str!("../../config/rbac/bridge-leader-election-role.yaml"))
        .expect("config/rbac/bridge-leader-election-role.yaml parses");
    let election_name = election.metadata.name.clone().expect("the Role's name");
    match ns.api::<Role>().create(&PostParams::default(), &election).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating the bridge's leader-election Role in {}: {e}", ns.name),
    }
    for (name, kind, role) in
        [("mw-bridge", "ClusterRole", "mw-bridge".to_string()), (election_name.as_str(), "Role", election_name.clone())]
    {
        let binding = RoleBinding {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            role_ref: RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: kind.into(), name: role },
            subjects: Some(vec![Subject {
                kind: "User".into(),
                name: "mw-bridge".into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                ..Default::default()
            }]),
        };
        match ns.api::<RoleBinding>().create(&PostParams::default(), &binding).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("binding the bridge's {kind} in {}: {e}", ns.name),
        }
    }
    // The API server's RBAC cache takes a moment to see a new binding; the bridge checks its
    // access at start-up and would (rightly) exit on a denial.
    let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(ns.client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some("mw-bridge".into()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.name.clone()),
                verb: Some("list".into()),
                group: Some("opensource-server.mieweb.org".into()),
                resource: Some("managedworkloads".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    super::eventually("the bridge's RoleBinding to take effect", Duration::from_secs(30), || async {
        let answer = reviews.create(&PostParams::default(), &review).await.map_err(|e| e.to_string())?;
        if answer.status.is_some_and(|s| s.allowed) { Ok(()) } else { Err("not allowed yet".into()) }
    })
    .await;
}

impl Bridge {
    /// Start a bridge serving Manager node `k8s-lab-1` (the sample rows' node) into `ns`.
    pub async fn start(ns: &TestNamespace, db: &ManagerDb, extra: &[&str]) -> Bridge {
        Self::start_with(ns, db, &kubeconfig(), extra).await
    }

    /// The same, reaching the API server through `kubeconfig` (e.g. a cuttable proxy).
    pub async fn start_with(ns: &TestNamespace, db: &ManagerDb, kubeconfig: &str, extra: &[&str]) -> Bridge {
        // Each default unless the test gives that flag itself. No rootfs volume unless a test
        // asks for one: the test control plane has no default StorageClass, so its claims
        // would never bind.
        let mut args = vec![];
        for (flag, value) in [
            ("--poll-interval", POLL),
            ("--resync-interval", RESYNC),
            ("--requests-percent", "1"),
            ("--rootfs-mount-path", ""),
        ] {
            if !extra.iter().any(|a| a.starts_with(flag)) {
                args.extend_from_slice(&[flag, value]);
            }
        }
        args.extend_from_slice(extra);
        Self::spawn(ns, db, kubeconfig, &args).await
    }

    /// Run `mw-operator bridge` serving node `k8s-lab-1` into `ns` with exactly `args` beyond
    /// the connection and node flags (the benchmark runs it with its defaults).
    pub async fn spawn(ns: &TestNamespace, db: &ManagerDb, kubeconfig: &str, args: &[&str]) -> Bridge {
        grant(ns).await;
        // One log per bridge process, so a second bridge in a test is not read from the first's.
        let dir = PathBuf::from(super::log_dir());
        let log = (1..)
            .map(|n| {
                dir.join(if n == 1 { format!("bridge-{}.log", ns.name) } else { format!("bridge-{}-{n}.log", ns.name) })
            })
            .find(|path| !path.exists())
            .expect("a free log name");
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("opening the bridge log");
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_mw-operator"));
        cmd.arg("bridge")
            .args(["--kubeconfig", kubeconfig])
            .args(["--database-url", &db.url])
            .args(["--node", &format!("k8s-lab-1={}", ns.name)])
            .args(["--metrics-address", "127.0.0.1:0"])
            .args(["--lease-namespace", &ns.name])
            .args(args)
            .env_remove("MW_DATABASE_PASSWORD")
            .env("RUST_LOG", "info,mw_operator=debug,kube=warn,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .kill_on_drop(true);
        if let Some(pw) = &db.password_file {
            cmd.args(["--database-password-file", pw]);
        }
        let child = cmd.spawn().expect("starting mw-operator bridge");
        Bridge { child, log }
    }

    /// The bridge's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or_default()
    }

    /// Everything the bridge printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Still running (it never exits on its own)?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait until the output holds a line containing every one of `needles`.
    pub async fn wait_for_line(&self, needles: &[&str], timeout: Duration) -> String {
        self.wait_for_lines(needles, 1, timeout).await
    }

    /// The lines of the output so far that contain every one of `needles`.
    pub fn lines(&self, needles: &[&str]) -> Vec<String> {
        self.output().lines().filter(|l| needles.iter().all(|n| l.contains(n))).map(str::to_string).collect()
    }

    /// Wait until the output holds `count` lines containing every one of `needles`; the last.
    pub async fn wait_for_lines(&self, needles: &[&str], count: usize, timeout: Duration) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let lines = self.lines(needles);
            if lines.len() >= count {
                return lines[count - 1].clone();
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "the bridge logged {} of {count} lines with {needles:?} within {timeout:?}; its log: {}",
                    lines.len(),
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Wait until the bridge has logged `n` more lines with `needles` than it had when
    /// called: the evidence that it did a thing again (`n` more full resyncs, polls), in place
    /// of a sleep that guesses how long that takes.
    pub async fn wait_for_more(&self, needles: &[&str], n: usize, timeout: Duration) -> String {
        let seen = self.lines(needles).len();
        self.wait_for_lines(needles, seen + n, timeout).await
    }

    /// GET `path` from the bridge's probe/metrics server: (status code, body).
    pub async fn http_get(&self, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let line = self.wait_for_line(&["serving /healthz"], Duration::from_secs(30)).await;
        let address =
            line.split("address=").nth(1).and_then(|s| s.split_whitespace().next()).expect("the bound address");
        let mut stream = tokio::net::TcpStream::connect(address).await.expect("connecting to the metrics server");
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .expect("sending the request");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("reading the response");
        let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    /// The value of one metric sample (`name{labels}`), if exported.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (_, body) = self.http_get("/metrics").await;
        body.lines().find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
    }

    /// Stop it as Kubernetes does: SIGTERM (it finishes its pass and releases its Lease, so a
    /// bridge started next in the namespace leads at once), SIGKILL after 15 s.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            if tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await.is_ok() {
                return;
            }
        }
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}
