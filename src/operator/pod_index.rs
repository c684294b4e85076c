//! The workload's Pods, found through an index by (namespace, workload) instead of a scan of
//! every managed Pod.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::slim::CachedPod;

/// Names of the managed Pods per (namespace, workload), from the Pod watch. A superset: a
/// name whose Pod is gone or relabelled is skipped and dropped when looked up, so a watch gap
/// that hides a deletion costs nothing but a stale name until the next look-up.
#[derive(Default)]
pub struct PodIndex {
    names: Mutex<HashMap<(String, String), Names>>,
}

/// A workload's Pod names, sorted: one, or two during a rollout. A B-tree set's first node
/// has room for eleven (280 bytes), most of what the index kept per workload.
type Names = Vec<Box<str>>;

impl PodIndex {
    fn key(pod: &CachedPod) -> Option<(String, String)> {
        Some((pod.namespace()?, pod.instance()?.to_owned()))
    }

    pub fn observe(&self, event: &watcher::Event<CachedPod>) {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                if let Some(key) = Self::key(pod) {
                    let set = names.entry(key).or_default();
                    let name = pod.name_any();
                    if let Err(at) = set.binary_search_by(|n| (**n).cmp(name.as_str())) {
                        set.insert(at, name.into());
                    }
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(key) = Self::key(pod)
                    && let Some(set) = names.get_mut(&key)
                {
                    let name = pod.name_any();
                    set.retain(|n| **n != *name);
                    if set.is_empty() {
                        names.remove(&key);
                    }
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// The workload's Pods from `store`, in name order (so an unchanged world reads the same).
    pub fn pods(&self, store: &Store<CachedPod>, namespace: &str, workload: &str) -> Vec<Arc<CachedPod>> {
        let key = (namespace.to_string(), workload.to_string());
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let Some(set) = names.get_mut(&key) else { return Vec::new() };
        let mut pods = Vec::with_capacity(set.len());
        set.retain(|name| match store.get(&ObjectRef::new(name).within(namespace)) {
            Some(pod) if Self::key(&pod).as_ref() == Some(&key) => {
                pods.push(pod);
                true
            }
            _ => false,
        });
        if set.is_empty() {
            names.remove(&key);
        }
        pods
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::ownership::INSTANCE_LABEL;
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::reflector::store::Writer;

    fn cached(namespace: &str, name: &str, instance: &str) -> CachedPod {
        pod(namespace, name, instance).into()
    }

    fn pod(namespace: &str, name: &str, instance: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(namespace.into());
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some([(INSTANCE_LABEL.to_string(), instance.to_string())].into());
        p
    }

    #[test]
    fn pods_are_found_per_workload_and_forgotten_when_gone() {
        let index = PodIndex::default();
        let mut writer: Writer<CachedPod> = Writer::default();
        let store = writer.as_reader();
        let events = [
            watcher::Event::Init,
            watcher::Event::InitApply(cached("a", "web-2", "web")),
            watcher::Event::InitApply(cached("a", "web-1", "web")),
            watcher::Event::InitApply(cached("a", "db-1", "db")),
            watcher::Event::InitApply(cached("b", "web-1", "web")),
            watcher::Event::InitDone,
        ];
        for e in &events {
            index.observe(e);
            writer.apply_watcher_event(e);
        }
        let names = |ns, w| index.pods(&store, ns, w).iter().map(|p| p.name_any()).collect::<Vec<_>>();
        assert_eq!(names("a", "web"), ["web-1", "web-2"], "name order, this namespace only");
        assert_eq!(names("b", "web"), ["web-1"]);

        let gone = watcher::Event::Delete(cached("a", "web-1", "web"));
        index.observe(&gone);
        writer.apply_watcher_event(&gone);
        assert_eq!(names("a", "web"), ["web-2"]);

        // Relabelled to another workload: found there, not here.
        let moved = watcher::Event::Apply(cached("a", "web-2", "db"));
        index.observe(&moved);
        writer.apply_watcher_event(&moved);
        assert_eq!(names("a", "web"), Vec::<String>::new());
        assert_eq!(names("a", "db"), ["db-1", "web-2"]);
        // A deletion the watch never delivered (a gap, then a re-list without it).
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(cached("a", "db-1", "db")));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(names("a", "db"), ["db-1"]);
        let entries = index.names.lock().unwrap();
        assert_eq!(entries.len(), 2, "emptied keys are dropped: {:?}", entries.keys());
    }
}
