//! A kube-runtime store kept in step with a watch, with re-lists applied in place, and lists
//! streamed where the API server supports it.
//!
//! kube-runtime's `reflect` builds a re-list (after an API server restart or an expired
//! resourceVersion) as a second full copy of the cache and swaps it in at the end; at
//! thousands of objects this left resident memory 5–9 MiB higher after each re-list. Here a
//! re-list replaces each changed object at once and, when done, removes what it did not list.
//! Meanwhile the cache mixes new and old objects; nothing acts on that, because a re-list
//! triggers reconciles only once it is done (`operator::watches`).

use std::collections::HashSet;

use futures::{Stream, StreamExt, TryStreamExt};
use kube::Resource;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher::{self, InitialListStrategy};
use tracing::{info, warn};

/// Objects per list request, where lists are paged. A page and its body are held whole while
/// listing; with kube-runtime's 500, re-listing every watch at once held six such pages.
pub const LIST_PAGE: u32 = 100;

/// A watch of `selector`'s objects (all for `None`), listed as `lists` says (`initial_lists`).
/// Paged lists are consistent reads (the default).
pub fn watch_config(selector: Option<&str>, lists: InitialListStrategy) -> watcher::Config {
    let config = match lists {
        InitialListStrategy::StreamingList => watcher::Config::default().streaming_lists(),
        InitialListStrategy::ListWatch => watcher::Config::default().page_size(LIST_PAGE),
    };
    match selector {
        Some(selector) => config.labels(selector),
        None => config,
    }
}

/// A label selector no object matches: the probe's watch lists nothing.
const NOTHING: &str = "opensource-server.mieweb.org/none,!opensource-server.mieweb.org/none";
/// How long the probe's watch stays open on the server, and how long we wait for it.
const PROBE_WATCH_SECONDS: u32 = 1;
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// The annotation of the bookmark that ends a streamed list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How this API server lists for a watch: streamed as the watch's first events (WatchList,
/// KEP-3157; on by default in 1.32 and from 1.34) if it can, else paged. Asked once, logged.
///
/// A streamed list holds one object at a time instead of a page and its body; paged re-lists
/// left resident memory about 2 MiB higher after each API server restart (`make soak`). A
/// streamed list comes from the watch cache, not a quorum read; later changes arrive as watch
/// events.
pub async fn initial_lists<K>(api: &Api<K>) -> InitialListStrategy
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let lists = probe_lists(api).await;
    match &lists {
        Lists::Streamed => info!("{lists}"),
        Lists::Paged { .. } => info!("{lists}"),
        Lists::Unknown { .. } => warn!("{lists}"),
    }
    lists.strategy()
}

/// The answer to "does the API server stream lists?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lists {
    /// It streamed the probe's (empty) list and ended it with its bookmark.
    Streamed,
    /// It does not: refused in its own words (WatchList off), or a plain watch that ended
    /// without a list (before 1.27).
    Paged { refusal: Option<String> },
    /// No clear answer (error, unexpected event, timeout): page, which works everywhere.
    Unknown { reason: String },
}

impl Lists {
    pub fn strategy(&self) -> InitialListStrategy {
        match self {
            Lists::Streamed => InitialListStrategy::StreamingList,
            Lists::Paged { .. } | Lists::Unknown { .. } => InitialListStrategy::ListWatch,
        }
    }
}

impl std::fmt::Display for Lists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lists::Streamed => write!(f, "lists streamed as watch events"),
            Lists::Paged { refusal: None } => {
                write!(f, "lists paged, {LIST_PAGE} objects a page: the API server does not stream them")
            }
            Lists::Paged { refusal: Some(refusal) } => {
                write!(f, "lists paged, {LIST_PAGE} objects a page: the API server does not stream them ({refusal})")
            }
            Lists::Unknown { reason } => {
                write!(
                    f,
                    "lists paged, {LIST_PAGE} objects a page: could not tell whether the API server streams them: {reason}"
                )
            }
        }
    }
}

/// Ask whether the API server streams lists, by a watch of `api` that lists nothing.
pub async fn probe_lists<K>(api: &Api<K>) -> Lists
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let probe = WatchParams::streaming_lists().labels(NOTHING).timeout(PROBE_WATCH_SECONDS);
    let first = async { api.watch(&probe, "0").await?.boxed().try_next().await };
    match tokio::time::timeout(PROBE_WAIT, first).await {
        Ok(Ok(Some(event))) if ends_streamed_list(&event) => Lists::Streamed,
        // Refused (WatchList off), or not understood (before 1.27: a plain watch that lists
        // nothing here and ends).
        Ok(Err(kube::Error::Api(status))) if status.code == 422 => Lists::Paged { refusal: Some(status.message) },
        Ok(Ok(None)) => Lists::Paged { refusal: None },
        Ok(Err(err)) => Lists::Unknown { reason: format!("asking failed: {err}") },
        Ok(Ok(Some(event))) => {
            Lists::Unknown { reason: format!("the probe's list did not end as a streamed list does: {event:?}") }
        }
        Err(_) => Lists::Unknown { reason: format!("no answer within {PROBE_WAIT:?}") },
    }
}

