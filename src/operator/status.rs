//! The status of a ManagedWorkload, derived from what the cluster reports: a pure function
//! of the CR, its Deployment and its Pods (plus the clock, passed in), so the phase table
//! of docs/resource.md is unit-tested case by case.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{ContainerStateWaiting, ContainerStatus, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use super::deployment::{self as desired};
use super::ownership::applied_hash;
use super::service;
use crate::names::TEMPLATE_HASH_ANNOTATION;
use crate::resource::{DesiredState, ManagedWorkload, ManagedWorkloadStatus, Phase};

/// Container waiting reasons that mean the Pod will not start without a change: reported as
/// `Failed` at once instead of after the rollout's progress deadline. A Secret or ConfigMap
/// (or one of its keys) not there yet is the exception: a wait (`config_wait`).
pub const FAILURE_REASONS: [&str; 5] =
    ["ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "CreateContainerConfigError", "InvalidImageName"];

/// How long a container that restarted after a termination must have been running before it
/// counts as recovered rather than crash-looping. A kubelet cycles a crash-looping container
/// through waiting → running → terminated; judging from the current state alone would flap
/// between Failed and Creating on every cycle. Two minutes covers the usual loop (a crash
/// within seconds of starting, back-off growing to five minutes) while a one-off restart is
/// reported Failed for at most two minutes after the container came back.
pub const CRASH_LOOP_RECOVERY: Duration = Duration::from_secs(120);

/// How long past its deletion deadline (`deletionTimestamp`, when the kubelet kills what is
/// left) a Pod may take to go before it counts as stuck: its kubelet is unreachable (a node
/// lost or partitioned), and the Pod stays Terminating until the node comes back or is
/// deleted. A stuck Pod no longer keeps a workload whose replacement serves out of `Running`.
pub const STUCK_TERMINATING: Duration = Duration::from_secs(30);

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
/// Deployment conditions copied into the CR's status.
pub const MIRRORED: [&str; 3] = [AVAILABLE, "Progressing", "ReplicaFailure"];
const AVAILABLE: &str = "Available";
/// The reason of a crash loop's verdict, whichever step of the kubelet's cycle it was seen in.
const CRASH_LOOP: &str = "CrashLoopBackOff";

/// What the operator saw of the workload's children in this reconcile.
#[derive(Debug)]
pub struct Observed<'a> {
    /// The fingerprint (`ownership::applied_hash`) of the Deployment the workload's current
    /// spec asks for, as the reconcile built it: a live Deployment with another one was
    /// applied from an older spec.
    pub desired_hash: &'a str,
    /// The Deployment this CR controls, if it exists.
    pub deployment: Option<&'a Deployment>,
    /// Pods labelled as this workload's.
    pub pods: Vec<&'a Pod>,
    /// Why the operator could not make the Deployment what it should be; reported as Stalled.
    pub blocked: Option<Blocked>,
    /// The workload's own claims (see claims.rs), for `status.volumes` and the verdict.
    pub claims: Vec<&'a PersistentVolumeClaim>,
    /// Changes to those claims the API server refused (claim name, its words): said on
    /// `status.volumes`; the workload runs on the claims as they are.
    pub refused: &'a [(String, String)],
    /// The workload's own Service, when it asks for one (`spec.service`) and it exists.
    pub service: Option<&'a Service>,
    /// Why the kubelet cannot make a current Pod's sandbox, in its words (the Pod's latest
    /// `FailedCreatePodSandBox` Event), once it has failed for `SANDBOX_GRACE`: read for
    /// system containers only (`sandbox_stuck`).
    pub sandbox: Option<&'a str>,
}

impl Observed<'_> {
    /// The Deployment, when it was built from the spec being reported (it carries the desired
    /// one's fingerprint). One that was not describes an older spec: the reconcile is about to
    /// apply this one (the status is derived while that apply is in flight), or something
    /// holds it back (then `blocked` says what). Its Pods are no current ones, and its scale,
    /// failures and conditions say nothing about this generation.
    fn built(&self) -> Option<&Deployment> {
        self.deployment.filter(|d| applied_hash(*d) == Some(self.desired_hash))
    }
}

/// A reason the desired Deployment cannot be applied: one only a human can fix (reported as
/// Stalled, phase Failed), or, for `Blocked::departing`, one that time fixes (a wait).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub reason: &'static str,
    pub message: String,
    pub cause: Cause,
}

/// What ends a block, and so when the workload is looked at again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// An object the workload may not touch (someone else's, or one being deleted by hand):
    /// a human ends it.
    Conflict,
    /// The API server refused the object; a cause outside the spec (a quota, an admission
    /// policy) may go away by itself.
    Rejected,
    /// An object of the workload's name on its way out: garbage collection ends it.
    Departing,
}

/// Reason of the wait for an object of the workload's name that is on its way out.
pub const WAITING_FOR_DELETION: &str = "WaitingForDeletion";

impl Blocked {
    pub fn conflict(reason: &'static str, message: String) -> Blocked {
        Blocked { reason, message, cause: Cause::Conflict }
    }

    /// The API server refused `kind` `name`, in its own words.
    pub fn rejected(reason: &'static str, kind: &str, name: &str, message: &str) -> Blocked {
        let message = format!("the API server refused {kind} {name}: {message}");
        Blocked { reason, message, cause: Cause::Rejected }
    }

