//! The operator's Prometheus metrics (served by `telemetry` on `--metrics-address`).
//!
//! Where controller-runtime has a metric for the same thing, its name and labels are used
//! (`controller_runtime_*`, `leader_election_master_status`), so dashboards and alerts for
//! controller-runtime operators work unchanged; the rest is `mw_operator_*`.
//! docs/operations.md lists every metric.

use std::collections::BTreeMap;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::resource::Phase;

type Labels = Vec<(&'static str, String)>;

/// The `controller` label value, as controller-runtime names a controller after its kind.
pub const CONTROLLER: &str = "managedworkload";
/// The `name` label of `leader_election_master_status`: the Lease's name.
pub const DEFAULT_LEASE: &str = "mw-operator";

/// The `resource` label of `mw_operator_watch_restarts_total`: one per watch (another name
/// trips a debug assertion).
pub const WATCHED: [&str; 7] =
    ["managedworkloads", "deployments", "replicasets", "pods", "persistentvolumeclaims", "services", "networkpolicies"];

/// The `resource` and `verb` labels of `mw_operator_api_writes_total`: every write the
/// operator makes (one not listed here trips a debug assertion).
pub const WRITES: [(&str, &str); 9] = [
    ("managedworkloads/status", "patch"),
    ("deployments", "apply"),
    ("persistentvolumeclaims", "apply"),
    ("services", "apply"),
    ("services", "patch"),
    ("services", "delete"),
    ("networkpolicies", "apply"),
    ("networkpolicies", "delete"),
    ("events", "create"),
];

/// The `result` label of `controller_runtime_reconcile_total`.
pub const RESULTS: [&str; 2] = ["success", "error"];

#[derive(Debug)]
pub struct Metrics {
    reconciles: Family<Labels, Counter>,
    reconcile_errors: Family<Labels, Counter>,
    reconcile_time: Family<Labels, Histogram>,
    active_workers: Family<Labels, Gauge>,
    max_concurrent: Family<Labels, Gauge>,
    leader: Family<Labels, Gauge>,
    errors_by_kind: Family<Labels, Counter>,
    watch_restarts: Family<Labels, Counter>,
    api_writes: Family<Labels, Counter>,
    events_dropped: Counter,
    workloads: Family<Labels, Gauge>,
}

fn reconcile_buckets() -> Histogram {
    // controller-runtime's buckets span 5 ms to ~1 min; a reconcile here is a few cache reads
    // and at most three API calls.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(reconcile_buckets),
            active_workers: Family::default(),
            max_concurrent: Family::default(),
            leader: Family::default(),
            errors_by_kind: Family::default(),
            watch_restarts: Family::default(),
            api_writes: Family::default(),
            events_dropped: Counter::default(),
            workloads: Family::default(),
        }
    }
}

fn controller() -> Labels {
    vec![("controller", CONTROLLER.to_string())]
}

fn reconcile_labels(result: &str) -> Labels {
    vec![("controller", CONTROLLER.to_string()), ("result", result.to_string())]
}

fn kind_labels(kind: &str) -> Labels {
    vec![("kind", kind.to_string())]
}

fn resource_labels(resource: &str) -> Labels {
    vec![("resource", resource.to_string())]
}

fn write_labels(resource: &str, verb: &str) -> Labels {
    vec![("resource", resource.to_string()), ("verb", verb.to_string())]
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> std::sync::Arc<Metrics> {
        let m = Metrics::default();
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles per controller and result (success, error)",
            m.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that returned an error, per controller",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time per reconcile, per controller",
            m.reconcile_time.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Reconciles running now, per controller",
            m.active_workers.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum reconciles running at once, per controller (--concurrency times the watched namespaces)",
            m.max_concurrent.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the leader Lease (and so reconciles and writes), else 0",
            m.leader.clone(),
        );
        let r = registry.sub_registry_with_prefix("mw_operator");
        r.register("reconcile_errors", "Failed reconciles by error kind", m.errors_by_kind.clone());
        r.register(
            "watch_restarts",
            "Watch failures (each is retried with backoff), by resource",
            m.watch_restarts.clone(),
        );
        r.register("api_writes", "Write requests sent to the API server, by resource and verb", m.api_writes.clone());
        r.register(
            "events_dropped",
            "Events dropped: too many were waiting to be sent (the API server is down or slow), or still waiting when a term of leadership ended",
            m.events_dropped.clone(),
        );
        r.register(
            "workloads",
            "ManagedWorkloads in the watch cache, by status phase (None: no status yet)",
            m.workloads.clone(),
        );
        // Every known series exists from the start, at 0: `rate()` and `increase()` see the
        // first failure or write as a change instead of as a new series, and what is exported
        // is the whole list of label values (tests/docs.rs compares docs/operations.md with it).
        for result in RESULTS {
            let _ = m.reconciles.get_or_create(&reconcile_labels(result));
        }
        let _ = m.reconcile_errors.get_or_create(&controller());
        for kind in crate::error::Error::RECONCILE_KINDS {
            let _ = m.errors_by_kind.get_or_create(&kind_labels(kind));
        }
        for resource in WATCHED {
            let _ = m.watch_restarts.get_or_create(&resource_labels(resource));
        }
        for (resource, verb) in WRITES {
            let _ = m.api_writes.get_or_create(&write_labels(resource, verb));
        }
        std::sync::Arc::new(m)
    }

    pub fn set_max_concurrent(&self, n: i64) {
        self.max_concurrent.get_or_create(&controller()).set(n);
    }

    /// A reconcile started; the guard records its duration and result when it ends.
    pub fn reconcile_started(&self) -> ReconcileTimer<'_> {
        self.active_workers.get_or_create(&controller()).inc();
        ReconcileTimer { metrics: self, start: std::time::Instant::now(), done: false }
    }

    pub fn reconcile_failed(&self, kind: &'static str) {
        debug_assert!(
            crate::error::Error::RECONCILE_KINDS.contains(&kind),
            "reconcile error {kind:?} is missing from Error::RECONCILE_KINDS"
        );
        self.errors_by_kind.get_or_create(&kind_labels(kind)).inc();
    }

    pub fn set_leader(&self, lease: &str, leading: bool) {
        self.leader.get_or_create(&vec![("name", lease.to_string())]).set(i64::from(leading));
    }

    pub fn watch_restarted(&self, resource: &'static str) {
        debug_assert!(WATCHED.contains(&resource), "watch {resource:?} is missing from metrics::WATCHED");
        self.watch_restarts.get_or_create(&resource_labels(resource)).inc();
    }

    /// A write made, with the API server's answer: counted unless the fence refused it before
    /// it left (`election::refused_before_sending`), so the counter says what was sent.
    pub fn sent<T>(&self, resource: &'static str, verb: &'static str, answer: &Result<T, kube::Error>) {
        if answer.as_ref().is_err_and(crate::election::refused_before_sending) {
            return;
        }
        self.wrote(resource, verb);
    }

    fn wrote(&self, resource: &'static str, verb: &'static str) {
        debug_assert!(
            WRITES.contains(&(resource, verb)),
            "write {resource:?} {verb:?} is missing from metrics::WRITES"
        );
        self.api_writes.get_or_create(&write_labels(resource, verb)).inc();
    }

    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    #[cfg(test)]
    pub fn dropped_events(&self) -> u64 {
        self.events_dropped.get()
    }

    /// Events lost at once: still queued when a term's sender had to stop.
    pub fn events_dropped(&self, n: u64) {
        self.events_dropped.inc_by(n);
    }

    /// Replace the workloads-by-phase gauges with `counts`. Every phase is always exported (0
    /// when absent), so one that empties does not keep its last value.
    pub fn set_workloads(&self, counts: &BTreeMap<&'static str, i64>) {
        let phases = [
            None,
            Some(Phase::Creating),
            Some(Phase::Running),
            Some(Phase::Updating),
            Some(Phase::Stopping),
            Some(Phase::Stopped),
            Some(Phase::Failed),
        ];
        for phase in phases {
            let label = phase_label(phase);
            self.workloads
                .get_or_create(&vec![("phase", label.to_string())])
                .set(counts.get(label).copied().unwrap_or(0));
        }
    }
}

