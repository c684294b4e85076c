//! The status of a ManagedWorkload, derived from what the cluster reports: a pure function
//! of the CR, its Deployment and its Pods (plus the clock, passed in), so the DESIGN's truth
//! table is unit-tested case by case.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::desired::{self, TEMPLATE_HASH_ANNOTATION};
use crate::resource::{DesiredState, ManagedWorkload, ManagedWorkloadStatus, Phase};

/// Container waiting reasons that mean the Pod will not start without a change: reported as
/// `Failed` at once instead of after the rollout's progress deadline.
pub const FAILURE_REASONS: [&str; 5] =
    ["ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "CreateContainerConfigError", "InvalidImageName"];

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
/// Deployment conditions copied into the CR's status.
pub const MIRRORED: [&str; 3] = ["Available", "Progressing", "ReplicaFailure"];

/// What the operator saw of the workload's children in this reconcile.
#[derive(Debug, Default)]
pub struct Observed<'a> {
    /// The Deployment this CR controls, if it exists.
    pub deployment: Option<&'a Deployment>,
    /// Pods labelled as this workload's.
    pub pods: Vec<&'a Pod>,
    /// Why the operator could not make the Deployment what it should be; reported as Stalled.
    pub blocked: Option<Blocked>,
}

/// A reason the desired Deployment cannot be applied, which only a human can fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub reason: &'static str,
    pub message: String,
}

/// The verdict on the workload before it is spelled out as conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    phase: Phase,
    /// CamelCase reason for Ready/Reconciling/Stalled.
    reason: String,
    message: String,
}

/// The full status the CR should have. `now` stamps conditions whose status changed;
/// unchanged conditions keep their lastTransitionTime, so an unchanged world derives an
/// identical status and nothing is written.
pub fn derive(mw: &ManagedWorkload, observed: &Observed<'_>, now: &Time) -> ManagedWorkloadStatus {
    let generation = mw.metadata.generation;
    let previous = mw.status.as_ref();
    let desired = desired::desired_replicas(mw);
    let verdict = verdict(mw, observed);

    let dep_status = observed.deployment.and_then(|d| d.status.as_ref());
    let replicas = |f: fn(&DeploymentStatus) -> Option<i32>| observed.deployment.map_or(0, |d| count(d, f));

    let mut conditions = Vec::new();
    let phase = verdict.phase;
    let ready = matches!(phase, Phase::Running | Phase::Stopped);
    let reconciling = matches!(phase, Phase::Creating | Phase::Updating | Phase::Stopping);
    let stalled = phase == Phase::Failed;
    conditions.push(condition(READY, ready, &verdict.reason, &verdict.message));
    conditions.push(condition(
        RECONCILING,
        reconciling,
        if reconciling { &verdict.reason } else { "Idle" },
        if reconciling { &verdict.message } else { "No change in progress" },
    ));
    conditions.push(condition(
        STALLED,
        stalled,
        if stalled { &verdict.reason } else { "Healthy" },
        if stalled { &verdict.message } else { "No failure observed" },
    ));
    if let Some(dep_conditions) = dep_status.and_then(|s| s.conditions.as_ref()) {
        for type_ in MIRRORED {
            if let Some(c) = dep_conditions.iter().find(|c| c.type_ == type_) {
                conditions.push(mirror(c));
            }
        }
    }
    let previous_conditions = previous.map(|s| s.conditions.as_slice()).unwrap_or_default();
    for c in &mut conditions {
        c.observed_generation = generation;
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
        desired_replicas: desired,
        replicas: replicas(|s| s.replicas),
        updated_replicas: replicas(|s| s.updated_replicas),
        ready_replicas: replicas(|s| s.ready_replicas),
        available_replicas: replicas(|s| s.available_replicas),
        conditions,
    }
}

/// The permanent id Manager stores for the container: `namespace/name`.
pub fn provider_id(mw: &ManagedWorkload) -> String {
    format!("{}/{}", mw.namespace().unwrap_or_default(), mw.name_any())
}

/// Placeholder time for conditions whose transition time is filled in by `derive`.
const UNSET: Time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);

fn condition(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: UNSET,
        observed_generation: None,
    }
}

