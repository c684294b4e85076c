//! The claims step of a reconcile, run before the Deployment's: observe each volume's claim
//! (the cache, one GET when the cache cannot tell), decide (`plan::decide_by` with the claims
//! room's ownership rule), act (server-side apply, never a delete), and say what the
//! Deployment step must know: the workload's claims as they now are, and whether it may be
//! started (a foreign, refused or deleting claim holds it).

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::info;

use super::apply::apply;
use super::claims;
use super::plan::{self, Decision, Refusal};
use super::reconcile::Context;
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
    pub deleting: Option<String>,
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
    for volume in &mw.spec.volumes {
        let name = claims::claim_name(&mw.name_any(), &volume.name);
        let live = observe(ctx, &api, namespace, &name).await?;
        let own = |c: &PersistentVolumeClaim| claims::is_own(c, mw, volume);
        if let Some(live) = live.as_ref().filter(|c| c.metadata.deletion_timestamp.is_some()) {
            // Never applied to: an apply cannot stop a deletion, and would only race it.
            out.deleting.get_or_insert(name.clone());
            if own(live) {
                out.own.push(live.clone());
            }
            continue;
        }
        let Some(desired) = claims::claim(mw, volume, live.as_ref()) else { continue };
        match plan::decide_by(own, &desired, live.as_ref()) {
            Decision::Conflict => {
                out.blocked.get_or_insert_with(|| conflict(&name));
            }
            Decision::UpToDate => out.own.extend(live),
            Decision::Apply(mode) => {
                match apply(&ctx.metrics, "persistentvolumeclaims", &api, &name, &desired, mode).await {
                    Ok(applied) => {
                        info!(claim = %name, verb = if mode.force() { "updated" } else { "created" }, "applied PersistentVolumeClaim");
                        out.own.push(applied);
                    }
                    Err(source) => match plan::judge(mode, &source) {
                        Refusal::Appeared => {
                            info!(claim = %name, "a PersistentVolumeClaim appeared while creating it; rechecking");
                            return Ok(Step::Requeue(plan::APPEARED_RECHECK));
                        }
                        Refusal::Rejected(message) => {
                            out.blocked.get_or_insert_with(|| Blocked {
                                reason: REJECTED,
                                message: format!("the API server refused claim {name}: {message}"),
                            });
                            out.own.extend(live);
                        }
                        Refusal::Retry => {
                            return Err(Error::ApplyClaim { namespace: namespace.into(), name, source });
                        }
                    },
                }
            }
        }
    }
    Ok(Step::Done(out))
}

/// The live claim: the cache (label-selected, so "not there" may be absent, just created, or
/// someone else's claim of that name), else one GET.
async fn observe(
    ctx: &Context,
    api: &Api<PersistentVolumeClaim>,
    namespace: &str,
    name: &str,
) -> Result<Option<PersistentVolumeClaim>, Error> {
    if let Some(cached) = ctx.claims.get(&ObjectRef::new(name).within(namespace)) {
        return Ok(Some((*cached).clone()));
    }
    api.get_opt(name).await.map_err(|source| Error::GetClaim { namespace: namespace.into(), name: name.into(), source })
}

fn conflict(name: &str) -> Blocked {
    Blocked {
        reason: CONFLICT,
        message: format!(
            "a PersistentVolumeClaim named {name} already exists and was not made for this volume of this \
             ManagedWorkload; it is left untouched: delete or rename it, or rename the volume or the ManagedWorkload"
        ),
    }
}

/// The hold on a workload desired Running whose claim is being deleted.
pub fn deleting(name: &str) -> Blocked {
    Blocked {
        reason: DELETING,
        message: format!(
            "claim {name} is being deleted; the workload is not started against it. The deletion completes once \
             no Pod uses the claim (set spec.state: Stopped if one still does); then a new, empty claim is made"
        ),
    }
}
