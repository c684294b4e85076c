//! The phase table of docs/resource.md ("Phases"), case by case, over hand-built observed objects.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::operator::deployment::{self as desired, PodSettings};
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
    let mut d = desired::deployment(mw, &Default::default()).unwrap();
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

/// `d` with its rollout past its progress deadline, as the Deployment controller says it.
fn timed_out(d: &Deployment) -> Deployment {
    let mut late = d.clone();
    late.status.as_mut().unwrap().conditions = Some(vec![dep_condition(
        "Progressing",
        "False",
        "ProgressDeadlineExceeded",
        "ReplicaSet \"web-abc\" has timed out progressing.",
    )]);
    late
}

/// A Pod of `d`'s current template (or another one when `current` is false).
fn pod(d: &Deployment, current: bool, ready: bool, ip: &str) -> Pod {
    let hash = if current { desired::current_template_hash(d).unwrap().to_string() } else { "0000000000000000".into() };
    let mut p = Pod::default();
    p.metadata.name = Some(format!("web-{hash}"));
    p.metadata.annotations = Some([(crate::names::TEMPLATE_HASH_ANNOTATION.to_string(), hash)].into());
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

/// Being deleted, its deletion deadline 10 s before `derive_with`'s now.
fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(at(990));
    p
}

fn derive_with(mw: &ManagedWorkload, d: Option<&Deployment>, pods: &[Pod]) -> ManagedWorkloadStatus {
    let observed = Observed {
        desired_hash: &desired_hash(mw),
        deployment: d,
        pods: pods.iter().collect(),
        blocked: None,
        claims: vec![],
        refused: &[],
        service: None,
        sandbox: None,
    };
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
    // Stale status: counts say 1/1/1 but for the previous generation, whose template the only
    // Pod still runs.
    let mw = with_phase(workload(DesiredState::Running, 2), Phase::Running);
    let d = deployment(&mw, 2, 1, [1, 1, 1, 1]);
    let s = derive_with(&mw, Some(&d), &[pod(&d, false, true, "10.0.0.5")]);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
    // Nor while the Pod of the new template is not yet Ready.
    let s = derive_with(&mw, Some(&d), &[pod(&d, true, false, "10.0.0.6")]);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
}

/// The status written while the apply of a spec change is in flight is derived from the
/// Deployment as it was, built from the older spec: it reports the transition the change
/// starts, at the new generation, and nothing of the old Deployment's state as the new one's.
#[test]
fn a_deployment_of_an_older_spec_reports_the_transition_the_change_starts() {
    let mut old = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    old.status.as_mut().unwrap().observed_generation = Some(1);
    let d = deployment(&old, 1, 1, [1, 1, 1, 1]);
    let serving = pod(&d, true, true, "10.0.0.5");
    let running = derive_with(&old, Some(&d), std::slice::from_ref(&serving));
    assert_eq!(running.phase, Some(Phase::Running));
    old.status = Some(running);

    // An image change: rolled out, available and Ready as the old Deployment is, it is not
    // Running at the new generation, and the old Pod keeps serving meanwhile.
    let mut image = old.clone();
    image.spec.image = "nginx:1.27".into();
    image.metadata.generation = Some(2);
    let s = derive_with(&image, Some(&d), std::slice::from_ref(&serving));
    assert_summary(&s, Phase::Updating, "False", "True", "False");
    assert_eq!(cond(&s, READY).observed_generation, Some(2));
    assert_eq!(cond(&s, "Available").observed_generation, Some(1), "the old Deployment's, not the new spec's");
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.5"));

    // A stop: Stopping until the Pods are gone, whatever the old Deployment's scale.
    let mut stop = old.clone();
    stop.spec.state = Some(DesiredState::Stopped);
    stop.metadata.generation = Some(2);
    let s = derive_with(&stop, Some(&d), std::slice::from_ref(&serving));
    assert_summary(&s, Phase::Stopping, "False", "True", "False");
    let stopped = deployment(&with_phase(workload(DesiredState::Stopped, 1), Phase::Stopped), 1, 1, [0, 0, 0, 0]);
    let mut start = with_phase(workload(DesiredState::Running, 2), Phase::Stopped);
    start.status.as_mut().unwrap().observed_generation = Some(1);
    let s = derive_with(&start, Some(&stopped), &[]);
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    // Nor Stopped at the new generation from an old Deployment at 0 (an edit while stopped):
    // its controller has yet to observe the new one.
    let mut edited = with_phase(workload(DesiredState::Stopped, 2), Phase::Stopped);
    edited.spec.image = "nginx:1.27".into();
    let s = derive_with(&edited, Some(&stopped), &[]);
    assert_eq!(s.phase, Some(Phase::Stopping));

    // A fix of a failing spec: the old Pod's failure and the old Deployment's exceeded
    // deadline are not the new spec's.
    let failing = timed_out(&d);
    let pulling = waiting(pod(&d, true, false, ""), "ImagePullBackOff", "no such image");
    assert_eq!(derive_with(&old, Some(&failing), std::slice::from_ref(&pulling)).phase, Some(Phase::Failed));
    let s = derive_with(&image, Some(&failing), &[pulling]);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
}

#[test]
fn a_deployment_generation_that_changes_no_pod_is_no_rollout() {
    // Someone edited a Deployment field outside the template (the operator restores it): the
    // generation moves, the Deployment controller has not caught up, and the one Ready Pod
    // runs the current template. Nothing rolls out, so nothing says it does.
    let mut mw = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    mw.status.as_mut().unwrap().observed_generation = Some(1);
    let d = deployment(&mw, 3, 2, [1, 1, 1, 1]);
    let s = derive_with(&mw, Some(&d), &[pod(&d, true, true, "10.0.0.5")]);
    assert_summary(&s, Phase::Running, "True", "False", "False");

    // After a change of ours the Deployment's status trails its Pods: the new Pod Ready and
    // the old one gone, but the status still the old generation's 1/1/1. Not Running yet:
    // the next status (2 replicas while the old Pod goes) would flap it back.
    let updating = with_phase(workload(DesiredState::Running, 2), Phase::Updating);
    let d = deployment(&updating, 2, 1, [1, 1, 1, 1]);
    let s = derive_with(&updating, Some(&d), &[pod(&d, true, true, "10.0.0.6")]);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
}

#[test]
fn a_pod_stuck_terminating_on_a_lost_node_does_not_hold_back_its_replacement() {
    let mw = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let replacement = pod(&d, true, true, "10.0.0.6");
    let mut old = terminating(pod(&d, true, false, "10.0.0.5"));
    old.metadata.name = Some("web-old".into());
    let observed = |now: i64, pods: &[Pod]| {
        let o = Observed {
            desired_hash: &desired_hash(&mw),
            deployment: Some(&d),
            pods: pods.iter().collect(),
            blocked: None,
            claims: vec![],
            refused: &[],
            service: None,
            sandbox: None,
        };
        (derive(&mw, &o, &at(now)), revisit_after(&mw, &o, &at(now)))
    };
    // Deadline at 990: within the kubelet's time to report, it is still going.
    let pods = [old.clone(), replacement.clone()];
    let (s, revisit) = observed(1000, &pods);
    assert_ne!(s.phase, Some(Phase::Running), "{s:#?}");
    assert!(cond(&s, RECONCILING).message.ends_with("waiting for old Pods to terminate"), "{s:#?}");
    assert_eq!(revisit, Some(Duration::from_secs(21)), "looked at again once it counts as stuck");
    // Long past its deadline: its node is gone; the replacement serves.
    let (s, revisit) = observed(2000, &pods);
    assert_summary(&s, Phase::Running, "True", "False", "False");
    assert_eq!(revisit, None);
}