/// A Deployment condition in metav1.Condition shape. Its own transition time is kept: it says
/// when the Deployment changed, which is what the condition reports.
fn mirror(c: &DeploymentCondition) -> Condition {
    Condition {
        type_: c.type_.clone(),
        status: c.status.clone(),
        // metav1.Condition requires a CamelCase reason; the Deployment controller always sets one.
        reason: c.reason.clone().filter(|r| !r.is_empty()).unwrap_or_else(|| c.type_.clone()),
        message: c.message.clone().unwrap_or_default(),
        last_transition_time: c.last_transition_time.clone().unwrap_or(UNSET),
        observed_generation: None,
    }
}

fn verdict(mw: &ManagedWorkload, observed: &Observed<'_>) -> Verdict {
    if let Some(blocked) = &observed.blocked {
        return Verdict { phase: Phase::Failed, reason: blocked.reason.into(), message: blocked.message.clone() };
    }
    let deployment = observed.deployment;
    let hash = deployment.and_then(desired::current_template_hash);
    let live: Vec<&Pod> = observed.pods.iter().copied().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();

    match mw.spec.desired_state() {
        DesiredState::Stopped => {
            let remaining = observed.pods.len();
            let scaled_down = deployment.is_some_and(|d| rolled_out(d) && count(d, |s| s.replicas) == 0);
            if remaining == 0 && (scaled_down || deployment.is_none()) {
                Verdict {
                    phase: Phase::Stopped,
                    reason: "Stopped".into(),
                    message: "Stopped: no Pods are running".into(),
                }
            } else {
                Verdict {
                    phase: Phase::Stopping,
                    reason: "Stopping".into(),
                    message: if remaining == 0 {
                        "Stopping: waiting for the Deployment controller to scale down".to_string()
                    } else {
                        format!("Stopping: waiting for {remaining} Pod(s) to terminate")
                    },
                }
            }
        }
        DesiredState::Running => {
            let current: Vec<&Pod> = live.iter().copied().filter(|p| hash.is_some() && pod_hash(p) == hash).collect();
            if let Some(failure) = current.iter().find_map(|p| pod_failure(p)) {
                return failure;
            }
            if let Some(failure) = deployment.and_then(deployment_failure) {
                return failure;
            }
            let Some(deployment) = deployment else {
                return Verdict {
                    phase: Phase::Creating,
                    reason: "Creating".into(),
                    message: "Creating: the Deployment does not exist yet".into(),
                };
            };
            let old_pods = observed.pods.len() - current.len();
            let complete = rolled_out(deployment)
                && [
                    count(deployment, |s| s.replicas),
                    count(deployment, |s| s.updated_replicas),
                    count(deployment, |s| s.available_replicas),
                ]
                .iter()
                .all(|&n| n == 1)
                && old_pods == 0
                && current.len() == 1;
            if complete {
                return Verdict {
                    phase: Phase::Running,
                    reason: "Running".into(),
                    message: "Running: 1 of 1 Pod available".into(),
                };
            }
            let had_run =
                mw.status.as_ref().and_then(|s| s.phase).is_some_and(|p| matches!(p, Phase::Running | Phase::Updating));
            let (phase, word) = if had_run { (Phase::Updating, "Updating") } else { (Phase::Creating, "Creating") };
            let detail = if !rolled_out(deployment) {
                "waiting for the Deployment controller to observe the new spec".to_string()
            } else if old_pods > 0 {
                format!("waiting for {old_pods} old Pod(s) to terminate")
            } else {
                "waiting for the new Pod to become available".to_string()
            };
            Verdict { phase, reason: word.into(), message: format!("{word}: {detail}") }
        }
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

/// A container of this Pod stuck in a state that needs a change to the spec or the cluster.
fn pod_failure(pod: &Pod) -> Option<Verdict> {
    let statuses = pod.status.as_ref()?;
    let all = statuses.init_container_statuses.iter().flatten().chain(statuses.container_statuses.iter().flatten());
    all.filter_map(|cs| {
        let waiting = cs.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        FAILURE_REASONS.contains(&reason).then(|| Verdict {
            phase: Phase::Failed,
            reason: reason.to_string(),
            message: match waiting.message.as_deref() {
                Some(m) if !m.is_empty() => format!("container {}: {reason}: {m}", cs.name),
                _ => format!("container {}: {reason}", cs.name),
            },
        })
    })
    .next()
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
    let hash = observed.deployment.and_then(desired::current_template_hash);
    let candidates = observed.pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).filter_map(|p| {
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

#[cfg(test)]
mod tests;