/// The `phase` label of `mw_operator_workloads`.
pub fn phase_label(phase: Option<Phase>) -> &'static str {
    phase.map_or("None", Phase::as_str)
}

/// Records one reconcile when dropped: duration, result, and one worker fewer.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    start: std::time::Instant,
    done: bool,
}

impl ReconcileTimer<'_> {
    pub fn finish(mut self, ok: bool) {
        self.record(ok);
    }

    fn record(&mut self, ok: bool) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let m = self.metrics;
        m.active_workers.get_or_create(&controller()).dec();
        m.reconcile_time.get_or_create(&controller()).observe(self.start.elapsed().as_secs_f64());
        let result = if ok { RESULTS[0] } else { RESULTS[1] };
        m.reconciles.get_or_create(&reconcile_labels(result)).inc();
        if !ok {
            m.reconcile_errors.get_or_create(&controller()).inc();
        }
    }
}

impl Drop for ReconcileTimer<'_> {
    /// A reconcile aborted mid-way (forced shutdown) still frees its worker slot.
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            self.metrics.active_workers.get_or_create(&controller()).dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn names_follow_controller_runtime() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.set_max_concurrent(8);
        m.reconcile_started().finish(true);
        m.reconcile_started().finish(false);
        drop(m.reconcile_started());
        m.reconcile_failed("write_status");
        m.set_leader(DEFAULT_LEASE, true);
        m.watch_restarted("pods");
        m.sent("deployments", "apply", &Ok::<(), kube::Error>(()));
        // What the fence refused before it left was not sent; what it abandoned unanswered was.
        let refused = |why| {
            let refusal = crate::election::NotLeading { lease: "ns/lease".into(), why };
            Err::<(), _>(kube::Error::Service(Box::new(refusal)))
        };
        m.sent("deployments", "apply", &refused(crate::election::Refused::NotLeading));
        m.sent("deployments", "apply", &refused(crate::election::Refused::DeadlinePassed));
        m.sent("services", "patch", &refused(crate::election::Refused::Unanswered));
        m.set_workloads(&[("Running", 3), ("None", 1)].into_iter().collect());
        let text = exposition(&registry);
        for line in [
            r#"controller_runtime_reconcile_total{controller="managedworkload",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="managedworkload",result="error"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="managedworkload"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="managedworkload"} 2"#,
            r#"controller_runtime_active_workers{controller="managedworkload"} 0"#,
            r#"controller_runtime_max_concurrent_reconciles{controller="managedworkload"} 8"#,
            r#"leader_election_master_status{name="mw-operator"} 1"#,
            r#"mw_operator_reconcile_errors_total{kind="write_status"} 1"#,
            r#"mw_operator_watch_restarts_total{resource="pods"} 1"#,
            r#"mw_operator_api_writes_total{resource="deployments",verb="apply"} 1"#,
            r#"mw_operator_api_writes_total{resource="services",verb="patch"} 1"#,
            r#"mw_operator_workloads{phase="Running"} 3"#,
            r#"mw_operator_workloads{phase="None"} 1"#,
            r#"mw_operator_workloads{phase="Failed"} 0"#,
            // Exported before anything happened, at 0.
            r#"mw_operator_watch_restarts_total{resource="replicasets"} 0"#,
            r#"mw_operator_api_writes_total{resource="services",verb="delete"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
