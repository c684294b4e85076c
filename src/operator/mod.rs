//! The reconcile loop: I/O only. What the Deployment should be comes from `desired`, whether
//! it already is from `drift`, and what the status says from `status`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::{DeserializeGuard, error_boundary::InvalidObject};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{broadcast, mpsc, watch};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::desired::{self, INSTANCE_LABEL, MANAGED_LABEL};
use crate::drift;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::resource::{ManagedWorkload, ManagedWorkloadStatus, Phase};
use crate::slim::{CachedDeployment, CachedPod};
use crate::status::{self, Blocked, Observed};
use crate::telemetry::Health;

/// Field manager for everything the operator applies. Stable: changing it would leave the
/// old manager owning fields that then could never be removed.
pub use crate::drift::FIELD_MANAGER;

/// First retry after a failed reconcile; doubles per consecutive failure of the same object.
const BACKOFF_BASE: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Steady-state resync. Watches deliver every change; this only bounds how long a missed
/// event could go unnoticed. It costs reads from the local cache, never a write.
const RESYNC: Duration = Duration::from_secs(600);
/// Recheck of a workload blocked by a Deployment it does not control. That Deployment is
/// outside the operator's label-selected watch, so nothing announces its deletion; a GET
/// every few seconds lets the workload recover within seconds of the cause going away.
const CONFLICT_RECHECK: Duration = Duration::from_secs(5);
/// Retry of a Deployment the API server rejected. A spec change retries at once (it is a new
/// generation); this catches causes outside the spec (an admission policy, a webhook).
const REJECTED_RECHECK: Duration = Duration::from_secs(10);

/// What to watch and how hard to work.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Reconciles running at once (per watched namespace).
    pub concurrency: u16,
    /// Leader election; None runs the controller at once (one replica only).
    pub election: Option<crate::election::Election>,
}

/// Shared state of one controller (one per watched namespace, or one for all).
pub struct Context {
    client: Client,
    metrics: Arc<Metrics>,
    deployments: Store<CachedDeployment>,
    pods: Store<CachedPod>,
    /// Pod names per workload, so a reconcile reads its own Pods, not every managed Pod.
    pod_index: Arc<PodIndex>,
    events: crate::events::Events,
    /// Per-workload memory, dropped when the workload goes.
    objects: Arc<PerObject>,
}

/// What the operator remembers per ManagedWorkload UID between reconciles.
#[derive(Default)]
struct PerObject {
    inner: Mutex<PerObjectInner>,
}

#[derive(Default)]
struct PerObjectInner {
    /// Consecutive failures, for exponential backoff; cleared on success.
    failures: HashMap<String, u32>,
    /// The status last written, until the cache has caught up with it.
    written: HashMap<String, Written>,
    /// The Deployment as the last apply returned it, until the cache has caught up with it:
    /// while a watch is down (an API server outage) the cache keeps the old one, and every
    /// retry would apply the same change again.
    applied: HashMap<String, Deployment>,
    /// When the operator last wrote each workload's status, to let details wait (see
    /// `status::urgency`).
    last_write: HashMap<String, Instant>,
    /// UIDs listed since the watch (re)started its initial list.
    listing: Option<HashSet<String>>,
}

/// A status write the cache may not show yet.
struct Written {
    /// resourceVersion the write produced: a cached CR older than that predates the write.
    version: Option<String>,
    status: ManagedWorkloadStatus,
}

/// `cached` is older than `written`. resourceVersions are etcd revisions; they are compared as
/// numbers only to order the operator's own write against its cache, and when either does not
/// parse, only an exact match counts as caught up.
fn older(cached: Option<&str>, written: Option<&str>) -> bool {
    match (cached.and_then(|c| c.parse::<u64>().ok()), written.and_then(|w| w.parse::<u64>().ok())) {
        (Some(c), Some(w)) => c < w,
        _ => cached != written,
    }
}