#[test]
fn updating_while_an_old_pod_remains() {
    let mw = with_phase(workload(DesiredState::Running, 2), Phase::Running);
    let d = deployment(&mw, 2, 2, [1, 1, 1, 1]);
    let pods = [pod(&d, true, true, "10.0.0.6"), terminating(pod(&d, false, true, "10.0.0.5"))];
    let s = derive_with(&mw, Some(&d), &pods);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
    assert_eq!(cond(&s, RECONCILING).message, "Updating: waiting for old Pods to terminate");
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
        // (A CreateContainerConfigError that waits for a Secret is a wait: the next test.)
        let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
        let p = waiting(pod(&d, true, false, ""), reason, "details from the kubelet");
        let s = derive_with(&mw, Some(&d), &[p]);
        assert_summary(&s, Phase::Failed, "False", "False", "True");
        // ErrImagePull and ImagePullBackOff alternate on a real kubelet: one reason for both.
        let expected = if reason == "ErrImagePull" { "ImagePullBackOff" } else { reason };
        assert_eq!(cond(&s, STALLED).reason, expected);
        assert!(cond(&s, STALLED).message.starts_with(&format!("container workload: {expected}")));
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
    let d = timed_out(&deployment(&mw, 1, 1, [1, 1, 0, 0]));
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
        desired_hash: &desired_hash(&mw),
        deployment: None,
        pods: vec![],
        blocked: Some(Blocked::conflict("DeploymentConflict", "not ours".into())),
        claims: vec![],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_summary(&s, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&s, STALLED).reason, "DeploymentConflict");
    assert_eq!(cond(&s, READY).message, "not ours");
}

/// Deleted and re-created under its name: the predecessor's objects on their way out are a
/// wait (kstatus InProgress), not Failed/Stalled, whether the workload should run or stop;
/// bounded by the progress deadline.
#[test]
fn waiting_for_a_predecessors_objects_is_in_progress_not_stalled() {
    for (state, phase) in [(DesiredState::Running, Phase::Creating), (DesiredState::Stopped, Phase::Stopping)] {
        let mw = workload(state, 1);
        let observed = Observed {
            desired_hash: &desired_hash(&mw),
            deployment: None,
            pods: vec![],
            blocked: Some(Blocked::departing("Deployment", "web")),
            claims: vec![],
            refused: &[],
            service: None,
            sandbox: None,
        };
        let s = derive(&mw, &observed, &at(1000));
        assert_summary(&s, phase, "False", "True", "False");
        assert_eq!(cond(&s, RECONCILING).reason, WAITING_FOR_DELETION);
        assert!(cond(&s, READY).message.contains("waiting for Deployment web to be deleted"), "{:?}", cond(&s, READY));

        // Still waiting at the progress deadline (600 s since Reconciling began): a wait...
        let mut waiting = mw.clone();
        waiting.status = Some(s.clone());
        let s = derive(&waiting, &observed, &at(1600));
        assert_summary(&s, phase, "False", "True", "False");
        // ...and past it (a claim held by a Pod on a lost node), Stalled, saying so.
        let s = derive(&waiting, &observed, &at(1601));
        assert_summary(&s, Phase::Failed, "False", "False", "True");
        assert_eq!(cond(&s, STALLED).reason, WAITING_FOR_DELETION);
        assert!(
            cond(&s, STALLED).message.contains("longer than the progress deadline (600 s)"),
            "{:?}",
            cond(&s, STALLED)
        );
        // Reported so, it stays so (no count begun again), with the same status.
        let mut stalled = waiting.clone();
        stalled.status = Some(s.clone());
        assert_eq!(derive(&stalled, &observed, &at(1700)), s);
        // A deadline of the spec's own.
        waiting.spec.progress_deadline_seconds = Some(30);
        assert_eq!(derive(&waiting, &observed, &at(1031)).phase, Some(Phase::Failed));
    }
}

#[test]
fn an_unchanged_world_derives_an_identical_status() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let pods = [pod(&d, true, true, "10.0.0.5")];
    let first = derive_with(&mw, Some(&d), &pods);
    let mut again = mw.clone();
    again.status = Some(first.clone());
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: pods.iter().collect(),
        blocked: None,
        claims: vec![],
        refused: &[],
        service: None,
        sandbox: None,
    };
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
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d2),
        pods: vec![&pods[0]],
        blocked: None,
        claims: vec![],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&stopping, &observed, &at(2000));
    assert_eq!(cond(&s, READY).last_transition_time, at(2000));
    assert_eq!(cond(&s, STALLED).last_transition_time, cond(&running, STALLED).last_transition_time);
}

/// A Pod the kubelet failed (evicted), as it stays until Pod garbage collection.
fn evicted(mut p: Pod) -> Pod {
    let status = p.status.get_or_insert_with(Default::default);
    status.phase = Some("Failed".into());
    status.reason = Some("Evicted".into());
    status.pod_ip = None;
    status.conditions = None;
    p.metadata.name = Some("web-evicted".into());
    p
}

#[test]
fn an_evicted_pod_is_history_once_its_replacement_is_ready() {
    let mw = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    let mut mw = mw;
    mw.status.as_mut().unwrap().observed_generation = Some(1);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let pods = [evicted(pod(&d, true, true, "10.0.0.5")), pod(&d, true, true, "10.0.0.6")];
    let s = derive_with(&mw, Some(&d), &pods);
    assert_summary(&s, Phase::Running, "True", "False", "False");
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.6"));
}

#[test]
fn a_pod_replaced_without_a_spec_change_is_creating_not_updating() {
    let mut mw = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    mw.status.as_mut().unwrap().observed_generation = Some(1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let pods = [evicted(pod(&d, true, true, "10.0.0.5")), pod(&d, true, false, "10.0.0.6")];
    let s = derive_with(&mw, Some(&d), &pods);
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    assert_eq!(cond(&s, RECONCILING).message, "Creating: waiting for the new Pod to become available");

    // The same after a spec change is an update.
    let mut changed = with_phase(workload(DesiredState::Running, 2), Phase::Running);
    changed.status.as_mut().unwrap().observed_generation = Some(1);
    let d = deployment(&changed, 2, 2, [1, 1, 0, 0]);
    let s = derive_with(&changed, Some(&d), &[pod(&d, true, false, "10.0.0.7")]);
    assert_eq!(s.phase, Some(Phase::Updating));
}

#[test]
fn stopped_when_only_finished_pods_are_left() {
    let mw = with_phase(workload(DesiredState::Stopped, 2), Phase::Stopping);
    let d = deployment(&mw, 2, 2, [0, 0, 0, 0]);
    let mut succeeded = pod(&d, true, false, "");
    succeeded.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let s = derive_with(&mw, Some(&d), &[evicted(pod(&d, true, true, "10.0.0.5")), succeeded]);
    assert_summary(&s, Phase::Stopped, "True", "False", "False");
}

/// A container in one step of a kubelet's crash-loop cycle, `restarts` restarts in.
fn crash_cycle(d: &Deployment, step: &str, restarts: i32, started: i64) -> Pod {
    let mut p = pod(d, true, step == "running", "10.0.0.5");
    let state = match step {
        "waiting" => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                message: Some(format!(
                    "back-off {restarts}0s restarting failed container=workload pod=web-x_apps(uid-9)"
                )),
            }),
            ..Default::default()
        },
        "running" => ContainerState {
            running: Some(ContainerStateRunning { started_at: Some(at(started)) }),
            ..Default::default()
        },
        _ => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                reason: Some("Error".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    };
    p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        name: "workload".into(),
        restart_count: restarts,
        last_state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                reason: Some("Error".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        state: Some(state),
        ..Default::default()
    }]);
    p
}

