//! The operator: watches ManagedWorkloads and what they own, and reconciles each into the
//! objects it asks for. `watches` fills the caches; `reconcile` takes each owned kind through
//! `step` (observe, `plan` decides, apply, judge) and then reports the status (`status`, pure).
//! Each owned kind has a pure builder (`deployment`, `claims`, `service`, `network_policy`);
//! `ownership` and `drift` are shared by all. CONTRIBUTING.md lists every module.
//!
//! This file runs it all: caches first, then, while leading, one controller per watched scope.

pub mod by_uid;
pub mod claims;
pub mod context;
pub mod deployment;
pub mod drift;
pub mod events;
pub mod expose;
pub mod liveness;
pub mod memory;
pub mod network_policy;
pub mod ownership;
pub mod plan;
pub mod pod_index;
pub mod reconcile;
pub mod replica_sets;
pub mod resync;
pub mod service;
pub mod slim;
pub mod status;
pub mod status_write;
pub mod step;
pub mod volumes;
pub mod watches;

#[cfg(test)]
mod properties;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info};

use crate::election::{Election, Leadership};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::resource::ManagedWorkload;
use crate::resource::Workload;
use crate::telemetry::Health;
use context::Context;
use ownership::FIELD_MANAGER;
use reconcile::{error_policy, reconcile};
use watches::{Caches, subscribe};

/// What to watch and how hard to work.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Reconciles running at once (per watched namespace).
    pub concurrency: u16,
    /// Leader election; None runs the controller at once (one replica only).
    pub election: Option<crate::election::Election>,
    /// What every workload's pod template is built with (the GPU resource name).
    pub pod_settings: deployment::PodSettings,
}

/// Run until SIGTERM/SIGINT: fill the caches, then reconcile while leading. A standby keeps
/// its caches warm and writes nothing; on SIGTERM in-flight reconciles finish and the Lease is
/// released.
pub async fn run(
    clients: crate::client::Clients,
    settings: Settings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> Result<(), Error> {
    let client = clients.requests.clone();
    let scopes: Vec<Option<String>> = if settings.namespaces.is_empty() {
        vec![None]
    } else {
        settings.namespaces.iter().cloned().map(Some).collect()
    };
    for scope in &scopes {
        check_access(&client, scope.as_deref()).await?;
    }
    info!(namespaces = ?settings.namespaces, concurrency = settings.concurrency, "starting ManagedWorkload controller");
    // One controller per watched namespace, each with its own limit.
    metrics.set_max_concurrent(i64::from(settings.concurrency) * scopes.len() as i64);
    let shutdown = crate::shutdown::signal();
    // One API server answers for every scope.
    let lists =
        crate::reflect::initial_lists(&crate::client::api_in::<ManagedWorkload>(&client, scopes[0].as_deref())).await;
    let caches: Vec<Arc<Caches>> = scopes
        .into_iter()
        .map(|ns| Arc::new(Caches::start(&clients.watches, ns, lists.clone(), metrics.clone())))
        .collect();
    let (synced_tx, mut synced) = watch::channel(false);
    let in_flight = Arc::new(liveness::InFlight::default());
    tokio::spawn(liveness::report(in_flight.clone(), health.clone()));
    tokio::spawn(report_health(caches.clone(), metrics.clone(), health, synced_tx));
    // Nothing is reconciled before the caches are full, since decisions read them; and only a
    // replica with full caches competes for the Lease, so a new leader can act at once.
    let mut stop = shutdown.clone();
    tokio::select! {
        done = synced.wait_for(|s| *s) => if done.is_err() { return Err(Error::CacheClosed) },
        _ = stop.wait_for(|s| *s) => {
            info!("shut down before the caches synced");
            return Ok(());
        }
    }
    let concurrency = settings.concurrency;
    let pod_settings = Arc::new(settings.pod_settings);
    // Every write of a term (applies, status writes, Events) is fenced by the leader's deadline;
    // the Lease requests and the watches use the plain clients.
    let leadership = settings.election.as_ref().map_or_else(Leadership::unfenced, Election::leadership);
    let writer = leadership.client(clients.config.clone()).map_err(Error::Client)?;
    let term = |stop: watch::Receiver<bool>| {
        let (client, caches, metrics, pod_settings, in_flight) =
            (writer.clone(), caches.clone(), metrics.clone(), pod_settings.clone(), in_flight.clone());
        async move {
            let controllers = caches.iter().map(|c| {
                let shared = Shared {
                    client: client.clone(),
                    metrics: metrics.clone(),
                    pod_settings: pod_settings.clone(),
                    in_flight: in_flight.clone(),
                };
                lead(shared, c.clone(), concurrency, stop.clone())
            });
            futures::future::join_all(controllers).await;
        }
    };
    match settings.election {
        None => crate::shutdown::until_stopped(crate::shutdown::STOP_GRACE, shutdown.clone(), term(shutdown)).await,
        Some(election) => {
            let leading = |lease: &str, leads: bool| metrics.set_leader(lease, leads);
            election.run(client.clone(), &leadership, leading, shutdown, term).await?
        }
    }
    info!("controller stopped");
    Ok(())
}

/// Fail fast with a hint when the CRD is missing or RBAC forbids listing ManagedWorkloads,
/// instead of retrying watches forever.
async fn check_access(client: &Client, namespace: Option<&str>) -> Result<(), Error> {
    match crate::client::may_list::<ManagedWorkload>(client, namespace).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(Error::CrdMissing(kube::Error::Api(status))),
        Err(err) => {
            // The API's own message ("... is forbidden: User ... cannot list ...") says it all; the
            // full Status dump would bury it.
            let message = match err {
                kube::Error::Api(status) => status.message,
                // A TLS or connection failure is several sources down the chain.
                other => crate::check::explain_connect_error(&crate::check::error_chain(&other)),
            };
            Err(Error::Access { scope: namespace.unwrap_or("all namespaces").to_string(), message })
        }
    }
}