    /// Waiting for `kind` `name` to go (`plan::Decision::Departing`): a workload deleted and
    /// re-created under its name meets its predecessor's objects until garbage collection
    /// has removed them. A wait, not a failure: kstatus reads it InProgress, so Argo CD and
    /// Flux keep waiting instead of aborting a sync.
    pub fn departing(kind: &str, name: &str) -> Blocked {
        Blocked {
            reason: WAITING_FOR_DELETION,
            message: format!(
                "waiting for {kind} {name} to be deleted: it belongs to a deleted ManagedWorkload of the same name, \
                 or is being deleted, and garbage collection removes it"
            ),
            cause: Cause::Departing,
        }
    }

    /// Time, not a human, ends it.
    pub fn is_wait(&self) -> bool {
        self.cause == Cause::Departing
    }
}

/// The verdict on the workload before it is spelled out as conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    phase: Phase,
    /// CamelCase reason for Ready/Reconciling/Stalled.
    reason: String,
    message: String,
}

impl Verdict {
    fn new(phase: Phase, reason: &str, message: impl Into<String>) -> Self {
        Verdict { phase, reason: reason.into(), message: message.into() }
    }
}

/// The full status the CR should have. `mw.status` is the status last written (the caller
/// makes sure of that: the cache may lag behind the operator's own writes). `now` stamps
/// conditions whose status changed; unchanged conditions keep their lastTransitionTime, so an
/// unchanged world derives an identical status and nothing is written.
pub fn derive(mw: &ManagedWorkload, observed: &Observed<'_>, now: &Time) -> ManagedWorkloadStatus {
    let generation = mw.metadata.generation;
    let previous = mw.status.as_ref();
    let desired = desired::desired_replicas(mw);
    let verdict = verdict(mw, observed, now);

    let replicas = |f: fn(&DeploymentStatus) -> Option<i32>| observed.deployment.map_or(0, |d| count(d, f));

    // A crash-looping container runs for moments between restarts. With no readiness probe
    // its Pod is Ready meanwhile, so a real kubelet makes the Deployment count it ready and
    // available, and turn Available True, then not, on every cycle. The verdict holds the
    // workload Failed through the cycle; the counts and the mirrored Available condition are
    // held with it, at "not available": a Pod the verdict calls crash-looping is no available
    // replica. Otherwise every restart would be two status writes.
    let looping = verdict.phase == Phase::Failed && verdict.reason == CRASH_LOOP;
    let available = |f: fn(&DeploymentStatus) -> Option<i32>| if looping { 0 } else { replicas(f) };

    let phase = verdict.phase;
    let ready = matches!(phase, Phase::Running | Phase::Stopped);
    let reconciling = phase.in_transition();
    let stalled = phase == Phase::Failed;
    let mut conditions = vec![
        condition(READY, ready, &verdict.reason, &verdict.message, generation),
        condition(
            RECONCILING,
            reconciling,
            if reconciling { &verdict.reason } else { "Idle" },
            if reconciling { &verdict.message } else { "No change in progress" },
            generation,
        ),
        condition(
            STALLED,
            stalled,
            if stalled { &verdict.reason } else { "Healthy" },
            if stalled { &verdict.message } else { "No failure observed" },
            generation,
        ),
    ];
    conditions.extend(mirrored(mw, observed));
    if looping {
        for c in conditions.iter_mut().filter(|c| c.type_ == AVAILABLE && c.status == "True") {
            // The Deployment controller's own words for a Deployment without its replica.
            c.status = "False".into();
            c.reason = "MinimumReplicasUnavailable".into();
            c.message = "Deployment does not have minimum availability.".into();
            c.last_transition_time = UNSET;
        }
    }
    let previous_conditions = previous.map(|s| s.conditions.as_slice()).unwrap_or_default();
    for c in &mut conditions {
        c.last_transition_time = previous_conditions
            .iter()
            .find(|p| p.type_ == c.type_ && p.status == c.status)
            .map(|p| p.last_transition_time.clone())
            .or_else(|| (c.last_transition_time.0 != UNSET.0).then(|| c.last_transition_time.clone()))
            .unwrap_or_else(|| now.clone());
    }

    ManagedWorkloadStatus {
        observed_generation: generation,
        phase: Some(phase),
        provider_id: Some(provider_id(mw)),
        pod_ip: pod_ip(mw, observed),
        address: address(mw, observed),
        service: observed.service.filter(|_| mw.spec.service.is_some()).map(service::status),
        desired_replicas: desired,
        replicas: replicas(|s| s.replicas),
        updated_replicas: replicas(|s| s.updated_replicas),
        ready_replicas: available(|s| s.ready_replicas),
        available_replicas: available(|s| s.available_replicas),
        conditions,
        volumes: volumes::statuses(mw, observed),
    }
}

/// How long a status change may wait before it is written, so that the intermediate states a
/// rollout passes through share one write instead of taking one each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// Something a client waits on changed: write it now.
    Now,
    /// Only details changed: write them at most this long after the previous status write
    /// (sooner if something urgent comes along and carries them).
    Within(Duration),
}