#[test]
fn a_crash_loop_stays_failed_through_its_whole_cycle_with_one_status() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let first = derive_with(&mw, Some(&d), &[crash_cycle(&d, "waiting", 1, 0)]);
    assert_summary(&first, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&first, STALLED).reason, "CrashLoopBackOff");
    let mut mw = mw;
    mw.status = Some(first.clone());
    for (step, restarts) in [("running", 2), ("terminated", 2), ("waiting", 3), ("running", 4), ("waiting", 9)] {
        // Ready while running (no readiness probe) or not: either way a loop.
        let p = crash_cycle(&d, step, restarts, 990);
        let observed = Observed {
            desired_hash: &desired_hash(&mw),
            deployment: Some(&d),
            pods: vec![&p],
            blocked: None,
            claims: vec![],
            refused: &[],
            service: None,
            sandbox: None,
        };
        let s = derive(&mw, &observed, &at(1000));
        assert_eq!(s, first, "{step} #{restarts}: the status must not change within the cycle");
    }
    let message = &cond(&first, STALLED).message;
    for volatile in ["web-x", "uid-9", "10s", "back-off 1"] {
        assert!(!message.contains(volatile), "{message}");
    }
}

/// What a real kubelet does to the Deployment on every crash-loop cycle of a container with no
/// readiness probe: while the container runs, its Pod is Ready, the ReplicaSet counts it and
/// the Deployment turns Available (maxUnavailable 0: one available replica is the minimum);
/// when it exits, all of that goes back. Found on the real node (tests/realnode.rs): two
/// status writes per restart until the counts and Available were held through the loop.
#[test]
fn a_crash_loop_holds_counts_and_available_while_the_deployment_flips_each_cycle() {
    let mw = workload(DesiredState::Running, 1);
    let unavailable = |d: &mut Deployment| {
        let status = d.status.as_mut().unwrap();
        status.conditions.as_mut().unwrap()[0] = dep_condition(
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
        );
    };
    let mut down = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    unavailable(&mut down);
    let up = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let first = derive_with(&mw, Some(&down), &[crash_cycle(&down, "waiting", 1, 0)]);
    assert_summary(&first, Phase::Failed, "False", "False", "True");
    assert_eq!((first.ready_replicas, first.available_replicas), (0, 0));
    assert_eq!(cond(&first, "Available").status, "False");
    let mut mw = mw;
    mw.status = Some(first.clone());
    for (step, restarts, d) in [
        ("running", 2, &up),
        ("terminated", 2, &down),
        ("waiting", 2, &down),
        ("running", 3, &up),
        ("running", 3, &down),
    ] {
        let p = crash_cycle(d, step, restarts, 990);
        let observed = Observed {
            desired_hash: &desired_hash(&mw),
            deployment: Some(d),
            pods: vec![&p],
            blocked: None,
            claims: vec![],
            refused: &[],
            service: None,
            sandbox: None,
        };
        let s = derive(&mw, &observed, &at(1000));
        assert_eq!(s, first, "{step} #{restarts}: the Deployment's flip must not change the status");
        assert_eq!(urgency(mw.status.as_ref(), &s), Urgency::Within(DETAIL_DELAY), "nothing to write");
    }
    // Recovered (running for the whole window): the counts and Available are the Deployment's again.
    let p = crash_cycle(&up, "running", 3, 1000 - CRASH_LOOP_RECOVERY.as_secs() as i64);
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&up),
        pods: vec![&p],
        blocked: None,
        claims: vec![],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_summary(&s, Phase::Running, "True", "False", "False");
    assert_eq!((s.ready_replicas, s.available_replicas), (1, 1));
    assert_eq!(cond(&s, "Available").status, "True");
}

#[test]
fn a_restarted_container_recovers_after_running_for_the_window() {
    let mut mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let p = crash_cycle(&d, "running", 1, 1000);
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: vec![&p],
        blocked: None,
        claims: vec![],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let window = CRASH_LOOP_RECOVERY.as_secs() as i64;
    let s = derive(&mw, &observed, &at(1000 + window - 1));
    assert_eq!(s.phase, Some(Phase::Failed));
    // The status changes with time alone here, so the controller must look again then.
    assert_eq!(revisit_after(&mw, &observed, &at(1000 + window - 1)), Some(std::time::Duration::from_secs(2)));
    mw.status = Some(s);
    let s = derive(&mw, &observed, &at(1000 + window));
    assert_summary(&s, Phase::Running, "True", "False", "False");
    // A healthy Pod needs no revisit.
    let healthy = pod(&d, true, true, "10.0.0.5");
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: vec![&healthy],
        blocked: None,
        claims: vec![],
        refused: &[],
        service: None,
        sandbox: None,
    };
    assert_eq!(revisit_after(&mw, &observed, &at(5000)), None);
}

#[test]
fn alternating_image_pull_errors_derive_one_status() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let pull = waiting(pod(&d, true, false, ""), "ErrImagePull", "rpc error: pulling web-x: not found");
    let backoff = waiting(pod(&d, true, false, ""), "ImagePullBackOff", "Back-off pulling image \"nginx\"");
    let a = derive_with(&mw, Some(&d), &[pull]);
    let b = derive_with(&mw, Some(&d), &[backoff]);
    assert_eq!(a, b);
    assert_eq!(
        cond(&a, STALLED).message,
        "container workload: ImagePullBackOff: image \"nginx:latest\" cannot be pulled"
    );
}

#[test]
fn kubelet_messages_lose_the_pods_identity() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let mut p = waiting(pod(&d, true, false, ""), "CreateContainerConfigError", "");
    p.metadata.uid = Some("pod-uid-7".into());
    let name = p.metadata.name.clone().unwrap();
    let message = format!("configmap \"missing\" not found for {name} ({})", "pod-uid-7");
    let p = waiting(p, "CreateContainerConfigError", &message);
    let s = derive_with(&mw, Some(&d), &[p]);
    let m = &cond(&s, RECONCILING).message;
    assert_eq!(m, "Creating: container workload waits: configmap \"missing\" not found for <pod> (<pod>)");
}

/// A Secret or ConfigMap not there yet (a bridged container's env Secret follows its
/// workload by moments) is a wait, not a failure: Creating (or Updating), Reconciling, with
/// what it waits for; past the rollout's progress deadline, Failed as any stuck rollout.
#[test]
fn a_container_waiting_for_its_secret_is_creating_until_the_progress_deadline() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    for message in ["secret \"web-manager-env\" not found", "couldn't find key GREETING in Secret apps/web-env"] {
        let p = waiting(pod(&d, true, false, ""), "CreateContainerConfigError", message);
        let s = derive_with(&mw, Some(&d), std::slice::from_ref(&p));
        assert_summary(&s, Phase::Creating, "False", "True", "False");
        assert_eq!(cond(&s, RECONCILING).reason, "CreateContainerConfigError");
        assert!(cond(&s, RECONCILING).message.contains(message), "{}", cond(&s, RECONCILING).message);
        // Said at once, not held back with the transition's details: someone has to make it.
        let creating = derive_with(&mw, Some(&d), &[pod(&d, true, false, "")]);
        assert_eq!(urgency(Some(&creating), &s), Urgency::Now);
        let stuck = timed_out(&d);
        let s = derive_with(&mw, Some(&stuck), &[p]);
        assert_summary(&s, Phase::Failed, "False", "False", "True");
    }
    let rooted = waiting(
        pod(&d, true, false, ""),
        "CreateContainerConfigError",
        "container has runAsNonRoot and image will run as root",
    );
    let s = derive_with(&mw, Some(&d), &[rooted]);
    assert_summary(&s, Phase::Failed, "False", "False", "True");
}

