//! The storage part of the status, pure: `status.volumes` from the workload's own claims, and
//! what a claim does to the verdict (a Lost claim fails the workload at once; a claim not yet
//! bound keeps it Creating, named, and fails it, named, at the progress deadline).

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;

use super::{Observed, Verdict};
use crate::names::REPLACED_ANNOTATION;
use crate::operator::claims::{bytes, capacity, claim_name, requested};
use crate::resource::{AccessMode, ManagedWorkload, Phase, VolumeStatus};

/// Reasons the verdict gives for a claim.
pub const CLAIM_LOST: &str = "ClaimLost";
pub const CLAIM_PENDING: &str = "ClaimPending";
pub const CLAIM_NOT_BOUND: &str = "ClaimNotBound";
pub const VOLUME_HELD_ELSEWHERE: &str = "VolumeHeldElsewhere";

/// The claim of each volume, in spec order; each message is stable (no times, no UIDs).
pub fn statuses(mw: &ManagedWorkload, observed: &Observed<'_>) -> Vec<VolumeStatus> {
    mw.spec
        .volumes
        .iter()
        .map(|v| {
            let name = claim_name(&mw.name_any(), &v.name);
            let claim = find(observed, &name);
            let refused = observed.refused.iter().find(|(c, _)| *c == name).map(|(_, why)| why);
            VolumeStatus {
                name: v.name.clone(),
                phase: claim.and_then(phase).map(str::to_owned),
                capacity: claim.and_then(capacity),
                message: match (refused, claim) {
                    (Some(why), Some(c)) => Some(refusal(c, &v.size, why)),
                    _ => claim.and_then(message),
                },
                claim: name,
            }
        })
        .collect()
}

/// A Lost claim: its volume is gone, and no restart brings the data back.
pub fn lost(mw: &ManagedWorkload, observed: &Observed<'_>) -> Option<Verdict> {
    let name = own_claims(mw, observed).find(|(_, c)| c.and_then(phase) == Some("Lost"))?.0;
    Some(Verdict::new(
        Phase::Failed,
        CLAIM_LOST,
        format!(
            "claim {name} is Lost: the PersistentVolume it was bound to is gone, and with it the data; restore \
             the volume, or delete the claim to start over with an empty one"
        ),
    ))
}

/// The first claim that is not bound yet (or not there yet), by name.
pub fn unbound(mw: &ManagedWorkload, observed: &Observed<'_>) -> Option<String> {
    own_claims(mw, observed).find(|(_, c)| c.and_then(phase) != Some("Bound")).map(|(name, _)| name)
}

/// Still waiting for a claim to bind: the phase the rollout is in, the claim named.
pub fn waiting_for(phase: Phase, word: &str, claim: &str) -> Verdict {
    Verdict::new(
        phase,
        CLAIM_PENDING,
        format!(
            "{word}: waiting for claim {claim} to be bound to a PersistentVolume (kubectl describe pvc {claim} \
             says why it is not)"
        ),
    )
}

/// A volume that one node at a time may mount, held by a Pod being deleted on another node
/// than the one the current Pod waits on: the Multi-Attach wait. It is what happens when a
/// node is lost: its Pods are deleted but cannot finish (no kubelet confirms it), and the
/// volume stays attached there until the attach/detach controller gives up waiting for the
/// unmount (6 minutes) or someone deletes the Node. Judged from the Pods alone (the
/// VolumeAttachment objects are cluster-scoped, and the operator may watch one namespace):
/// the current Pod is placed but none of its containers has started, and an older Pod of this
/// workload is being deleted on another node. Returns the claim and that node.
pub fn held_elsewhere(mw: &ManagedWorkload, observed: &Observed<'_>, current: &[&Pod]) -> Option<(String, String)> {
    let exclusive = mw.spec.volumes.iter().find(|v| v.access_mode.unwrap_or_default() != AccessMode::ReadWriteMany)?;
    let waiting_on = current.iter().find_map(|p| node_of(p).filter(|_| !started(p)))?;
    let holder = observed.pods.iter().find_map(|p| {
        let node = node_of(p)?;
        (p.metadata.deletion_timestamp.is_some() && !super::finished(p) && node != waiting_on).then_some(node)
    })?;
    Some((claim_name(&mw.name_any(), &exclusive.name), holder.to_owned()))
}

