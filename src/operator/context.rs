//! What every reconcile of one controller shares: the client, the caches of what workloads
//! own, what is remembered per workload, and where Events and metrics go.

use std::sync::Arc;

use kube::Client;
use kube::runtime::reflector::Store;

use super::memory::PerObject;
use super::pod_index::PodIndex;
use super::replica_sets::ReplicaSets;
use super::slim::{CachedClaim, CachedDeployment, CachedPod, CachedService};
use super::{deployment, events};
use crate::metrics::Metrics;

/// Shared state of one controller (one per watched namespace, or one for all).
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub deployments: Store<CachedDeployment>,
    /// Which ReplicaSets each Deployment controls.
    pub replica_sets: Arc<ReplicaSets>,
    pub pods: Store<CachedPod>,
    /// The workloads' claims (label-selected, trimmed).
    pub claims: Store<CachedClaim>,
    /// The workloads' Services (label-selected, trimmed).
    pub services: Store<CachedService>,
    /// Pod names per workload, so a reconcile reads its own Pods, not every managed Pod.
    pub pod_index: Arc<PodIndex>,
    pub events: events::Events,
    /// Per-workload memory, dropped when the workload goes.
    pub objects: Arc<PerObject>,
    /// The operator's settings every pod template is built with.
    pub pod_settings: Arc<deployment::PodSettings>,
    /// The reconciles in flight, for liveness.
    pub in_flight: Arc<super::liveness::InFlight>,
}