#[test]
fn mirrored_conditions_carry_the_generation_they_reflect() {
    // Generation 2 asked for a new image; the Deployment controller has not seen it yet.
    let mut mw = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    let d1 = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let s1 = derive_with(&mw, Some(&d1), &[pod(&d1, true, true, "10.0.0.5")]);
    assert_eq!(cond(&s1, "Available").observed_generation, Some(1));
    mw.status = Some(s1);
    mw.metadata.generation = Some(2);
    mw.spec.image = "nginx:1.27".into();
    // The live Deployment already has the new spec, but its controller has not observed it.
    let d2 = deployment(&mw, 2, 1, [1, 0, 1, 1]);
    let s = derive_with(&mw, Some(&d2), &[pod(&d1, true, true, "10.0.0.5")]);
    assert_eq!(cond(&s, "Available").observed_generation, Some(1), "still the old ReplicaSet's state");
    assert_eq!(cond(&s, READY).observed_generation, Some(2));
    // A Deployment still built from the old spec (not yet re-applied) reflects the old one too.
    let s = derive_with(&mw, Some(&d1), &[pod(&d1, true, true, "10.0.0.5")]);
    assert_eq!(cond(&s, "Progressing").observed_generation, Some(1));
    // Observed and built from generation 2: now they speak for it.
    let d2 = deployment(&mw, 2, 2, [1, 1, 1, 1]);
    let s = derive_with(&mw, Some(&d2), &[pod(&d2, true, true, "10.0.0.6")]);
    assert_eq!(cond(&s, "Available").observed_generation, Some(2));
    // Never current and never stamped before: left out rather than claimed.
    let fresh = workload(DesiredState::Running, 1);
    let d = deployment(&fresh, 1, 0, [0, 0, 0, 0]);
    let s = derive_with(&fresh, Some(&d), &[]);
    assert!(s.conditions.iter().all(|c| !MIRRORED.contains(&c.type_.as_str())), "{:?}", s.conditions);
}

#[test]
fn what_clients_wait_on_is_written_at_once_and_details_wait() {
    let fresh = workload(DesiredState::Running, 1);
    // The Deployment exists but its controller has not reported yet.
    let d0 = deployment(&fresh, 1, 0, [0, 0, 0, 0]);
    let creating = derive_with(&fresh, Some(&d0), &[]);
    assert_eq!(urgency(None, &creating), Urgency::Now, "the first status");

    // Its controller reports replica counts and its own conditions: details of a transition.
    let mut mw = fresh.clone();
    mw.status = Some(creating.clone());
    let d1 = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let counted = derive_with(&mw, Some(&d1), &[pod(&d1, true, false, "")]);
    assert_eq!(counted.phase, Some(Phase::Creating));
    assert_ne!(counted, creating);
    assert_eq!(urgency(Some(&creating), &counted), Urgency::Within(DETAIL_DELAY_IN_TRANSITION));
    // The Pod runs and has an IP before it is ready: still a detail of the transition.
    let mut addressed = counted.clone();
    addressed.pod_ip = Some("10.0.0.5".into());
    assert_eq!(urgency(Some(&creating), &addressed), Urgency::Within(DETAIL_DELAY_IN_TRANSITION));

    // Running: the phase, Ready and the Pod IP change.
    let d2 = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let running = derive_with(&mw, Some(&d2), &[pod(&d2, true, true, "10.0.0.5")]);
    assert_eq!(running.phase, Some(Phase::Running));
    assert_eq!(urgency(Some(&creating), &running), Urgency::Now);
    assert_eq!(urgency(Some(&counted), &running), Urgency::Now);

    // In a steady phase, a detail waits briefly.
    let mut detail = running.clone();
    detail.conditions.iter_mut().find(|c| c.type_ == "Progressing").unwrap().message = "changed".into();
    assert_eq!(urgency(Some(&running), &detail), Urgency::Within(DETAIL_DELAY));

    // Each summary field, condition status and observed generation is urgent on its own.
    type Change = (&'static str, fn(&mut ManagedWorkloadStatus));
    let changes: [Change; 9] = [
        ("no pod IP", |s| s.pod_ip = None),
        ("another pod IP", |s| s.pod_ip = Some("10.0.0.6".into())),
        ("observed generation", |s| s.observed_generation = Some(2)),
        ("desired replicas", |s| s.desired_replicas = 0),
        ("a condition's status", |s| {
            s.conditions.iter_mut().find(|c| c.type_ == "Available").unwrap().status = "False".into()
        }),
        ("a summary condition's generation", |s| {
            s.conditions.iter_mut().find(|c| c.type_ == READY).unwrap().observed_generation = Some(2)
        }),
        ("a summary reason", |s| s.conditions.iter_mut().find(|c| c.type_ == READY).unwrap().reason = "Other".into()),
        ("a summary condition gone", |s| s.conditions.retain(|c| c.type_ != STALLED)),
        ("a mirrored condition gone", |s| s.conditions.retain(|c| c.type_ != "Progressing")),
    ];
    for (what, change) in changes {
        let mut next = running.clone();
        change(&mut next);
        assert_eq!(urgency(Some(&running), &next), Urgency::Now, "{what}");
    }
    // A mirrored condition's reason or generation stamp is a detail.
    let mut next = running.clone();
    next.conditions.iter_mut().find(|c| c.type_ == "Progressing").unwrap().reason = "Other".into();
    next.conditions.iter_mut().find(|c| c.type_ == "Available").unwrap().observed_generation = Some(2);
    assert_eq!(urgency(Some(&running), &next), Urgency::Within(DETAIL_DELAY));
}

fn with_volume(mut mw: ManagedWorkload) -> ManagedWorkload {
    mw.spec.volumes = vec![crate::resource::Volume {
        name: "data".into(),
        mount_path: "/data".into(),
        size: "1Gi".into(),
        storage_class_name: None,
        access_mode: None,
        retention_policy: None,
    }];
    mw
}

fn claim(phase: &str, capacity: Option<&str>) -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut c = k8s_openapi::api::core::v1::PersistentVolumeClaim::default();
    c.metadata.name = Some("web-data".into());
    c.spec = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
        resources: Some(k8s_openapi::api::core::v1::VolumeResourceRequirements {
            requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
            limits: None,
        }),
        ..Default::default()
    });
    c.status = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
        phase: Some(phase.into()),
        capacity: capacity.map(|q| [("storage".to_string(), Quantity(q.into()))].into()),
        ..Default::default()
    });
    c
}

#[test]
fn an_unbound_claim_keeps_the_workload_creating_then_fails_it_at_the_deadline_naming_it() {
    let mw = with_volume(workload(DesiredState::Running, 1));
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let pending = claim("Pending", None);
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: vec![],
        blocked: None,
        claims: vec![&pending],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    assert_eq!(cond(&s, RECONCILING).reason, "ClaimPending");
    assert!(cond(&s, RECONCILING).message.contains("claim web-data"));
    let v = &s.volumes[0];
    assert_eq!((v.name.as_str(), v.claim.as_str(), v.phase.as_deref()), ("data", "web-data", Some("Pending")));

    let late = timed_out(&d);
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&late),
        pods: vec![],
        blocked: None,
        claims: vec![&pending],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_summary(&s, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&s, STALLED).reason, "ClaimNotBound");
    assert!(cond(&s, STALLED).message.contains("claim web-data"));
}

#[test]
fn a_lost_claim_fails_at_once_and_a_bound_one_reports_its_capacity() {
    let mw = with_volume(workload(DesiredState::Running, 1));
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let pods = [pod(&d, true, true, "10.0.0.5")];
    let lost = claim("Lost", None);
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: pods.iter().collect(),
        blocked: None,
        claims: vec![&lost],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_summary(&s, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&s, STALLED).reason, "ClaimLost");

    let bound = claim("Bound", Some("1Gi"));
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: pods.iter().collect(),
        blocked: None,
        claims: vec![&bound],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_eq!(s.phase, Some(Phase::Running));
    assert_eq!(s.volumes[0].capacity.as_deref(), Some("1Gi"));
    assert_eq!(s.volumes[0].message, None);

    let mut grown = bound.clone();
    grown.spec.as_mut().unwrap().resources.as_mut().unwrap().requests =
        Some([("storage".to_string(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("2Gi".into()))].into());
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: pods.iter().collect(),
        blocked: None,
        claims: vec![&grown],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_eq!(s.phase, Some(Phase::Running), "an expansion in progress fails nothing");
    assert!(s.volumes[0].message.as_deref().is_some_and(|m| m.contains("expansion to 2Gi requested")));

    // The class refuses expansion: said on the volume, and the workload runs on as it is.
    let refused = [("web-data".to_string(), "only dynamically provisioned pvc can be resized".to_string())];
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: pods.iter().collect(),
        blocked: None,
        claims: vec![&bound],
        refused: &refused,
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_summary(&s, Phase::Running, "True", "False", "False");
    let message = s.volumes[0].message.clone().unwrap();
    assert!(message.contains("refused") && message.contains("stays at 1Gi"), "{message}");
    assert!(message.contains("only dynamically provisioned pvc can be resized"), "the server's words: {message}");
}

