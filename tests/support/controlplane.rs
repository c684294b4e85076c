//! The local control plane's components, stopped and started as a fault test or the soak
//! needs (hack/controlplane.sh stop-component / start-component).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The control plane these tests run against: MW_TEST_CLUSTER, else the one whose state
/// directory holds MW_TEST_KUBECONFIG (hack/controlplane.sh keeps it in `<run dir>/<name>/`),
/// so a run against another cluster can never stop this one's components.
pub fn cluster() -> String {
    std::env::var("MW_TEST_CLUSTER").unwrap_or_else(|_| {
        let dir = state_dir();
        dir.file_name()
            .and_then(|d| d.to_str())
            .expect("the kubeconfig in a control plane's state directory")
            .to_string()
    })
}

/// The state directory of the control plane MW_TEST_KUBECONFIG names (its PID files are in
/// `pids/`).
fn state_dir() -> PathBuf {
    let kubeconfig = std::env::var("MW_TEST_KUBECONFIG").expect("MW_TEST_KUBECONFIG");
    Path::new(&kubeconfig).parent().expect("the kubeconfig in a control plane's state directory").to_path_buf()
}

/// The CPU seconds each component of this control plane (`pids/*.pid` in its state directory)
/// has used so far, by name: read before and after a run, what the run cost each of them.
pub fn components_cpu() -> std::collections::BTreeMap<String, f64> {
    let mut cpu = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(state_dir().join("pids")).into_iter().flatten().flatten() {
        let path = entry.path();
        let (Some(name), Some("pid")) =
            (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|s| s.to_str()))
        else {
            continue;
        };
        if let Some(pid) = std::fs::read_to_string(&path).ok().and_then(|p| p.trim().parse().ok()) {
            cpu.insert(name.to_string(), super::procfs::cpu_seconds(pid));
        }
    }
    cpu
}

pub fn control_plane(action: &str, component: &str) {
    let cluster = cluster();
    let status = std::process::Command::new("bash")
        .args(["hack/controlplane.sh", action, &cluster, component])
        .status()
        .expect("running hack/controlplane.sh");
    assert!(status.success(), "hack/controlplane.sh {action} {cluster} {component} failed");
}

/// A stopped control-plane component, started again when dropped (also when the test fails),
/// so one failing fault test does not take the next ones down with it.
pub struct Stopped(&'static str);

impl Stopped {
    /// Stopped as by a crash: SIGKILL. (A SIGTERM'd kube-apiserver stops listening at once but
    /// keeps serving the connections it has for a while, so its clients' writes still land
    /// during its "outage"; components built on client-go, kube-controller-manager and kwok,
    /// then do not always see those writes after the restart, and rollouts stall.)
    pub fn stop(component: &'static str) -> Stopped {
        let pid =
            std::fs::read_to_string(state_dir().join(format!("pids/{component}.pid"))).expect("the component's PID");
        let killed = std::process::Command::new("kill").args(["-KILL", pid.trim()]).status();
        assert!(killed.is_ok_and(|s| s.success()), "kill -KILL {component} ({pid})");
        // A process being killed loses its /proc/PID/exe before it is gone, and the script
        // would take it for a reused PID: wait until it has exited (or is a zombie).
        let stat = format!("/proc/{}/stat", pid.trim());
        let alive = || {
            std::fs::read_to_string(&stat)
                .ok()
                .and_then(|s| s.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()))
                .is_some_and(|state| !matches!(state, 'Z' | 'X'))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // Records it as stopped (the PID file goes once the process is gone).
        control_plane("stop-component", component);
        Stopped(component)
    }
    pub fn start(mut self) {
        restart(std::mem::take(&mut self.0));
    }
}

fn restart(component: &str) {
    control_plane("start-component", component);
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            restart(self.0);
        }
    }
}
