//! The claims step of a reconcile, run before the Deployment's: observe each volume's claim
//! (the cache, one GET when the cache cannot tell), decide (`plan::decide_by` with the claims
//! room's ownership rule), act (server-side apply, never a delete), and say what the
//! Deployment step must know: the workload's claims as they now are, and whether it may be
//! started (a foreign, refused or deleting claim holds it; a predecessor's on its way out
//! makes it wait). A refused change to a claim that exists (an expansion its StorageClass
//! does not allow) holds nothing: the workload runs on the claim as it is, the refusal is
//! reported on `status.volumes`, and the same apply is retried only after a growing backoff.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::{info, warn};

use super::apply::apply;
use super::claims;
use super::ownership::applied_hash;
use super::plan::{self, Decision, Mode, Refusal};
use super::reconcile::Context;
use super::slim::CachedClaim;
use super::status::Blocked;
use crate::error::Error;
use crate::resource::ManagedWorkload;

/// Reasons reported for a claim problem (Stalled, phase Failed).
pub const CONFLICT: &str = "ClaimConflict";
pub const REJECTED: &str = "ClaimRejected";
pub const DELETING: &str = "ClaimDeleting";

/// What the claims step leaves for the Deployment step and the status.
#[derive(Debug, Default)]
pub struct Claims {
    /// The workload's own claims as they now are (never a foreign one).
    pub own: Vec<PersistentVolumeClaim>,
    /// A claim problem only a human (or time) can fix; the first one found.
    pub blocked: Option<Blocked>,
    /// A claim of the workload's is being deleted: it must not be started against it.
    /// (Boxed: a claim is large, and a requeue should not carry its room.)
    pub deleting: Option<Box<PersistentVolumeClaim>>,
    /// Changes to existing claims the API server refused (claim name, its words), for
    /// `status.volumes`; the workload goes on with the claims as they are.
    pub refused: Vec<(String, String)>,
    /// When to look again at a refused change.
    pub retry: Option<Duration>,
}

impl Claims {
    /// A change to claim `name` was refused: the workload goes on with `live` as it is, the
    /// refusal is reported, and the step looks again once `wait` has passed.
    fn refused_change(&mut self, name: String, message: String, wait: Duration, live: Option<PersistentVolumeClaim>) {
        self.refused.push((name, message));
        self.retry = Some(self.retry.map_or(wait, |r| r.min(wait)));
        self.own.extend(live);
    }
}

/// The outcome of the step: go on to the Deployment, or look again soon.
pub enum Step {
    Done(Claims),
    Requeue(Duration),
}

pub async fn reconcile(ctx: &Context, mw: &ManagedWorkload, namespace: &str) -> Result<Step, Error> {
    let mut out = Claims::default();
    if mw.spec.volumes.is_empty() {
        return Ok(Step::Done(out));
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    'volumes: for volume in &mw.spec.volumes {
        let name = claims::claim_name(&mw.name_any(), &volume.name);
        let mut live = observe(ctx, &api, mw, namespace, &name).await?;
        loop {
            // The live claim as `claims` reads it, built once per look.
            let claim = live.as_ref().map(CachedClaim::to_claim);
            let own = claim.as_ref().is_some_and(|c| claims::is_own(c, mw, volume));
            // Never applied to: an apply cannot stop a deletion, and would only race it. (Someone
            // else's claim being deleted is `Departing` below: waited for.)
            if let Some(deleting) = claim.as_ref().filter(|c| own && c.metadata.deletion_timestamp.is_some()) {
                out.deleting.get_or_insert_with(|| Box::new(deleting.clone()));
                out.own.push(deleting.clone());
                continue 'volumes;
            }
            let replacing = live.is_none() && existed(ctx, mw, &name);
            let Some(desired) = claims::claim(mw, volume, claim.as_ref(), replacing) else {
                continue 'volumes;
            };
            let decision = plan::decide_by(mw, |_| own, &desired, live.as_ref());
            if !matches!(decision, Decision::Apply(_)) {
                ctx.objects.accepted(mw, &name);
            }
            match decision {
                Decision::Conflict => {
                    let whose = claim.as_ref().and_then(|c| claims::retained_for_another(c, mw, volume));
                    out.blocked.get_or_insert_with(|| conflict(&name, whose.as_deref()));
                }
                Decision::Departing => {
                    out.blocked.get_or_insert_with(|| Blocked::departing("PersistentVolumeClaim", &name));
                }
                Decision::UpToDate => out.own.extend(claim),
                Decision::Apply(mode) => {
                    let fingerprint = applied_hash(&desired).unwrap_or_default().to_owned();
                    if let Some((refused, wait)) =
                        ctx.objects.refusal(mw, &name, &fingerprint).filter(|(_, w)| !w.is_zero())
                    {
                        // The same change was refused moments ago: not sent again before its backoff.
                        out.refused_change(name, refused.message, wait, claim);
                        continue 'volumes;
                    }
                    match apply(&ctx.metrics, "persistentvolumeclaims", &api, &name, &desired, mode).await {
                        Ok(applied) => {
                            info!(claim = %name, verb = if mode.force() { "updated" } else { "created" }, "applied PersistentVolumeClaim");
                            ctx.objects.accepted(mw, &name);
                            if replacing {
                                announce_replacement(ctx, mw, &name);
                            }
                            out.own.push(applied);
                        }
                        Err(source) => match plan::judge(mode, &source) {
                            Refusal::Appeared => {
                                // One exists after all (someone else's, or ours not yet cached):
                                // what it is decides, as if it had been seen before.
                                info!(claim = %name, "a PersistentVolumeClaim of that name exists after all; looking it up");
                                live = get(&api, namespace, &name).await?;
                                if live.is_none() {
                                    return Ok(Step::Requeue(plan::APPEARED_RECHECK));
                                }
                                continue;
                            }
                            // The claim exists and serves as it is: only the change is refused.
                            Refusal::Rejected(message) if mode != Mode::Create && live.is_some() => {
                                let wait = ctx.objects.refused(mw, &name, &fingerprint, &message);
                                warn!(claim = %name, %message, retry_in = ?wait, "the API server refused a change to a PersistentVolumeClaim");
                                let note = format!("the API server refused the change to claim {name}: {message}");
                                ctx.events.send(mw.object_ref(&()), EventType::Warning, "ClaimChangeRefused", &note);
                                out.refused_change(name, message, wait, claim);
                            }
                            Refusal::Rejected(message) => {
                                out.blocked.get_or_insert_with(|| Blocked {
                                    reason: REJECTED,
                                    message: format!("the API server refused claim {name}: {message}"),
                                });
                                out.own.extend(claim);
                            }
                            Refusal::Retry => {
                                return Err(Error::ApplyClaim { namespace: namespace.into(), name, source });
                            }
                        },
                    }
                }
            }
            break;
        }
    }
    Ok(Step::Done(out))
}

