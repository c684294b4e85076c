//! What every reconcile of one controller shares: the client, the caches of what workloads
//! own (and what is remembered per workload), and where Events and metrics go.

use std::sync::Arc;

use kube::Client;

use super::watches::Caches;
use super::{deployment, events};
use crate::metrics::Metrics;

/// Shared state of one controller (one per watched namespace, or one for all).
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    /// The watches' caches of the scope, and what is remembered per workload.
    pub caches: Arc<Caches>,
    pub events: events::Events,
    /// The operator's settings every pod template is built with.
    pub pod_settings: Arc<deployment::PodSettings>,
    /// The reconciles in flight, for liveness.
    pub in_flight: Arc<super::liveness::InFlight>,
}
