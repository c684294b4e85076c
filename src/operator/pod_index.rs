//! The workload's Pods, found through an index by (namespace, workload) instead of scanning
//! every managed Pod.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::slim::CachedPod;

/// Managed Pod names per (namespace, workload), updated after the Pod cache. A superset: a
/// name not in the cache is skipped but kept (it may appear a moment later), a relabelled one
/// is dropped when looked up, and a re-list replaces the whole index.
#[derive(Default)]
pub struct PodIndex {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    names: HashMap<(String, String), Names>,
    /// What the re-list under way has listed so far: the index once it is done.
    listing: Option<HashMap<(String, String), Names>>,
}

/// A workload's Pod names, sorted: one, or two during a rollout. Not a B-tree set: its first
/// node takes 280 bytes.
type Names = Vec<Box<str>>;

fn insert(names: &mut HashMap<(String, String), Names>, key: (String, String), name: &str) {
    let set = names.entry(key).or_default();
    if let Err(at) = set.binary_search_by(|n| (**n).cmp(name)) {
        set.insert(at, name.into());
    }
}

impl PodIndex {
    fn key(pod: &CachedPod) -> Option<(String, String)> {
        Some((pod.namespace()?, pod.instance()?.to_owned()))
    }

    pub fn observe(&self, event: &watcher::Event<CachedPod>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(pod) => {
                if let Some(key) = Self::key(pod) {
                    insert(&mut inner.names, key, &pod.name_any());
                }
            }
            watcher::Event::InitApply(pod) => {
                if let (Some(key), Some(listing)) = (Self::key(pod), inner.listing.as_mut()) {
                    insert(listing, key, &pod.name_any());
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(key) = Self::key(pod)
                    && let Some(set) = inner.names.get_mut(&key)
                {
                    let name = pod.name_any();
                    set.retain(|n| **n != *name);
                    if set.is_empty() {
                        inner.names.remove(&key);
                    }
                }
            }
            watcher::Event::Init => inner.listing = Some(HashMap::new()),
            watcher::Event::InitDone => {
                if let Some(listed) = inner.listing.take() {
                    inner.names = listed;
                }
            }
        }
    }

    /// The workload's Pods, in name order (so an unchanged world reads the same).
    pub fn pods(&self, store: &Store<CachedPod>, namespace: &str, workload: &str) -> Vec<Arc<CachedPod>> {
        let key = (namespace.to_string(), workload.to_string());
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(set) = inner.names.get_mut(&key) else { return Vec::new() };
        let mut pods = Vec::with_capacity(set.len());
        set.retain(|name| match store.get(&ObjectRef::new(name).within(namespace)) {
            Some(pod) if Self::key(&pod).as_ref() == Some(&key) => {
                pods.push(pod);
                true
            }
            // Relabelled to another workload: its Apply put it under that one.
            Some(_) => false,
            // Not in the cache: gone (its Delete follows), or not there yet; kept either way.
            None => true,
        });
        if set.is_empty() {
            inner.names.remove(&key);
        }
        pods
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::INSTANCE_LABEL;

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
        // Deletions the watch never delivered (a gap, then a re-list without them): the
        // workload `b/web`, gone altogether, is forgotten too.
        for e in [watcher::Event::Init, watcher::Event::InitApply(cached("a", "db-1", "db")), watcher::Event::InitDone]
        {
            writer.apply_watcher_event(&e);
            index.observe(&e);
        }
        assert_eq!(names("a", "db"), ["db-1"]);
        let inner = index.inner.lock().unwrap();
        assert_eq!(inner.names.len(), 1, "only what the re-list listed: {:?}", inner.names.keys());
    }

    /// A look-up between the cache taking a Pod in and the index doing so, or the other way
    /// round, loses nothing: the Pod is found from the next look-up on.
    #[test]
    fn a_look_up_in_between_forgets_no_pod() {
        let index = PodIndex::default();
        let mut writer: Writer<CachedPod> = Writer::default();
        let store = writer.as_reader();
        for e in [watcher::Event::Init, watcher::Event::InitDone] {
            writer.apply_watcher_event(&e);
            index.observe(&e);
        }
        let first = watcher::Event::Apply(cached("a", "web-1", "web"));
        // The index first (a watch event seen before the cache has it).
        index.observe(&first);
        assert!(index.pods(&store, "a", "web").is_empty(), "not in the cache yet");
        writer.apply_watcher_event(&first);
        assert_eq!(index.pods(&store, "a", "web").len(), 1, "found once the cache has it");
        // During a re-list, the cache shows the old list until it is done.
        let relist = [watcher::Event::Init, watcher::Event::InitApply(cached("a", "web-2", "web"))];
        for e in &relist {
            writer.apply_watcher_event(e);
            index.observe(e);
            assert_eq!(index.pods(&store, "a", "web").len(), 1);
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        index.observe(&watcher::Event::InitDone);
        let found: Vec<_> = index.pods(&store, "a", "web").iter().map(|p| p.name_any()).collect();
        assert_eq!(found, ["web-2"]);
    }
}