/// Details of a workload in a steady phase (Running, Stopped, Failed) wait this long for more
/// changes to fold in.
pub const DETAIL_DELAY: Duration = Duration::from_secs(2);
/// Details of a workload in transition (Creating, Updating, Stopping) wait longer: the
/// transition's end is written at once and carries them, and until then they only narrate
/// progress (replica counts, which step a rollout waits on: `ClaimPending`, `Creating`,
/// `WaitingForLoadBalancer`). Longer than a burst of thousands of new workloads takes to
/// converge here (about 4 minutes for 5,000), so such a burst costs two status writes per
/// workload; a transition that takes longer (a slow image pull, a load balancer that takes
/// minutes) has them refreshed every 5 minutes.
pub const DETAIL_DELAY_IN_TRANSITION: Duration = Duration::from_secs(300);
/// Waits a human may have to end, said at once when the workload enters one in transition
/// (the other steps it waits on are details): no node can host the Pod (a cluster autoscaler
/// or an administrator adds one; Manager reports the reason); its volume is still attached to
/// a lost node; a Secret or ConfigMap it reads is not there; the kubelet cannot make its
/// sandbox.
pub const STUCK_WAITS: [&str; 4] = [UNSCHEDULABLE, volumes::VOLUME_HELD_ELSEWHERE, CONFIG_WAIT, SANDBOX_WAIT];

/// Reason of a wait for a Secret or ConfigMap (the kubelet's own word for it).
const CONFIG_WAIT: &str = "CreateContainerConfigError";
/// Reason of a wait for a sandbox the kubelet cannot make yet.
const SANDBOX_WAIT: &str = "PodSandboxFailed";

/// Kubernetes' kstatus conditions, whose reason is part of what a client waits on.
const SUMMARY: [&str; 3] = [READY, RECONCILING, STALLED];

/// Whether `next` (which differs from `previous`) must be written at once. Pure: what decides
/// status writes, and the one place that does.
///
/// Urgent: the first status; phase, observed generation, provider id or desired replicas; a
/// Pod IP or address that changes or goes; any condition's status (what `kubectl wait
/// --for=condition` reads); a summary condition's observed generation (kstatus), or one
/// appearing or going; a summary reason outside a transition (a failure's reason, the end of
/// one). Details: replica counts, messages, `status.volumes`, a mirrored condition's reason,
/// message, generation or first appearance, a first Pod IP or address, `status.service`
/// details (node ports), and, in transition, which step the workload waits on (the
/// `Ready`/`Reconciling` reason: `ClaimPending` → `Creating` → `WaitingForLoadBalancer`,
/// not into one of `STUCK_WAITS`): phase, condition statuses and generations, what kstatus,
/// `kubectl wait`, Argo CD's health check and Manager's status read, are the same either way,
/// and the change rides with the transition's end.
pub fn urgency(previous: Option<&ManagedWorkloadStatus>, next: &ManagedWorkloadStatus) -> Urgency {
    let Some(previous) = previous else { return Urgency::Now };
    let same_summary = previous.phase == next.phase
        && previous.observed_generation == next.observed_generation
        && previous.provider_id == next.provider_id
        // A Pod IP that appears before the Pod is ready reaches clients with the phase that
        // makes it usable (Running, written at once); one that changes or goes is stale now.
        && (previous.pod_ip == next.pod_ip || previous.pod_ip.is_none())
        // The same for the address clients use; the Service's address, once there, changes
        // only with the Service (a load balancer's address arriving, a type change).
        && (previous.address == next.address || previous.address.is_none())
        && previous.desired_replicas == next.desired_replicas;
    let in_transition = next.phase.is_some_and(Phase::in_transition);
    let same_conditions =
        next.conditions.iter().all(|c| match previous.conditions.iter().find(|p| p.type_ == c.type_) {
            Some(p) if SUMMARY.contains(&c.type_.as_str()) => {
                p.status == c.status
                    && p.observed_generation == c.observed_generation
                    && (p.reason == c.reason || (in_transition && !STUCK_WAITS.contains(&c.reason.as_str())))
            }
            // A mirrored condition newly stamped with the current generation was true of the
            // older one too; a client waiting for the stamp gets it with the phase change the
            // rollout ends in. A changed status would be wrong to keep.
            Some(p) => p.status == c.status,
            None => !SUMMARY.contains(&c.type_.as_str()),
        }) && previous.conditions.iter().all(|p| next.conditions.iter().any(|c| c.type_ == p.type_));
    if !(same_summary && same_conditions) {
        return Urgency::Now;
    }
    Urgency::Within(if in_transition { DETAIL_DELAY_IN_TRANSITION } else { DETAIL_DELAY })
}

/// The phase `next` reached, when it is news worth an Event. A transition the user's own spec
/// change started (`Creating`, `Updating` or `Stopping` at a newer generation, a new
/// workload's first `Creating`) only restates their request: its Event is where it ends
/// (`Running`, `Stopped`, `Failed`). The same phases with no spec change are news nobody asked
/// for: a replaced Pod (`Creating`), a rollout someone else started (`Updating`). Pure, so the
/// one rule is tested without a cluster; it saves a stop, a start and an update one write each.
pub fn phase_news(previous: Option<&ManagedWorkloadStatus>, next: &ManagedWorkloadStatus) -> Option<Phase> {
    let phase = next.phase?;
    if previous.and_then(|p| p.phase) == Some(phase) {
        return None;
    }
    // `None < Some(_)`: a first status is at a newer generation than no status.
    let asked_for = previous.and_then(|p| p.observed_generation) < next.observed_generation;
    (!(phase.in_transition() && asked_for)).then_some(phase)
}