fn ends_streamed_list<K>(event: &WatchEvent<K>) -> bool {
    matches!(event, WatchEvent::Bookmark(mark) if mark.metadata.annotations.contains_key(INITIAL_EVENTS_END))
}

/// `reflect`, with a re-list taken in place (see the module).
pub trait ReflectInPlace<K>: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Sized
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Default,
{
    fn reflect_in_place(self, writer: Writer<K>) -> impl Stream<Item = Self::Item> {
        let mut store = InPlace::new(writer);
        self.map(move |event| event.map(|event| store.apply(event)))
    }
}

impl<K, S> ReflectInPlace<K> for S
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Default,
{
}

/// Keys listed so far by a re-list, so what it did not list is forgotten when it ends: an
/// object deleted during a watch gap produces no event. Shared by every map kept beside a
/// watch (the caches here, `PerObject`, `ByUid`).
#[derive(Debug)]
pub struct Relist<T> {
    listing: Option<HashSet<T>>,
}

impl<T> Default for Relist<T> {
    fn default() -> Self {
        Relist { listing: None }
    }
}

impl<T: Eq + std::hash::Hash> Relist<T> {
    /// Follow `event` (`key` names the object; `None`: not kept). When a list ends, returns the
    /// keys it listed. A restarted list starts counting again; what it already applied is newer
    /// than the gap and stays.
    pub fn observe<K>(&mut self, event: &watcher::Event<K>, key: impl FnOnce(&K) -> Option<T>) -> Option<HashSet<T>> {
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashSet::new());
                None
            }
            watcher::Event::InitApply(object) => {
                if let Some(key) = key(object) {
                    self.listing.get_or_insert_with(HashSet::new).insert(key);
                }
                None
            }
            watcher::Event::InitDone => self.listing.take(),
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => None,
        }
    }
}

/// A store's writer, and what the re-list under way has listed so far.
struct InPlace<K: Resource + Clone + 'static>
where
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    writer: Writer<K>,
    reader: Store<K>,
    /// Whether the first list is done (the store is ready).
    listed_once: bool,
    relist: Relist<ObjectRef<K>>,
}

impl<K> InPlace<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Default,
{
    fn new(writer: Writer<K>) -> Self {
        let reader = writer.as_reader();
        InPlace { writer, reader, listed_once: false, relist: Relist::default() }
    }

    /// Apply `event` to the store and pass it on unchanged.
    fn apply(&mut self, event: watcher::Event<K>) -> watcher::Event<K> {
        if !self.listed_once {
            self.listed_once = matches!(event, watcher::Event::InitDone);
            self.writer.apply_watcher_event(&event);
            return event;
        }
        let listed = self.relist.observe(&event, |object| Some(key(object)));
        match event {
            watcher::Event::InitApply(object) => {
                // Unchanged by the gap (same resourceVersion): keep the cached copy; a new one
                // would be allocated among the list's garbage and fragment the heap.
                let version = object.meta().resource_version.as_deref();
                let unchanged = version.is_some()
                    && self
                        .reader
                        .get(&key(&object))
                        .is_some_and(|cached| cached.meta().resource_version.as_deref() == version);
                if unchanged {
                    return watcher::Event::InitApply(object);
                }
                // As an Apply, which the writer stores at once; moved in and out, not copied.
                let applied = watcher::Event::Apply(object);
                self.writer.apply_watcher_event(&applied);
                match applied {
                    watcher::Event::Apply(object) => watcher::Event::InitApply(object),
                    other => other,
                }
            }
            watcher::Event::InitDone => {
                let listed = listed.unwrap_or_default();
                for object in self.reader.state() {
                    if !listed.contains(&key(&object)) {
                        self.writer.apply_watcher_event(&watcher::Event::Delete(K::clone(&object)));
                    }
                }
                event
            }
            watcher::Event::Init => event,
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                self.writer.apply_watcher_event(&event);
                event
            }
        }
    }
}

