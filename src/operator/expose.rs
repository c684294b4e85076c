//! The Service step of a reconcile, beside the Deployment's: `step::ensure` (deleting only the
//! workload's own Service, once `spec.service` is gone), and what it means for the status.
//!
//! A foreign Service of that name is never touched: the workload is reported blocked
//! (`ServiceConflict`) and rechecked every few seconds. The Deployment step goes on meanwhile:
//! a Service problem is no reason to stop a Pod clients may reach some other way.

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
    /// The workload's own Service as it now is; None without `spec.service` or while blocked.
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
