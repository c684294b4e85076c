//! The Service step of a reconcile, run before the Deployment's: the owned-object step
//! (`step`, with `plan::decide`: the same rules as the Deployment's; a delete only of the
//! workload's own Service, and only once `spec.service` is gone), and what it means: the
//! Service as it now is for the status, or why it is not what it should be.
//!
//! A foreign Service of the workload's Service name is never touched: the workload is
//! reported blocked (`ServiceConflict`) and rechecked every few seconds, so it recovers within
//! seconds of that Service going. The Deployment step goes on meanwhile: a Service problem is
//! no reason to stop a Pod that serves clients who reach it some other way.

use std::borrow::Cow;
use std::convert::Infallible;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::info;

use super::context::Context;
use super::ownership::is_controlled_by;
use super::plan;
use super::service;
use super::status::Blocked;
use super::step::{self, Flow, Judged};
use crate::error::{Error, Operation};
use crate::resource::ManagedWorkload;

/// What the Service step leaves for the status.
#[derive(Debug, Default)]
pub struct Exposed {
    /// The workload's own Service as it now is; None without `spec.service`, or while it is
    /// blocked.
    pub service: Option<Box<Service>>,
    /// A Service problem only a human (or time) can fix.
    pub blocked: Option<Blocked>,
}

pub async fn reconcile(ctx: &Context, mw: &ManagedWorkload, namespace: &str) -> Result<Flow<Exposed>, Error> {
    let name = service::service_name(&mw.name_any());
    let Some(desired) = service::service(mw) else {
        remove_own(ctx, mw, namespace, &name).await?;
        return Ok(Flow::Done(Exposed::default()));
    };
    let verdict = step::step::<Service, Infallible>(ctx, mw, namespace, &name, |live| {
        Ok((Cow::Borrowed(&desired), plan::decide(mw, &desired, live)))
    })
    .await?;
    let exposed = match verdict.judge(ctx, mw, &name) {
        Judged::Left(never, _) => match never {},
        Judged::Done { live, blocked, .. } => Exposed { service: live.map(|s| Box::new(s.to_service())), blocked },
        Judged::Requeue(after) => return Ok(Flow::Requeue(after)),
    };
    Ok(Flow::Done(exposed))
}

/// `spec.service` was removed: delete the Service this workload controls, if the cache holds
/// one. Preconditioned on its UID, so a Service someone made under that name since is never
/// deleted; a Service that is already gone is no error.
async fn remove_own(ctx: &Context, mw: &ManagedWorkload, namespace: &str, name: &str) -> Result<(), Error> {
    let Some(cached) = ctx.caches.services.get(&ObjectRef::new(name).within(namespace)) else { return Ok(()) };
    if !is_controlled_by(&*cached, mw) || cached.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let Some(uid) = cached.metadata.uid.as_deref() else { return Ok(()) };
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let answer = crate::write::delete_by_uid(&api, name, uid).await;
    ctx.metrics.sent("services", "delete", &answer);
    match answer {
        Ok(deleted) => {
            if deleted {
                info!(service = %name, "deleted Service: spec.service was removed");
            }
            Ok(())
        }
        Err(source) => Err(Error::owned(Operation::Delete, "Service", namespace, name, source)),
    }
}

