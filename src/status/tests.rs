//! The DESIGN's phase table, case by case, over hand-built observed objects.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::desired;
use crate::resource::{ManagedWorkloadSpec, ManagedWorkloadStatus};

fn at(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

fn workload(state: DesiredState, generation: i64) -> ManagedWorkload {
    let mut mw = ManagedWorkload::new(
        "web",
        ManagedWorkloadSpec { image: "nginx:latest".into(), state: Some(state), ..Default::default() },
    );
    mw.metadata.namespace = Some("apps".into());
    mw.metadata.uid = Some("uid-1".into());
    mw.metadata.generation = Some(generation);
    mw
}

fn with_phase(mut mw: ManagedWorkload, phase: Phase) -> ManagedWorkload {
    mw.status = Some(ManagedWorkloadStatus { phase: Some(phase), ..Default::default() });
    mw
}

/// The Deployment the operator would apply for `mw`, as the cluster reports it.
fn deployment(mw: &ManagedWorkload, generation: i64, observed: i64, counts: [i32; 4]) -> Deployment {
    let mut d = desired::deployment(mw).unwrap();
    d.metadata.generation = Some(generation);
    let [replicas, updated, ready, available] = counts;
    d.status = Some(DeploymentStatus {
        observed_generation: Some(observed),
        replicas: Some(replicas),
        updated_replicas: Some(updated),
        ready_replicas: Some(ready),
        available_replicas: Some(available),
        conditions: Some(vec![
            dep_condition("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability."),
            dep_condition(
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                "ReplicaSet \"web-abc\" has successfully progressed.",
            ),
        ]),
        ..Default::default()
    });
    d
}

fn dep_condition(type_: &str, status: &str, reason: &str, message: &str) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(at(100)),
        last_update_time: Some(at(150)),
    }
}

/// A Pod of `d`'s current template (or another one when `current` is false).
fn pod(d: &Deployment, current: bool, ready: bool, ip: &str) -> Pod {
    let hash = if current { desired::current_template_hash(d).unwrap().to_string() } else { "0000000000000000".into() };
    let mut p = Pod::default();
    p.metadata.name = Some(format!("web-{hash}"));
    p.metadata.annotations = Some([(desired::TEMPLATE_HASH_ANNOTATION.to_string(), hash)].into());
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    p
}

fn waiting(mut p: Pod, reason: &str, message: &str) -> Pod {
    let status = p.status.get_or_insert_with(Default::default);
    status.phase = Some("Pending".into());
    status.pod_ip = None;
    status.container_statuses = Some(vec![ContainerStatus {
        name: "workload".into(),
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting { reason: Some(reason.into()), message: Some(message.into()) }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    p
}

fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(at(200));
    p
}

fn derive_with(mw: &ManagedWorkload, d: Option<&Deployment>, pods: &[Pod]) -> ManagedWorkloadStatus {
    let observed = Observed { deployment: d, pods: pods.iter().collect(), blocked: None };
    derive(mw, &observed, &at(1000))
}

fn cond<'a>(s: &'a ManagedWorkloadStatus, type_: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_} condition in {s:?}"))
}

fn assert_summary(s: &ManagedWorkloadStatus, phase: Phase, ready: &str, reconciling: &str, stalled: &str) {
    assert_eq!(s.phase, Some(phase), "{s:#?}");
    assert_eq!(cond(s, READY).status, ready, "Ready");
    assert_eq!(cond(s, RECONCILING).status, reconciling, "Reconciling");
    assert_eq!(cond(s, STALLED).status, stalled, "Stalled");
}

#[test]
fn creating_before_the_deployment_exists() {
    let mw = workload(DesiredState::Running, 1);
    let s = derive_with(&mw, None, &[]);
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    assert_eq!(s.provider_id.as_deref(), Some("apps/web"));
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(s.desired_replicas, 1);
    assert!(s.pod_ip.is_none());
}

#[test]
fn creating_while_the_first_pod_is_not_ready() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let s = derive_with(&mw, Some(&d), &[pod(&d, true, false, "10.0.0.5")]);
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    assert_eq!(cond(&s, RECONCILING).reason, "Creating");
}

