//! The controller-runtime peer: the same contract written the way most Go operators are
//! (hack/peer: kubebuilder's layout, controller-runtime's informer cache, `CreateOrUpdate` of
//! the Deployment and the Service, the status written with an Update when it changed), run on
//! the same N workloads applied the same way. Beside the ideal controller's floor it says what
//! the job costs done the usual way, and so what the operator's design buys or costs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::support::{self, TestNamespace};
use super::{apply_until_ready, components_cpu_of, gone, operator_command, operator_idle};

/// Its API user: hack/controlplane.sh signs `peer.kubeconfig`'s certificate for it and binds
/// it the peer's own ClusterRole (hack/peer/role.yaml), so the audit log tells its writes from
/// the bench's (`mw-admin`) and the operator's (`mw-operator`), and the API server authorizes
/// its requests through RBAC as it does the operator's.
const PEER_USER: &str = "mw-peer";

pub struct PeerRun {
    pub seconds: f64,
    /// Its writes, by "verb resource[/subresource]", refused ones included.
    pub writes: BTreeMap<String, usize>,
    /// Of those, the ones the API server refused (4xx, 5xx).
    pub refused: usize,
    /// CPU seconds per process, the peer's own as `peer`.
    pub cpu: BTreeMap<String, f64>,
    /// What kube-controller-manager, kube-scheduler and kwok wrote meanwhile in its namespace.
    pub control_plane_writes: usize,
}

/// MW_BENCH_PEER: the peer's binary (`hack/controlplane.sh peer-build`); unset, empty or "0":
/// no peer run.
pub fn binary() -> Option<String> {
    std::env::var("MW_BENCH_PEER").ok().filter(|b| !b.is_empty() && b != "0")
}

/// The peer's process, recorded with the control plane's (`pids/peer.pid`, as
/// hack/controlplane.sh records its own), so that `components_cpu` counts its CPU as `peer`
/// and `hack/controlplane.sh down` stops it should this test die first. Killed when dropped.
struct Running {
    child: Child,
    pids: PathBuf,
}

impl Running {
    /// Starts `binary` for namespace `namespace` as the peer's user, logging to
    /// `<log dir>/peer-<n>.log`, and waits until its controller's workers start: its caches
    /// have synced then, as the operator's have when the bench starts it.
    fn start(binary: &str, namespace: &str, n: usize) -> Running {
        let kubeconfig = std::env::var("MW_TEST_KUBECONFIG").expect("MW_TEST_KUBECONFIG");
        let state = Path::new(&kubeconfig).parent().expect("the control plane's state directory");
        let log = Path::new(&support::log_dir()).join(format!("peer-{n}.log"));
        let file = std::fs::File::create(&log).expect("the peer's log");
        let child = Command::new(binary)
            .arg("--kubeconfig")
            .arg(state.join("peer.kubeconfig"))
            .args(["--namespace", namespace])
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("the peer's log"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting the peer {binary}: {e}"));
        let pids = state.join("pids");
        let binary = std::fs::canonicalize(binary).expect("the peer's binary");
        std::fs::write(pids.join("peer.pid"), child.id().to_string()).expect("the peer's PID file");
        std::fs::write(pids.join("peer.exe"), binary.to_string_lossy().as_bytes()).expect("the peer's binary file");
        let mut running = Running { child, pids };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("Starting workers") {
            if let Ok(Some(exit)) = running.child.try_wait() {
                panic!("the peer exited ({exit}); its log: {}", log.display());
            }
            assert!(
                Instant::now() < deadline,
                "the peer's workers did not start within 60 s; its log: {}",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.pids.join("peer.pid"));
        let _ = std::fs::remove_file(self.pids.join("peer.exe"));
    }
}

/// The peer's run for `n` workloads with `spec`, mirroring the ideal controller's: the
/// operator is stopped meanwhile (it watches every namespace) and started again, ready, once
/// the namespace is gone. The peer watches its namespace only: earlier sizes' workloads are
/// kept for the operator's memory figures, and they are the operator's to reconcile.
pub async fn run(n: usize, binary: &str, spec: impl Fn(usize) -> Value) -> PeerRun {
    operator_command("MW_BENCH_STOP_CMD");
    super::settle(&format!("the peer's run of {n}")).await;
    let ns = TestNamespace::new(&format!("peer-{n}")).await;
    let peer = Running::start(binary, &ns.name, n);
    let (seconds, cpu) = components_cpu_of("peer", n, apply_until_ready(&ns.api(), n, "w", spec)).await;
    // Let trailing writes land before counting, as for the operator.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut writes = BTreeMap::new();
    for w in support::audit::writes_by(PEER_USER, &ns.name) {
        *writes.entry(format!("{} {}", w.verb, w.path())).or_insert(0) += 1;
    }
    let refused = support::audit::timed_refused_writes_by(PEER_USER, &ns.name).len();
    let control_plane_writes = support::audit::control_plane_writes(&ns.name);
    drop(peer);
    gone(ns).await;
    operator_command("MW_BENCH_RESTART_CMD");
    operator_idle().await;
    PeerRun { seconds, writes, refused, cpu, control_plane_writes }
}