/// Mark the process ready once every watch has synced (and say so on `synced`), and keep the
/// workloads-by-phase gauges current from the cache (so right on a standby too). Only this
/// task waits on the stores: kube-runtime's `wait_until_ready` wakes only the last of several
/// waiters, so everyone else waits on `synced`.
async fn report_health(
    caches: Vec<Arc<Caches>>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    synced: watch::Sender<bool>,
) {
    let mut all_ready = true;
    for cache in &caches {
        all_ready &= cache.ready().await;
    }
    if !all_ready {
        // A watch stream ended (shutdown): nothing to report.
        return;
    }
    info!("caches synced; ready");
    health.set_ready(true);
    let _ = synced.send(true);
    loop {
        let mut counts = std::collections::BTreeMap::new();
        for cache in &caches {
            for guard in cache.workloads.state() {
                let phase = guard.0.as_ref().ok().and_then(|mw| mw.status.as_ref()?.phase);
                *counts.entry(crate::metrics::phase_label(phase)).or_insert(0) += 1;
            }
        }
        metrics.set_workloads(&counts);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// What every scope's controller shares.
struct Shared {
    client: Client,
    metrics: Arc<Metrics>,
    pod_settings: Arc<deployment::PodSettings>,
    in_flight: Arc<liveness::InFlight>,
}

/// One term of leadership for one scope: reconcile everything once, then every trigger, until
/// `stop`; in-flight reconciles finish and queued Events are sent. Dropped instead when
/// leadership is lost, with its reconciles and Events task.
async fn lead(shared: Shared, caches: Arc<Caches>, concurrency: u16, mut stop: watch::Receiver<bool>) {
    let Shared { client, metrics, pod_settings, in_flight } = shared;
    // An earlier term's memory is stale (another leader may have written since): the first pass
    // rewrites every status that differs from what the caches derive.
    caches.objects.new_term();
    let (resync, resyncs) = mpsc::unbounded_channel();
    // Subscribed before the first full pass, so nothing between the two is missed.
    let triggers = subscribe(&caches.triggers, resync.clone());
    let _ = resync.send(());
    let resyncs = futures::stream::unfold(resyncs, |mut rx| async move { rx.recv().await.map(|()| ((), rx)) });
    let reporter = Reporter { controller: FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
    let (events, event_sender) = events::start(client.clone(), reporter, metrics.clone());
    let ctx = Arc::new(Context { client, metrics, caches: caches.clone(), events, pod_settings, in_flight });
    info!(namespace = caches.namespace.as_deref(), "reconciling");
    Controller::for_stream(futures::stream::pending::<Result<Workload, watcher::Error>>(), caches.workloads.clone())
        .reconcile_on(triggers)
        .reconcile_on(resync::paced(caches.workloads.clone()))
        .reconcile_all_on(resyncs)
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(namespace = obj.namespace.as_deref(), name = %obj.name, "reconciled"),
                // Reconcile failures are logged by error_policy.
                Err(err) => debug!(error = %err, "reconcile did not complete"),
            }
        })
        .await;
    // The controller (and with it every handle to the event queue) is gone: send what is queued.
    event_sender.drain().await;
    info!(namespace = caches.namespace.as_deref(), "stopped reconciling");
}
