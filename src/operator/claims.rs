//! The claims: one PersistentVolumeClaim per entry of `spec.volumes`, built purely from the
//! CR (and the live claim, since a claim never shrinks), and the rule for whether a live claim
//! is this workload's. Pure and unit-tested.
//!
//! Retention: a `Delete` volume's claim has the workload as controller, so garbage collection
//! removes it with the workload. A `Retain` volume's claim (the default) has no owner
//! reference, and the operator never deletes a claim.
//!
//! Whose is a claim? It is this workload's when its controller is this workload (by UID), or
//! when it has no controller, carries every mark the operator puts on its claims (managed-by,
//! instance, `volume-of: <workload>/<volume>`, an apply record of our field manager), and:
//! - its `workload-uid` annotation is this workload's UID (on claims older than that mark:
//!   the claim is younger than the workload); or
//! - it was retained by a predecessor of the same owner. A Manager workload's owner is its
//!   Manager user and node (the `owner` annotation and `node-id` label): Manager lets anyone
//!   reuse a deleted container's hostname, so user B's new `app` must never mount user A's old
//!   disk, while A re-creating `app` gets the data back. A hand-written workload's owner is the
//!   namespace, so a re-created workload re-attaches its predecessor's claims, as a
//!   StatefulSet's Pod does.
//!
//! Any other claim of that name is never touched or mounted: it blocks the workload
//! (`ClaimConflict`). These marks guard against accidents and Manager's users, not a
//! namespace member in bad faith (who could forge them, or mount the claim directly): the
//! namespace is the trust boundary.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::ownership::{FIELD_MANAGER, MANAGER_NAME, labels, stamp_applied_hash};
use crate::names::{
    INSTANCE_LABEL, MANAGED_BY_LABEL, NODE_ID_LABEL, OWNER_ANNOTATION, REPLACED_ANNOTATION, VOLUME_OF_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
};
use crate::resource::{ManagedWorkload, RetentionPolicy, Volume};
/// `<workload>-<volume>`. Two pairs giving the same name (`a-b` + `c`, `a` + `b-c`) cannot
/// both have it: the second sees a claim marked for another workload, a conflict.
pub fn claim_name(workload: &str, volume: &str) -> String {
    format!("{workload}-{volume}")
}

fn volume_of(mw: &ManagedWorkload, volume: &Volume) -> String {
    format!("{}/{}", mw.name_any(), volume.name)
}

/// The desired claim of `volume`, ready for server-side apply; `None` when the CR has no UID
/// yet. The live claim's size is kept when larger (a claim never shrinks, say after a refused
/// expansion or a re-created workload asking for less). `replacing`: made where a claim of
/// that name was just deleted, so it starts empty (`REPLACED_ANNOTATION`, kept afterwards).
pub fn claim(
    mw: &ManagedWorkload,
    volume: &Volume,
    live: Option<&PersistentVolumeClaim>,
    replacing: bool,
) -> Option<PersistentVolumeClaim> {
    let owner = mw.controller_owner_ref(&())?;
    let mut annotations = BTreeMap::from([
        (VOLUME_OF_ANNOTATION.to_string(), volume_of(mw, volume)),
        (WORKLOAD_UID_ANNOTATION.to_string(), owner.uid.clone()),
    ]);
    if let Some(user) = mw.annotations().get(OWNER_ANNOTATION) {
        annotations.insert(OWNER_ANNOTATION.to_string(), user.clone());
    }
    if let Some(since) = live.and_then(|c| c.annotations().get(REPLACED_ANNOTATION)) {
        annotations.insert(REPLACED_ANNOTATION.to_string(), since.clone());
    } else if replacing {
        annotations.insert(REPLACED_ANNOTATION.to_string(), "true".to_string());
    }
    let mut size = volume.size.clone();
    if let Some(current) = live.and_then(requested)
        && let (Some(c), Some(s)) = (bytes(&current), bytes(&size))
        && c > s
    {
        size = current;
    }
    let mut claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim_name(&mw.name_any(), &volume.name)),
            namespace: mw.namespace(),
            labels: Some(labels(mw)),
            annotations: Some(annotations),
            owner_references: (volume.retention_policy() == RetentionPolicy::Delete).then(|| vec![owner]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![volume.access_mode().as_str().to_string()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(size))])),
                limits: None,
            }),
            storage_class_name: volume.storage_class_name.clone(),
            ..Default::default()
        }),
        status: None,
    };
    stamp_applied_hash(&mut claim);
    Some(claim)
}