/// When the same world, unchanged, would derive a different status: a restarted container
/// that is still inside its crash-loop window stops counting as a failure once the window
/// ends, and a Pod being deleted counts as stuck once `STUCK_TERMINATING` has passed; no
/// watch event marks either moment. None when only a change can alter the status.
pub fn revisit_after(mw: &ManagedWorkload, observed: &Observed<'_>, now: &Time) -> Option<Duration> {
    if mw.spec.desired_state() == DesiredState::Stopped || observed.blocked.is_some() {
        return None;
    }
    let stuck = observed
        .pods
        .iter()
        .filter(|p| !finished(p))
        .filter_map(|p| stuck_in(p, now))
        .filter(|&left| left > 0)
        // One second late rather than early, as below.
        .map(|left| Duration::from_secs(left + 1))
        .min();
    let recovered = current_pods(observed)
        .flat_map(container_statuses)
        .filter_map(|cs| {
            let started = cs.state.as_ref()?.running.as_ref()?.started_at.as_ref()?;
            if !restarted(cs) {
                return None;
            }
            let ends = started.0.as_second().saturating_add(CRASH_LOOP_RECOVERY.as_secs() as i64);
            let left = ends.saturating_sub(now.0.as_second());
            // One second late rather than early: at the boundary the window has ended.
            (left >= 0).then(|| Duration::from_secs(left as u64 + 1))
        })
        .min();
    // A system container's sandbox not made yet: its reason is looked up once it has taken
    // `SANDBOX_GRACE`.
    let sandbox = mw.spec.system_container.as_ref().and_then(|_| {
        current_pods(observed)
            .filter_map(sandbox_pending_since)
            .map(|since| since.saturating_add(SANDBOX_GRACE.as_secs() as i64) - now.0.as_second())
            .filter(|&left| left >= 0)
            .map(|left| Duration::from_secs(left as u64 + 1))
            .min()
    });
    stuck.into_iter().chain(recovered).chain(sandbox).min()
}

/// How long a Pod's sandbox (its namespaces and network, made before any container) may take
/// before the kubelet's reason is looked up: it takes moments, unless it cannot be made.
pub const SANDBOX_GRACE: Duration = Duration::from_secs(15);

/// The Pod condition that says whether its sandbox is made.
pub const SANDBOX_READY: &str = "PodReadyToStartContainers";

/// Since when (seconds) the Pod's sandbox has not been made (`PodReadyToStartContainers`
/// False), while it has not.
fn sandbox_pending_since(pod: &Pod) -> Option<i64> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let pending = conditions.iter().find(|c| c.type_ == SANDBOX_READY && c.status == "False")?;
    Some(pending.last_transition_time.as_ref()?.0.as_second())
}

/// The Pod's sandbox has not been made for `SANDBOX_GRACE`: the kubelet's Events say why.
pub fn sandbox_stuck(pod: &Pod, now: &Time) -> bool {
    sandbox_pending_since(pod).is_some_and(|since| now.0.as_second() - since >= SANDBOX_GRACE.as_secs() as i64)
}

/// A sandbox the kubelet cannot make, in its words: a node without user namespaces is a
/// failure no retry cures, named with what the node lacks; anything else (a network plugin
/// not ready yet) is a wait, bounded by the rollout's progress deadline.
fn sandbox_failure(mw: &ManagedWorkload, message: &str) -> Verdict {
    if message.contains("does not support user namespaces") {
        let why = format!(
            "this node's container runtime cannot run the Pod in a user namespace of its own (the kubelet: \
             {message}). A system container runs in one unless spec.systemContainer.userNamespace is false: it \
             needs Kubernetes 1.33+, containerd 2.0+, runc 1.2+ and Linux 6.3+ on the node (docs/install.md, \
             \"System containers\")"
        );
        return Verdict::new(Phase::Failed, "UserNamespacesUnsupported", why);
    }
    waiting_on(mw, SANDBOX_WAIT, &format!("the kubelet cannot make the Pod's sandbox yet: {message}"))
}

/// The permanent id Manager stores for the container: `namespace/name`.
pub fn provider_id(mw: &ManagedWorkload) -> String {
    format!("{}/{}", mw.namespace().unwrap_or_default(), mw.name_any())
}

/// Placeholder time for conditions whose transition time is filled in by `derive`.
const UNSET: Time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);

fn condition(type_: &str, status: bool, reason: &str, message: &str, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: UNSET,
        observed_generation: generation,
    }
}

/// The Deployment's conditions in metav1.Condition shape, each stamped with the CR generation
/// it truly reflects. That is the current one only once the Deployment controller has observed
/// a Deployment built from the current spec; before that (a spec change not yet rolled into
/// the Deployment, or not yet seen by its controller) the conditions still describe the
/// previous template, so they keep the generation they had, and are left out when they never
/// had one. `kubectl wait --for=condition=Available` then cannot return on the old
/// ReplicaSet's state.
fn mirrored(mw: &ManagedWorkload, observed: &Observed<'_>) -> Vec<Condition> {
    let Some(conditions) = observed.deployment.and_then(|d| d.status.as_ref()?.conditions.as_ref()) else {
        return Vec::new();
    };
    let current = observed.built().is_some_and(rolled_out);
    let previous = mw.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    MIRRORED
        .iter()
        .filter_map(|type_| {
            let c = conditions.iter().find(|c| c.type_ == *type_)?;
            let generation = if current {
                mw.metadata.generation
            } else {
                previous.iter().find(|p| p.type_ == *type_)?.observed_generation
            };
            Some(mirror(c, generation))
        })
        .collect()
}

/// A Deployment condition in metav1.Condition shape. Its own transition time is kept: it says
/// when the Deployment changed, which is what the condition reports.
fn mirror(c: &DeploymentCondition, generation: Option<i64>) -> Condition {
    Condition {
        type_: c.type_.clone(),
        status: c.status.clone(),
        // metav1.Condition requires a CamelCase reason; the Deployment controller always sets one.
        reason: c.reason.clone().filter(|r| !r.is_empty()).unwrap_or_else(|| c.type_.clone()),
        message: c.message.clone().unwrap_or_default(),
        last_transition_time: c.last_transition_time.clone().unwrap_or(UNSET),
        observed_generation: generation,
    }
}

