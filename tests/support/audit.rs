//! API writes the operator made, read from the control plane's audit log (every write, at
//! Metadata level; see hack/audit-policy.yaml). This is how "no writes when nothing changed"
//! is checked: the API server's own record, not the operator's word.

use std::io::{BufRead, BufReader};

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// One write request, as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub name: Option<String>,
}

/// The operator's writes in `namespace` so far, in order.
pub fn operator_writes(namespace: &str) -> Vec<Write> {
    writes_by(&operator_user(), namespace)
}

/// Writes by API user `user` in `namespace` so far, in order.
pub fn writes_by(user: &str, namespace: &str) -> Vec<Write> {
    timed_writes_by(user, namespace).into_iter().map(|(_, w)| w).collect()
}

/// Writes by `user` in `namespace` with the time the API server completed each, in the audit
/// log's order (the order they ended; `timed_accepted_writes_by` and `timed_refused_writes_by`
/// rely on it). A request whose client's connection closed before the API server answered (500 "client
/// disconnected") is timed when it arrived, which is when the client sent it: its end only says
/// when the connection closed (a fenced leader drops its connections when its term ends, with a
/// request's body perhaps still unsent).
pub fn timed_writes_by(user: &str, namespace: &str) -> Vec<(Timestamp, Write)> {
    write_entries(user, namespace)
        .into_iter()
        .map(|e| {
            let stage = if abandoned(&e) { "requestReceivedTimestamp" } else { "stageTimestamp" };
            (time(&e, stage).unwrap_or(Timestamp::UNIX_EPOCH), Write::of(&e))
        })
        .collect()
}

/// The API server stopped on this request because its client's connection closed.
fn abandoned(e: &Value) -> bool {
    e["responseStatus"]["code"] == 500 && e["responseStatus"]["message"] == "client disconnected"
}

impl Write {
    fn of(e: &Value) -> Write {
        Write {
            verb: e["verb"].as_str().unwrap_or_default().into(),
            resource: e["objectRef"]["resource"].as_str().unwrap_or_default().into(),
            subresource: e["objectRef"]["subresource"].as_str().map(String::from),
            name: e["objectRef"]["name"].as_str().map(String::from),
        }
    }

