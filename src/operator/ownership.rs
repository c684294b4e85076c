//! What every owned object shares, whatever its kind: the field manager, the labels that mark
//! it as a workload's, the controller ownerReference, and the applied fingerprint. Pure.

use std::collections::BTreeMap;

use kube::{Resource, ResourceExt};

use crate::names::{
    APPLIED_HASH_ANNOTATION, CONTAINER_ID_LABEL, INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGED_LABEL, NODE_ID_LABEL,
};
use crate::resource::ManagedWorkload;
/// Field manager for everything the operator applies. Never change it: the old manager would
/// keep owning fields that could then never be removed.
pub const FIELD_MANAGER: &str = "mw-operator";
/// `app.kubernetes.io/managed-by` value on everything this operator creates.
pub const MANAGER_NAME: &str = "mw-operator";

/// Labels on every owned object and the Pods, built only from the CR's name and Manager
/// identity labels, so nothing a user sets can override them.
pub fn labels(mw: &ManagedWorkload) -> BTreeMap<String, String> {
    let mut labels = selector_labels(mw);
    labels.insert(MANAGED_BY_LABEL.into(), MANAGER_NAME.into());
    for key in [NODE_ID_LABEL, CONTAINER_ID_LABEL] {
        if let Some(value) = mw.labels().get(key) {
            labels.insert(key.into(), value.clone());
        }
    }
    labels
}

/// The labels that select the workload's Pods: only labels that never change, since a
/// Deployment's selector is immutable.
pub fn selector_labels(mw: &ManagedWorkload) -> BTreeMap<String, String> {
    BTreeMap::from([(INSTANCE_LABEL.to_string(), mw.name_any()), (MANAGED_LABEL.to_string(), "true".to_string())])
}

/// FNV-1a over the JSON form. Not std's hasher, whose output may change between Rust
/// releases: a changed template hash would roll out every workload on upgrade.
pub fn fingerprint(value: &impl serde::Serialize) -> String {
    // Serializing plain data with string keys cannot fail.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// Stamp `object` with its own fingerprint (call last, once the desired object is complete).
pub fn stamp_applied_hash<K: Resource + serde::Serialize>(object: &mut K) {
    let hash = fingerprint(&*object);
    object.meta_mut().annotations.get_or_insert_with(Default::default).insert(APPLIED_HASH_ANNOTATION.into(), hash);
}

/// The fingerprint of the desired object `object` was applied from.
pub fn applied_hash<K: Resource>(object: &K) -> Option<&str> {
    object.meta().annotations.as_ref()?.get(APPLIED_HASH_ANNOTATION).map(String::as_str)
}

/// `object` is on its way out: being deleted, or controlled by a ManagedWorkload of `mw`'s
/// name with another UID, i.e. a deleted predecessor (two cannot coexist), whose objects
/// garbage collection removes. (A `--cascade=orphan` deletion removes the reference instead,
/// making the object someone else's: a conflict.) A re-created workload waits for these.
pub fn is_departing<K: Resource>(object: &K, mw: &ManagedWorkload) -> bool {
    if object.meta().deletion_timestamp.is_some() {
        return true;
    }
    let (api_version, kind) = (ManagedWorkload::api_version(&()), ManagedWorkload::kind(&()));
    object.owner_references().iter().any(|o| {
        o.controller == Some(true)
            && o.api_version == api_version
            && o.kind == kind
            && o.name == mw.name_any()
            && mw.uid().is_some_and(|uid| o.uid != uid)
    })
}

/// `object` has `mw` as its controller, by UID (a re-created workload of the same name does
/// not own its predecessor's objects).
pub fn is_controlled_by<K: Resource>(object: &K, mw: &ManagedWorkload) -> bool {
    let uid = mw.uid();
    object.owner_references().iter().any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn controlled_means_the_controller_reference_with_this_uid() {
        let mut mw = ManagedWorkload::new("web", Default::default());
        mw.metadata.uid = Some("u1".into());
        let mut d = Deployment::default();
        let owner = |uid: &str, controller| OwnerReference {
            uid: uid.into(),
            controller: Some(controller),
            ..Default::default()
        };
        d.metadata.owner_references = Some(vec![owner("u1", false), owner("u2", true)]);
        assert!(!is_controlled_by(&d, &mw), "an owner that is not the controller, or another UID");
        d.metadata.owner_references.as_mut().unwrap().push(owner("u1", true));
        assert!(is_controlled_by(&d, &mw));
    }

    #[test]
    fn the_applied_hash_is_of_the_object_without_it() {
        let mut d = Deployment::default();
        d.metadata.name = Some("web".into());
        let before = fingerprint(&d);
        stamp_applied_hash(&mut d);
        assert_eq!(applied_hash(&d), Some(before.as_str()));
        assert_eq!(fingerprint(&"x"), fingerprint(&"x"), "stable");
        assert_ne!(fingerprint(&"x"), fingerprint(&"y"));
    }
}
