//! One reconcile: claims (`volumes`), the NetworkPolicy (`network_policy`), then the Service
//! (`expose`) and the Deployment side by side, each through `step`, then report
//! (`status::derive`, then one status write when it differs). Only the step and the status
//! write call the API server.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tokio::sync::oneshot;
use tracing::{Instrument, debug, info, info_span, warn};

use super::context::Context;
use super::ownership::{applied_hash, is_controlled_by};
use super::plan;
use super::slim::CachedDeployment;
use super::status::{self, Blocked, Cause, Observed};
use super::status_write::{self, Written};
use super::step::{self, Flow, Judged};
use super::watches::Freshness;
use super::{deployment, expose, network_policy, volumes};
use crate::error::Error;
use crate::resource::Workload;
use crate::resource::{DesiredState, ManagedWorkload, ManagedWorkloadStatus, Phase};
use crate::retry::Backoff;

/// After a failed reconcile: 2 s, doubling per consecutive failure, up to 5 minutes.
const BACKOFF: Backoff = Backoff { base: Duration::from_secs(2), max: Duration::from_secs(300) };
/// Recheck of a workload blocked by a Deployment it does not control: that Deployment is
/// outside the label-selected watch, so nothing announces its deletion.
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(5);
/// Recheck when the cached workload is older than the one of its name (re-created or
/// changed): the watch catches up within moments.
const SUPERSEDED_RECHECK: Duration = Duration::from_secs(1);
/// Recheck while waiting for an object of its name to be deleted (garbage collection takes
/// moments; the watches announce most of them).
const DEPARTING_RECHECK: Duration = Duration::from_secs(2);
/// Retry of a rejected Deployment. A spec change retries at once; this covers causes outside
/// the spec (a quota, an admission policy, a webhook).
const REJECTED_RECHECK: Duration = Duration::from_secs(10);