/// The object's store key: namespace and name, without the resourceVersion and UID an
/// `ObjectRef` may carry.
fn key<K: Resource>(object: &K) -> ObjectRef<K>
where
    K::DynamicType: Default,
{
    let mut key = ObjectRef::from_obj_with(object, K::DynamicType::default());
    key.extra = Default::default();
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::sync::Arc;
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};

    fn object(name: &str, version: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some("ns".into());
        c.metadata.name = Some(name.into());
        c.metadata.resource_version = Some(version.into());
        c
    }

    fn versions(store: &Store<ConfigMap>) -> Vec<(String, String)> {
        let mut all: Vec<_> = store
            .state()
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), c.metadata.resource_version.clone().unwrap()))
            .collect();
        all.sort();
        all
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    /// A store whose first list held `listed` (name, resourceVersion), and its writer.
    fn listed(listed: &[(&str, &str)]) -> (Store<ConfigMap>, InPlace<ConfigMap>) {
        let (reader, writer) = kube::runtime::reflector::store();
        let mut store = InPlace::new(writer);
        store.apply(Init);
        for (name, version) in listed {
            store.apply(InitApply(object(name, version)));
        }
        store.apply(InitDone);
        (reader, store)
    }

    fn cached(reader: &Store<ConfigMap>, name: &str) -> Arc<ConfigMap> {
        reader.get(&ObjectRef::new(name).within("ns")).unwrap()
    }

    /// A watch event as the API server sends it.
    fn sent(event: serde_json::Value) -> WatchEvent<ConfigMap> {
        serde_json::from_value(event).unwrap()
    }

    #[test]
    fn a_streamed_list_is_known_by_the_bookmark_that_ends_it() {
        let mark = |annotations: serde_json::Value| {
            sent(serde_json::json!({"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"resourceVersion": "12", "annotations": annotations}}}))
        };
        assert!(ends_streamed_list(&mark(serde_json::json!({"k8s.io/initial-events-end": "true"}))));
        // A bookmark of a watch that only watches (a server that ignored sendInitialEvents).
        assert!(!ends_streamed_list(&mark(serde_json::json!({}))));
        let added = sent(serde_json::json!({"type": "ADDED", "object": object("a", "1")}));
        assert!(!ends_streamed_list(&added));
    }

    #[test]
    fn the_first_list_is_reflected_whole_and_makes_the_store_ready() {
        let (reader, writer) = kube::runtime::reflector::store();
        let mut store = InPlace::new(writer);
        store.apply(Init);
        store.apply(InitApply(object("a", "1")));
        assert!(reader.is_empty(), "the first list reaches the store at its end, as kube-runtime's");
        store.apply(InitDone);
        assert_eq!(versions(&reader), pairs(&[("a", "1")]));
        assert!(futures::executor::block_on(reader.wait_until_ready()).is_ok());
    }

    #[test]
    fn a_relist_replaces_each_object_as_it_is_listed_and_removes_the_unlisted_at_its_end() {
        let (reader, mut store) = listed(&[("kept", "1"), ("gone", "1")]);
        let before = cached(&reader, "kept");

        store.apply(Init);
        assert_eq!(versions(&reader), pairs(&[("gone", "1"), ("kept", "1")]), "the cache stays whole");
        store.apply(InitApply(object("kept", "2")));
        assert_eq!(versions(&reader), pairs(&[("gone", "1"), ("kept", "2")]), "taken in at once");
        assert_eq!(Arc::strong_count(&before), 1, "the old copy is the caller's alone: freed when it lets go");
        store.apply(InitApply(object("new", "3")));
        store.apply(InitDone);
        assert_eq!(versions(&reader), pairs(&[("kept", "2"), ("new", "3")]), "deleted during the gap: gone");

        store.apply(Apply(object("new", "4")));
        store.apply(Delete(object("kept", "2")));
        assert_eq!(versions(&reader), pairs(&[("new", "4")]), "watch events as ever");
    }

    #[test]
    fn an_object_the_gap_did_not_change_keeps_its_cached_copy() {
        let (reader, mut store) = listed(&[("same", "1"), ("changed", "1")]);
        let (same, changed) = (cached(&reader, "same"), cached(&reader, "changed"));
        for event in [Init, InitApply(object("same", "1")), InitApply(object("changed", "2")), InitDone] {
            store.apply(event);
        }
        assert!(Arc::ptr_eq(&same, &cached(&reader, "same")), "kept");
        assert!(!Arc::ptr_eq(&changed, &cached(&reader, "changed")), "replaced");
        assert_eq!(versions(&reader), pairs(&[("changed", "2"), ("same", "1")]));
    }

    #[test]
    fn a_relist_that_restarts_keeps_what_it_listed_before() {
        let (reader, mut store) = listed(&[("a", "1"), ("b", "1")]);
        for event in [Init, InitApply(object("a", "2")), Init, InitApply(object("b", "2"))] {
            store.apply(event);
        }
        assert_eq!(versions(&reader), pairs(&[("a", "2"), ("b", "2")]));
        store.apply(InitApply(object("a", "3")));
        store.apply(InitDone);
        assert_eq!(versions(&reader), pairs(&[("a", "3"), ("b", "2")]));
    }

    #[test]
    fn events_go_on_unchanged() {
        let (_, writer) = kube::runtime::reflector::store();
        let mut store = InPlace::new(writer);
        for event in [Init, InitDone, Init] {
            assert_eq!(std::mem::discriminant(&store.apply(event.clone())), std::mem::discriminant(&event));
        }
        let InitApply(listed) = store.apply(InitApply(object("a", "1"))) else { panic!("not an InitApply") };
        assert_eq!(listed.metadata.resource_version.as_deref(), Some("1"));
    }
}
