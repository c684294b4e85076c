//! The claims room: one PersistentVolumeClaim per entry of `spec.volumes`, its desired state
//! built purely from the CR (and, for the size, the live claim: a claim never shrinks), and
//! the rule that says whether a live claim is this workload's. Pure and unit-tested.
//!
//! Retention. A `Delete` volume's claim carries the workload as its controller, so garbage
//! collection removes it with the workload. A `Retain` volume's claim (the default) carries
//! no owner reference at all: nothing removes it, and the operator never deletes a claim.
//!
//! Whose claim is it, without an owner reference? A claim is this workload's when either
//! - its controller reference is this workload (by UID), or
//! - it has no controller reference, and it carries every mark the operator puts on the claims
//!   it makes: `app.kubernetes.io/managed-by: mw-operator`, `app.kubernetes.io/instance:
//!   <workload>`, the annotation `opensource-server.mieweb.org/volume-of: <workload>/<volume>`,
//!   and a server-side apply record of the operator's field manager.
//!
//! So a workload re-created under the same name in the same namespace re-attaches the claims
//! its predecessor retained, and a claim made by hand, by another tool, or for another
//! workload whose name happens to produce the same claim name is never touched: it blocks
//! the workload (as a foreign Deployment does) until it is removed or renamed.
//!
//! Trust model: these marks guard against accidents, not against a namespace member acting in
//! bad faith. Whoever may create claims in the namespace can forge all of them (labels,
//! annotation, even the field manager's name); but such a person can also mount that claim,
//! or the workload's own, in a Pod of their own. The namespace is the trust boundary, as it is
//! for a StatefulSet, which re-attaches any claim of the right name with no check at all.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::ownership::{FIELD_MANAGER, INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGER_NAME, labels, stamp_applied_hash};
use crate::resource::{ManagedWorkload, RetentionPolicy, Volume};

/// The operator's mark on every claim it makes: `<workload>/<volume>`.
pub const VOLUME_OF_ANNOTATION: &str = "opensource-server.mieweb.org/volume-of";

/// The claim of volume `volume` of workload `workload`: `<workload>-<volume>`. Two names that
/// produce the same claim name (`a-b` + `c`, `a` + `b-c`) cannot both have it: the second
/// sees a claim marked for another workload and reports a conflict.
pub fn claim_name(workload: &str, volume: &str) -> String {
    format!("{workload}-{volume}")
}

fn volume_of(mw: &ManagedWorkload, volume: &Volume) -> String {
    format!("{}/{}", mw.name_any(), volume.name)
}

/// The desired claim of `volume`, ready for server-side apply. `live` is the claim as it is,
/// if it exists: its requested size is kept when larger than the spec's (a re-created
/// workload asking for less than its predecessor's claim has re-attaches it as it is; the
/// CRD itself refuses shrinking a volume). `None` when the CR has no UID yet.
pub fn claim(
    mw: &ManagedWorkload,
    volume: &Volume,
    live: Option<&PersistentVolumeClaim>,
) -> Option<PersistentVolumeClaim> {
    let owner = mw.controller_owner_ref(&())?;
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
            annotations: Some(BTreeMap::from([(VOLUME_OF_ANNOTATION.to_string(), volume_of(mw, volume))])),
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

/// `claim` (the live claim of `volume`) is this workload's: see the module documentation.
pub fn is_own(claim: &PersistentVolumeClaim, mw: &ManagedWorkload, volume: &Volume) -> bool {
    if let Some(controller) = claim.owner_references().iter().find(|o| o.controller == Some(true)) {
        return mw.uid().is_some_and(|uid| controller.uid == uid);
    }
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

/// A quantity in bytes, for comparing sizes (`1Gi` > `1000Mi`). Decimal and binary suffixes
/// and exponents; None for anything else (then no comparison is made).
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
        let c = claim(&mw, &volume(None), None).unwrap();
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
        assert_eq!(claim(&mw, &rwop, None).unwrap().spec.unwrap().access_modes.unwrap(), vec!["ReadWriteOncePod"]);
    }

    #[test]
    fn retain_has_no_owner_and_delete_is_owned_by_the_workload() {
        let mw = workload("u1");
        assert!(claim(&mw, &volume(None), None).unwrap().metadata.owner_references.is_none(), "Retain by default");
        assert!(claim(&mw, &volume(Some(RetentionPolicy::Retain)), None).unwrap().metadata.owner_references.is_none());
        let owned = claim(&mw, &volume(Some(RetentionPolicy::Delete)), None).unwrap();
        let owner = &owned.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.uid.as_str(), owner.controller), ("u1", Some(true)));
    }

    #[test]
    fn a_claim_never_shrinks() {
        let mw = workload("u1");
        let mut bigger = claim(&mw, &volume(None), None).unwrap();
        bigger.spec.as_mut().unwrap().resources.as_mut().unwrap().requests =
            Some(BTreeMap::from([("storage".into(), Quantity("2Gi".into()))]));
        assert_eq!(requested(&claim(&mw, &volume(None), Some(&bigger)).unwrap()).as_deref(), Some("2Gi"));
        let mut grown = volume(None);
        grown.size = "3G".into();
        assert_eq!(requested(&claim(&mw, &grown, Some(&bigger)).unwrap()).as_deref(), Some("3G"));
    }

    #[test]
    fn whose_claim_it_is() {
        let mw = workload("u1");
        let retained = stored(claim(&mw, &volume(None), None).unwrap());
        assert!(is_own(&retained, &mw, &volume(None)), "made by this workload");
        let successor = workload("u2");
        assert!(is_own(&retained, &successor, &volume(None)), "a re-created workload re-attaches a retained claim");

        let owned = stored(claim(&mw, &volume(Some(RetentionPolicy::Delete)), None).unwrap());
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
        let theirs = stored(claim(&other, &x, None).unwrap());
        let mut mine = volume(None);
        mine.name = "x-data".into();
        assert_eq!(claim(&mw, &mine, None).unwrap().metadata.name, theirs.metadata.name);
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