pub async fn reconcile(guard: Arc<Workload>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = guard.name_any();
    let namespace = guard.namespace().ok_or_else(|| Error::MissingNamespace(name.clone()))?;
    let span =
        info_span!("reconcile", object = %format_args!("{namespace}/{name}"), generation = guard.meta().generation);
    let timer = ctx.metrics.reconcile_started();
    let _running = ctx.in_flight.start();
    let result = match &guard.0 {
        Ok(mw) => reconcile_one(mw, &ctx, &namespace, &name).instrument(span.clone()).await,
        Err(invalid) => report_invalid(&ctx, &guard, invalid).instrument(span.clone()).await,
    };
    timer.finish(result.is_ok());
    match &result {
        Ok(_) => ctx.caches.objects.succeeded(guard.uid().as_deref()),
        // A permission removed at runtime: also said on the object (`kubectl describe` is where the
        // owner looks). Retried with backoff, so the operator recovers once it is granted again.
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

/// What acting on the Deployment (and the Service) left to report.
struct Acted {
    /// The Deployment as it now is, when this workload controls one.
    deployment: Option<Deployment>,
    /// The workload's Service as it now is, when it asks for one and controls it.
    service: Option<Service>,
    /// Why it is not what it should be, when a human must act.
    blocked: Option<Blocked>,
}

async fn reconcile_one(mw: &ManagedWorkload, ctx: &Context, namespace: &str, name: &str) -> Result<Action, Error> {
    if ctx.caches.workloads_watch.freshness() == Freshness::Listing {
        // The end of the re-list reconciles every workload from the cache as it then is.
        debug!("the workloads' watch is listing again; waiting for its end");
        return Ok(Action::await_change());
    }
    // Deletion is garbage collection's job (the CR owns everything). No finalizer, so an
    // uninstalled operator never leaves CRs stuck.
    if mw.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // Its namespace is being deleted (`error_policy`): the deletion takes the workload too,
    // and every object re-made for it would be refused.
    if ctx.caches.objects.is_closing(mw) {
        return Ok(Action::await_change());
    }
    let Some(desired) = deployment::deployment(mw, &ctx.pod_settings) else {
        return Ok(Action::await_change());
    };
    if is_superseded(ctx, mw, namespace, name).await {
        debug!("the ManagedWorkload of this name is newer than the cache's; waiting for the cache to catch up");
        return Ok(Action::requeue(SUPERSEDED_RECHECK));
    }
    // Claims first, so a Pod never waits for a claim the operator has yet to make.
    let claims = match volumes::reconcile(ctx, mw, namespace).await? {
        Flow::Done(claims) => claims,
        Flow::Requeue(after) => return Ok(Action::requeue(after)),
    };
    // Isolation before the Deployment, so a Pod never starts without the policy it asks for.
    let isolation = match network_policy::reconcile(ctx, mw, namespace).await? {
        Flow::Done(blocked) => blocked,
        Flow::Requeue(after) => return Ok(Action::requeue(after)),
    };
    // A claim or isolation problem holds the workload where it is (its Pod would mount someone
    // else's claim, or one being deleted, or run without its isolation). A stop still goes ahead.
    let running = mw.spec.desired_state() == DesiredState::Running;
    let hold = match (&claims.blocked, &claims.deleting) {
        (Some(blocked), _) => Some(blocked.clone()),
        (None, Some(claim)) if running => Some(volumes::deleting(claim)),
        _ => None,
    }
    .or(isolation);
    let held = hold.is_some() && running;
    // The Service and the Deployment side by side: creating a Service is the API server's
    // slowest write here (it allocates the cluster IP, at a cost that grows with the Services
    // in the cluster), and the rollout need not wait for it. The status written beside the
    // Deployment's apply waits for the Service instead, so a new workload's first status
    // carries its cluster IP. An existing Service comes from the cache at once.
    let (exposed_tx, exposed_rx) = oneshot::channel();
    let expose = async {
        let flow = expose::reconcile(ctx, mw, namespace).await;
        if let Ok(Flow::Done(exposed)) = &flow {
            let _ = exposed_tx.send((exposed.service.as_deref().cloned(), exposed.blocked.clone()));
        }
        flow
    };
    let deployment_step = step::step_beside(
        ctx,
        mw,
        namespace,
        name,
        |live| if held { Err(Held) } else { Ok((Cow::Borrowed(&desired), plan::decide(mw, &desired, live))) },
        |live| {
            // Before the first Deployment exists, the one being created stands in for it.
            let deployment = Some(live.map_or_else(|| desired.clone(), CachedDeployment::to_deployment));
            let (hold, claims, desired) = (hold.clone(), &claims, &desired);
            async move {
                // No Service to report (its step failed or asks to look again): the report after
                // the next reconcile's steps writes the status.
                let Ok((service, service_blocked)) = exposed_rx.await else { return };
                let before = Acted { deployment, service, blocked: hold.or(service_blocked) };
                report_ahead(ctx, mw, namespace, name, desired, before, claims).await
            }
        },
    );
    let (exposed, verdict) = tokio::join!(expose, deployment_step);
    // The Deployment's verdict first: judging it remembers an applied Deployment, which the next
    // reconcile needs also when the Service's step failed.
    let judged = verdict?.judge(ctx, mw, name);
    let exposed = match exposed? {
        Flow::Done(exposed) => exposed,
        Flow::Requeue(after) => return Ok(Action::requeue(after)),
    };
    let service = exposed.service.map(|s| *s);
    let (deployment, blocked) = match judged {
        Judged::Left(Held, live) => (live.filter(|d| is_controlled_by(d, mw)), None),
        Judged::Done { live, blocked, .. } => (live, blocked),
        Judged::Requeue(after) => return Ok(Action::requeue(after)),
    };
    let deployment = deployment.map(|d| d.to_deployment());
    let acted = Acted { deployment, service, blocked: blocked.or(hold).or(exposed.blocked) };
    report(ctx, mw, namespace, name, &desired, acted, &claims).await
}

/// The Deployment step's reason to leave the Deployment alone: a claim or isolation problem
/// holds the workload.
struct Held;

/// Whether the cached `mw` is no longer the workload of its name (re-created or changed, and
/// the cache has not heard yet). The watches are separate streams, so the Deployment cache
/// may already miss the Deployment of a workload the CR cache still holds; acting then would
/// create objects for a deleted owner, which garbage collection deletes at once. One metadata
/// GET, only for a reconciled workload whose Deployment is not cached, or while the workloads'
/// watch is interrupted. A failed GET answers no: this check saves a write, never holds one.
async fn is_superseded(ctx: &Context, mw: &ManagedWorkload, namespace: &str, name: &str) -> bool {
    let interrupted = ctx.caches.workloads_watch.freshness() == Freshness::Interrupted;
    if !interrupted
        && (ctx.caches.previous_status(mw).is_none()
            || ctx.caches.deployments.get(&ObjectRef::new(name).within(namespace)).is_some())
    {
        return false;
    }
    let api: Api<ManagedWorkload> = Api::namespaced(ctx.client.clone(), namespace);
    match api.get_metadata_opt(name).await {
        Ok(current) => !current.is_some_and(|c| {
            (c.uid(), c.meta().generation, c.labels()) == (mw.uid(), mw.meta().generation, mw.labels())
        }),
        Err(err) => {
            debug!(error = %err, "could not confirm that the workload is current; going on");
            false
        }
    }
}

/// Derive the status and write it when it differs from the CR's (details once they have
/// waited long enough).
async fn report(
    ctx: &Context,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
    desired: &Deployment,
    acted: Acted,
    claims: &volumes::Claims,
) -> Result<Action, Error> {
    let recheck = acted.blocked.as_ref().map(|b| match b.cause {
        Cause::Departing => DEPARTING_RECHECK,
        Cause::Rejected => REJECTED_RECHECK,
        Cause::Conflict => CONFLICT_RECHECK,
    });
    let pods = workload_pods(ctx, namespace, name, &acted);
    let sandbox = sandbox_failure(ctx, mw, namespace, &pods).await;
    let derived = derive(ctx, mw, desired, &acted, claims, &pods, sandbox.as_deref());
    let mut held = None;
    if derived.changed() {
        // Details wait so more changes fold into one write; the requeue below comes back for them.
        let wait = ctx.caches.objects.hold_back(mw, derived.urgency());
        if wait.is_zero() {
            if write(ctx, mw, namespace, name, &derived).await? == Written::Superseded {
                return Ok(Action::requeue(SUPERSEDED_RECHECK));
            }
        } else {
            debug!(?wait, "status details held back");
            held = Some(wait);
        }
    }
    // With nothing to come back for, wait for a change; `resync` visits the workload meanwhile.
    let requeue = [recheck, derived.revisit, held, claims.retry].into_iter().flatten().min();
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Write the transition a spec change starts (Stopping, Updating, Creating) while its
/// Deployment apply is in flight, so it shows one round trip sooner. It is derived from the
/// old Deployment, which the status reads as not yet rolled out. Only an urgent change of a
/// generation not yet reported is written; the report after the apply corrects it if needed.
///
/// Before the first Deployment exists, the one being created stands in for it (no status
/// yet, as the API server's answer will be), so a new workload's first status goes out beside
/// its create: one round trip instead of two (`status::tests` checks they agree).
async fn report_ahead(
    ctx: &Context,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
    desired: &Deployment,
    acted: Acted,
    claims: &volumes::Claims,
) {
    let pods = workload_pods(ctx, namespace, name, &acted);
    let derived = derive(ctx, mw, desired, &acted, claims, &pods, None);
    let reported = derived.known.status.as_ref().and_then(|s| s.observed_generation) == mw.metadata.generation;
    if reported || !derived.changed() || derived.urgency() != status::Urgency::Now {
        return;
    }
    if let Err(err) = write(ctx, mw, namespace, name, &derived).await {
        debug!(error = %err, "the status written beside the apply failed; the report after it writes it");
    }
}

/// The status derived from what was observed and acted on, beside the one the workload has.
struct Derived {
    /// The workload with the status last written: the cache may not hold that write yet, and
    /// comparing with it would cause a duplicate write and phase Event.
    known: ManagedWorkload,
    status: ManagedWorkloadStatus,
    /// When the same world would derive another status (`status::revisit_after`).
    revisit: Option<Duration>,
}

impl Derived {
    fn changed(&self) -> bool {
        self.known.status.as_ref() != Some(&self.status)
    }

    fn urgency(&self) -> status::Urgency {
        status::urgency(self.known.status.as_ref(), &self.status)
    }
}

/// The workload's Pods: labelled as its own and owned by its Deployment's ReplicaSets
/// (anyone could create a Pod with those labels).
fn workload_pods(ctx: &Context, namespace: &str, name: &str, acted: &Acted) -> Vec<Pod> {
    let deployment_uid = acted.deployment.as_ref().and_then(|d| d.metadata.uid.as_deref());
    let caches = &ctx.caches;
    caches
        .pod_index
        .pods(&caches.pods, namespace, name)
        .iter()
        .map(|p| p.to_pod())
        .filter(|p| deployment_uid.is_some_and(|uid| caches.replica_sets.owns(uid, p)))
        .collect()
}

/// Why the kubelet cannot make a system container's sandbox, once it has failed for a while
/// (`status::sandbox_stuck`): the newest `FailedCreatePodSandBox` Event of the Pod, since the
/// Pod's status does not say. A failed read gives no reason; the next reconcile looks again.
async fn sandbox_failure(ctx: &Context, mw: &ManagedWorkload, namespace: &str, pods: &[Pod]) -> Option<String> {
    mw.spec.system_container.as_ref()?;
    let now = Time(Timestamp::now());
    let uid = pods.iter().find(|p| status::sandbox_stuck(p, &now))?.metadata.uid.clone()?;
    let events: Api<CoreEvent> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("involvedObject.uid={uid},reason=FailedCreatePodSandBox");
    match events.list(&ListParams::default().fields(&selector)).await {
        Ok(list) => {
            list.items.into_iter().max_by_key(|e| e.last_timestamp.clone().map(|t| t.0)).and_then(|e| e.message)
        }
        Err(err) => {
            debug!(error = %err, "could not read the Pod's sandbox Events");
            None
        }
    }
}

fn derive(
    ctx: &Context,
    mw: &ManagedWorkload,
    desired: &Deployment,
    acted: &Acted,
    claims: &volumes::Claims,
    pods: &[Pod],
    sandbox: Option<&str>,
) -> Derived {
    let caches = &ctx.caches;
    let observed = Observed {
        desired_hash: applied_hash(desired).unwrap_or_default(),
        deployment: acted.deployment.as_ref(),
        pods: pods.iter().collect(),
        blocked: acted.blocked.clone(),
        claims: claims.own.iter().collect(),
        refused: &claims.refused,
        service: acted.service.as_ref(),
        sandbox,
    };
    let now = Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH));
    let mut known = mw.clone();
    known.status = caches.previous_status(mw);
    let status = status::derive(&known, &observed, &now);
    let revisit = status::revisit_after(&known, &observed, &now);
    Derived { known, status, revisit }
}

/// Write the derived status, remember it, and announce a phase change. Says whether the
/// workload of that name is still the one reconciled.
async fn write(
    ctx: &Context,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
    derived: &Derived,
) -> Result<Written, Error> {
    let answer = status_write::write(&ctx.client, mw, &derived.status).await;
    ctx.metrics.sent("managedworkloads/status", "patch", &answer);
    let written =
        answer.map_err(|source| Error::WriteStatus { namespace: namespace.into(), name: name.into(), source })?;
    match &written {
        Written::Version(version) => {
            debug!(phase = ?derived.status.phase, "status written");
            ctx.caches.objects.wrote(mw, version.clone(), derived.status.clone());
            announce_phase_change(ctx, &derived.known, &derived.status);
        }
        Written::Superseded => debug!("status not written: the workload of this name is another one by now"),
    }
    Ok(written)
}

fn announce_phase_change(ctx: &Context, mw: &ManagedWorkload, status: &ManagedWorkloadStatus) {
    let before = mw.status.as_ref().and_then(|s| s.phase);
    let Some(after) = status::phase_news(mw.status.as_ref(), status) else {
        debug!(from = ?before, to = ?status.phase, "phase set");
        return;
    };
    let ready = status.conditions.iter().find(|c| c.type_ == status::READY);
    let note = ready.map(|c| c.message.as_str()).unwrap_or(after.as_str());
    let type_ = if after == Phase::Failed { EventType::Warning } else { EventType::Normal };
    info!(from = ?before, to = ?after, "phase changed");
    publish(ctx, mw, type_, after.as_str(), note);
}

fn publish(ctx: &Context, mw: &ManagedWorkload, type_: EventType, reason: &str, note: &str) {
    ctx.events.send(mw.object_ref(&()), type_, reason, note);
}

/// An object that does not parse cannot be reconciled: say so once on the object and wait
/// for it to change.
async fn report_invalid(ctx: &Context, guard: &Workload, invalid: &InvalidObject) -> Result<Action, Error> {
    warn!(error = %invalid.error, "cannot parse the ManagedWorkload; skipping it until it changes");
    let note = format!("the operator cannot read this object: {}", invalid.error);
    ctx.events.send(guard.object_ref(&()), EventType::Warning, "InvalidSpec", &note);
    Ok(Action::await_change())
}

pub fn error_policy(mw: Arc<Workload>, err: &Error, ctx: Arc<Context>) -> Action {
    let (namespace, name) = (mw.namespace(), mw.name_any());
    if err.namespace_terminating() {
        // The namespace's deletion removes the workload's objects before the workload itself:
        // re-making them, or reporting each refusal in its status and an Event, would fight it.
        info!(namespace = namespace.as_deref(), %name, "its namespace is being deleted; leaving the workload to it");
        ctx.caches.objects.closing(mw.uid().as_deref());
        return Action::await_change();
    }
    ctx.metrics.reconcile_failed(err.kind());
    if err.is_permanent() {
        // Retrying gets the same answer; the object's next change is reconciled at once.
        warn!(namespace = namespace.as_deref(), %name, error = %err, kind = err.kind(), "reconcile failed permanently; waiting for the object to change");
        ctx.caches.objects.succeeded(mw.uid().as_deref());
        return Action::await_change();
    }
    let failures = ctx.caches.objects.failed(mw.meta().uid.as_deref());
    let delay = BACKOFF.delay(failures);
    warn!(namespace = namespace.as_deref(), %name, error = %err, kind = err.kind(), failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