/// A Pod that has run to completion or was failed by the kubelet (evicted, node shutdown):
/// history, never a live copy of the workload. It stays until Pod garbage collection.
pub fn finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Failed" | "Succeeded"))
}

/// Not finished and not being deleted: a copy of the workload that runs or is about to.
fn live(pod: &Pod) -> bool {
    !finished(pod) && pod.metadata.deletion_timestamp.is_none()
}

/// Live Pods of the current template: the one of the Deployment built from the spec.
fn current_pods<'a>(observed: &'a Observed<'_>) -> impl Iterator<Item = &'a Pod> + 'a {
    let hash = observed.built().and_then(desired::current_template_hash);
    observed.pods.iter().copied().filter(move |p| live(p) && hash.is_some() && pod_hash(p) == hash)
}

fn verdict(mw: &ManagedWorkload, observed: &Observed<'_>, now: &Time) -> Verdict {
    if let Some(blocked) = &observed.blocked {
        if !blocked.is_wait() {
            return Verdict::new(Phase::Failed, blocked.reason, blocked.message.clone());
        }
        if let Some(deadline) = waited_past_deadline(mw, blocked.reason, now) {
            let message = format!(
                "{}, for longer than the progress deadline ({deadline} s): something holds it (a finalizer, or a Pod \
                 on a node that is gone); `kubectl describe` it to see what",
                blocked.message
            );
            return Verdict::new(Phase::Failed, blocked.reason, message);
        }
        return waiting_on(mw, blocked.reason, &blocked.message);
    }
    let deployment = observed.deployment;
    let built = observed.built();
    // Pods still holding resources: running, starting or terminating. Finished ones are not.
    let unfinished = observed.pods.iter().filter(|p| !finished(p)).count();

    match mw.spec.desired_state() {
        DesiredState::Stopped => {
            let scaled_down = built.is_some_and(|d| rolled_out(d) && count(d, |s| s.replicas) == 0);
            if unfinished == 0 && (scaled_down || deployment.is_none()) {
                Verdict::new(Phase::Stopped, "Stopped", "Stopped: no Pods are running")
            } else if unfinished == 0 {
                Verdict::new(
                    Phase::Stopping,
                    "Stopping",
                    "Stopping: waiting for the Deployment controller to scale down",
                )
            } else {
                Verdict::new(Phase::Stopping, "Stopping", "Stopping: waiting for the workload's Pods to terminate")
            }
        }
        DesiredState::Running => {
            if let Some(lost) = volumes::lost(mw, observed) {
                return lost;
            }
            let current: Vec<&Pod> = current_pods(observed).collect();
            if let Some(failure) = current.iter().find_map(|p| pod_failure(mw, p, now)) {
                return failure;
            }
            if let Some(message) = observed.sandbox {
                return sandbox_failure(mw, message);
            }
            let unbound = volumes::unbound(mw, observed);
            if let Some(failure) = built.and_then(deployment_failure) {
                return match unbound {
                    Some(claim) => volumes::not_bound_in_time(&claim, &failure),
                    None => failure,
                };
            }
            // Within the progress deadline, a container waiting for its Secret or ConfigMap
            // is a wait, and says what it waits for.
            if let Some((reason, message)) = current.iter().find_map(|p| config_wait(p)) {
                return waiting_on(mw, reason, &message);
            }
            let Some(deployment) = deployment else {
                return Verdict::new(Phase::Creating, "Creating", "Creating: the Deployment does not exist yet");
            };
            // Unfinished Pods that are not live copies of the current template: an older
            // template's, or terminating ones (but not those stuck on a lost node).
            let holding = observed.pods.iter().filter(|p| !finished(p) && !stuck_terminating(p, now)).count();
            let others = holding.saturating_sub(current.len());
            // A Deployment generation the Deployment controller has not observed yet is no
            // rollout when nothing of ours changed: the workload was Running at this very
            // spec, so the desired Deployment is the one it ran, and the bump is someone
            // else's edit (an annotation bumps a Deployment's generation too), which the
            // controller observes within moments. Only then, and only with the one current
            // Pod Ready, does the unobserved generation not count. (After a change of ours the
            // Deployment's status may trail its Pods; reading it early would flap.)
            let ran_this_spec = mw
                .status
                .as_ref()
                .is_some_and(|s| s.phase == Some(Phase::Running) && s.observed_generation == mw.metadata.generation);
            let settled = built.is_some()
                && (rolled_out(deployment) || (ran_this_spec && current.len() == 1 && pod_ready(current[0])));
            let complete = settled
                && [
                    count(deployment, |s| s.replicas),
                    count(deployment, |s| s.updated_replicas),
                    count(deployment, |s| s.available_replicas),
                ]
                .iter()
                .all(|&n| n == 1)
                && others == 0
                && current.len() == 1
                // The Deployment's counts can be ahead of the Pod cache (two watches): Running
                // only once the Pod itself is seen Ready, so it comes with the Pod's IP.
                && pod_ready(current[0]);
            let (phase, word) =
                if updating(mw) { (Phase::Updating, "Updating") } else { (Phase::Creating, "Creating") };
            if complete {
                // Ready means clients can reach the workload at its address: with a load
                // balancer, once it has given the Service one.
                return match (mw.spec.service.is_some(), observed.service) {
                    (true, None) => Verdict::new(phase, word, format!("{word}: waiting for the Service")),
                    (true, Some(s)) if service::waiting_for_load_balancer(s) => Verdict::new(
                        phase,
                        WAITING_FOR_LOAD_BALANCER,
                        format!(
                            "{word}: {WAITING_FOR_LOAD_BALANCER}: the Pod is available; Service {} has no load-balancer \
                             address yet",
                            s.name_any()
                        ),
                    ),
                    _ => Verdict::new(Phase::Running, "Running", "Running: 1 of 1 Pod available"),
                };
            }
            if let Some(claim) = unbound {
                return volumes::waiting_for(phase, word, &claim);
            }
            if let Some((claim, node)) = volumes::held_elsewhere(mw, observed, &current) {
                return volumes::waiting_for_detach(phase, word, &claim, &node);
            }
            if let Some(why) = current.iter().find_map(|p| unschedulable(p)) {
                return Verdict::new(
                    phase,
                    UNSCHEDULABLE,
                    format!("{word}: {UNSCHEDULABLE}: {}", scrub_scheduler(why)),
                );
            }
            let detail = if !built.is_some_and(rolled_out) {
                "waiting for the Deployment controller to observe the new spec"
            } else if others > 0 {
                "waiting for old Pods to terminate"
            } else {
                "waiting for the new Pod to become available"
            };
            Verdict::new(phase, word, format!("{word}: {detail}"))
        }
    }
}

