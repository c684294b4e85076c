//! The reconcile loop: I/O only. What the Deployment should be comes from `desired`, whether
//! it already is from `drift`, and what the status says from `status`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::{DeserializeGuard, error_boundary::InvalidObject};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller, Error as ControllerError};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::desired::{self, INSTANCE_LABEL, MANAGED_LABEL};
use crate::drift;
use crate::error::Error;
use crate::resource::{ManagedWorkload, ManagedWorkloadStatus, Phase};
use crate::status::{self, Blocked, Observed};

/// Field manager for everything the operator applies. Stable: changing it would leave the
/// old manager owning fields that then could never be removed.
pub use crate::drift::FIELD_MANAGER;

/// First retry after a failed reconcile; doubles per consecutive failure of the same object.
const BACKOFF_BASE: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Steady-state resync. Watches deliver every change; this only bounds how long a missed
/// event could go unnoticed. It costs reads from the local cache, never a write.
const RESYNC: Duration = Duration::from_secs(600);

/// What to watch and how hard to work.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Reconciles running at once (per watched namespace).
    pub concurrency: u16,
}

/// Shared state of one controller (one per watched namespace, or one for all).
pub struct Context {
    client: Client,
    deployments: Store<Deployment>,
    pods: Store<Pod>,
    recorder: Recorder,
    /// Consecutive failures per object UID, for exponential backoff; cleared on success.
    failures: Mutex<HashMap<String, u32>>,
}

/// Run the controller until SIGTERM/SIGINT.
pub async fn run(client: Client, settings: Settings) -> Result<(), Error> {
    let scopes: Vec<Option<String>> = if settings.namespaces.is_empty() {
        vec![None]
    } else {
        settings.namespaces.iter().cloned().map(Some).collect()
    };
    for scope in &scopes {
        check_access(&client, scope.as_deref()).await?;
    }
    info!(namespaces = ?settings.namespaces, concurrency = settings.concurrency, "starting ManagedWorkload controller");
    let controllers = scopes.into_iter().map(|ns| run_scope(client.clone(), ns, settings.concurrency));
    futures::future::join_all(controllers).await;
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
                other => other.to_string(),
            };
            Err(Error::Access { scope: namespace.unwrap_or("all namespaces").to_string(), message })
        }
    }
}

async fn run_scope(client: Client, namespace: Option<String>, concurrency: u16) {
    let ns = namespace.as_deref();
    let managed = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));

    let (deployments, writer) = reflector::store();
    let deployment_events = watcher(api::<Deployment>(&client, ns), managed.clone())
        .default_backoff()
        .modify(|d| d.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects();

    // Only metadata and status of Pods are read; dropping the spec keeps the cache small.
    let (pods, writer) = reflector::store();
    let pod_events = watcher(api::<Pod>(&client, ns), managed)
        .default_backoff()
        .modify(|p| {
            p.managed_fields_mut().clear();
            p.spec = None;
        })
        .reflect(writer)
        .touched_objects();

    // Our own status writes change neither generation nor labels, so they do not echo back
    // as reconciles. DeserializeGuard: one object the operator cannot parse (say, stored under
    // an older schema) is reported on its own instead of failing the whole watch.
    let (workloads, writer) = reflector::store();
    let workload_events = watcher(api::<Workload>(&client, ns), watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|mw| mw.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation.combine(predicates::labels), Default::default());

    let reporter = Reporter { controller: FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        deployments,
        pods,
        failures: Mutex::default(),
    });

    Controller::for_stream(workload_events, workloads)
        .owns_stream(deployment_events)
        .watches_stream(pod_events, |pod: Pod| {
            let name = pod.labels().get(INSTANCE_LABEL)?;
            Some(ObjectRef::new(name).within(&pod.namespace()?))
        })
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(namespace = obj.namespace.as_deref(), name = %obj.name, "reconciled"),
                // Reconcile failures are logged by error_policy; a failing watch (RBAC, network)
                // is only visible here.
                Err(ControllerError::QueueError(err)) => warn!(error = %err, "watch failed; retrying with backoff"),
                Err(err) => debug!(error = %err, "reconcile did not complete"),
            }
        })
        .await;
}

/// A ManagedWorkload as watched: parsed, or the reason it could not be.
type Workload = DeserializeGuard<ManagedWorkload>;

