//! Whether the controller still makes progress, for `/healthz`.
//!
//! Every request is bounded, so a reconcile cannot wait on the API server forever; nothing
//! bounds a reconcile wedged elsewhere (a lock, a bug) or a runtime too starved to run tasks,
//! and only a restart ends that. So the operator is alive while its own small task runs every
//! few seconds and no reconcile has been in flight longer than `STALL_LIMIT`. One wedged
//! reconcile counts even while others work: its workload would never be reconciled again.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::client::REQUEST_TIMEOUT;
use crate::telemetry::Health;

/// How long one reconcile may run before the operator counts as stalled. A reconcile makes at
/// most about a dozen sequential requests (up to 8 claims, the Deployment, its status), each
/// bounded by `REQUEST_TIMEOUT`: 6 minutes if none is answered in time. Twenty timeouts cover
/// that and are still far from "never".
pub const STALL_LIMIT: Duration = Duration::from_secs(REQUEST_TIMEOUT.as_secs() * 20);

/// How often the operator says it is alive, and how long `/healthz` waits for the next beat
/// before answering 503: a runtime that cannot run this task for half a minute serves nobody.
pub const BEAT: Duration = Duration::from_secs(5);
pub const BEAT_GRACE: Duration = Duration::from_secs(30);

/// Beat `health` every `BEAT` while no reconcile is wedged; runs for the process's life.
pub async fn report(in_flight: std::sync::Arc<InFlight>, health: std::sync::Arc<Health>) {
    let mut was_wedged = false;
    loop {
        let wedged = in_flight.wedged(Instant::now(), STALL_LIMIT);
        match wedged {
            None => {
                if was_wedged {
                    info!("the reconcile that ran past the stall limit ended; alive again");
                }
                health.beat();
            }
            Some(running) if !was_wedged => warn!(
                running_s = running.as_secs(),
                limit_s = STALL_LIMIT.as_secs(),
                "a reconcile has run past the stall limit: /healthz fails from now on, so the kubelet restarts the operator"
            ),
            Some(_) => {}
        }
        was_wedged = wedged.is_some();
        tokio::time::sleep(BEAT).await;
    }
}

/// The reconciles in flight, by when each started.
#[derive(Debug, Default)]
pub struct InFlight {
    next: AtomicU64,
    started: Mutex<BTreeMap<u64, Instant>>,
}

/// One reconcile in flight; it counts until dropped (also when its future is cancelled).
pub struct Running<'a> {
    registry: &'a InFlight,
    id: u64,
}

impl InFlight {
    pub fn start(&self) -> Running<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Instant::now());
        Running { registry: self, id }
    }

    /// How long the oldest reconcile in flight has run, if longer than `limit`.
    pub fn wedged(&self, now: Instant, limit: Duration) -> Option<Duration> {
        let oldest = self.lock().values().min().copied()?;
        let running = now.saturating_duration_since(oldest);
        (running > limit).then_some(running)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Instant>> {
        // The map holds plain values, so a panic while holding the lock leaves it whole.
        self.started.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_reconcile_running_past_the_limit_is_wedged() {
        let limit = Duration::from_secs(60);
        let in_flight = InFlight::default();
        let now = Instant::now();
        assert_eq!(in_flight.wedged(now + limit * 2, limit), None, "nothing in flight: alive");

        let first = in_flight.start();
        let second = in_flight.start();
        assert_eq!(in_flight.wedged(now, limit), None);
        let wedged = in_flight.wedged(now + limit * 2, limit).expect("the oldest ran past the limit");
        assert!(wedged > limit && wedged <= limit * 2);

        // The oldest ends; the other is judged on its own start.
        drop(first);
        assert!(in_flight.wedged(now + limit * 2, limit).is_some(), "the second started at about the same time");
        drop(second);
        assert_eq!(in_flight.wedged(now + limit * 2, limit), None, "every reconcile ended: alive again");
    }

    #[test]
    fn the_limit_outlasts_a_reconcile_whose_every_request_times_out() {
        // Up to 8 claims, the Deployment (and a read of it), the status: 11 requests.
        assert!(STALL_LIMIT > REQUEST_TIMEOUT * 11);
    }
}
