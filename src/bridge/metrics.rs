//! The bridge's Prometheus metrics (served by `telemetry` on `--metrics-address`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::error::RowError;

type Labels = Vec<(&'static str, String)>;

/// The `kind` label of `mw_bridge_writes_total`: four API writes and the database's.
pub const WRITE_KINDS: [&str; 5] = ["workload_apply", "secret_apply", "workload_delete", "secret_delete", "row_update"];

/// The `result` label of `mw_bridge_sync_passes_total`.
pub const RESULTS: [&str; 2] = ["ok", "error"];

#[derive(Debug)]
pub struct Metrics {
    /// Rows that could not be synced, by reason (`RowError::reason`), counted once per row
    /// and change of reason, not per poll.
    pub row_errors: Family<Labels, Counter>,
    /// API and database writes, by what was written.
    pub writes: Family<Labels, Counter>,
    /// Sync passes by result (`ok`, `error`).
    pub passes: Family<Labels, Counter>,
    /// Wall time of full resyncs (read, map, compare, apply what differs, delete orphans).
    pub full_resync_seconds: Histogram,
    /// Rows of served nodes the bridge tracks, and how many of them are failing.
    pub rows: Gauge,
    pub rows_failing: Gauge,
    /// CRs whose row is gone held by the deletion guard, by stage: `confirmation` (waiting for a
    /// second full read to agree) or `approval` (beyond the share: waiting for an administrator).
    pub deletions_pending: Family<Labels, Gauge>,
    /// 1 while this replica holds the bridge's Lease, by Lease name.
    pub leader: Family<Labels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            row_errors: Family::default(),
            writes: Family::default(),
            passes: Family::default(),
            full_resync_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 16)),
            rows: Gauge::default(),
            rows_failing: Gauge::default(),
            deletions_pending: Family::default(),
            leader: Family::default(),
        }
    }
}

impl Metrics {
    /// Create the metrics and register them under the `mw_bridge` prefix.
    pub fn register(registry: &mut Registry) -> std::sync::Arc<Metrics> {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("mw_bridge");
        r.register("row_errors", "Rows not synced, by reason (once per row and reason)", m.row_errors.clone());
        r.register(
            "writes",
            "Writes made, by kind (workload_apply, secret_apply, workload_delete, secret_delete, row_update)",
            m.writes.clone(),
        );
        r.register("sync_passes", "Sync passes, by result", m.passes.clone());
        r.register("full_resync_duration_seconds", "Wall time of full resyncs", m.full_resync_seconds.clone());
        r.register("rows", "Rows of served nodes tracked", m.rows.clone());
        r.register("rows_failing", "Tracked rows that currently fail to sync", m.rows_failing.clone());
        r.register(
            "deletions_pending",
            "ManagedWorkloads whose row is gone that the deletion guard holds, by stage (confirmation, approval)",
            m.deletions_pending.clone(),
        );
        // Unprefixed, as the operator's (and controller-runtime's): one alert rule serves both.
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the bridge's Lease (and so syncs and writes), else 0",
            m.leader.clone(),
        );
        // Every known series from the start, at 0 (as the operator's, see crate::metrics):
        // the first row error or failed pass is a change `increase()` sees, not a new series.
        for reason in RowError::REASONS {
            let _ = m.row_errors.get_or_create(&label("reason", reason));
        }
        for kind in WRITE_KINDS {
            let _ = m.writes.get_or_create(&label("kind", kind));
        }
        for result in RESULTS {
            let _ = m.passes.get_or_create(&label("result", result));
        }
        m.set_deletions_pending(0, 0);
        std::sync::Arc::new(m)
    }

    pub fn set_leader(&self, lease: &str, leading: bool) {
        self.leader.get_or_create(&vec![("name", lease.to_string())]).set(i64::from(leading));
    }

    pub fn row_error(&self, reason: &'static str) {
        debug_assert!(RowError::REASONS.contains(&reason), "row error {reason:?} is missing from RowError::REASONS");
        self.row_errors.get_or_create(&label("reason", reason)).inc();
    }

    pub fn wrote(&self, kind: &'static str) {
        debug_assert!(WRITE_KINDS.contains(&kind), "write {kind:?} is missing from WRITE_KINDS");
        self.writes.get_or_create(&label("kind", kind)).inc();
    }

    /// How many CRs the deletion guard holds at each stage now.
    pub fn set_deletions_pending(&self, confirmation: usize, approval: usize) {
        for (stage, n) in [("confirmation", confirmation), ("approval", approval)] {
            self.deletions_pending
                .get_or_create(&vec![("stage", stage.to_string())])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn pass(&self, ok: bool) {
        self.passes.get_or_create(&label("result", if ok { RESULTS[0] } else { RESULTS[1] })).inc();
    }
}

fn label(name: &'static str, value: &str) -> Labels {
    vec![(name, value.to_string())]
}
