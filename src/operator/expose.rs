//! The Service step of a reconcile, run before the Deployment's: `step::ensure` (the same
//! rules as the Deployment's; a delete only of the workload's own Service, and only once
//! `spec.service` is gone), and what it means: the Service as it now is for the status, or why
//! it is not what it should be.
//!
//! A foreign Service of the workload's Service name is never touched: the workload is
//! reported blocked (`ServiceConflict`) and rechecked every few seconds, so it recovers within
//! seconds of that Service going. The Deployment step goes on meanwhile: a Service problem is
//! no reason to stop a Pod that serves clients who reach it some other way.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use super::context::Context;
use super::service;
use super::slim::CachedService;
use super::status::Blocked;
use super::step::{self, Flow};
use crate::error::Error;
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
    Ok(match step::ensure(ctx, mw, namespace, &name, service::service(mw)).await? {
        Flow::Done((live, blocked)) => {
            Flow::Done(Exposed { service: live.map(|s: CachedService| Box::new(s.to_service())), blocked })
        }
        Flow::Requeue(after) => Flow::Requeue(after),
    })
}