    /// The resource as `kubectl` names it: `deployments`, `managedworkloads/status`.
    pub fn path(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// One of an audit entry's timestamps.
fn time(e: &Value, stage: &str) -> Option<Timestamp> {
    e[stage].as_str().and_then(|t| t.parse().ok())
}

/// The median time the API server took over `user`'s writes of `verb` and `resource` in
/// `namespace`, in seconds: from receiving a request's headers to answering, so a body slow to
/// follow its headers counts (a client whose connection holds small writes back shows here
/// beside another client's writes of the same kind). None without such writes.
pub fn median_write_seconds(user: &str, namespace: &str, verb: &str, resource: &str) -> Option<f64> {
    let mut taken: Vec<f64> = write_entries(user, namespace)
        .iter()
        .filter(|e| {
            let write = Write::of(e);
            write.verb == verb && write.path() == resource
        })
        .filter_map(|e| Some(time(e, "stageTimestamp")?.duration_since(time(e, "requestReceivedTimestamp")?)))
        .map(|d| d.as_secs_f64())
        .collect();
    taken.sort_by(f64::total_cmp);
    taken.get(taken.len() / 2).copied()
}

/// Like `timed_writes_by`, only the writes the API server accepted (2xx): a write refused or
/// failed during an outage (etcd down, RBAC not yet loaded) changed nothing and is retried.
pub fn timed_accepted_writes_by(user: &str, namespace: &str) -> Vec<(Timestamp, Write)> {
    let accepted: Vec<bool> = write_entries(user, namespace)
        .iter()
        .map(|e| e["responseStatus"]["code"].as_u64().is_some_and(|c| (200..300).contains(&c)))
        .collect();
    timed_writes_by(user, namespace).into_iter().zip(accepted).filter(|(_, ok)| *ok).map(|(w, _)| w).collect()
}

/// Like `timed_writes_by`, only the writes the API server refused (4xx, 5xx).
pub fn timed_refused_writes_by(user: &str, namespace: &str) -> Vec<(Timestamp, Write)> {
    let refused: Vec<bool> = write_entries(user, namespace)
        .iter()
        .map(|e| e["responseStatus"]["code"].as_u64().is_some_and(|c| c >= 400))
        .collect();
    timed_writes_by(user, namespace).into_iter().zip(refused).filter(|(_, r)| *r).map(|(w, _)| w).collect()
}

/// The control plane's own users: the writes each workload's Deployment makes them do.
const CONTROL_PLANE_USERS: [&str; 3] = ["system:kube-controller-manager", "system:kube-scheduler", "kwok-controller"];

/// How many writes kube-controller-manager, kube-scheduler and kwok made in `namespace`.
pub fn control_plane_writes(namespace: &str) -> usize {
    writes_where(namespace, |user| CONTROL_PLANE_USERS.contains(&user)).len()
}

/// The User-Agent headers `user`'s writes in `namespace` carried.
pub fn user_agents(user: &str, namespace: &str) -> std::collections::BTreeSet<String> {
    write_entries(user, namespace).iter().map(|e| e["userAgent"].as_str().unwrap_or_default().to_string()).collect()
}

/// The audit log's files, oldest first: the API server rotates `audit.log` into
/// `audit-<time>.log` at 200 MB (a run at N = 5000 writes more than that).
fn log_files() -> Vec<std::path::PathBuf> {
    let dir = std::path::PathBuf::from(super::log_dir());
    let mut rotated: Vec<_> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    rotated.retain(|p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
    });
    rotated.sort();
    rotated.push(dir.join("audit.log"));
    rotated
}

fn write_entries(user: &str, namespace: &str) -> Vec<Value> {
    writes_where(namespace, |u| u == user)
}

/// The audit entries of writes in `namespace` by the users `user` accepts.
fn writes_where(namespace: &str, user: impl Fn(&str) -> bool) -> Vec<Value> {
    let lines = log_files().into_iter().flat_map(|path| {
        let file =
            std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening the audit log {}: {e}", path.display()));
        BufReader::new(file).lines()
    });
    lines
        .map_while(Result::ok)
        // Parsing is most of the time over a log of gigabytes: skip the other namespaces' lines.
        .filter(|line| line.contains(namespace))
        .filter_map(|line| serde_json::from_str::<Value>(&line).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && user(e["user"]["username"].as_str().unwrap_or_default()))
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete" | "deletecollection")))
        .collect()
}

/// A quiet window long enough to see any write the operator still holds back from a workload in
/// a steady phase (Running, Stopped, Failed): status details wait at most
/// `DETAIL_DELAY` after the previous write. (In transition, Creating, Updating or Stopping,
/// they may wait `DETAIL_DELAY_IN_TRANSITION`, but the transition's end is written at once and
/// carries them: wait for the steady phase first, as every caller does.)
pub const QUIET: std::time::Duration =
    mw_operator::operator::status::DETAIL_DELAY.saturating_add(std::time::Duration::from_secs(2));

/// The API user of the operator under test (the shared host process's by default).
pub fn operator_user() -> String {
    std::env::var("MW_TEST_OPERATOR_USER").unwrap_or_else(|_| "mw-operator".into())
}

/// Wait until the operator has made no write in `namespace` for `QUIET`, and return its writes
/// so far: the settled starting point for a "nothing more is written" check.
pub async fn settled_writes(namespace: &str) -> Vec<Write> {
    settled_writes_by(&operator_user(), namespace).await
}

/// `settled_writes` for API user `user` (an operator running as a Pod: its ServiceAccount).
pub async fn settled_writes_by(user: &str, namespace: &str) -> Vec<Write> {
    let quiet = QUIET;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = writes_by(user, namespace);
    loop {
        tokio::time::sleep(quiet).await;
        let now = writes_by(user, namespace);
        if now.len() == seen.len() {
            return now;
        }
        assert!(tokio::time::Instant::now() < deadline, "{user} kept writing in {namespace}: {now:?}");
        seen = now;
    }
}

/// The positive control of a "no writes" window: once the caller has made a change the
/// operator must act on, one more of its writes shows in the audit log (beyond the `seen`
/// counted at the window's end), so the log was written and read while the window was watched.
pub async fn wait_for_operator_write(namespace: &str, seen: usize) {
    wait_for_write_by(&operator_user(), namespace, seen).await
}

/// `wait_for_operator_write` for API user `user`.
pub async fn wait_for_write_by(user: &str, namespace: &str, seen: usize) {
    super::eventually(
        "the operator's write after the change (the positive control)",
        super::workload::TIMEOUT,
        || async {
            let now = writes_by(user, namespace).len();
            if now > seen { Ok(()) } else { Err(format!("{now} writes, as at the end of the quiet window")) }
        },
    )
    .await;
}

/// The positive control for a window in which nothing else is to change: stop workload `name`
/// (a change the operator must write: its Deployment's replicas and its status) and see the
/// write in the audit log, beyond the `seen` counted at the window's end.
pub async fn stop_and_see_a_write(
    workloads: &kube::Api<mw_operator::resource::ManagedWorkload>,
    namespace: &str,
    name: &str,
    seen: usize,
) {
    stop_and_see_a_write_by(&operator_user(), workloads, namespace, name, seen).await
}

/// `stop_and_see_a_write` for API user `user`.
pub async fn stop_and_see_a_write_by(
    user: &str,
    workloads: &kube::Api<mw_operator::resource::ManagedWorkload>,
    namespace: &str,
    name: &str,
    seen: usize,
) {
    let stop = serde_json::json!({"spec": {"state": "Stopped"}});
    let params = kube::api::PatchParams::default();
    workloads.patch(name, &params, &kube::api::Patch::Merge(&stop)).await.expect("stopping the workload");
    wait_for_write_by(user, namespace, seen).await;
}

/// Deployment writes per workload name in `writes`.
pub fn deployment_writes_per_name(writes: &[&Write]) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for w in writes.iter().filter(|w| w.resource == "deployments") {
        *counts.entry(w.name.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    counts
}

/// Deployment writes by `users` in the namespace that the API server accepted after `since`
/// (attempts refused during an outage are retries, not writes).
pub fn deployment_writes_since(
    users: &[&str],
    ns: &str,
    since: Timestamp,
) -> std::collections::BTreeMap<String, usize> {
    let writes: Vec<(Timestamp, Write)> = users.iter().flat_map(|u| timed_accepted_writes_by(u, ns)).collect();
    let after: Vec<&Write> = writes.iter().filter(|(t, _)| *t > since).map(|(_, w)| w).collect();
    deployment_writes_per_name(&after)
}