/// The size a claim asks for.
pub fn requested(claim: &PersistentVolumeClaim) -> Option<String> {
    claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?.get("storage").map(|q| q.0.clone())
}

/// The size the bound volume provides.
pub fn capacity(claim: &PersistentVolumeClaim) -> Option<String> {
    claim.status.as_ref()?.capacity.as_ref()?.get("storage").map(|q| q.0.clone())
}

/// `claim` (the live claim of `volume`) is this workload's: see the module comment.
pub fn is_own(claim: &PersistentVolumeClaim, mw: &ManagedWorkload, volume: &Volume) -> bool {
    if let Some(controller) = claim.owner_references().iter().find(|o| o.controller == Some(true)) {
        return mw.uid().is_some_and(|uid| controller.uid == uid);
    }
    made_by_operator(claim, mw, volume) && (attached_to(claim, mw) || owner(claim) == owner(mw))
}

/// Whose data an operator-made claim for `mw`'s name holds when it is not `mw`'s, for the
/// conflict message. None for any other claim.
pub fn retained_for_another(claim: &PersistentVolumeClaim, mw: &ManagedWorkload, volume: &Volume) -> Option<String> {
    if !claim.owner_references().is_empty() || !made_by_operator(claim, mw, volume) || is_own(claim, mw, volume) {
        return None;
    }
    Some(match owner(claim) {
        Owner::Manager { node, user } => format!("Manager user {user} on node {node}"),
        Owner::Namespace => "a workload of this name that was not made by Manager".to_string(),
    })
}

fn made_by_operator(claim: &PersistentVolumeClaim, mw: &ManagedWorkload, volume: &Volume) -> bool {
    let labels = claim.labels();
    labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGER_NAME)
        && labels.get(INSTANCE_LABEL) == Some(&mw.name_any())
        && claim.annotations().get(VOLUME_OF_ANNOTATION) == Some(&volume_of(mw, volume))
        && claim
            .meta()
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some(FIELD_MANAGER) && m.operation.as_deref() == Some("Apply"))
}

/// The claim carries `mw`'s UID, or (made before that mark existed) is younger than `mw`,
/// so no predecessor made it.
fn attached_to(claim: &PersistentVolumeClaim, mw: &ManagedWorkload) -> bool {
    match claim.annotations().get(WORKLOAD_UID_ANNOTATION) {
        Some(uid) => mw.uid().as_ref() == Some(uid),
        None => match (&claim.metadata.creation_timestamp, &mw.metadata.creation_timestamp) {
            (Some(made), Some(workload)) => made.0 >= workload.0,
            _ => false,
        },
    }
}

/// Whose a workload's data is, from the Manager identity on the workload or its claim.
#[derive(Debug, PartialEq, Eq)]
enum Owner {
    /// A Manager user on a Manager node.
    Manager { node: String, user: String },
    /// Not made for Manager (or the identity is incomplete): whoever may write in the namespace.
    Namespace,
}

fn owner<K: Resource>(object: &K) -> Owner {
    let node = object.meta().labels.as_ref().and_then(|l| l.get(NODE_ID_LABEL));
    let user = object.meta().annotations.as_ref().and_then(|a| a.get(OWNER_ANNOTATION));
    match (node, user) {
        (Some(node), Some(user)) => Owner::Manager { node: node.clone(), user: user.clone() },
        _ => Owner::Namespace,
    }
}