#[test]
fn running_when_rolled_out_and_available() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let s = derive_with(&mw, Some(&d), &[pod(&d, true, true, "10.0.0.5")]);
    assert_summary(&s, Phase::Running, "True", "False", "False");
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.5"));
    assert_eq!((s.replicas, s.updated_replicas, s.ready_replicas, s.available_replicas), (1, 1, 1, 1));
    for c in &s.conditions {
        assert_eq!(c.observed_generation, Some(1), "{} carries the generation", c.type_);
    }
    // The Deployment's conditions are mirrored with their own transition time.
    assert_eq!(cond(&s, "Available").reason, "MinimumReplicasAvailable");
    assert_eq!(cond(&s, "Progressing").last_transition_time, at(100));
    assert_eq!(cond(&s, READY).last_transition_time, at(1000));
}

#[test]
fn not_running_until_the_deployment_controller_saw_the_latest_spec() {
    // Stale status: counts say 1/1/1 but for the previous generation.
    let mw = with_phase(workload(DesiredState::Running, 2), Phase::Running);
    let d = deployment(&mw, 2, 1, [1, 1, 1, 1]);
    let s = derive_with(&mw, Some(&d), &[pod(&d, true, true, "10.0.0.5")]);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
}

#[test]
fn updating_while_an_old_pod_remains() {
    let mw = with_phase(workload(DesiredState::Running, 2), Phase::Running);
    let d = deployment(&mw, 2, 2, [1, 1, 1, 1]);
    let pods = [pod(&d, true, true, "10.0.0.6"), terminating(pod(&d, false, true, "10.0.0.5"))];
    let s = derive_with(&mw, Some(&d), &pods);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
    assert!(cond(&s, RECONCILING).message.contains("1 old Pod"));
    // The new Pod serves; the terminating one is not reported.
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.6"));
}

#[test]
fn updating_while_the_new_pod_is_not_available() {
    let mw = with_phase(workload(DesiredState::Running, 3), Phase::Updating);
    let d = deployment(&mw, 3, 3, [2, 1, 1, 1]);
    let pods = [pod(&d, true, false, "10.0.0.7"), pod(&d, false, true, "10.0.0.6")];
    let s = derive_with(&mw, Some(&d), &pods);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
    // The old, Ready Pod still serves while the new one starts.
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.6"));
}

#[test]
fn stopping_while_pods_remain_and_stopped_when_none() {
    let mw = with_phase(workload(DesiredState::Stopped, 2), Phase::Running);
    let d = deployment(&mw, 2, 2, [0, 0, 0, 0]);
    let s = derive_with(&mw, Some(&d), &[terminating(pod(&d, true, true, "10.0.0.5"))]);
    assert_summary(&s, Phase::Stopping, "False", "True", "False");
    assert!(s.pod_ip.is_none());
    assert_eq!(s.desired_replicas, 0);

    let s = derive_with(&mw, Some(&d), &[]);
    assert_summary(&s, Phase::Stopped, "True", "False", "False");
    assert_eq!(cond(&s, READY).reason, "Stopped");
}

#[test]
fn stopping_until_the_deployment_controller_scaled_down() {
    let mw = workload(DesiredState::Stopped, 2);
    let d = deployment(&mw, 2, 1, [1, 1, 1, 1]);
    let s = derive_with(&mw, Some(&d), &[]);
    assert_summary(&s, Phase::Stopping, "False", "True", "False");
    assert_eq!(cond(&s, RECONCILING).message, "Stopping: waiting for the Deployment controller to scale down");
}

#[test]
fn failed_at_once_when_a_current_pod_cannot_start() {
    for reason in FAILURE_REASONS {
        let mw = workload(DesiredState::Running, 1);
        let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
        let p = waiting(pod(&d, true, false, ""), reason, "details from the kubelet");
        let s = derive_with(&mw, Some(&d), &[p]);
        assert_summary(&s, Phase::Failed, "False", "False", "True");
        assert_eq!(cond(&s, STALLED).reason, reason);
        assert_eq!(cond(&s, STALLED).message, format!("container workload: {reason}: details from the kubelet"));
        assert!(!cond(&s, STALLED).message.contains("web-"), "no Pod names in messages");
    }
}