/// The workload's status (as the operator last knew it) lists claim `name` as one it had: the
/// claim is gone now, so a new one would start empty.
fn existed(ctx: &Context, mw: &ManagedWorkload, name: &str) -> bool {
    let status = ctx.objects.previous_status(mw);
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

/// The live claim: the cache (label-selected, so "not there" may be absent, just created, or
/// someone else's claim of that name). Not there for a workload never reconciled before (no
/// status): none of its own, and the create-only apply guards against anyone else's (a 409,
/// then the caller looks it up), so no GET precedes the create. Otherwise one GET tells (a
/// blocked workload's recheck looks, and does not try a create the API server refuses).
async fn observe(
    ctx: &Context,
    api: &Api<PersistentVolumeClaim>,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
) -> Result<Option<CachedClaim>, Error> {
    if let Some(cached) = ctx.claims.get(&ObjectRef::new(name).within(namespace)) {
        return Ok(Some((*cached).clone()));
    }
    if ctx.objects.previous_status(mw).is_none() {
        return Ok(None);
    }
    get(api, namespace, name).await
}

async fn get(api: &Api<PersistentVolumeClaim>, namespace: &str, name: &str) -> Result<Option<CachedClaim>, Error> {
    let found = api.get_opt(name).await;
    let found = found.map_err(|source| Error::GetClaim { namespace: namespace.into(), name: name.into(), source })?;
    Ok(found.map(CachedClaim::from))
}

fn conflict(name: &str, retained_for: Option<&str>) -> Blocked {
    let message = match retained_for {
        Some(owner) => format!(
            "PersistentVolumeClaim {name} holds the data of an earlier workload of this name, owned by {owner}; it is \
             not mounted here. To start this workload with an empty volume, rename the volume in spec.volumes; to \
             give it that data, an administrator sets the claim's annotation {owner_key} and label {node_key} to \
             this workload's; to discard the data, delete the claim (its PersistentVolume's reclaim policy decides \
             what happens to the volume)",
            owner_key = crate::resource::OWNER_ANNOTATION,
            node_key = crate::resource::NODE_ID_LABEL,
        ),
        None => format!(
            "a PersistentVolumeClaim named {name} already exists and was not made for this volume of this \
             ManagedWorkload; it is left untouched: delete or rename it, or rename the volume or the ManagedWorkload"
        ),
    };
    Blocked { reason: CONFLICT, message }
}

/// The hold on a workload desired Running whose claim is being deleted.
pub fn deleting(claim: &PersistentVolumeClaim) -> Blocked {
    let name = claim.name_any();
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("<its PersistentVolume>");
    Blocked {
        reason: DELETING,
        message: format!(
            "claim {name} is being deleted (the operator never deletes a claim); the workload is not started against \
             it. The deletion completes once no Pod uses the claim, and with the usual reclaim policy Delete its \
             volume and data are then destroyed. To keep the data, first set the volume's policy to Retain: kubectl \
             patch pv {volume} -p '{{\"spec\":{{\"persistentVolumeReclaimPolicy\":\"Retain\"}}}}'. Once the \
             claim is gone, a new, empty one is made, and the workload's Events say so"
        ),
    }
}