/// A quantity in bytes, to compare sizes (`1Gi` > `1000Mi`). None for what it cannot parse
/// (then no comparison is made).
pub fn bytes(quantity: &str) -> Option<f64> {
    let q = quantity.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * factor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{AccessMode, ManagedWorkloadSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};

    fn workload(uid: &str) -> ManagedWorkload {
        let mut mw = ManagedWorkload::new("web", ManagedWorkloadSpec { image: "nginx".into(), ..Default::default() });
        mw.metadata.namespace = Some("apps".into());
        mw.metadata.uid = Some(uid.into());
        mw
    }

    fn volume(policy: Option<RetentionPolicy>) -> Volume {
        Volume {
            name: "data".into(),
            mount_path: "/data".into(),
            size: "1Gi".into(),
            storage_class_name: Some("local".into()),
            access_mode: None,
            retention_policy: policy,
        }
    }

    /// As the API server stores what the operator applied.
    fn stored(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
        claim.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(FIELD_MANAGER.into()),
            operation: Some("Apply".into()),
            ..Default::default()
        }]);
        claim
    }

    #[test]
    fn a_claim_per_volume_named_labelled_and_marked() {
        let mw = workload("u1");
        let c = claim(&mw, &volume(None), None, false).unwrap();
        assert_eq!(c.metadata.name.as_deref(), Some("web-data"));
        assert_eq!(c.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(c.labels()[INSTANCE_LABEL], "web");
        assert_eq!(c.labels()[MANAGED_BY_LABEL], MANAGER_NAME);
        assert_eq!(c.annotations()[VOLUME_OF_ANNOTATION], "web/data");
        let spec = c.spec.as_ref().unwrap();
        assert_eq!(spec.access_modes.as_deref(), Some(&["ReadWriteOnce".to_string()][..]));
        assert_eq!(requested(&c).as_deref(), Some("1Gi"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("local"));
        let mut rwop = volume(None);
        rwop.access_mode = Some(AccessMode::ReadWriteOncePod);
        assert_eq!(
            claim(&mw, &rwop, None, false).unwrap().spec.unwrap().access_modes.unwrap(),
            vec!["ReadWriteOncePod"]
        );
    }

    #[test]
    fn retain_has_no_owner_and_delete_is_owned_by_the_workload() {
        let mw = workload("u1");
        assert!(
            claim(&mw, &volume(None), None, false).unwrap().metadata.owner_references.is_none(),
            "Retain by default"
        );
        assert!(
            claim(&mw, &volume(Some(RetentionPolicy::Retain)), None, false)
                .unwrap()
                .metadata
                .owner_references
                .is_none()
        );
        let owned = claim(&mw, &volume(Some(RetentionPolicy::Delete)), None, false).unwrap();
        let owner = &owned.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.uid.as_str(), owner.controller), ("u1", Some(true)));
    }

    #[test]
    fn a_claim_never_shrinks() {
        let mw = workload("u1");
        let mut bigger = claim(&mw, &volume(None), None, false).unwrap();
        bigger.spec.as_mut().unwrap().resources.as_mut().unwrap().requests =
            Some(BTreeMap::from([("storage".into(), Quantity("2Gi".into()))]));
        assert_eq!(requested(&claim(&mw, &volume(None), Some(&bigger), false).unwrap()).as_deref(), Some("2Gi"));
        let mut grown = volume(None);
        grown.size = "3G".into();
        assert_eq!(requested(&claim(&mw, &grown, Some(&bigger), false).unwrap()).as_deref(), Some("3G"));
    }

    fn of_manager(mut mw: ManagedWorkload, node: &str, user: &str) -> ManagedWorkload {
        mw.labels_mut().insert(NODE_ID_LABEL.into(), node.into());
        mw.annotations_mut().insert(OWNER_ANNOTATION.into(), user.into());
        mw
    }

    #[test]
    fn a_retained_claim_goes_back_only_to_the_same_owner() {
        let alice = of_manager(workload("u1"), "3", "alice");
        let retained = stored(claim(&alice, &volume(None), None, false).unwrap());
        assert_eq!(retained.annotations()[WORKLOAD_UID_ANNOTATION], "u1");
        assert_eq!(retained.annotations()[OWNER_ANNOTATION], "alice");
        assert_eq!(retained.labels()[NODE_ID_LABEL], "3");
        assert!(is_own(&retained, &alice, &volume(None)));
        assert_eq!(retained_for_another(&retained, &alice, &volume(None)), None);

        // Manager lets user B take the hostname once A's container is deleted.
        let bob = of_manager(workload("u2"), "3", "bob");
        assert!(!is_own(&retained, &bob, &volume(None)), "another Manager user's data");
        assert_eq!(
            retained_for_another(&retained, &bob, &volume(None)).as_deref(),
            Some("Manager user alice on node 3")
        );
        let elsewhere = of_manager(workload("u3"), "4", "alice");
        assert!(!is_own(&retained, &elsewhere, &volume(None)), "the same user on another node");
        let by_hand = workload("u4");
        assert!(
            !is_own(&retained, &by_hand, &volume(None)),
            "a hand-written workload never gets a Manager user's disk"
        );
        let again = of_manager(workload("u5"), "3", "alice");
        assert!(is_own(&retained, &again, &volume(None)), "A re-creating the container gets the data back");

        // Once attached, it follows the workload even if Manager hands the container over.
        let handed_over = of_manager(workload("u1"), "3", "carol");
        assert!(is_own(&retained, &handed_over, &volume(None)));
        assert_eq!(
            claim(&handed_over, &volume(None), Some(&retained), false).unwrap().annotations()[OWNER_ANNOTATION],
            "carol"
        );

        // A hand-written workload's claim, and Manager's, the other way round.
        let hands = stored(claim(&by_hand, &volume(None), None, false).unwrap());
        assert!(!is_own(&hands, &again, &volume(None)), "a Manager workload never gets a hand-written one's disk");
        assert_eq!(
            retained_for_another(&hands, &again, &volume(None)).as_deref(),
            Some("a workload of this name that was not made by Manager")
        );
    }

    #[test]
    fn claims_made_before_the_uid_mark_are_judged_by_age() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |s: i64| Some(Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap()));
        let mut alice = of_manager(workload("u1"), "3", "alice");
        alice.metadata.creation_timestamp = at(100);
        let mut legacy = stored(claim(&alice, &volume(None), None, false).unwrap());
        legacy.metadata.annotations.as_mut().unwrap().retain(|k, _| k == VOLUME_OF_ANNOTATION);
        legacy.metadata.creation_timestamp = at(101);
        assert!(is_own(&legacy, &alice, &volume(None)), "made after the workload: its own (an upgrade keeps it)");
        legacy.metadata.creation_timestamp = at(50);
        assert!(!is_own(&legacy, &alice, &volume(None)), "older than the workload, of no known owner");
        let mut hands = workload("u9");
        hands.metadata.creation_timestamp = at(100);
        assert!(is_own(&legacy, &hands, &volume(None)), "a hand-written workload re-attaches by name, as before");
    }

    #[test]
    fn a_claim_made_over_a_deleted_one_says_so_for_good() {
        let mw = workload("u1");
        let fresh = claim(&mw, &volume(None), None, true).unwrap();
        assert_eq!(fresh.annotations()[REPLACED_ANNOTATION], "true");
        assert_eq!(claim(&mw, &volume(None), Some(&fresh), false).unwrap().annotations()[REPLACED_ANNOTATION], "true");
        assert!(!claim(&mw, &volume(None), None, false).unwrap().annotations().contains_key(REPLACED_ANNOTATION));
    }

    #[test]
    fn whose_claim_it_is() {
        let mw = workload("u1");
        let retained = stored(claim(&mw, &volume(None), None, false).unwrap());
        assert!(is_own(&retained, &mw, &volume(None)), "made by this workload");
        let successor = workload("u2");
        assert!(
            is_own(&retained, &successor, &volume(None)),
            "a re-created hand-written workload re-attaches a retained claim"
        );

        let owned = stored(claim(&mw, &volume(Some(RetentionPolicy::Delete)), None, false).unwrap());
        assert!(is_own(&owned, &mw, &volume(None)));
        assert!(!is_own(&owned, &successor, &volume(None)), "another workload's controller reference");

        let mut by_hand = retained.clone();
        by_hand.metadata.managed_fields = None;
        assert!(!is_own(&by_hand, &mw, &volume(None)), "not applied by the operator");
        let mut unmarked = retained.clone();
        unmarked.metadata.annotations = None;
        assert!(!is_own(&unmarked, &mw, &volume(None)), "no volume-of mark");
        let mut other = ManagedWorkload::new("web-x", mw.spec.clone());
        other.metadata.uid = Some("u3".into());
        let mut x = volume(None);
        x.name = "data".into();
        // `web` + `x-data` and `web-x` + `data` both make `web-x-data`.
        let theirs = stored(claim(&other, &x, None, false).unwrap());
        let mut mine = volume(None);
        mine.name = "x-data".into();
        assert_eq!(claim(&mw, &mine, None, false).unwrap().metadata.name, theirs.metadata.name);
        assert!(!is_own(&theirs, &mw, &mine), "a claim of another workload with the same name");
        let mut controlled_elsewhere = retained.clone();
        controlled_elsewhere.metadata.owner_references =
            Some(vec![OwnerReference { uid: "other".into(), controller: Some(true), ..Default::default() }]);
        assert!(!is_own(&controlled_elsewhere, &mw, &volume(None)));
    }

    #[test]
    fn sizes_compare_across_units() {
        assert_eq!(bytes("1Gi"), Some(1073741824.0));
        assert!(bytes("1Gi") > bytes("1000Mi"));
        assert!(bytes("1G") < bytes("1Gi"));
        assert_eq!(bytes("1e3"), Some(1000.0));
        assert_eq!(bytes("1.5Ki"), Some(1536.0));
        assert_eq!(bytes("12"), Some(12.0));
        assert_eq!(bytes("x"), None);
        assert_eq!(bytes("1Zi"), None);
    }
}
