//! The claims step of a reconcile, before the Deployment's: each volume's claim through
//! `step`, decided by `plan::decide_by` with the claims' ownership rule (apply only, never
//! delete). A foreign, refused or deleting claim holds the workload; a predecessor's claim on
//! its way out makes it wait. A refused change to an existing claim (an expansion its
//! StorageClass does not allow) holds nothing: the workload runs on the claim as it is, the
//! refusal shows in `status.volumes`, and the apply is retried with a growing backoff.

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::claims;
use super::context::Context;
use super::memory::Refused;
use super::ownership::applied_hash;
use super::plan::{self, Decision, Mode};
use super::slim::CachedClaim;
use super::status::Blocked;
use super::step::{self, Flow, Intent, Judged, Verdict};
use crate::error::Error;
use crate::resource::{ManagedWorkload, Volume};

/// Reason reported while a claim of the workload's is being deleted (Stalled, phase Failed).
pub const DELETING: &str = "ClaimDeleting";

/// What the claims step leaves for the Deployment step and the status.
#[derive(Debug, Default)]
pub struct Claims {
    /// The workload's own claims as they now are (never a foreign one).
    pub own: Vec<PersistentVolumeClaim>,
    /// A claim problem only a human (or time) can fix; the first one found.
    pub blocked: Option<Blocked>,
    /// A claim of the workload's is being deleted: it must not be started against it. Boxed, so
    /// a requeue does not carry a claim-sized value.
    pub deleting: Option<Box<PersistentVolumeClaim>>,
    /// Refused changes to existing claims (name, the API server's words), for `status.volumes`.
    pub refused: Vec<(String, String)>,
    /// When to look again at a refused change.
    pub retry: Option<Duration>,
}

impl Claims {
    /// A change to claim `name` was refused: go on with `live`, report it, look again after
    /// `wait`.
    fn refused_change(&mut self, name: String, message: String, wait: Duration, live: Option<PersistentVolumeClaim>) {
        self.refused.push((name, message));
        self.retry = Some(self.retry.map_or(wait, |r| r.min(wait)));
        self.own.extend(live);
    }
}

pub async fn reconcile(ctx: &Context, mw: &ManagedWorkload, namespace: &str) -> Result<Flow<Claims>, Error> {
    let mut out = Claims::default();
    for volume in &mw.spec.volumes {
        let name = claims::claim_name(&mw.name_any(), &volume.name);
        let verdict = step::step(ctx, mw, namespace, &name, |live| intent(ctx, mw, volume, &name, live)).await?;
        if let Some(after) = out.take(ctx, mw, name, verdict) {
            return Ok(Flow::Requeue(after));
        }
    }
    Ok(Flow::Done(out))
}

/// Why the claims step leaves a claim alone.
enum Leave {
    /// No claim is wanted for the volume (`claims::claim` says so).
    Unwanted,
    /// The workload's own claim is being deleted: an apply cannot stop a deletion and would
    /// only race it. (Someone else's departing claim is `Departing`: waited for.)
    Deleting,
    /// The same change was refused moments ago: not sent again before its backoff has passed.
    Held(Refused, Duration),
}

/// The claim the workload wants for `volume`, given the live one, and what to do about it.
fn intent(
    ctx: &Context,
    mw: &ManagedWorkload,
    volume: &Volume,
    name: &str,
    live: Option<&CachedClaim>,
) -> Intent<'static, PersistentVolumeClaim, Leave> {
    // The live claim as `claims` reads it, built once per look.
    let claim = live.map(CachedClaim::to_claim);
    let own = claim.as_ref().is_some_and(|c| claims::is_own(c, mw, volume));
    if own && claim.as_ref().is_some_and(|c| c.metadata.deletion_timestamp.is_some()) {
        return Err(Leave::Deleting);
    }
    let replacing = live.is_none() && existed(ctx, mw, name);
    let desired = claims::claim(mw, volume, claim.as_ref(), replacing).ok_or(Leave::Unwanted)?;
    let decision = plan::decide_by(mw, |_| own, &desired, live);
    if matches!(decision, Decision::Apply(_))
        && let Some((refused, wait)) = ctx
            .caches
            .objects
            .refusal(mw, name, applied_hash(&desired).unwrap_or_default())
            .filter(|(_, w)| !w.is_zero())
    {
        return Err(Leave::Held(refused, wait));
    }
    Ok((Cow::Owned(desired), decision))
}