/// A Pod the scheduler could not place, as kube-scheduler reports it.
fn unscheduled(d: &Deployment, message: &str) -> Pod {
    let mut p = pod(d, true, false, "");
    let status = p.status.as_mut().unwrap();
    status.phase = Some("Pending".into());
    status.pod_ip = None;
    status.conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some(message.into()),
        ..Default::default()
    }]);
    p
}

const NO_GPU: &str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. no new claims to deallocate, \
                      preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.";

#[test]
fn an_unschedulable_pod_is_a_wait_naming_what_is_missing() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let s = derive_with(&mw, Some(&d), &[unscheduled(&d, NO_GPU)]);
    // A wait, not a failure: kstatus InProgress, Manager "creating".
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    let reconciling = cond(&s, RECONCILING);
    assert_eq!(reconciling.reason, "Unschedulable");
    assert_eq!(
        reconciling.message,
        "Creating: Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu. no new claims to deallocate"
    );
    assert_eq!(cond(&s, READY).reason, "Unschedulable");
    assert_eq!(cond(&s, STALLED).reason, "Healthy");
    // Said at once: a wait a human may have to end (the other steps a new workload waits on
    // are details, see `a_new_workload_costs_two_status_writes_whatever_it_waits_on`).
    let before = derive_with(&mw, Some(&d), &[pod(&d, true, false, "")]);
    assert_eq!(urgency(Some(&before), &s), Urgency::Now);
    let mut still = s.clone();
    still.conditions.iter_mut().for_each(|c| c.message.push_str(" (more)"));
    assert_eq!(urgency(Some(&s), &still), Urgency::Within(DETAIL_DELAY_IN_TRANSITION), "already said");
    // Leaving it for the next step is a detail: the phase and conditions are the same.
    assert_eq!(urgency(Some(&s), &before), Urgency::Within(DETAIL_DELAY_IN_TRANSITION));
}

#[test]
fn an_unschedulable_update_stays_updating_and_the_deadline_still_fails_it() {
    let mw = with_phase(workload(DesiredState::Running, 2), Phase::Running);
    let d = deployment(&mw, 2, 2, [2, 1, 1, 1]);
    let old = pod(&d, false, true, "10.0.0.1");
    let s = derive_with(&mw, Some(&d), &[old.clone(), unscheduled(&d, NO_GPU)]);
    assert_summary(&s, Phase::Updating, "False", "True", "False");
    assert!(cond(&s, RECONCILING).message.starts_with("Updating: Unschedulable: 0/3 nodes"));
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.1"), "the old Pod still serves");

    // The progress deadline bounds the wait.
    let late = timed_out(&d);
    let s = derive_with(&mw, Some(&late), &[old, unscheduled(&late, NO_GPU)]);
    assert_summary(&s, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&s, STALLED).reason, "ProgressDeadlineExceeded");
}

#[test]
fn scheduled_pods_and_other_templates_are_not_unschedulable() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let mut scheduled = unscheduled(&d, NO_GPU);
    scheduled.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
    let s = derive_with(&mw, Some(&d), &[scheduled]);
    assert_eq!(cond(&s, RECONCILING).reason, "Creating");
    // An old template's Pod that cannot be placed says nothing about the current one.
    let mut old = unscheduled(&d, NO_GPU);
    old.metadata.annotations = Some([(crate::names::TEMPLATE_HASH_ANNOTATION.to_string(), "0".repeat(16))].into());
    let s = derive_with(&mw, Some(&d), &[old]);
    assert_ne!(cond(&s, RECONCILING).reason, "Unschedulable");
}

#[test]
fn scheduler_messages_lose_the_preemption_postscript_and_stay_short() {
    assert_eq!(
        scrub_scheduler(NO_GPU),
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. no new claims to deallocate"
    );
    assert_eq!(scrub_scheduler(""), "no node can host the Pod");
    let long = "é".repeat(600);
    let cut = scrub_scheduler(&long);
    assert!(cut.len() <= 512 && cut.chars().all(|c| c == 'é'));
}

#[test]
fn gpu_workloads_are_judged_against_the_resource_name_they_were_built_with() {
    let mut mw = workload(DesiredState::Running, 1);
    mw.spec.resources = Some(crate::resource::Resources { gpus: Some(1), ..Default::default() });
    let amd = PodSettings { gpu_resource: "amd.com/gpu".into(), ..Default::default() };
    let mut d = desired::deployment(&mw, &amd).unwrap();
    d.metadata.generation = Some(1);
    d.status = deployment(&mw, 1, 1, [1, 1, 1, 1]).status;
    let p = pod(&d, true, true, "10.0.0.9");
    let observed = Observed {
        desired_hash: applied_hash(&d).unwrap(),
        deployment: Some(&d),
        pods: vec![&p],
        blocked: None,
        claims: vec![],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_eq!(s.phase, Some(Phase::Running));
    assert_eq!(cond(&s, "Available").observed_generation, Some(1), "mirrored conditions are current");
}

/// `p` placed on `node`.
fn on(mut p: Pod, node: &str) -> Pod {
    p.spec.get_or_insert_with(Default::default).node_name = Some(node.into());
    p
}

#[test]
fn a_volume_still_attached_to_a_lost_node_is_that_wait_naming_the_claim_and_the_node() {
    let mw = with_volume(workload(DesiredState::Running, 1));
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let bound = claim("Bound", Some("1Gi"));
    // The lost node's Pod is being deleted (and cannot finish); its replacement is placed on
    // another node and waits, no container started, for the volume to attach there.
    let lost = on(terminating(pod(&d, true, true, "10.0.0.1")), "node-a");
    let replacement = on(waiting(pod(&d, true, false, ""), "ContainerCreating", ""), "node-b");
    let pods = [lost.clone(), replacement.clone()];
    let observed = Observed {
        desired_hash: &desired_hash(&mw),
        deployment: Some(&d),
        pods: pods.iter().collect(),
        blocked: None,
        claims: vec![&bound],
        refused: &[],
        service: None,
        sandbox: None,
    };
    let s = derive(&mw, &observed, &at(1000));
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    let reconciling = cond(&s, RECONCILING);
    assert_eq!(reconciling.reason, "VolumeHeldElsewhere");
    assert!(reconciling.message.contains("claim web-data") && reconciling.message.contains("node node-a"));

    // Not that wait: the same node (the volume is attached where the Pod waits), a shared
    // volume (ReadWriteMany attaches to many nodes), or a replacement already running.
    let same_node = [lost.clone(), on(replacement.clone(), "node-a")];
    let mut shared = mw.clone();
    shared.spec.volumes[0].access_mode = Some(crate::resource::AccessMode::ReadWriteMany);
    let running = [lost, on(pod(&d, true, false, "10.0.0.2"), "node-b")];
    for (mw, pods) in [(&mw, &same_node[..]), (&shared, &pods[..]), (&mw, &running[..])] {
        let observed = Observed {
            desired_hash: &desired_hash(mw),
            deployment: Some(&d),
            pods: pods.iter().collect(),
            blocked: None,
            claims: vec![&bound],
            refused: &[],
            service: None,
            sandbox: None,
        };
        assert_ne!(cond(&derive(mw, &observed, &at(1000)), RECONCILING).reason, "VolumeHeldElsewhere");
    }
}

#[test]
fn running_waits_for_the_pod_cache_when_the_deployment_is_ahead_and_comes_with_the_pod_ip() {
    // The Deployment controller has counted the Pod available, but the Pod cache still holds
    // it as it was before it was ready (the two watches deliver independently).
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let mut starting = pod(&d, true, false, "");
    starting.status.as_mut().unwrap().phase = Some("Pending".into());
    let s = derive_with(&mw, Some(&d), &[starting]);
    assert_eq!(s.phase, Some(Phase::Creating), "not Running before the Pod is seen Ready");
    assert_eq!(s.pod_ip, None);

    let s = derive_with(&mw, Some(&d), &[pod(&d, true, true, "10.0.0.7")]);
    assert_eq!(s.phase, Some(Phase::Running));
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.7"), "Running comes with the address");
}

// --- Service and address (issue 15) -----------------------------------------------------------

fn with_service(mut mw: ManagedWorkload, type_: crate::resource::ServiceType) -> ManagedWorkload {
    mw.spec.ports =
        vec![crate::resource::ContainerPort { container_port: 80, name: Some("http".into()), protocol: None }];
    mw.spec.service = Some(crate::resource::ServiceSpec { type_: Some(type_), ..Default::default() });
    mw
}

/// The Service the operator would apply for `mw`, as the cluster reports it: a cluster IP,
/// and the load balancer's address when one is given.
fn live_service(mw: &ManagedWorkload, ingress: Option<&str>) -> Service {
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
    let mut s = service::service(mw).unwrap();
    s.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.20".into());
    s.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: ingress.map(|ip| vec![LoadBalancerIngress { ip: Some(ip.into()), ..Default::default() }]),
        }),
        conditions: None,
    });
    s
}