impl PerObject {
    fn lock(&self) -> std::sync::MutexGuard<'_, PerObjectInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep the map in step with the CR watch: forget deleted workloads, and after a re-list
    /// (a watch gap may hide deletions) every workload that is no longer listed.
    fn observe(&self, event: &watcher::Event<Workload>) {
        let mut inner = self.lock();
        match event {
            watcher::Event::Delete(mw) => inner.forget(mw.uid().as_deref()),
            watcher::Event::Init => inner.listing = Some(HashSet::new()),
            watcher::Event::InitApply(mw) => {
                if let (Some(listing), Some(uid)) = (inner.listing.as_mut(), mw.uid()) {
                    listing.insert(uid);
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = inner.listing.take() {
                    inner.failures.retain(|uid, _| listed.contains(uid));
                    inner.written.retain(|uid, _| listed.contains(uid));
                    inner.applied.retain(|uid, _| listed.contains(uid));
                    inner.last_write.retain(|uid, _| listed.contains(uid));
                }
            }
            watcher::Event::Apply(_) => {}
        }
    }

    /// The status the CR has as far as the operator knows: the one it last wrote while the
    /// cached CR predates that write, else the cached one.
    fn previous_status(&self, mw: &ManagedWorkload) -> Option<ManagedWorkloadStatus> {
        let uid = mw.uid()?;
        let mut inner = self.lock();
        match inner.written.get(&uid) {
            Some(w) if older(mw.metadata.resource_version.as_deref(), w.version.as_deref()) => Some(w.status.clone()),
            Some(_) => {
                inner.written.remove(&uid);
                mw.status.clone()
            }
            None => mw.status.clone(),
        }
    }

    fn wrote(&self, mw: &ManagedWorkload, version: Option<String>, status: ManagedWorkloadStatus) {
        if let Some(uid) = mw.uid() {
            let mut inner = self.lock();
            inner.last_write.insert(uid.clone(), Instant::now());
            inner.written.insert(uid, Written { version, status });
        }
    }

    /// How long to hold back a status change of this urgency: none when it is urgent or the
    /// last write (if the operator made one since it started) is long enough ago.
    fn hold_back(&self, mw: &ManagedWorkload, urgency: status::Urgency) -> Duration {
        let status::Urgency::Within(delay) = urgency else { return Duration::ZERO };
        let last = mw.uid().and_then(|uid| self.lock().last_write.get(&uid).copied());
        last.map_or(Duration::ZERO, |at| delay.saturating_sub(at.elapsed()))
    }

    /// The live Deployment as far as the operator knows: the one its last apply returned while
    /// the cached one predates it, else the cached one. Nothing cached: the caller asks the
    /// API server (it may have been deleted since), and the memo goes.
    fn newest_deployment(&self, mw: &ManagedWorkload, cached: Option<Deployment>) -> Option<Deployment> {
        let Some(uid) = mw.uid() else { return cached };
        let mut inner = self.lock();
        let newer = match (&cached, inner.applied.get(&uid)) {
            (Some(c), Some(a))
                if older(c.metadata.resource_version.as_deref(), a.metadata.resource_version.as_deref()) =>
            {
                Some(a.clone())
            }
            _ => None,
        };
        if newer.is_none() {
            inner.applied.remove(&uid);
        }
        newer.or(cached)
    }

    fn applied(&self, mw: &ManagedWorkload, mut deployment: Deployment) {
        if let Some(uid) = mw.uid() {
            crate::slim::deployment(&mut deployment);
            self.lock().applied.insert(uid, deployment);
        }
    }

    fn failed(&self, uid: Option<String>) -> u32 {
        let mut inner = self.lock();
        let n = inner.failures.entry(uid.unwrap_or_default()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    fn succeeded(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.lock().failures.remove(uid);
        }
    }

    #[cfg(test)]
    fn len(&self) -> (usize, usize, usize) {
        let inner = self.lock();
        (inner.failures.len(), inner.written.len(), inner.last_write.len())
    }
}

impl PerObjectInner {
    fn forget(&mut self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.failures.remove(uid);
            self.written.remove(uid);
            self.applied.remove(uid);
            self.last_write.remove(uid);
        }
    }
}

/// Names of the managed Pods per (namespace, workload), from the Pod watch. A superset: a
/// name whose Pod is gone or relabelled is skipped and dropped when looked up, so a watch gap
/// that hides a deletion costs nothing but a stale name until the next look-up.
#[derive(Default)]
struct PodIndex {
    names: Mutex<HashMap<(String, String), BTreeSet<String>>>,
}

impl PodIndex {
    fn key(pod: &CachedPod) -> Option<(String, String)> {
        Some((pod.namespace()?, pod.labels().get(INSTANCE_LABEL)?.clone()))
    }