impl Claims {
    /// Take in the step's verdict for claim `name`; returns when to look again if the step
    /// cannot go on.
    fn take(
        &mut self,
        ctx: &Context,
        mw: &ManagedWorkload,
        name: String,
        verdict: Verdict<'_, PersistentVolumeClaim, Leave>,
    ) -> Option<Duration> {
        let as_is = |live: Option<CachedClaim>| live.as_ref().map(CachedClaim::to_claim);
        if matches!(verdict, Verdict::Conflict(_) | Verdict::Departing | Verdict::UpToDate(_) | Verdict::Applied(..)) {
            ctx.caches.objects.accepted(mw, &name);
        }
        // The claim exists and serves as it is: only the change is refused.
        if let Verdict::Rejected { desired, live: Some(live), mode: Mode::Update { .. }, message } = verdict {
            let wait = ctx.caches.objects.refused(mw, &name, applied_hash(&*desired).unwrap_or_default(), &message);
            warn!(claim = %name, %message, retry_in = ?wait, "the API server refused a change to a PersistentVolumeClaim");
            let note = format!("the API server refused the change to claim {name}: {message}");
            ctx.events.send(mw.object_ref(&()), EventType::Warning, "ClaimChangeRefused", &note);
            self.refused_change(name, message, wait, as_is(Some(live)));
            return None;
        }
        match verdict.judge(ctx, mw, &name) {
            Judged::Left(Leave::Unwanted, _) => {}
            Judged::Left(Leave::Deleting, live) => {
                if let Some(claim) = as_is(live) {
                    self.deleting.get_or_insert_with(|| Box::new(claim.clone()));
                    self.own.push(claim);
                }
            }
            Judged::Left(Leave::Held(refused, wait), live) => {
                self.refused_change(name, refused.message, wait, as_is(live))
            }
            Judged::Done { live, blocked, written } => {
                if written == Some(Mode::Create) && existed(ctx, mw, &name) {
                    announce_replacement(ctx, mw, &name);
                }
                self.own.extend(as_is(live));
                if let Some(blocked) = blocked {
                    self.blocked.get_or_insert(blocked);
                }
            }
            Judged::Requeue(after) => return Some(after),
        }
        None
    }
}

/// The status as last known lists claim `name` as one the workload had: it is gone now, so
/// a new one would start empty.
fn existed(ctx: &Context, mw: &ManagedWorkload, name: &str) -> bool {
    let status = ctx.caches.previous_status(mw);
    status.iter().flat_map(|s| &s.volumes).any(|v| v.claim == name && v.phase.is_some())
}

/// A claim was made where the workload's claim of that name had been deleted: it is empty.
fn announce_replacement(ctx: &Context, mw: &ManagedWorkload, name: &str) {
    warn!(claim = %name, "made a new, empty PersistentVolumeClaim where a deleted one was");
    let note = format!(
        "claim {name} was deleted, and a new, empty claim of that name was made for the volume; the old data is \
         where the reclaim policy of the old claim's PersistentVolume left it (with Retain, on that volume)"
    );
    ctx.events.send(mw.object_ref(&()), EventType::Warning, "ClaimReplaced", &note);
}

/// The conflict message for claim `name`: retained for another owner's earlier workload of
/// this name, or someone else's. For a Manager container the way out is in Manager (it puts
/// the spec back).
pub fn conflict(mw: &ManagedWorkload, name: &str, live: Option<&CachedClaim>) -> String {
    let volume = mw.spec.volumes.iter().find(|v| claims::claim_name(&mw.name_any(), &v.name) == name);
    let retained_for = live.zip(volume).and_then(|(c, v)| claims::retained_for_another(&c.to_claim(), mw, v));
    conflict_message(name, retained_for.as_deref(), crate::resource::made_for_manager(mw))
}

fn conflict_message(name: &str, retained_for: Option<&str>, manager: bool) -> String {
    let empty = if manager {
        "To start this container with an empty disk, give it another hostname in Manager"
    } else {
        "To start this workload with an empty volume, rename the volume in spec.volumes"
    };
    match retained_for {
        Some(owner) => format!(
            "PersistentVolumeClaim {name} holds the data of an earlier workload of this name, owned by {owner}; it is \
             not mounted here. {empty}; to give it that data, an administrator sets the claim's annotation \
             {owner_key} and label {node_key} to this workload's; to discard the data, delete the claim (its \
             PersistentVolume's reclaim policy decides what happens to the volume)",
            owner_key = crate::names::OWNER_ANNOTATION,
            node_key = crate::names::NODE_ID_LABEL,
        ),
        None if manager => format!(
            "a PersistentVolumeClaim named {name} already exists and was not made for this container's disk; it is \
             left untouched: delete or rename it, or give the container another hostname in Manager"
        ),
        None => format!(
            "a PersistentVolumeClaim named {name} already exists and was not made for this volume of this \
             ManagedWorkload; it is left untouched: delete or rename it, or rename the volume or the ManagedWorkload"
        ),
    }
}

/// The hold on a workload desired Running whose claim is being deleted.
pub fn deleting(claim: &PersistentVolumeClaim) -> Blocked {
    let name = claim.name_any();
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("<its PersistentVolume>");
    Blocked::conflict(
        DELETING,
        format!(
            "claim {name} is being deleted (the operator never deletes a claim); the workload is not started against \
             it. The deletion completes once no Pod uses the claim, and with the usual reclaim policy Delete its \
             volume and data are then destroyed. To keep the data, first set the volume's policy to Retain: kubectl \
             patch pv {volume} -p '{{\"spec\":{{\"persistentVolumeReclaimPolicy\":\"Retain\"}}}}'. Once the \
             claim is gone, a new, empty one is made, and the workload's Events say so"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_conflicts_advice_is_one_that_works_for_the_workload() {
        let by_hand = conflict_message("web-data", Some("alice"), false);
        assert!(by_hand.contains("rename the volume in spec.volumes"), "{by_hand}");
        // The bridge and Manager's provider put a hand edit of the spec back.
        let manager = conflict_message("web-rootfs", Some("alice"), true);
        assert!(!manager.contains("spec.volumes") && manager.contains("another hostname in Manager"), "{manager}");
        let foreign = conflict_message("web-rootfs", None, true);
        assert!(!foreign.contains("rename the volume") && foreign.contains("another hostname in Manager"), "{foreign}");
    }
}