fn derive_exposed(mw: &ManagedWorkload, d: &Deployment, pods: &[Pod], svc: Option<&Service>) -> ManagedWorkloadStatus {
    let observed = Observed {
        desired_hash: &desired_hash(mw),
        deployment: Some(d),
        pods: pods.iter().collect(),
        blocked: None,
        claims: vec![],
        refused: &[],
        service: svc,
        sandbox: None,
    };
    derive(mw, &observed, &at(1000))
}

#[test]
fn without_a_service_the_address_is_the_serving_pods_ip_kept_through_a_rollout() {
    let running = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    let d = deployment(&running, 1, 1, [1, 1, 1, 1]);
    let s = derive_with(&running, Some(&d), &[pod(&d, true, true, "10.0.0.5")]);
    assert_eq!((s.address.as_deref(), s.service.as_ref()), (Some("10.0.0.5"), None));

    // Updating: the old Pod serves until the new one is Ready, and stays the address.
    let mw = with_phase(workload(DesiredState::Running, 2), Phase::Running);
    let d = deployment(&mw, 2, 2, [2, 1, 1, 1]);
    let s = derive_with(&mw, Some(&d), &[pod(&d, true, false, "10.0.0.7"), pod(&d, false, true, "10.0.0.5")]);
    assert_eq!(s.phase, Some(Phase::Updating));
    assert_eq!(s.address.as_deref(), Some("10.0.0.5"), "the old, serving Pod");
    let s = derive_with(&mw, Some(&d), &[pod(&d, true, true, "10.0.0.7"), pod(&d, false, true, "10.0.0.5")]);
    assert_eq!(s.address.as_deref(), Some("10.0.0.7"), "the new Pod, once Ready");

    let stopped = workload(DesiredState::Stopped, 1);
    let d = deployment(&stopped, 1, 1, [0, 0, 0, 0]);
    assert_eq!(derive_with(&stopped, Some(&d), &[]).address, None, "nothing serves");
}

#[test]
fn with_a_service_the_address_is_its_cluster_ip_whichever_pod_serves() {
    use crate::resource::ServiceType;
    let mut mw = with_phase(with_service(workload(DesiredState::Running, 1), ServiceType::ClusterIP), Phase::Running);
    mw.status.as_mut().unwrap().observed_generation = Some(1);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let svc = live_service(&mw, None);
    let first = derive_exposed(&mw, &d, &[pod(&d, true, true, "10.0.0.5")], Some(&svc));
    assert_summary(&first, Phase::Running, "True", "False", "False");
    assert_eq!(first.address.as_deref(), Some("10.96.0.20"));
    assert_eq!(first.pod_ip.as_deref(), Some("10.0.0.5"), "the Pod IP is still reported, for information");
    let service = first.service.as_ref().unwrap();
    assert_eq!((service.name.as_str(), service.type_.as_str()), ("web", "ClusterIP"));
    assert_eq!(service.dns_name, "web.apps.svc");
    assert_eq!(service.ports[0].port, 80);

    // The Pod is replaced (deleted, evicted, a rollout): the address stays.
    let unavailable = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let replaced = derive_exposed(&mw, &unavailable, &[pod(&unavailable, true, false, "10.0.0.9")], Some(&svc));
    assert_eq!(replaced.phase, Some(Phase::Creating));
    assert_eq!(replaced.address, first.address);
    let stopped = with_service(workload(DesiredState::Stopped, 1), ServiceType::ClusterIP);
    let d0 = deployment(&stopped, 1, 1, [0, 0, 0, 0]);
    assert_eq!(derive_exposed(&stopped, &d0, &[], Some(&svc)).address, first.address, "the Service stays");

    // Asked for, but not there (yet): not Ready, and no address.
    let missing = derive_exposed(&mw, &d, &[pod(&d, true, true, "10.0.0.5")], None);
    assert_summary(&missing, Phase::Creating, "False", "True", "False");
    assert_eq!(cond(&missing, RECONCILING).message, "Creating: waiting for the Service");
    assert_eq!(missing.address, None);
}

#[test]
fn a_load_balancer_is_ready_once_it_has_an_address() {
    use crate::resource::ServiceType;
    let mw = with_service(workload(DesiredState::Running, 1), ServiceType::LoadBalancer);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let pods = [pod(&d, true, true, "10.0.0.5")];
    let pending = derive_exposed(&mw, &d, &pods, Some(&live_service(&mw, None)));
    // Reconciling (kstatus: InProgress; Argo CD: Progressing), not Stalled: a wait.
    assert_summary(&pending, Phase::Creating, "False", "True", "False");
    assert_eq!(cond(&pending, READY).reason, WAITING_FOR_LOAD_BALANCER);
    assert_eq!(cond(&pending, RECONCILING).reason, WAITING_FOR_LOAD_BALANCER);
    assert_eq!(
        cond(&pending, RECONCILING).message,
        "Creating: WaitingForLoadBalancer: the Pod is available; Service web has no load-balancer address yet"
    );
    assert_eq!(pending.address.as_deref(), Some("10.96.0.20"), "the cluster IP meanwhile");

    let mut known = mw.clone();
    known.status = Some(pending.clone());
    let served = derive_exposed(&known, &d, &pods, Some(&live_service(&mw, Some("192.0.2.10"))));
    assert_summary(&served, Phase::Running, "True", "False", "False");
    assert_eq!(served.address.as_deref(), Some("192.0.2.10"));
    assert_eq!(served.service.as_ref().unwrap().load_balancer_ingress, ["192.0.2.10"]);
    assert_eq!(urgency(Some(&pending), &served), Urgency::Now);

    // The same world again: the same status, so no write.
    known.status = Some(served.clone());
    let again = derive_exposed(&known, &d, &pods, Some(&live_service(&mw, Some("192.0.2.10"))));
    assert_eq!(again, served);
}

