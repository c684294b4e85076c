//! A map keyed by object UID, kept in step with a watch: what a re-list does not list is
//! forgotten when it ends (`reflect::Relist`), since a deletion during a watch gap comes as no
//! event. For what the operator keeps of a kind without caching its objects.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use kube::Resource;
use kube::runtime::watcher;

use crate::reflect::Relist;

/// An object's UID as a key: the UUID's 128 bits in place (as a `String`, each key was an
/// extra 48-byte allocation). A UID that is not a UUID (only hand-made objects) is kept as a
/// hash of its text with the top bit set: such a hash could collide, two UUIDs never do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Uid(u128);

impl Uid {
    pub fn of(uid: &str) -> Uid {
        let bytes = uid.as_bytes();
        let dashes_in_place = bytes.len() == 36 && [8, 13, 18, 23].iter().all(|&i| bytes[i] == b'-');
        let digits = bytes.iter().filter(|&&b| b != b'-');
        let parsed = dashes_in_place
            .then(|| digits.map(|&b| char::from(b).to_digit(16)).try_fold(0u128, |n, d| Some(n << 4 | u128::from(d?))))
            .flatten();
        parsed.map_or_else(
            || {
                let mut hasher = DefaultHasher::new();
                uid.hash(&mut hasher);
                Uid(1 << 127 | u128::from(hasher.finish()))
            },
            Uid,
        )
    }
}

#[derive(Debug)]
pub struct ByUid<V> {
    entries: HashMap<Uid, V>,
    relist: Relist<Uid>,
}

impl<V> Default for ByUid<V> {
    fn default() -> Self {
        ByUid { entries: HashMap::new(), relist: Relist::default() }
    }
}

impl<V: PartialEq> ByUid<V> {
    /// Follow one watch event; `value` is what an object maps to (`None`: nothing to keep, or no
    /// UID). Says whether an `Apply` changed the entry.
    pub fn observe<K: Resource>(&mut self, event: &watcher::Event<K>, value: impl Fn(&K) -> Option<V>) -> bool {
        let uid = |object: &K| object.meta().uid.as_deref().map(Uid::of);
        if let Some(listed) = self.relist.observe(event, uid) {
            self.entries.retain(|uid, _| listed.contains(uid));
        }
        match event {
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => match (uid(object), value(object)) {
                (Some(uid), Some(value)) => {
                    let changed = self.entries.get(&uid) != Some(&value);
                    self.entries.insert(uid, value);
                    changed && matches!(event, watcher::Event::Apply(_))
                }
                _ => false,
            },
            watcher::Event::Delete(object) => {
                if let Some(uid) = uid(object) {
                    self.entries.remove(&uid);
                }
                false
            }
            watcher::Event::Init | watcher::Event::InitDone => false,
        }
    }

    pub fn get(&self, uid: &str) -> Option<&V> {
        self.entries.get(&Uid::of(uid))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn object(uid: &str, value: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.uid = Some(uid.into());
        cm.data = Some([("v".to_string(), value.to_string())].into());
        cm
    }

    fn value(cm: &ConfigMap) -> Option<String> {
        cm.data.as_ref()?.get("v").cloned()
    }

    #[test]
    fn a_uuid_is_its_128_bits_and_anything_else_a_hash() {
        let uid = Uid::of("8babc3c4-a8c1-489a-b498-3d50ed9d8868");
        assert_eq!(uid, Uid(0x8babc3c4_a8c1_489a_b498_3d50ed9d8868));
        assert_eq!(Uid::of("8BABC3C4-A8C1-489A-B498-3D50ED9D8868"), uid, "hex digits of either case");
        assert_ne!(Uid::of("8babc3c4-a8c1-489a-b498-3d50ed9d8869"), uid);
        for other in ["u1", "", "8babc3c4a8c1489ab4983d50ed9d8868aaaa", "8babc3c4-a8c1-489a-b498-3d50ed9d886g"] {
            assert_eq!(Uid::of(other), Uid::of(other), "{other}: the same each time");
            assert!(Uid::of(other).0 >> 127 == 1, "{other}: a hash");
        }
        assert_ne!(Uid::of("u1"), Uid::of("u2"));
    }

    #[test]
    fn follows_events_and_says_what_changed() {
        let mut map = ByUid::default();
        assert!(map.observe(&watcher::Event::Apply(object("a", "1")), value), "new");
        assert!(!map.observe(&watcher::Event::Apply(object("a", "1")), value), "the same again");
        assert!(map.observe(&watcher::Event::Apply(object("a", "2")), value), "a new value");
        assert!(!map.observe(&watcher::Event::Apply(ConfigMap::default()), value), "no UID: nothing kept");
        assert_eq!(map.get("a").map(String::as_str), Some("2"));
        assert!(!map.observe(&watcher::Event::Delete(object("a", "2")), value));
        assert!(map.is_empty());
    }

    #[test]
    fn a_relist_updates_as_it_lists_and_forgets_the_unlisted_when_it_is_done() {
        let mut map = ByUid::default();
        map.observe(&watcher::Event::Apply(object("gone", "1")), value);
        map.observe(&watcher::Event::Apply(object("kept", "1")), value);
        map.observe(&watcher::Event::<ConfigMap>::Init, value);
        map.observe(&watcher::Event::InitApply(object("kept", "2")), value);
        map.observe(&watcher::Event::InitApply(object("new", "1")), value);
        // As the caches do: what is listed is current at once; the rest waits for the end.
        assert_eq!(map.len(), 3, "nothing is forgotten before the re-list is done");
        assert_eq!(map.get("kept").map(String::as_str), Some("2"));
        map.observe(&watcher::Event::<ConfigMap>::InitDone, value);
        assert_eq!(map.get("gone"), None, "deleted during the gap");
        assert_eq!(map.get("kept").map(String::as_str), Some("2"));
        assert_eq!(map.len(), 2);
    }
}