/// Reason of a workload whose Pod is available but whose `LoadBalancer` Service has no
/// address from its load balancer yet (no load-balancer controller in the cluster, an
/// exhausted MetalLB pool, a cloud still provisioning). A wait, not a failure: Reconciling.
pub const WAITING_FOR_LOAD_BALANCER: &str = "WaitingForLoadBalancer";

/// Reason of a workload whose current Pod no node can host (yet).
pub const UNSCHEDULABLE: &str = "Unschedulable";

/// The scheduler's word on a Pod it could not place: its `PodScheduled=False` condition with
/// reason `Unschedulable` ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. ..."),
/// which names what is missing. A capacity wait is a waiting state, not a failure: a node may
/// be added (a cluster autoscaler reacts to exactly this condition) or another workload may
/// stop, and the Pod is then placed with no change of the spec. So the workload stays
/// `Creating` (or `Updating`) with `Reconciling=True` and this reason, reported at once; the
/// progress deadline bounds the wait (then `Failed`, `ProgressDeadlineExceeded`).
///
/// Not when the scheduler only waited for the workload's claims to bind: the verdict reads
/// that from the claims themselves (`ClaimPending`, before this is asked), and once they are
/// bound the scheduler's word is stale until its retry places the Pod, a moment later.
fn unschedulable(pod: &Pod) -> Option<&str> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "PodScheduled")?;
    let message = c.message.as_deref().unwrap_or("");
    (c.status == "False" && c.reason.as_deref() == Some(UNSCHEDULABLE) && !message.contains(UNBOUND_CLAIMS))
        .then_some(message)
}

/// kube-scheduler's words for a Pod whose claims are not bound yet (its VolumeBinding plugin).
const UNBOUND_CLAIMS: &str = "pod has unbound immediate PersistentVolumeClaims";

/// The scheduler's message without its preemption postscript ("preemption: 0/3 nodes are
/// available: 3 No preemption victims found for incoming pod."), which says nothing about
/// what is missing; at most 512 characters, cut at a character boundary.
fn scrub_scheduler(message: &str) -> String {
    let core = message.split("preemption: ").next().unwrap_or(message).trim_end_matches([' ', ',']).trim();
    let core = if core.is_empty() { "no node can host the Pod" } else { core };
    let mut end = core.len().min(512);
    while !core.is_char_boundary(end) {
        end -= 1;
    }
    core[..end].to_string()
}

/// The Pod's Ready condition is True.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Being deleted, and still there `STUCK_TERMINATING` after its deletion deadline.
fn stuck_terminating(pod: &Pod, now: &Time) -> bool {
    stuck_in(pod, now).is_some_and(|left| left == 0)
}

/// Seconds until a Pod being deleted counts as stuck (0 once it does); None when it is not
/// being deleted.
fn stuck_in(pod: &Pod, now: &Time) -> Option<u64> {
    let deadline = pod.metadata.deletion_timestamp.as_ref()?.0.as_second();
    let stuck_at = deadline.saturating_add(STUCK_TERMINATING.as_secs() as i64);
    Some(u64::try_from(stuck_at.saturating_sub(now.0.as_second())).unwrap_or(0))
}

/// A spec change is rolling out over a workload that ran: the last status was Running for an
/// older generation, or already Updating. A Pod replaced while the spec stayed the same
/// (evicted, deleted, lost with its node) is not an update: that is `Creating` again.
fn updating(mw: &ManagedWorkload) -> bool {
    let Some(previous) = mw.status.as_ref() else { return false };
    match previous.phase {
        Some(Phase::Updating) => true,
        Some(Phase::Running) => previous.observed_generation != mw.metadata.generation,
        _ => false,
    }
}

/// The Deployment controller has seen the latest Deployment spec.
fn rolled_out(d: &Deployment) -> bool {
    let observed = d.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0);
    observed >= d.metadata.generation.unwrap_or(0) && d.metadata.generation.is_some()
}