#[test]
fn an_address_that_changes_is_written_at_once() {
    let mw = with_phase(workload(DesiredState::Running, 1), Phase::Running);
    let d = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let running = derive_with(&mw, Some(&d), &[pod(&d, true, true, "10.0.0.5")]);
    for (what, address) in [("another address", Some("192.0.2.10")), ("no address", None)] {
        let mut next = running.clone();
        next.address = address.map(Into::into);
        assert_eq!(urgency(Some(&running), &next), Urgency::Now, "{what}");
    }
    let mut first = running.clone();
    first.address = None;
    let mut next = first.clone();
    next.address = Some("10.96.0.20".into());
    assert_eq!(urgency(Some(&first), &next), Urgency::Within(DETAIL_DELAY), "a first address is a detail");
}

/// A new workload's status writes, for each thing it may own and wait on (issue 25): the
/// first status and `Running` are written at once; every step between (which it waits on:
/// its claim, its Pod, its load balancer) is a detail that rides with the next write, so the
/// lifecycle costs two status writes, and what kstatus, `kubectl wait`, Argo CD and Manager
/// read (phase, condition statuses, generations) is right at every step.
#[test]
fn a_new_workload_costs_two_status_writes_whatever_it_waits_on() {
    use crate::resource::ServiceType;
    let mw = with_service(with_volume(workload(DesiredState::Running, 1)), ServiceType::LoadBalancer);
    let d0 = deployment(&mw, 1, 0, [0, 0, 0, 0]);
    let d1 = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let d2 = deployment(&mw, 1, 1, [1, 1, 1, 1]);
    let (pending, bound) = (claim("Pending", None), claim("Bound", Some("1Gi")));
    let (starting, serving) = (pod(&d1, true, false, ""), pod(&d2, true, true, "10.0.0.5"));
    let (no_lb, lb) = (live_service(&mw, None), live_service(&mw, Some("192.0.2.10")));
    type Step<'a> = (&'a str, &'a Deployment, Vec<&'a Pod>, &'a k8s_openapi::api::core::v1::PersistentVolumeClaim);
    let steps: [Step<'_>; 5] = [
        ("the claim is made, not bound yet", &d0, vec![], &pending),
        ("bound on first consumer: the Pod is scheduled", &d1, vec![&starting], &pending),
        ("bound", &d1, vec![&starting], &bound),
        ("the scheduler waited for the claim", &d1, vec![], &bound),
        ("the Pod is available, the load balancer not yet", &d2, vec![&serving], &bound),
    ];
    let derive_at = |known: &ManagedWorkload, d: &Deployment, pods: &[&Pod], c, svc| {
        let observed = Observed {
            desired_hash: &desired_hash(&mw),
            deployment: Some(d),
            pods: pods.to_vec(),
            blocked: None,
            claims: vec![c],
            refused: &[],
            service: Some(svc),
            sandbox: None,
        };
        derive(known, &observed, &at(1000))
    };
    let mut known = mw.clone();
    let mut writes = 0;
    let mut reasons = Vec::new();
    for (what, d, pods, c) in &steps {
        let s = derive_at(&known, d, pods, c, &no_lb);
        // kstatus InProgress, Argo CD Progressing, Manager "creating", `kubectl wait` waits.
        assert_summary(&s, Phase::Creating, "False", "True", "False");
        assert_eq!(s.observed_generation, Some(1), "{what}");
        reasons.push(cond(&s, RECONCILING).reason.clone());
        match urgency(known.status.as_ref(), &s) {
            Urgency::Now => {
                writes += 1;
                known.status = Some(s);
            }
            Urgency::Within(wait) => assert_eq!(wait, DETAIL_DELAY_IN_TRANSITION, "{what}"),
        }
    }
    assert_eq!(reasons, ["ClaimPending", "ClaimPending", "Creating", "Creating", WAITING_FOR_LOAD_BALANCER]);
    assert_eq!(writes, 1, "only the first Creating was written");
    assert_eq!(cond(known.status.as_ref().unwrap(), RECONCILING).reason, "ClaimPending", "a stale detail");
    let running = derive_at(&known, &d2, &[&serving], &bound, &lb);
    assert_summary(&running, Phase::Running, "True", "False", "False");
    assert_eq!(urgency(known.status.as_ref(), &running), Urgency::Now, "Ready is written at once");
    // The write is the whole status: the stale detail goes with it.
    assert_eq!(running.volumes[0].phase.as_deref(), Some("Bound"));
    assert_eq!(running.address.as_deref(), Some("192.0.2.10"));
}

/// A new workload's first status is written while its Deployment is being created
/// (`reconcile::report_ahead`), derived from the desired Deployment standing in for it. That
/// is sound only if it is the status the report after the create derives from the API
/// server's answer (the same object with a UID, generation 1, an empty status): whatever the
/// workload owns and whichever state it is created in.
#[test]
fn the_deployment_being_created_reads_as_the_one_created() {
    use crate::resource::ServiceType;
    let plain = workload(DesiredState::Running, 1);
    let cases = [
        ("plain", plain.clone(), None, Phase::Creating),
        ("created Stopped", workload(DesiredState::Stopped, 1), None, Phase::Stopping),
        ("a claim not bound yet", with_volume(plain.clone()), Some(claim("Pending", None)), Phase::Creating),
        ("a claim bound", with_volume(plain.clone()), Some(claim("Bound", Some("1Gi"))), Phase::Creating),
        ("a load balancer", with_service(plain.clone(), ServiceType::LoadBalancer), None, Phase::Creating),
    ];
    for (what, mw, claim, phase) in cases {
        let being_created = desired::deployment(&mw, &Default::default()).unwrap();
        let mut created = being_created.clone();
        created.metadata.uid = Some("deployment-uid".into());
        created.metadata.generation = Some(1);
        created.metadata.resource_version = Some("42".into());
        created.status = Some(DeploymentStatus::default());
        let service = mw.spec.service.as_ref().map(|_| live_service(&mw, None));
        let derive_over = |d: &Deployment| {
            let observed = Observed {
                desired_hash: &desired_hash(&mw),
                deployment: Some(d),
                pods: vec![],
                blocked: None,
                claims: claim.iter().collect(),
                refused: &[],
                service: service.as_ref(),
                sandbox: None,
            };
            derive(&mw, &observed, &at(1000))
        };
        let ahead = derive_over(&being_created);
        assert_eq!(ahead, derive_over(&created), "{what}");
        assert_eq!(ahead.phase, Some(phase), "{what}");
    }
}

/// Only a wait's reason is a detail: the same reason change outside a transition (a failure
/// that turns into another, the end of one) is written at once, and so is every change of
/// phase, condition status or generation during a transition.
#[test]
fn a_reason_is_a_detail_only_while_waiting() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let pull = derive_with(&mw, Some(&d), &[waiting(pod(&d, true, false, ""), "ErrImagePull", "")]);
    assert_summary(&pull, Phase::Failed, "False", "False", "True");
    let config = derive_with(&mw, Some(&d), &[waiting(pod(&d, true, false, ""), "CreateContainerConfigError", "x")]);
    assert_eq!(urgency(Some(&pull), &config), Urgency::Now, "another failure");
    let creating = derive_with(&mw, Some(&d), &[pod(&d, true, false, "")]);
    assert_eq!(urgency(Some(&pull), &creating), Urgency::Now, "a failure's end");
    assert_eq!(urgency(Some(&creating), &pull), Urgency::Now, "a failure");
    type Change = (&'static str, fn(&mut ManagedWorkloadStatus));
    let changes: [Change; 4] = [
        ("the phase", |s| s.phase = Some(Phase::Updating)),
        ("a summary condition's status", |s| {
            s.conditions.iter_mut().find(|c| c.type_ == STALLED).unwrap().status = "True".into()
        }),
        ("a summary condition's generation", |s| {
            s.conditions.iter_mut().find(|c| c.type_ == RECONCILING).unwrap().observed_generation = Some(2)
        }),
        ("the observed generation", |s| s.observed_generation = Some(2)),
    ];
    for (what, change) in changes {
        let mut next = creating.clone();
        change(&mut next);
        next.conditions.iter_mut().for_each(|c| c.reason = "Other".into());
        assert_eq!(urgency(Some(&creating), &next), Urgency::Now, "{what}");
    }
}

