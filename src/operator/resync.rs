//! The steady-state resync: every workload reconciled once per `PERIOD`, spread evenly. It
//! only bounds how long a missed watch event could go unnoticed, and reads only the cache.
//!
//! Nothing is kept per workload: a requeue timer per resting workload would cost about
//! 0.7 KiB each in the controller's queue. Instead, each second the cache is read and the
//! workloads whose slot has come (fixed by UID) are sent.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use futures::Stream;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::resource::Workload;

/// How often each workload is reconciled with nothing having changed.
pub const PERIOD: Duration = Duration::from_secs(600);
/// How often the cache is read for the workloads whose slot has come.
const TICK: Duration = Duration::from_secs(1);
const SLOTS: u64 = PERIOD.as_secs() / TICK.as_secs();

/// A workload's slot in the period: the same in every period (the hasher's keys are fixed),
/// so each workload is resynced once per period.
fn slot(uid: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    uid.hash(&mut hasher);
    hasher.finish() % SLOTS
}

/// The workloads whose slot is `tick`'s. One that does not parse is left out: its reconcile
/// would only repeat the Event it already got.
fn due(store: &Store<Workload>, tick: u64) -> Vec<ObjectRef<Workload>> {
    let slot_now = tick % SLOTS;
    store
        .state()
        .iter()
        .filter(|mw| mw.0.is_ok() && mw.meta().uid.as_deref().is_some_and(|uid| slot(uid) == slot_now))
        .map(|mw| ObjectRef::from_obj(&**mw))
        .collect()
}

/// Every workload, each once per `PERIOD`, a slot's worth each `TICK`, starting one tick in
/// (a term begins by reconciling everything).
pub fn paced(store: Store<Workload>) -> impl Stream<Item = ObjectRef<Workload>> + Send + 'static {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    // A stalled runtime delays the later slots instead of sending several at once.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let batches = futures::stream::unfold((ticks, 0u64), move |(mut ticks, tick)| {
        let store = store.clone();
        async move {
            ticks.tick().await;
            Some((futures::stream::iter(due(&store, tick)), (ticks, tick + 1)))
        }
    });
    futures::StreamExt::flatten(batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::ManagedWorkload;
    use kube::core::DeserializeGuard;
    use kube::runtime::watcher::Event;

    fn workload(i: usize) -> Workload {
        let mut mw = ManagedWorkload::new(&format!("w{i}"), Default::default());
        mw.metadata.namespace = Some("a".into());
        mw.metadata.uid = Some(format!("0000{i:04}-1111-2222-3333-444455556666"));
        DeserializeGuard(Ok(mw))
    }

    #[test]
    fn every_workload_is_due_exactly_once_a_period_and_the_slots_are_spread() {
        let (store, mut writer) = kube::runtime::reflector::store::<Workload>();
        let n = 3000;
        for i in 0..n {
            writer.apply_watcher_event(&Event::Apply(workload(i)));
        }
        let mut seen = std::collections::HashMap::new();
        let mut busiest = 0;
        for tick in 0..SLOTS {
            let batch = due(&store, tick);
            busiest = busiest.max(batch.len());
            for r in batch {
                *seen.entry(r.name).or_insert(0) += 1;
            }
        }
        assert_eq!(seen.len(), n, "every workload once");
        assert!(seen.values().all(|&c| c == 1), "and only once");
        // 5 a slot on average: a fair spread has no slot with several times that.
        assert!(busiest <= 20, "a slot with {busiest} workloads");
        let again: Vec<_> = due(&store, SLOTS + 7).into_iter().map(|r| r.name).collect();
        let first: Vec<_> = due(&store, 7).into_iter().map(|r| r.name).collect();
        assert_eq!(again, first, "the same slot in the next period");
    }
}