fn count(d: &Deployment, f: fn(&DeploymentStatus) -> Option<i32>) -> i32 {
    d.status.as_ref().and_then(f).unwrap_or(0)
}

fn pod_hash(pod: &Pod) -> Option<&str> {
    pod.annotations().get(TEMPLATE_HASH_ANNOTATION).map(String::as_str)
}

fn container_statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    let statuses = pod.status.as_ref();
    let init = statuses.and_then(|s| s.init_container_statuses.as_ref()).into_iter().flatten();
    init.chain(statuses.and_then(|s| s.container_statuses.as_ref()).into_iter().flatten())
}

/// The container was restarted after a termination (a crash, an OOM kill, or an exit that
/// restartPolicy Always turns into a restart).
fn restarted(cs: &ContainerStatus) -> bool {
    cs.restart_count > 0 && cs.last_state.as_ref().is_some_and(|s| s.terminated.is_some())
}

/// A container of this Pod stuck in a state that needs a change to the spec or the cluster.
/// Reasons and messages are stable across the kubelet's retry cycle: ErrImagePull and
/// ImagePullBackOff alternate on a real kubelet, so both read `ImagePullBackOff`; a crash
/// loop is recognised in every state of its cycle (waiting, running, terminated); messages
/// carry no Pod names, UIDs, back-off durations or counters.
fn pod_failure(mw: &ManagedWorkload, pod: &Pod, now: &Time) -> Option<Verdict> {
    container_statuses(pod).find_map(|cs| {
        let waiting = cs.state.as_ref().and_then(|s| s.waiting.as_ref());
        let reason = waiting
            .filter(|w| !waits_for_config(w))
            .and_then(|w| w.reason.as_deref())
            .filter(|r| FAILURE_REASONS.contains(r));
        let name = &cs.name;
        if let Some(verdict) = node_cannot_boot(cs) {
            return Some(verdict);
        }
        match reason {
            Some("ErrImagePull" | "ImagePullBackOff") => Some(Verdict::new(
                Phase::Failed,
                "ImagePullBackOff",
                format!("container {name}: ImagePullBackOff: image {:?} cannot be pulled", mw.spec.image),
            )),
            Some("CrashLoopBackOff") => Some(crash_loop(cs)),
            Some(reason) => {
                // These kubelet messages name what is wrong (a missing ConfigMap key, an
                // unparsable image) and stay the same while it is; scrub the Pod's identity
                // in case a kubelet adds it.
                let message = waiting.and_then(|w| w.message.as_deref()).map(|m| scrub(m, pod)).unwrap_or_default();
                Some(Verdict::new(
                    Phase::Failed,
                    reason,
                    if message.is_empty() {
                        format!("container {name}: {reason}")
                    } else {
                        format!("container {name}: {reason}: {message}")
                    },
                ))
            }
            None if restarted(cs) && !recovered(cs, now) => Some(crash_loop(cs)),
            None => None,
        }
    })
}

/// What a system container's last words (its termination message: the log's tail, with
/// `FallbackToLogsOnError`) say about the node, as (the words, reason, message): a failure
/// no restart cures, named with the node capability it lacks and the way out.
const NODE_CANNOT_BOOT: [(&str, &str, &str); 1] = [(
    "control group: Read-only file system",
    "CgroupReadOnly",
    "systemd could not create its control group: this node's container runtime gives the container a read-only \
     cgroup filesystem. A system container needs a node with cgroup v2 (mounted with nsdelegate) and containerd \
     2.1+ whose runtime handler sets cgroup_writable = true, named by spec.systemContainer.runtimeClassName or \
     the operator's --system-container-runtime-class (docs/install.md, \"System containers\"); on a cgroup v1 \
     node, only spec.systemContainer.privileged runs it, and that gives the container the node",
)];

/// The words of a termination message the status explains (`NODE_CANNOT_BOOT`), if any: all
/// the caches keep of it.
pub fn known_termination(message: &str) -> Option<&'static str> {
    NODE_CANNOT_BOOT.iter().map(|(words, ..)| *words).find(|words| message.contains(words))
}

/// A container that ended for a reason of the node's (`NODE_CANNOT_BOOT`), now or in its last
/// run.
fn node_cannot_boot(cs: &ContainerStatus) -> Option<Verdict> {
    let ended = [&cs.state, &cs.last_state].into_iter().flatten().filter_map(|s| s.terminated.as_ref());
    let words = ended.filter_map(|t| t.message.as_deref().and_then(known_termination)).next()?;
    let (_, reason, why) = NODE_CANNOT_BOOT.iter().find(|(w, ..)| *w == words)?;
    Some(Verdict::new(Phase::Failed, reason, format!("container {}: {why}", cs.name)))
}

/// The kubelet cannot make the container because a Secret or ConfigMap it reads, or a key of
/// one, is not there (yet): a bridged container's env Secret follows its workload by
/// moments, and anyone's may be created after the workload. Any other configuration error
/// (a security context the image cannot meet) needs a change: a failure.
fn waits_for_config(waiting: &ContainerStateWaiting) -> bool {
    let message = waiting.message.as_deref().unwrap_or_default();
    waiting.reason.as_deref() == Some("CreateContainerConfigError")
        && (message.contains(" not found") || message.contains("couldn't find key"))
}

/// A container of this Pod waiting for its configuration (`waits_for_config`): the reason and
/// what it waits for.
fn config_wait(pod: &Pod) -> Option<(&'static str, String)> {
    container_statuses(pod).find_map(|cs| {
        let waiting = cs.state.as_ref()?.waiting.as_ref().filter(|w| waits_for_config(w))?;
        let message = scrub(waiting.message.as_deref().unwrap_or_default(), pod);
        Some((CONFIG_WAIT, format!("container {} waits: {message}", cs.name)))
    })
}