/// The scheduler's moment of waiting for a claim to bind is the claim's wait, not a capacity
/// wait: once the claim is bound, the scheduler's word is stale until its retry, and the
/// workload reads `Creating` meanwhile (no `Unschedulable` write of its own).
#[test]
fn the_schedulers_wait_for_a_claim_to_bind_is_no_capacity_wait() {
    let mw = with_volume(workload(DesiredState::Running, 1));
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let waiting = unscheduled(
        &d,
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are \
         available: 1 Preemption is not helpful for scheduling.",
    );
    let with_claim = |c| {
        let observed = Observed {
            desired_hash: &desired_hash(&mw),
            deployment: Some(&d),
            pods: vec![&waiting],
            blocked: None,
            claims: vec![c],
            refused: &[],
            service: None,
            sandbox: None,
        };
        derive(&mw, &observed, &at(1000))
    };
    let (pending, bound) = (claim("Pending", None), claim("Bound", Some("1Gi")));
    assert_eq!(cond(&with_claim(&pending), RECONCILING).reason, "ClaimPending");
    let s = with_claim(&bound);
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    assert_eq!(cond(&s, RECONCILING).reason, "Creating");
}

/// A system container on a node whose runtime mounts the cgroup filesystem read-only: systemd
/// says so in its last words and exits. Failed at its first exit, named for the node's
/// missing capability and the way out, through the whole crash loop that follows; never a
/// bare CrashLoopBackOff.
#[test]
fn a_system_container_on_a_node_that_cannot_boot_it_says_why() {
    let mw = workload(DesiredState::Running, 1);
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let last_words = "systemd 257 running in system mode\nFailed to create /init.scope control group: Read-only \
                      file system\nFailed to allocate manager object: Read-only file system\nExiting PID 1...";
    let kept = known_termination(last_words).expect("known");
    let exited = |p: Pod| {
        let mut p = p;
        for cs in p.status.as_mut().unwrap().container_statuses.iter_mut().flatten() {
            for state in [&mut cs.state, &mut cs.last_state].into_iter().flatten() {
                if let Some(t) = state.terminated.as_mut() {
                    t.message = Some(kept.into());
                }
            }
        }
        p
    };
    let mut first_exit = crash_cycle(&d, "terminated", 0, 0);
    first_exit.status.as_mut().unwrap().container_statuses.as_mut().unwrap()[0].last_state = None;
    let first = derive_with(&mw, Some(&d), &[exited(first_exit)]);
    assert_summary(&first, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&first, STALLED).reason, "CgroupReadOnly");
    let message = &cond(&first, STALLED).message;
    assert!(message.contains("cgroup v2") && message.contains("cgroup_writable = true"), "{message}");
    assert!(message.contains("privileged"), "{message}");
    for (step, restarts) in [("waiting", 1), ("running", 2), ("terminated", 2), ("waiting", 5)] {
        let s = derive_with(&mw, Some(&d), &[exited(crash_cycle(&d, step, restarts, 990))]);
        assert_eq!(cond(&s, STALLED).reason, "CgroupReadOnly", "{step} #{restarts}");
    }
    // An ordinary crash's log says nothing the status knows: a crash loop, as before.
    assert_eq!(known_termination("panic: oops\nexit status 2"), None);
}

/// A system container's Pod whose sandbox the kubelet cannot make: on a node without user
/// namespaces, Failed, naming what the node lacks (the Pod's own status says only
/// ContainerCreating); any other reason is a wait that says why. The reason is looked up only
/// once the sandbox has failed for `SANDBOX_GRACE`, and the workload is revisited then.
#[test]
fn a_sandbox_the_kubelet_cannot_make_says_why() {
    let mut mw = workload(DesiredState::Running, 1);
    mw.spec.system_container = Some(Box::default());
    let d = deployment(&mw, 1, 1, [1, 1, 0, 0]);
    let mut p = waiting(pod(&d, true, false, ""), "ContainerCreating", "");
    p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: SANDBOX_READY.into(),
        status: "False".into(),
        last_transition_time: Some(at(990)),
        ..Default::default()
    }]);
    assert!(!sandbox_stuck(&p, &at(1000)), "10 s in: not yet");
    assert!(sandbox_stuck(&p, &at(1005)));
    let hash = desired_hash(&mw);
    let observed = |sandbox| Observed {
        desired_hash: &hash,
        deployment: Some(&d),
        pods: vec![&p],
        blocked: None,
        claims: vec![],
        refused: &[],
        service: None,
        sandbox,
    };
    assert_eq!(revisit_after(&mw, &observed(None), &at(1000)), Some(Duration::from_secs(6)), "back at the grace's end");
    let userns =
        "Failed to create pod sandbox: can't set `spec.hostUsers: false`, runtime does not support user namespaces";
    let s = derive(&mw, &observed(Some(userns)), &at(1005));
    assert_summary(&s, Phase::Failed, "False", "False", "True");
    assert_eq!(cond(&s, STALLED).reason, "UserNamespacesUnsupported");
    let message = &cond(&s, STALLED).message;
    assert!(message.contains("containerd 2.0+") && message.contains("userNamespace is false"), "{message}");
    let cni = "Failed to create pod sandbox: plugin type=\"bridge\" failed: network not ready";
    let s = derive(&mw, &observed(Some(cni)), &at(1005));
    assert_summary(&s, Phase::Creating, "False", "True", "False");
    assert_eq!(cond(&s, RECONCILING).reason, "PodSandboxFailed");
    // The caches keep the sandbox's condition while it is not made, and only then.
    let cached = crate::operator::slim::CachedPod::from(p.clone()).to_pod();
    assert!(sandbox_stuck(&cached, &at(1005)), "{:?}", cached.status.and_then(|s| s.conditions));
}

/// An Event for each phase the user did not just ask for, none for the transition their own
/// spec change started.
#[test]
fn phase_news_leaves_out_the_transition_a_spec_change_started() {
    let status = |phase: Phase, generation: i64| ManagedWorkloadStatus {
        phase: Some(phase),
        observed_generation: Some(generation),
        ..Default::default()
    };
    let news = |before: Option<(Phase, i64)>, after: (Phase, i64)| {
        phase_news(before.map(|(p, g)| status(p, g)).as_ref(), &status(after.0, after.1))
    };
    use Phase::*;
    // A new workload: Creating is the user's act; Running is news.
    assert_eq!(news(None, (Creating, 1)), None);
    assert_eq!(news(Some((Creating, 1)), (Running, 1)), Some(Running));
    // A stop, a start and an update: only where each ends.
    assert_eq!(news(Some((Running, 1)), (Stopping, 2)), None);
    assert_eq!(news(Some((Stopping, 2)), (Stopped, 2)), Some(Stopped));
    assert_eq!(news(Some((Stopped, 2)), (Creating, 3)), None);
    assert_eq!(news(Some((Running, 3)), (Updating, 4)), None);
    assert_eq!(news(Some((Updating, 4)), (Failed, 4)), Some(Failed));
    // The same transitions with no spec change: nobody asked, so they are news.
    assert_eq!(news(Some((Running, 4)), (Creating, 4)), Some(Creating), "a replaced Pod");
    assert_eq!(news(Some((Running, 4)), (Updating, 4)), Some(Updating), "someone else's rollout");
    // A failure is news whatever started it; an unchanged phase never is.
    assert_eq!(news(None, (Failed, 1)), Some(Failed));
    assert_eq!(news(Some((Running, 4)), (Running, 5)), None);
}