async fn reconcile(guard: Arc<Workload>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = guard.name_any();
    let namespace = guard.namespace().ok_or_else(|| Error::MissingNamespace(name.clone()))?;
    let span = info_span!("reconcile", %namespace, %name, generation = guard.meta().generation);
    let mw = match &guard.0 {
        Ok(mw) => mw,
        Err(invalid) => return report_invalid(&ctx, &guard, invalid).instrument(span).await,
    };
    let result = reconcile_one(mw, &ctx, &namespace, &name).instrument(span).await;
    if let (Ok(_), Some(uid)) = (&result, mw.uid()) {
        ctx.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
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
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);

    let cached = ctx.deployments.get(&ObjectRef::new(name).within(namespace)).map(|d| (*d).clone());
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
            blocked = Some(Blocked {
                reason: "DeploymentConflict",
                message: format!(
                    "a Deployment named {name} already exists and is not controlled by this ManagedWorkload; \
                     delete or rename it, or rename the ManagedWorkload"
                ),
            });
            None
        }
        Some(live) if drift::up_to_date(&desired, &live) => Some(live),
        live => match apply(&deployments, name, &desired).await {
            Ok(applied) => {
                let verb = if live.is_some() { "updated" } else { "created" };
                info!(verb, "applied Deployment");
                // Spec changes are announced by the phase change they cause; an edit made to
                // the Deployment behind the operator's back deserves its own event.
                if live.as_ref().is_some_and(|l| drift::same_desired(&desired, l)) {
                    let note = format!("Deployment {name} was changed outside the operator; restored");
                    publish(ctx, mw, EventType::Normal, "DriftCorrected", &note).await;
                }
                Some(applied)
            }
            Err(kube::Error::Api(status)) if status.code == 400 || status.code == 422 => {
                // The API server refused the Deployment built from this spec: only a spec
                // change can fix that, so report it instead of retrying.
                blocked = Some(Blocked { reason: "DeploymentRejected", message: status.message });
                live
            }
            Err(source) => {
                return Err(Error::ApplyDeployment { namespace: namespace.into(), name: name.into(), source });
            }
        },
    };

    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(namespace)
                && p.labels().get(INSTANCE_LABEL).map(String::as_str) == Some(name)
        })
        .collect();
    let observed =
        Observed { deployment: observed_deployment.as_ref(), pods: pods.iter().map(AsRef::as_ref).collect(), blocked };
    let now = Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH));
    let status = status::derive(mw, &observed, &now);

    if mw.status.as_ref() != Some(&status) {
        write_status(ctx, namespace, name, &status).await?;
        announce_phase_change(ctx, mw, &status).await;
    }
    Ok(Action::requeue(RESYNC))
}

async fn apply(api: &Api<Deployment>, name: &str, desired: &Deployment) -> Result<Deployment, kube::Error> {
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(desired)).await
}

fn is_controlled_by(deployment: &Deployment, mw: &ManagedWorkload) -> bool {
    let uid = mw.uid();
    deployment.owner_references().iter().any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

async fn write_status(ctx: &Context, namespace: &str, name: &str, status: &ManagedWorkloadStatus) -> Result<(), Error> {
    let api: Api<ManagedWorkload> = Api::namespaced(ctx.client.clone(), namespace);
    // Server-side apply: fields we stop setting (a pod IP that is gone) are removed, and no
    // resourceVersion is needed, so there are no 409 conflicts with spec writers.
    let patch = serde_json::json!({
        "apiVersion": ManagedWorkload::api_version(&()),
        "kind": ManagedWorkload::kind(&()),
        "status": status,
    });
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::WriteStatus { namespace: namespace.into(), name: name.into(), source })?;
    debug!(phase = ?status.phase, "status written");
    Ok(())
}

async fn announce_phase_change(ctx: &Context, mw: &ManagedWorkload, status: &ManagedWorkloadStatus) {
    let before = mw.status.as_ref().and_then(|s| s.phase);
    let Some(after) = status.phase else { return };
    if before == Some(after) {
        return;
    }
    let ready = status.conditions.iter().find(|c| c.type_ == status::READY);
    let note = ready.map(|c| c.message.as_str()).unwrap_or(after.as_str());
    let type_ = if after == Phase::Failed { EventType::Warning } else { EventType::Normal };
    info!(from = ?before, to = ?after, "phase changed");
    publish(ctx, mw, type_, after.as_str(), note).await;
}

async fn publish(ctx: &Context, mw: &ManagedWorkload, type_: EventType, reason: &str, note: &str) {
    record(ctx, &mw.object_ref(&()), type_, reason, note).await;
}

/// Events are best effort: failing to record one must not fail the reconcile.
async fn record(ctx: &Context, object: &ObjectReference, type_: EventType, reason: &str, note: &str) {
    let event = Event {
        type_,
        reason: reason.into(),
        // The events API caps notes at 1 kB.
        note: Some(note.chars().take(1024).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, object).await {
        warn!(error = %err, "could not record event");
    }
}

/// An object that does not parse cannot be reconciled; say so once, on the object, and wait
/// for it to change. Every other workload keeps being served.
async fn report_invalid(ctx: &Context, guard: &Workload, invalid: &InvalidObject) -> Result<Action, Error> {
    warn!(error = %invalid.error, "cannot parse the ManagedWorkload; skipping it until it changes");
    let note = format!("the operator cannot read this object: {}", invalid.error);
    record(ctx, &guard.object_ref(&()), EventType::Warning, "InvalidSpec", &note).await;
    Ok(Action::await_change())
}

fn error_policy(mw: Arc<Workload>, err: &Error, ctx: Arc<Context>) -> Action {
    let failures = {
        let mut map = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(mw.uid().unwrap_or_default()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = backoff(failures);
    warn!(namespace = mw.namespace().as_deref(), name = %mw.name_any(), error = %err, kind = err.kind(), failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// 2s, 4s, 8s, ... capped at 5 minutes.
fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    BACKOFF_BASE.saturating_mul(1 << exp).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(9), BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }
}