/// The progress deadline, when the workload has waited (`reason`) for longer: since its
/// `Reconciling` condition became True, or it has been reported Stalled for that wait
/// already (which ends Reconciling, and must not start the count again). A wait that long is
/// no longer one that time ends.
fn waited_past_deadline(mw: &ManagedWorkload, reason: &str, now: &Time) -> Option<i64> {
    let deadline = i64::from(mw.spec.progress_deadline_seconds.unwrap_or(desired::PROGRESS_DEADLINE_SECONDS));
    let conditions = &mw.status.as_ref()?.conditions;
    let holds = |type_: &str| conditions.iter().find(|c| c.type_ == type_ && c.status == "True");
    if holds(STALLED).is_some_and(|c| c.reason == reason) {
        return Some(deadline);
    }
    let since = holds(RECONCILING)?.last_transition_time.0.as_second();
    (now.0.as_second().saturating_sub(since) > deadline).then_some(deadline)
}

/// A wait of the workload's, in the phase its spec is heading to.
fn waiting_on(mw: &ManagedWorkload, reason: &str, message: &str) -> Verdict {
    let (phase, word) = match mw.spec.desired_state() {
        DesiredState::Stopped => (Phase::Stopping, "Stopping"),
        DesiredState::Running if updating(mw) => (Phase::Updating, "Updating"),
        DesiredState::Running => (Phase::Creating, "Creating"),
    };
    Verdict::new(phase, reason, format!("{word}: {message}"))
}

fn crash_loop(cs: &ContainerStatus) -> Verdict {
    let last = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let how = match last.and_then(|t| t.reason.as_deref()).filter(|r| !r.is_empty()) {
        Some(reason) => format!("; last termination: {reason}"),
        None => String::new(),
    };
    Verdict::new(
        Phase::Failed,
        CRASH_LOOP,
        format!(
            "container {}: CrashLoopBackOff: the container keeps exiting and is restarted with back-off{how}",
            cs.name
        ),
    )
}

/// A restarted container has been running for the whole recovery window.
fn recovered(cs: &ContainerStatus, now: &Time) -> bool {
    let started = cs.state.as_ref().and_then(|s| s.running.as_ref()).and_then(|r| r.started_at.as_ref());
    started.is_some_and(|t| now.0.as_second().saturating_sub(t.0.as_second()) >= CRASH_LOOP_RECOVERY.as_secs() as i64)
}

/// The message without the Pod's name or UID.
fn scrub(message: &str, pod: &Pod) -> String {
    let mut out = message.to_string();
    for id in [pod.metadata.uid.as_deref(), pod.metadata.name.as_deref()].into_iter().flatten() {
        if !id.is_empty() {
            out = out.replace(id, "<pod>");
        }
    }
    out
}

/// The Deployment itself reports a failure for its current spec.
fn deployment_failure(d: &Deployment) -> Option<Verdict> {
    // A condition left over from before the latest spec says nothing about it.
    if !rolled_out(d) {
        return None;
    }
    let conditions = d.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find_map(|c| {
        let failed = (c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
            || (c.type_ == "ReplicaFailure" && c.status == "True");
        failed.then(|| {
            let reason = c.reason.clone().filter(|r| !r.is_empty()).unwrap_or_else(|| c.type_.clone());
            let message = c.message.clone().unwrap_or_default();
            Verdict { phase: Phase::Failed, message: format!("{reason}: {message}"), reason }
        })
    })
}

/// The IP of the Pod serving the workload: a live, Running Pod, preferring one that is Ready
/// and runs the current template. None while stopped or stopping.
fn pod_ip(mw: &ManagedWorkload, observed: &Observed<'_>) -> Option<String> {
    if mw.spec.desired_state() == DesiredState::Stopped {
        return None;
    }
    let hash = observed.built().and_then(desired::current_template_hash);
    let candidates = observed.pods.iter().filter(|p| live(p)).filter_map(|p| {
        let status = p.status.as_ref()?;
        let ip = status.pod_ip.as_ref().filter(|ip| !ip.is_empty())?;
        if status.phase.as_deref() != Some("Running") {
            return None;
        }
        let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
        let current = hash.is_some() && pod_hash(p) == hash;
        Some(((ready, current), ip))
    });
    candidates.max_by_key(|(rank, _)| *rank).map(|(_, ip)| ip.clone())
}

/// The address clients should use: the Service's (its load balancer's, else its cluster IP)
/// when the workload has one, which does not move when the Pod is replaced; else the serving
/// Pod's IP (`pod_ip`: during a rollout, the old Pod's until the new one is Ready).
fn address(mw: &ManagedWorkload, observed: &Observed<'_>) -> Option<String> {
    if mw.spec.service.is_some() {
        return observed.service.and_then(service::address);
    }
    pod_ip(mw, observed)
}

mod volumes;

/// The fingerprint of the Deployment `mw`'s spec asks for with the default settings, as a
/// reconcile builds it (`Observed::desired_hash`), for tests.
#[cfg(test)]
pub fn desired_hash(mw: &ManagedWorkload) -> String {
    let desired = desired::deployment(mw, &Default::default()).expect("a desired Deployment");
    applied_hash(&desired).expect("its fingerprint").to_owned()
}

#[cfg(test)]
mod tests;
