//! The Service step of a reconcile, run before the Deployment's: observe the workload's
//! Service (the cache, one GET when the cache cannot tell), decide (`plan::decide`: the same
//! rules as the Deployment's), act (server-side apply; a delete only of the workload's own
//! Service, and only once `spec.service` is gone), and say what the status must know: the
//! Service as it now is, or why it is not what it should be.
//!
//! A foreign Service of the workload's Service name is never touched: the workload is
//! reported blocked (`ServiceConflict`) and rechecked every few seconds, so it recovers within
//! seconds of that Service going. The Deployment step goes on meanwhile: a Service problem is
//! no reason to stop a Pod that serves clients who reach it some other way.

use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::info;

use super::apply::apply;
use super::ownership::{FIELD_MANAGER, is_controlled_by};
use super::plan::{self, Decision, Mode, Refusal};
use super::reconcile::Context;
use super::service;
use super::slim::CachedService;
use super::status::Blocked;
use crate::error::Error;
use crate::resource::ManagedWorkload;

/// Reasons reported for a Service problem (Stalled, phase Failed).
pub const CONFLICT: &str = "ServiceConflict";
pub const REJECTED: &str = "ServiceRejected";

/// What the Service step leaves for the status.
#[derive(Debug, Default)]
pub struct Exposed {
    /// The workload's own Service as it now is; None without `spec.service`, or while it is
    /// blocked.
    pub service: Option<Box<Service>>,
    /// A Service problem only a human (or time) can fix.
    pub blocked: Option<Blocked>,
    /// Drift was reverted: worth an Event of its own.
    pub drift_corrected: bool,
}

/// The outcome of the step: go on to the Deployment, or look again soon. (The Service is
/// boxed: a Service is large, and a requeue should not carry its room.)
pub enum Step {
    Done(Exposed),
    Requeue(std::time::Duration),
}

pub async fn reconcile(ctx: &Context, mw: &ManagedWorkload, namespace: &str) -> Result<Step, Error> {
    let name = service::service_name(&mw.name_any());
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(desired) = service::service(mw) else {
        remove_own(ctx, &api, mw, namespace, &name).await?;
        return Ok(Step::Done(Exposed::default()));
    };
    let mut live = observe(ctx, &api, mw, namespace, &name).await?;
    let exposed = loop {
        break match plan::decide(mw, &desired, live.as_ref()) {
            Decision::Conflict => Exposed { blocked: Some(conflict(&name)), ..Default::default() },
            Decision::Departing => {
                Exposed { blocked: Some(Blocked::departing("Service", &name)), ..Default::default() }
            }
            Decision::UpToDate => Exposed { service: live.map(|s| Box::new(s.to_service())), ..Default::default() },
            Decision::Apply(mode) => match apply_service(ctx, &api, &name, &desired, mode).await {
                Ok(applied) => {
                    info!(service = %name, verb = if mode.force() { "updated" } else { "created" }, "applied Service");
                    Exposed {
                        service: Some(Box::new(applied)),
                        blocked: None,
                        drift_corrected: mode == (Mode::Update { drift: true }),
                    }
                }
                Err(source) => match plan::judge(mode, &source) {
                    Refusal::Appeared => {
                        info!(service = %name, "a Service of that name exists after all; looking it up");
                        live = get(&api, namespace, &name).await?;
                        if live.is_none() {
                            return Ok(Step::Requeue(plan::APPEARED_RECHECK));
                        }
                        continue;
                    }
                    Refusal::Rejected(message) => Exposed {
                        service: live.map(|s| Box::new(s.to_service())),
                        blocked: Some(Blocked {
                            reason: REJECTED,
                            message: format!("the API server refused Service {name}: {message}"),
                        }),
                        drift_corrected: false,
                    },
                    Refusal::Retry => return Err(Error::ApplyService { namespace: namespace.into(), name, source }),
                },
            },
        };
    };
    Ok(Step::Done(exposed))
}

/// The live Service: the cache (label-selected, so "not there" may be absent, just created, or
/// someone else's Service of that name). Not there for a workload never reconciled before (no
/// status): none of its own, and the create-only apply guards against anyone else's (a 409,
/// then the caller looks it up), so no GET precedes the create. Otherwise one GET tells (a
/// blocked workload's recheck looks, and does not try a create the API server refuses).
async fn observe(
    ctx: &Context,
    api: &Api<Service>,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
) -> Result<Option<CachedService>, Error> {
    if let Some(cached) = ctx.services.get(&ObjectRef::new(name).within(namespace)) {
        return Ok(Some((*cached).clone()));
    }
    if ctx.objects.previous_status(mw).is_none() {
        return Ok(None);
    }
    get(api, namespace, name).await
}

async fn get(api: &Api<Service>, namespace: &str, name: &str) -> Result<Option<CachedService>, Error> {
    let found = api.get_opt(name).await.map_err(|source| Error::GetService {
        namespace: namespace.into(),
        name: name.into(),
        source,
    })?;
    Ok(found.map(CachedService::from))
}

/// `spec.service` was removed: delete the Service this workload controls, if the cache holds
/// one. Preconditioned on its UID, so a Service someone made under that name since is never
/// deleted; a Service that is already gone is no error.
async fn remove_own(
    ctx: &Context,
    api: &Api<Service>,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
) -> Result<(), Error> {
    let Some(cached) = ctx.services.get(&ObjectRef::new(name).within(namespace)) else { return Ok(()) };
    if !is_controlled_by(&*cached, mw) || cached.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    ctx.metrics.wrote("services", "delete");
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: cached.metadata.uid.clone(), resource_version: None }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            info!(service = %name, "deleted Service: spec.service was removed");
            Ok(())
        }
        // Gone already, or replaced by another object of that name (the UID precondition).
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(source) => Err(Error::DeleteService { namespace: namespace.into(), name: name.into(), source }),
    }
}

/// The shared apply, after one step of the Service's own on drift: the ports are exactly the
/// workload's. A port someone else added or renamed by hand is theirs to server-side apply,
/// so an apply would leave it (and fail outright when it reuses one of ours' names); the list
/// is set whole first, then applied as usual.
async fn apply_service(
    ctx: &Context,
    api: &Api<Service>,
    name: &str,
    desired: &Service,
    mode: Mode,
) -> Result<Service, kube::Error> {
    if mode == (Mode::Update { drift: true }) {
        let ports = desired.spec.as_ref().map(|s| s.ports.clone());
        ctx.metrics.wrote("services", "patch");
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        api.patch(name, &params, &Patch::Merge(serde_json::json!({ "spec": { "ports": ports } }))).await?;
    }
    apply(&ctx.metrics, "services", api, name, desired, mode).await
}

fn conflict(name: &str) -> Blocked {
    Blocked {
        reason: CONFLICT,
        message: format!(
            "a Service named {name} already exists and is not controlled by this ManagedWorkload; it is left \
             untouched: delete or rename it, or rename the ManagedWorkload (or remove spec.service)"
        ),
    }
}