    fn observe(&self, event: &watcher::Event<CachedPod>) {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                if let Some(key) = Self::key(pod) {
                    names.entry(key).or_default().insert(pod.name_any());
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(key) = Self::key(pod)
                    && let Some(set) = names.get_mut(&key)
                {
                    set.remove(&pod.name_any());
                    if set.is_empty() {
                        names.remove(&key);
                    }
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// The workload's Pods from `store`, in name order (so an unchanged world reads the same).
    fn pods(&self, store: &Store<CachedPod>, namespace: &str, workload: &str) -> Vec<Arc<CachedPod>> {
        let key = (namespace.to_string(), workload.to_string());
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let Some(set) = names.get_mut(&key) else { return Vec::new() };
        let mut pods = Vec::with_capacity(set.len());
        set.retain(|name| match store.get(&ObjectRef::new(name).within(namespace)) {
            Some(pod) if Self::key(&pod).as_ref() == Some(&key) => {
                pods.push(pod);
                true
            }
            _ => false,
        });
        if set.is_empty() {
            names.remove(&key);
        }
        pods
    }
}

/// Run until SIGTERM/SIGINT: fill the caches, then (as leader, when election is on) reconcile.
/// A standby keeps its caches warm and writes nothing; on SIGTERM in-flight reconciles finish,
/// the Lease is released and this returns.
pub async fn run(client: Client, settings: Settings, metrics: Arc<Metrics>, health: Arc<Health>) -> Result<(), Error> {
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
    let shutdown = crate::election::shutdown_signal();
    let caches: Vec<Arc<Caches>> =
        scopes.into_iter().map(|ns| Arc::new(Caches::start(&client, ns, metrics.clone()))).collect();
    let (synced_tx, mut synced) = watch::channel(false);
    tokio::spawn(report_health(caches.clone(), metrics.clone(), health, synced_tx));
    // Decisions read the caches, so nothing is reconciled before they are full; and only a
    // replica whose caches are full competes for the Lease: a new leader decides at once, and
    // takeover time is the Lease's, not a full list's.
    let mut stop = shutdown.clone();
    tokio::select! {
        done = synced.wait_for(|s| *s) => if done.is_err() { return Err(Error::CacheClosed) },
        _ = stop.wait_for(|s| *s) => {
            info!("shut down before the caches synced");
            return Ok(());
        }
    }
    let concurrency = settings.concurrency;
    let term = |stop: watch::Receiver<bool>| {
        let (client, caches, metrics) = (client.clone(), caches.clone(), metrics.clone());
        async move {
            let controllers =
                caches.iter().map(|c| lead(client.clone(), c.clone(), concurrency, metrics.clone(), stop.clone()));
            futures::future::join_all(controllers).await;
        }
    };
    match settings.election {
        None => crate::election::until_stopped(crate::election::STOP_GRACE, shutdown.clone(), term(shutdown)).await,
        Some(election) => election.run(client.clone(), &metrics, shutdown, term).await?,
    }
    info!("controller stopped");
    Ok(())
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Fail fast, with a hint, when the CRD is missing or RBAC does not let the operator list
/// ManagedWorkloads where it is told to watch, instead of retrying watches forever.
async fn check_access(client: &Client, namespace: Option<&str>) -> Result<(), Error> {
    let probe = api::<ManagedWorkload>(client, namespace);
    match probe.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(Error::CrdMissing(kube::Error::Api(status))),
        Err(err) => {
            // The API's own message ("... is forbidden: User ... cannot list ...") says it all;
            // the full Status debug dump would bury it.
            let message = match err {
                kube::Error::Api(status) => status.message,
                // A TLS or connection failure is several sources down the chain.
                other => crate::check::explain_connect_error(&crate::check::error_chain(&other)),
            };
            Err(Error::Access { scope: namespace.unwrap_or("all namespaces").to_string(), message })
        }
    }
}

/// The watches of one scope (a namespace, or all), their caches, and the fan-out of "this
/// workload may need a reconcile" to whichever controller runs now. They run from start to
/// exit, leader or not, so a standby is warm when it takes over.
struct Caches {
    namespace: Option<String>,
    deployments: Store<CachedDeployment>,
    pods: Store<CachedPod>,
    workloads: Store<Workload>,
    pod_index: Arc<PodIndex>,
    objects: Arc<PerObject>,
    /// Workloads to reconcile, mapped from all three watches. Only a leader subscribes; a
    /// standby's sends go nowhere.
    triggers: broadcast::Sender<ObjectRef<Workload>>,
}

/// Queued triggers per subscriber. A leader that falls this far behind reconciles everything
/// once (see `subscribe`) instead of losing a trigger; a reconcile from the cache is cheap.
const TRIGGER_BUFFER: usize = 4096;

impl Caches {
    fn start(client: &Client, namespace: Option<String>, metrics: Arc<Metrics>) -> Caches {
        let ns = namespace.as_deref();
        let managed = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
        let (triggers, _) = broadcast::channel(TRIGGER_BUFFER);

        // Each cache keeps only what the operator reads of its objects (see slim.rs).
        let (deployments, writer) = reflector::store();
        let deployment_events = watcher(api::<CachedDeployment>(client, ns), managed.clone())
            .default_backoff()
            .reflect(writer)
            .touched_objects();
        let deployment_targets = targets(deployment_events, "deployments", owner_of);

        let (pods, writer) = reflector::store();
        let pod_index = Arc::new(PodIndex::default());
        let indexer = pod_index.clone();
        let pod_events = watcher(api::<CachedPod>(client, ns), managed)
            .default_backoff()
            .inspect(move |event| {
                if let Ok(event) = event {
                    indexer.observe(event);
                }
            })
            .reflect(writer)
            .touched_objects();
        let pod_targets = targets(pod_events, "pods", |pod: &CachedPod| {
            let name = pod.labels().get(INSTANCE_LABEL)?;
            Some(ObjectRef::new(name).within(&pod.namespace()?))
        });

        // Our own status writes change neither generation nor labels, so they do not echo back
        // as reconciles. DeserializeGuard: one object the operator cannot parse (say, stored under
        // an older schema) is reported on its own instead of failing the whole watch.
        let (workloads, writer) = reflector::store();
        let objects = Arc::new(PerObject::default());
        let pruner = objects.clone();
        let workload_events = watcher(api::<Workload>(client, ns), watcher::Config::default().any_semantic())
            .default_backoff()
            .modify(crate::slim::workload)
            .inspect(move |event| {
                if let Ok(event) = event {
                    pruner.observe(event);
                }
            })
            .reflect(writer)
            .applied_objects()
            .predicate_filter(predicates::generation.combine(predicates::labels), Default::default());
        let workload_targets =
            targets(workload_events, "managedworkloads", |mw: &Workload| Some(ObjectRef::from_obj(mw)));
        // One task drives all three watches, so their events (and cache updates) are handled
        // one at a time in the order they arrive, as when the Controller itself polled them.
        let all = futures::stream::select_all([deployment_targets, pod_targets, workload_targets]);
        tokio::spawn(fan_out(all, triggers.clone(), metrics));

        Caches { namespace, deployments, pods, workloads, pod_index, objects, triggers }
    }

    async fn ready(&self) -> bool {
        self.deployments.wait_until_ready().await.is_ok()
            && self.pods.wait_until_ready().await.is_ok()
            && self.workloads.wait_until_ready().await.is_ok()
    }
}

/// The controller a Deployment belongs to, from its controller ownerReference.
fn owner_of(deployment: &impl Resource) -> Option<ObjectRef<Workload>> {
    let owner = deployment.owner_references().iter().find(|o| {
        o.controller == Some(true)
            && o.kind == ManagedWorkload::kind(&())
            && o.api_version == ManagedWorkload::api_version(&())
    })?;
    Some(ObjectRef::new(&owner.name).within(&deployment.namespace()?))
}

/// What one watch event means for the controller: the workload to reconcile (if any), or the
/// watch's failure, named by resource.
type Target = Result<Option<ObjectRef<Workload>>, (&'static str, watcher::Error)>;

fn targets<K: Send + 'static>(
    events: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    resource: &'static str,
    map: impl Fn(&K) -> Option<ObjectRef<Workload>> + Send + 'static,
) -> futures::stream::BoxStream<'static, Target> {
    events.map(move |event| event.map(|object| map(&object)).map_err(|err| (resource, err))).boxed()
}

/// Drive the watches (which fill the caches) and send the workload each event concerns to the
/// subscribed controller, if any.
async fn fan_out(
    events: impl futures::Stream<Item = Target>,
    triggers: broadcast::Sender<ObjectRef<Workload>>,
    metrics: Arc<Metrics>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(Some(target)) => {
                // No receiver (a standby, or between terms) is fine: a new leader starts by
                // reconciling everything.
                let _ = triggers.send(target);
            }
            Ok(None) => {}
            Err((resource, err)) => {
                metrics.watch_restarted(resource);
                warn!(resource, error = %err, "watch failed; retrying with backoff");
            }
        }
    }
}

/// Mark the process ready once every watch has synced (and say so on `synced`), and keep the
/// workloads-by-phase gauges current (from the cache: free, and right on a standby too).
///
/// This is the only task that waits for the stores to become ready: kube-runtime's
/// `wait_until_ready` wakes only the last of several concurrent waiters, so everyone else
/// waits on `synced`.
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

/// The triggers from now on, as a stream; a gap (the buffer overflowed) asks for a reconcile
/// of everything through `resync`.
fn subscribe(
    triggers: &broadcast::Sender<ObjectRef<Workload>>,
    resync: mpsc::UnboundedSender<()>,
) -> impl futures::Stream<Item = ObjectRef<Workload>> + Send + 'static {
    futures::stream::unfold((triggers.subscribe(), resync), |(mut rx, resync)| async move {
        loop {
            match rx.recv().await {
                Ok(target) => return Some((target, (rx, resync))),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    warn!(missed, "the controller fell behind its watches; reconciling every workload");
                    let _ = resync.send(());
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// One term of leadership for one scope: reconcile everything once, then every trigger, until
/// `stop`; in-flight reconciles finish before this returns.
async fn lead(
    client: Client,
    caches: Arc<Caches>,
    concurrency: u16,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let (resync, resyncs) = mpsc::unbounded_channel();
    // Subscribed before the first full pass, so nothing between the two is missed.
    let triggers = subscribe(&caches.triggers, resync.clone());
    let _ = resync.send(());
    let resyncs = futures::stream::unfold(resyncs, |mut rx| async move { rx.recv().await.map(|()| ((), rx)) });
    let reporter = Reporter { controller: FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
    let (events, event_sender) = crate::events::start(client.clone(), reporter, metrics.clone());
    let ctx = Arc::new(Context {
        events,
        client,
        metrics,
        deployments: caches.deployments.clone(),
        pods: caches.pods.clone(),
        pod_index: caches.pod_index.clone(),
        objects: caches.objects.clone(),
    });
    info!(namespace = caches.namespace.as_deref(), "reconciling");
    Controller::for_stream(futures::stream::pending::<Result<Workload, watcher::Error>>(), caches.workloads.clone())
        .reconcile_on(triggers)
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

/// A ManagedWorkload as watched: parsed, or the reason it could not be.
type Workload = DeserializeGuard<ManagedWorkload>;

async fn reconcile(guard: Arc<Workload>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = guard.name_any();
    let namespace = guard.namespace().ok_or_else(|| Error::MissingNamespace(name.clone()))?;
    let span =
        info_span!("reconcile", object = %format_args!("{namespace}/{name}"), generation = guard.meta().generation);
    let timer = ctx.metrics.reconcile_started();
    let result = match &guard.0 {
        Ok(mw) => reconcile_one(mw, &ctx, &namespace, &name).instrument(span.clone()).await,
        Err(invalid) => report_invalid(&ctx, &guard, invalid).instrument(span.clone()).await,
    };
    timer.finish(result.is_ok());
    match &result {
        Ok(_) => ctx.objects.succeeded(guard.uid().as_deref()),
        // RBAC taken away at runtime: said on the object too (`kubectl describe` is where a
        // workload's owner looks; error_policy logs it for the admin). Retried with backoff,
        // so the operator recovers by itself once the permission is back.
        Err(err) => {
            if let (Some(message), Ok(mw)) = (err.forbidden(), &guard.0) {
                let note = format!(
                    "the operator lacks a permission it needs: {message}; grant the shipped Role (config/rbac) \
                     and verify with `mw-operator check`"
                );
                publish(&ctx, mw, EventType::Warning, "Forbidden", &note);
            }
        }
    }
    result
}

async fn reconcile_one(mw: &ManagedWorkload, ctx: &Context, namespace: &str, name: &str) -> Result<Action, Error> {
    // Deletion is garbage collection's job: the Deployment is owned by the CR. No finalizer,
    // so an uninstalled operator can never leave CRs stuck.
    if mw.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let Some(desired) = desired::deployment(mw) else {
        return Ok(Action::await_change());
    };
    // The decision reads both caches, which are full by now: a controller only runs once
    // every watch has synced (see `run`), so "not in the cache" means "not there".
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);

    let cached = ctx.deployments.get(&ObjectRef::new(name).within(namespace)).map(|d| d.to_deployment());
    let cached = ctx.objects.newest_deployment(mw, cached);
    // Not in the (label-selected) cache: either absent, just created and not seen yet, or a
    // Deployment someone else made under this name, which must not be touched.
    let live = match cached {
        Some(d) => Some(d),
        None => deployments.get_opt(name).await.map_err(|source| Error::GetDeployment {
            namespace: namespace.into(),
            name: name.into(),
            source,
        })?,
    };

    let mut blocked = None;
    let observed_deployment = match live {
        Some(live) if !is_controlled_by(&live, mw) => {
            blocked = Some(conflict(name));
            None
        }
        Some(live) if drift::up_to_date(&desired, &live) => Some(live),
        live => match apply(ctx, &deployments, name, &desired, live.is_some()).await {
            Ok(applied) => {
                ctx.objects.applied(mw, applied.clone());
                let verb = if live.is_some() { "updated" } else { "created" };
                info!(verb, "applied Deployment");
                // Spec changes are announced by the phase change they cause; an edit made to
                // the Deployment behind the operator's back deserves its own event.
                if live.as_ref().is_some_and(|l| drift::same_desired(&desired, l)) {
                    let note = format!("Deployment {name} was changed outside the operator; restored");
                    publish(ctx, mw, EventType::Normal, "DriftCorrected", &note);
                }
                Some(applied)
            }
            // Creation is not forced: a Deployment that appeared since the GET conflicts
            // instead of being merged into. Whose it is, the next reconcile tells (soon: a
            // blocked workload is rechecked within seconds).
            Err(kube::Error::Api(status)) if status.code == 409 && live.is_none() => {
                info!("a Deployment appeared while creating it; rechecking");
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            Err(kube::Error::Api(status)) if status.code == 400 || status.code == 422 => {
                // The API server refused the Deployment built from this spec: a spec change
                // retries at once; other causes are rechecked below.
                blocked = Some(Blocked { reason: REJECTED, message: status.message });
                live
            }
            Err(source) => {
                return Err(Error::ApplyDeployment { namespace: namespace.into(), name: name.into(), source });
            }
        },
    };

    let pods: Vec<Pod> = ctx.pod_index.pods(&ctx.pods, namespace, name).iter().map(|p| p.to_pod()).collect();
    let recheck = match &blocked {
        Some(b) if b.reason == REJECTED => Some(REJECTED_RECHECK),
        Some(_) => Some(CONFLICT_RECHECK),
        None => None,
    };
    let observed = Observed { deployment: observed_deployment.as_ref(), pods: pods.iter().collect(), blocked };
    let now = Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH));
    // Compared with what the operator last wrote, not only with the cache, which may not
    // hold that write yet: a stale cache would mean a duplicate write and phase Event.
    let mut known = mw.clone();
    known.status = ctx.objects.previous_status(mw);
    let status = status::derive(&known, &observed, &now);

    let mut held = None;
    if known.status.as_ref() != Some(&status) {
        // Details wait for more changes to fold into one write; the requeue below comes back
        // for them if nothing else does first.
        let wait = ctx.objects.hold_back(mw, status::urgency(known.status.as_ref(), &status));
        if wait.is_zero() {
            let version = write_status(ctx, namespace, name, &status).await?;
            ctx.objects.wrote(mw, version, status.clone());
            announce_phase_change(ctx, &known, &status);
        } else {
            debug!(?wait, "status details held back");
            held = Some(wait);
        }
    }
    let revisit = status::revisit_after(&known, &observed, &now);
    Ok(Action::requeue([Some(RESYNC), recheck, revisit, held].into_iter().flatten().min().unwrap_or(RESYNC)))
}

/// Reason reported when the API server refuses the Deployment built from the spec.
const REJECTED: &str = "DeploymentRejected";

fn conflict(name: &str) -> Blocked {
    Blocked {
        reason: "DeploymentConflict",
        message: format!(
            "a Deployment named {name} already exists and is not controlled by this ManagedWorkload; \
             delete or rename it, or rename the ManagedWorkload"
        ),
    }
}

/// Server-side apply of the desired Deployment. Forced once the Deployment is known to be
/// ours (controllers own their fields). Creating, it is neither forced nor able to touch an
/// existing object: the resourceVersion precondition "1" matches no stored object (etcd's
/// first write is revision 2) and is ignored when the object is created, so a Deployment
/// that appeared since the GET answers 409 instead of being merged into.
async fn apply(
    ctx: &Context,
    api: &Api<Deployment>,
    name: &str,
    desired: &Deployment,
    force: bool,
) -> Result<Deployment, kube::Error> {
    ctx.metrics.wrote("deployments", "apply");
    let mut params = PatchParams::apply(FIELD_MANAGER);
    params.force = force;
    if force {
        return api.patch(name, &params, &Patch::Apply(desired)).await;
    }
    let mut create_only = desired.clone();
    create_only.metadata.resource_version = Some("1".into());
    api.patch(name, &params, &Patch::Apply(&create_only)).await
}

fn is_controlled_by(deployment: &Deployment, mw: &ManagedWorkload) -> bool {
    let uid = mw.uid();
    deployment.owner_references().iter().any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// Returns the resourceVersion the write produced.
async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &ManagedWorkloadStatus,
) -> Result<Option<String>, Error> {
    let api: Api<ManagedWorkload> = Api::namespaced(ctx.client.clone(), namespace);
    ctx.metrics.wrote("managedworkloads/status", "apply");
    // Server-side apply: fields we stop setting (a pod IP that is gone) are removed, and no
    // resourceVersion is needed, so there are no 409 conflicts with spec writers.
    let patch = serde_json::json!({
        "apiVersion": ManagedWorkload::api_version(&()),
        "kind": ManagedWorkload::kind(&()),
        "status": status,
    });
    let written = api
        .patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::WriteStatus { namespace: namespace.into(), name: name.into(), source })?;
    debug!(phase = ?status.phase, "status written");
    Ok(written.metadata.resource_version)
}

fn announce_phase_change(ctx: &Context, mw: &ManagedWorkload, status: &ManagedWorkloadStatus) {
    let before = mw.status.as_ref().and_then(|s| s.phase);
    let Some(after) = status.phase else { return };
    // A new workload starting is the user's own act, not news: its first Event is the phase it
    // reaches (Running), or a failure (which is news from the start).
    if before == Some(after) || (before.is_none() && after == Phase::Creating) {
        debug!(to = ?after, "phase set");
        return;
    }
    let ready = status.conditions.iter().find(|c| c.type_ == status::READY);
    let note = ready.map(|c| c.message.as_str()).unwrap_or(after.as_str());
    let type_ = if after == Phase::Failed { EventType::Warning } else { EventType::Normal };
    info!(from = ?before, to = ?after, "phase changed");
    publish(ctx, mw, type_, after.as_str(), note);
}

fn publish(ctx: &Context, mw: &ManagedWorkload, type_: EventType, reason: &str, note: &str) {
    ctx.events.send(mw.object_ref(&()), type_, reason, note);
}

/// An object that does not parse cannot be reconciled; say so once, on the object, and wait
/// for it to change. Every other workload keeps being served.
async fn report_invalid(ctx: &Context, guard: &Workload, invalid: &InvalidObject) -> Result<Action, Error> {
    warn!(error = %invalid.error, "cannot parse the ManagedWorkload; skipping it until it changes");
    let note = format!("the operator cannot read this object: {}", invalid.error);
    ctx.events.send(guard.object_ref(&()), EventType::Warning, "InvalidSpec", &note);
    Ok(Action::await_change())
}

fn error_policy(mw: Arc<Workload>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(err.kind());
    let (namespace, name) = (mw.namespace(), mw.name_any());
    if err.is_permanent() {
        // Retrying the same object gets the same answer; its next change is reconciled at once.
        warn!(namespace = namespace.as_deref(), %name, error = %err, kind = err.kind(), "reconcile failed permanently; waiting for the object to change");
        ctx.objects.succeeded(mw.uid().as_deref());
        return Action::await_change();
    }
    let failures = ctx.objects.failed(mw.uid());
    let delay = backoff(failures, jitter());
    warn!(namespace = namespace.as_deref(), %name, error = %err, kind = err.kind(), failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// 2s, 4s, 8s, ... capped at 5 minutes, each stretched or shrunk by up to a fifth (`jitter` in
/// [0, 1)) so that workloads failing together (an API server outage) do not retry in lockstep.
fn backoff(failures: u32, jitter: f64) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    let base = BACKOFF_BASE.saturating_mul(1 << exp).min(BACKOFF_MAX);
    base.mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0))
}

/// A number in [0, 1), different every call. std's RandomState is seeded randomly per thread
/// and per instance, which is all jitter needs; no random-number crate for this.
fn jitter() -> f64 {
    use std::hash::BuildHasher;
    let bits = std::hash::RandomState::new().hash_one(std::time::SystemTime::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;

    fn cached(namespace: &str, name: &str, instance: &str) -> CachedPod {
        pod(namespace, name, instance).into()
    }

    fn pod(namespace: &str, name: &str, instance: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(namespace.into());
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some([(INSTANCE_LABEL.to_string(), instance.to_string())].into());
        p
    }

    #[test]
    fn pods_are_found_per_workload_and_forgotten_when_gone() {
        let index = PodIndex::default();
        let mut writer: Writer<CachedPod> = Writer::default();
        let store = writer.as_reader();
        let events = [
            watcher::Event::Init,
            watcher::Event::InitApply(cached("a", "web-2", "web")),
            watcher::Event::InitApply(cached("a", "web-1", "web")),
            watcher::Event::InitApply(cached("a", "db-1", "db")),
            watcher::Event::InitApply(cached("b", "web-1", "web")),
            watcher::Event::InitDone,
        ];
        for e in &events {
            index.observe(e);
            writer.apply_watcher_event(e);
        }
        let names = |ns, w| index.pods(&store, ns, w).iter().map(|p| p.name_any()).collect::<Vec<_>>();
        assert_eq!(names("a", "web"), ["web-1", "web-2"], "name order, this namespace only");
        assert_eq!(names("b", "web"), ["web-1"]);

        let gone = watcher::Event::Delete(cached("a", "web-1", "web"));
        index.observe(&gone);
        writer.apply_watcher_event(&gone);
        assert_eq!(names("a", "web"), ["web-2"]);

        // Relabelled to another workload: found there, not here.
        let moved = watcher::Event::Apply(cached("a", "web-2", "db"));
        index.observe(&moved);
        writer.apply_watcher_event(&moved);
        assert_eq!(names("a", "web"), Vec::<String>::new());
        assert_eq!(names("a", "db"), ["db-1", "web-2"]);
        // A deletion the watch never delivered (a gap, then a re-list without it).
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(cached("a", "db-1", "db")));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(names("a", "db"), ["db-1"]);
        let entries = index.names.lock().unwrap();
        assert_eq!(entries.len(), 2, "emptied keys are dropped: {:?}", entries.keys());
    }

    fn workload(uid: &str, rv: &str) -> Workload {
        let mut mw = ManagedWorkload::new("web", Default::default());
        mw.metadata.uid = Some(uid.into());
        mw.metadata.resource_version = Some(rv.into());
        DeserializeGuard(Ok(mw))
    }

    #[test]
    fn the_last_written_status_counts_until_the_cache_moves_past_it() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "10").0 else { unreachable!() };
        let written = ManagedWorkloadStatus { phase: Some(Phase::Running), ..Default::default() };
        objects.wrote(&mw, Some("12".into()), written.clone());
        assert_eq!(objects.previous_status(&mw), Some(written.clone()), "the cache still holds version 10");
        let mut between = mw.clone();
        between.metadata.resource_version = Some("11".into());
        assert_eq!(objects.previous_status(&between), Some(written), "version 11 (a spec change) predates it too");
        let mut caught_up = mw.clone();
        caught_up.metadata.resource_version = Some("12".into());
        assert_eq!(objects.previous_status(&caught_up), None, "the cache's own status once it has the write");
        assert_eq!(objects.len(), (0, 0, 1), "the write time stays: it spaces the next detail write");
        assert!(older(Some("9"), Some("10")) && !older(Some("10"), Some("10")) && !older(Some("11"), Some("10")));
        assert!(older(Some("x"), Some("y")) && !older(Some("y"), Some("y")), "opaque versions: only equality");
    }

    #[test]
    fn the_last_applied_deployment_counts_until_the_cache_moves_past_it() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "1").0 else { unreachable!() };
        let at = |rv: &str| {
            let mut d = Deployment::default();
            d.metadata.resource_version = Some(rv.into());
            d
        };
        objects.applied(&mw, at("20"));
        let seen = |cached: Option<Deployment>| {
            objects.newest_deployment(&mw, cached).and_then(|d| d.metadata.resource_version)
        };
        assert_eq!(seen(Some(at("10"))).as_deref(), Some("20"), "a stale cache: the applied one");
        assert_eq!(seen(Some(at("10"))).as_deref(), Some("20"), "still, on a retry");
        assert_eq!(seen(Some(at("20"))).as_deref(), Some("20"), "caught up");
        assert_eq!(seen(Some(at("10"))).as_deref(), Some("10"), "the memo went once the cache caught up");
        objects.applied(&mw, at("30"));
        assert_eq!(seen(None), None, "not cached: asked of the API server (it may be gone)");
        assert_eq!(seen(Some(at("10"))).as_deref(), Some("10"));
    }

    #[test]
    fn per_object_state_goes_with_the_object() {
        let objects = PerObject::default();
        for uid in ["u1", "u2", "u3"] {
            objects.failed(Some(uid.into()));
            let Ok(mw) = workload(uid, "1").0 else { unreachable!() };
            objects.wrote(&mw, Some("2".into()), Default::default());
        }
        objects.observe(&watcher::Event::Delete(workload("u1", "2")));
        assert_eq!(objects.len(), (2, 2, 2));
        // A re-list after a watch gap that hid u2's deletion.
        objects.observe(&watcher::Event::Init);
        objects.observe(&watcher::Event::InitApply(workload("u3", "1")));
        objects.observe(&watcher::Event::InitDone);
        assert_eq!(objects.len(), (1, 1, 1));
        objects.succeeded(Some("u3"));
        assert_eq!(objects.len(), (0, 1, 1));
    }

    #[test]
    fn backoff_doubles_and_caps_within_its_jitter() {
        let mid = |failures| backoff(failures, 0.5);
        assert_eq!(mid(1), Duration::from_secs(2));
        assert_eq!(mid(2), Duration::from_secs(4));
        assert_eq!(mid(5), Duration::from_secs(32));
        assert_eq!(mid(9), BACKOFF_MAX);
        assert_eq!(mid(u32::MAX), BACKOFF_MAX);
        assert_eq!(backoff(1, 0.0), Duration::from_millis(1600));
        assert!(backoff(1, 0.999_999) < Duration::from_millis(2400));
        assert_eq!(backoff(1, 7.0), Duration::from_millis(2400), "out-of-range jitter is clamped");
        // Drawn values differ and stay in range.
        let drawn: std::collections::HashSet<u64> = (0..50).map(|_| jitter().to_bits()).collect();
        assert!(drawn.len() > 40);
        assert!((0..1000).map(|_| jitter()).all(|j| (0.0..1.0).contains(&j)));
    }

    #[test]
    fn owned_deployments_map_to_their_controller_only() {
        let mut d = Deployment::default();
        d.metadata.namespace = Some("a".into());
        let owner = |kind: &str, controller| k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: ManagedWorkload::api_version(&()).into(),
            kind: kind.into(),
            name: format!("{kind}-owner"),
            uid: "u".into(),
            controller: Some(controller),
            ..Default::default()
        };
        d.metadata.owner_references = Some(vec![owner("ManagedWorkload", false), owner("Other", true)]);
        assert_eq!(owner_of(&d), None);
        d.metadata.owner_references.as_mut().unwrap().push(owner("ManagedWorkload", true));
        assert_eq!(owner_of(&d), Some(ObjectRef::new("ManagedWorkload-owner").within("a")));
    }
}