/// Waiting for the volume to be released by the node that still holds it.
pub fn waiting_for_detach(phase: Phase, word: &str, claim: &str, node: &str) -> Verdict {
    Verdict::new(
        phase,
        VOLUME_HELD_ELSEWHERE,
        format!(
            "{word}: the volume of claim {claim} is still attached to node {node}, where a Pod of this workload is \
             being deleted (Multi-Attach); it is detached once that Pod is gone, or after 6 minutes if the node is \
             lost (deleting the Node object releases it at once)"
        ),
    )
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// Has any container of the Pod started (running or run)? A Pod waiting for its volumes to
/// attach and mount has none.
fn started(pod: &Pod) -> bool {
    if pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|phase| phase != "Pending") {
        return true;
    }
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).into_iter().flatten();
    statuses.into_iter().any(|c| {
        let state = c.state.as_ref();
        state.is_some_and(|s| s.running.is_some() || s.terminated.is_some()) || c.restart_count > 0
    })
}

/// The rollout's progress deadline passed while a claim was unbound: that claim is the cause.
pub fn not_bound_in_time(claim: &str, failure: &Verdict) -> Verdict {
    Verdict::new(
        Phase::Failed,
        CLAIM_NOT_BOUND,
        format!(
            "claim {claim} was not bound to a PersistentVolume within the progress deadline (no volume or \
             StorageClass provides it, or a quota refuses it; kubectl describe pvc {claim}): {}",
            failure.message
        ),
    )
}

fn own_claims<'a>(
    mw: &'a ManagedWorkload,
    observed: &'a Observed<'_>,
) -> impl Iterator<Item = (String, Option<&'a PersistentVolumeClaim>)> + 'a {
    mw.spec.volumes.iter().map(move |v| {
        let name = claim_name(&mw.name_any(), &v.name);
        let claim = find(observed, &name);
        (name, claim)
    })
}

fn find<'a>(observed: &Observed<'a>, name: &str) -> Option<&'a PersistentVolumeClaim> {
    observed.claims.iter().copied().find(|c| c.metadata.name.as_deref() == Some(name))
}

fn phase(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref()?.phase.as_deref()
}

/// A change to the claim was refused (typically growing it on a StorageClass without
/// `allowVolumeExpansion`): it stays as it is, and the spec may be put back.
fn refusal(claim: &PersistentVolumeClaim, wanted: &str, why: &str) -> String {
    let kept = requested(claim).unwrap_or_default();
    format!(
        "the change to {wanted} was refused, and the claim stays at {kept} (the workload runs on it): {why}; set the \
         size back to {kept} to clear this, or ask for a StorageClass that allows expansion"
    )
}

/// What the claim waits on, if anything.
fn message(claim: &PersistentVolumeClaim) -> Option<String> {
    if claim.annotations().contains_key(REPLACED_ANNOTATION) && phase(claim) == Some("Bound") {
        return Some(
            "made new and empty where a deleted claim of this name was; the old data is where the old volume's \
             reclaim policy left it"
                .into(),
        );
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return Some("being deleted: removed once no Pod uses it".into());
    }
    match phase(claim) {
        Some("Pending") | None => return Some("waiting to be bound to a PersistentVolume".into()),
        Some("Lost") => return Some("Lost: the PersistentVolume it was bound to is gone".into()),
        _ => {}
    }
    let want = requested(claim).unwrap_or_default();
    let conditions = claim.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten();
    for c in conditions.filter(|c| c.status == "True") {
        match c.type_.as_str() {
            "FileSystemResizePending" => {
                return Some(format!(
                    "expanded to {want}; the file system is resized when a Pod next mounts the volume"
                ));
            }
            "Resizing" => return Some(format!("expanding to {want}")),
            "ControllerResizeError" | "NodeResizeError" => {
                return Some(format!("expansion to {want} failed: {}", c.message.as_deref().unwrap_or(&c.type_)));
            }
            _ => {}
        }
    }
    let have = capacity(claim)?;
    match (bytes(&want), bytes(&have)) {
        (Some(w), Some(h)) if w > h => Some(format!(
            "expansion to {want} requested; the volume still provides {have} (its StorageClass's provisioner \
             expands it, if it can)"
        )),
        _ => None,
    }
}