#[test]
fn an_old_pods_failure_does_not_fail_the_new_template() {
    let mw = with_phase(workload(DesiredState::Running, 2), Phase::Failed);
    let d = deployment(&mw, 2, 2, [2, 1, 0, 0]);
    let pods = [pod(&d, true, false, "10.0.0.9"), waiting(pod(&d, false, false, ""), "ImagePullBackOff", "x")];
    let s = derive_with(&mw, Some(&d), &pods);
    assert_summary(&s, Phase::Creating, "False", "True", "False");
}

#[test]
fn a_pending_pod_that_is_merely_creating_is_not_a_failure() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let p = waiting(pod(&d, true, false, ""), "ContainerCreating", "");
    assert_eq!(derive_with(&mw, Some(&d), &[p]).phase, Some(Phase::Creating));
}

#[test]
fn failed_when_the_progress_deadline_is_exceeded() {
    let mw = workload(DesiredState::Running, 1);
    let mut d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    d.status.as_mut().unwrap().conditions = Some(vec![dep_condition(
        "Progressing",
        "False",
        "ProgressDeadlineExceeded",
        "ReplicaSet \"web-abc\" has timed out progressing.",
    )]);
    let s = derive_with(&mw, Some(&d), &[pod(&d, true, false, "10.0.0.5")]);
    assert_summary(&s, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&s, STALLED).reason, "ProgressDeadlineExceeded");
    assert_eq!(cond(&s, "Progressing").status, "False");

    // The same condition from before the latest spec change says nothing about the new one.
    let mut stale = d.clone();
    stale.metadata.generation = Some(2);
    let s = derive_with(&workload(DesiredState::Running, 2), Some(&stale), &[]);
    assert_eq!(s.phase, Some(Phase::Creating));
}

#[test]
fn failed_on_replica_failure() {
    let mw = workload(DesiredState::Running, 1);
    let mut d = deployment(&mw, 1, 1, [0, 0, 0, 0]);
    d.status.as_mut().unwrap().conditions = Some(vec![dep_condition(
        "ReplicaFailure",
        "True",
        "FailedCreate",
        "pods \"web-x\" is forbidden: exceeded quota",
    )]);
    let s = derive_with(&mw, Some(&d), &[]);
    assert_summary(&s, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&s, STALLED).reason, "FailedCreate");
    assert_eq!(cond(&s, "ReplicaFailure").status, "True");
}

#[test]
fn blocked_reports_stalled_with_its_reason() {
    let mw = workload(DesiredState::Running, 1);
    let observed = Observed {
        deployment: None,
        pods: vec![],
        blocked: Some(Blocked { reason: "DeploymentConflict", message: "not ours".into() }),
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_summary(&s, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&s, STALLED).reason, "DeploymentConflict");
    assert_eq!(cond(&s, READY).message, "not ours");
}

#[test]
fn an_unchanged_world_derives_an_identical_status() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let pods = [pod(&d, true, true, "10.0.0.5")];
    let first = derive_with(&mw, Some(&d), &pods);
    let mut again = mw.clone();
    again.status = Some(first.clone());
    let observed = Observed { deployment: Some(&d), pods: pods.iter().collect(), blocked: None };
    let second = derive(&again, &observed, &at(5000));
    assert_eq!(first, second, "a later clock alone must not change the status");
}

#[test]
fn transition_time_moves_only_when_a_condition_flips() {
    let mw = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let pods = [pod(&d, true, true, "10.0.0.5")];
    let running = derive_with(&mw, Some(&d), &pods);

    // Stop: Ready flips to False at t=2000.
    let mut stopping = workload(DesiredState::Stopped, 2);
    stopping.status = Some(running.clone());
    let d2 = deployment(&stopping, 2, 2, [0, 0, 0, 0]);
    let observed = Observed { deployment: Some(&d2), pods: vec![&pods[0]], blocked: None };
    let s = derive(&stopping, &observed, &at(2000));
    assert_eq!(cond(&s, READY).last_transition_time, at(2000));
    assert_eq!(cond(&s, STALLED).last_transition_time, cond(&running, STALLED).last_transition_time);
}
