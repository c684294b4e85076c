//! Workloads on real containers: the real node (kubelet, containerd, runc, CNI; see
//! hack/realnode.sh) beside the kwok nodes. Each test's namespace carries the
//! PodNodeSelector/PodTolerationRestriction annotations that send its Pods to that node,
//! so the operator's Deployments are unchanged and land there. Images are the local ones
//! hack/images.py builds (mw-test.invalid/...): no registry is involved.
//!
//! `make test` starts the node and runs these with `--ignored`; without a real node they are
//! reported as ignored (and fail, saying why, when run with `--ignored` anyway).

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::json;
use support::realnode::{HTTPD_1, HTTPD_2, REAL_NODE, answers_at, http_get, real_node_namespace};
use support::storage::Storage;
use support::workload::{PhaseLog, WatchLog, apply, condition, phase_of};
use support::{audit, eventually, wait_until};

/// Starting a real container (sandbox, CNI, runc) takes a few seconds; a busy 2-core machine
/// can stretch that.
const TIMEOUT: Duration = Duration::from_secs(120);

/// A test namespace whose Pods all go to the real node, once the node is there and Ready.
async fn pods_of(pods: &Api<Pod>, name: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"))).await.unwrap().items
}

/// Wait for Ready and `phase` like `wait_phase`, with the real node's longer timeout.
async fn wait_real(api: &Api<ManagedWorkload>, name: &str, phase: Phase) -> ManagedWorkload {
    let what = format!("Ready=True and phase {phase:?}");
    wait_until(api, name, &what, TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| support::workload::condition_current(mw, "Ready", "True") && phase_of(mw) == Some(phase))
    })
    .await
    .unwrap()
}

/// The workload's Pod IP (from its status) answers HTTP with `body`, within a bounded wait.
async fn answers(mw: &ManagedWorkload, body: &str) -> String {
    let ip = mw.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_else(|| panic!("no Pod IP: {:#?}", mw.status));
    assert!(ip.starts_with("10.88.0."), "the Pod IP {ip} is not on the real node's CNI subnet 10.88.0.0/24");
    answers_at(&ip, body).await;
    ip
}

fn finished(p: &Pod) -> bool {
    matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn on_real_node(pods: &[Pod]) {
    for p in pods {
        let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
        assert_eq!(node, Some(REAL_NODE), "Pod {} runs on {node:?}, not the real node", p.name_any());
    }
}

#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn lifecycle_on_real_containers_answers_http_stops_starts_rolls_out_and_deletes() {
    let ns = real_node_namespace("real-lifecycle").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    let spec = |image: &str, state: &str| json!({"image": image, "state": state, "ports": [{"containerPort": 8080, "name": "http"}]});

    // Create → Running, and the Pod IP the status reports answers from this host.
    let started = Instant::now();
    apply(&workloads, "web", spec(HTTPD_1, "Running")).await.unwrap();
    let mw = wait_real(&workloads, "web", Phase::Running).await;
    eprintln!("created → Running in {:?}", started.elapsed());
    on_real_node(&pods_of(&pods, "web").await);
    let first_ip = answers(&mw, "mw-test httpd v1").await;

    // Stop → Stopped only once the container is gone: its address no longer answers.
    let started = Instant::now();
    apply(&workloads, "web", spec(HTTPD_1, "Stopped")).await.unwrap();
    let mw = wait_real(&workloads, "web", Phase::Stopped).await;
    eprintln!("stop → Stopped in {:?}", started.elapsed());
    assert_eq!(mw.status.as_ref().unwrap().pod_ip, None, "a stopped workload has no Pod IP");
    // A real kubelet marks a deleted Pod's phase terminal once its containers are gone, and
    // deletes the Pod a moment later: Stopped may come first (a finished Pod is history).
    let left = pods_of(&pods, "web").await;
    assert!(
        left.iter().all(finished),
        "Stopped, yet a Pod is not finished: {:?}",
        left.iter().map(|p| (p.name_any(), p.status.as_ref().and_then(|s| s.phase.clone()))).collect::<Vec<_>>()
    );
    assert!(http_get(&first_ip, 8080).await.is_err(), "{first_ip} still answers after Stopped");
    eventually("the finished Pod to be deleted by the kubelet", TIMEOUT, || async {
        let n = pods_of(&pods, "web").await.len();
        if n == 0 { Ok(()) } else { Err(format!("{n} Pods")) }
    })
    .await;

    // Start → Running again, answering.
    apply(&workloads, "web", spec(HTTPD_1, "Running")).await.unwrap();
    let mw = wait_real(&workloads, "web", Phase::Running).await;
    answers(&mw, "mw-test httpd v1").await;

    // Image change → Updating → Running at the new generation, and the new image answers.
    let phases = PhaseLog::start(&workloads, "web").await;
    let updated = apply(&workloads, "web", spec(HTTPD_2, "Running")).await.unwrap();
    let mw = wait_real(&workloads, "web", Phase::Running).await;
    assert_eq!(mw.status.as_ref().unwrap().observed_generation, updated.metadata.generation);
    phases.alive().await;
    let seen = phases.seen();
    assert!(seen.contains(&Phase::Updating), "an image change is an update: {seen:?}");
    assert!(!seen.contains(&Phase::Failed), "never Failed during a rollout on real containers: {seen:?}");
    answers(&mw, "mw-test httpd v2").await;
    let current = pods_of(&pods, "web").await;
    on_real_node(&current);
    eventually("the old Pod to be gone after the rollout", TIMEOUT, || async {
        let all = pods_of(&pods, "web").await;
        if all.len() == 1 { Ok(()) } else { Err(format!("{} Pods", all.len())) }
    })
    .await;

    // Delete → the Deployment and its Pods go (garbage collection through owner references).
    workloads.delete("web", &DeleteParams::default()).await.unwrap();
    let deployments = ns.api::<Deployment>();
    eventually("the Deployment and its Pods to be gone", TIMEOUT, || async {
        let d = deployments.get_opt("web").await.unwrap();
        let p = pods_of(&pods, "web").await;
        if d.is_none() && p.is_empty() {
            Ok(())
        } else {
            Err(format!("deployment: {}, pods: {}", d.is_some(), p.len()))
        }
    })
    .await;
}

/// The restart count of the workload's (first) Pod's container.
async fn restarts(pods: &Api<Pod>, name: &str) -> i32 {
    pods_of(pods, name)
        .await
        .first()
        .and_then(|p| p.status.as_ref()?.container_statuses.as_ref()?.first().map(|c| c.restart_count))
        .unwrap_or(0)
}

fn container_state(p: &Pod) -> String {
    let cs = p.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
    let Some(cs) = cs.first() else { return "none".into() };
    let state = cs.state.clone().unwrap_or_default();
    if let Some(w) = state.waiting {
        w.reason.unwrap_or_default()
    } else if state.running.is_some() {
        "running".into()
    } else {
        "terminated".into()
    }
}

#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn a_real_crash_loop_is_failed_and_stays_still_through_restart_cycles() {
    let ns = real_node_namespace("real-crash").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    apply(&workloads, "crash", json!({"image": "mw-test.invalid/crash:1", "progressDeadlineSeconds": 3600}))
        .await
        .unwrap();
    let mw = wait_until(&workloads, "crash", "Stalled=True", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| support::workload::condition_current(mw, "Stalled", "True"))
    })
    .await
    .unwrap();
    assert_eq!(phase_of(&mw), Some(Phase::Failed));
    assert_eq!(condition(&mw, "Stalled").reason, "CrashLoopBackOff");
    on_real_node(&pods_of(&pods, "crash").await);
    let before = audit::settled_writes(&ns.name).await;
    let phases = PhaseLog::start(&workloads, "crash").await;

    // Watch three more real restarts (the node restarts a crashed container at most 10 s
    // apart), recording every state the container passes through.
    let first = restarts(&pods, "crash").await;
    let mut states = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while restarts(&pods, "crash").await < first + 3 {
        assert!(
            Instant::now() < deadline,
            "the container restarted only {} times in 90 s",
            restarts(&pods, "crash").await - first
        );
        for p in pods_of(&pods, "crash").await {
            states.insert(container_state(&p));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cycles = restarts(&pods, "crash").await - first;
    let after = audit::operator_writes(&ns.name);
    let window = &after[before.len()..];
    let mw = workloads.get("crash").await.unwrap();
    eprintln!(
        "real crash loop: {cycles} restarts, container states seen {states:?}, operator writes in that window: {} {window:?}",
        window.len()
    );
    phases.alive().await;
    assert_eq!(phases.seen(), [Phase::Failed], "the phase moved during the crash loop");
    assert_eq!(condition(&mw, "Stalled").reason, "CrashLoopBackOff");
    assert!(
        condition(&mw, "Stalled").message.contains("last termination: Error"),
        "{}",
        condition(&mw, "Stalled").message
    );
    // Three restarts are the proof of the cycle; which of its short-lived states a 200 ms poll
    // catches (waiting CrashLoopBackOff, running, terminated) varies with the machine's load.
    assert!(states.len() >= 2, "the container was meant to cycle: {states:?}");
    assert_eq!(window, [], "the operator wrote during {cycles} real restart cycles (states seen: {states:?})");
    audit::stop_and_see_a_write(&workloads, &ns.name, "crash", after.len()).await;
}

/// A kubelet reports a container that exits at once as running and Ready for about a second
/// before it sees the exit. Without `minReadySeconds` the Deployment counted that Pod
/// available, and about half of such edits were reported Running at their generation for a
/// moment: long enough for Manager's job, which polls, to report a broken edit as done. Three
/// workloads at once, so that the old behaviour would show in almost every run.
#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn an_edit_whose_container_exits_at_once_is_never_running_at_its_generation() {
    let ns = real_node_namespace("real-exit").await;
    let workloads = ns.api::<ManagedWorkload>();
    let names = ["exit-0", "exit-1", "exit-2"];
    let healthy = json!({"image": HTTPD_1, "progressDeadlineSeconds": 3600});
    let broken =
        json!({"image": HTTPD_1, "progressDeadlineSeconds": 3600, "command": ["/bin/sh", "-c", "echo broken; exit 3"]});
    let edits = names.map(|name| {
        let (workloads, healthy, broken) = (workloads.clone(), healthy.clone(), broken.clone());
        async move {
            apply(&workloads, name, healthy).await.unwrap();
            wait_real(&workloads, name, Phase::Running).await;
            // Each phase with the generation it was written for: a Running at the edit's
            // generation can follow the Running before it with no other phase between.
            let phases =
                WatchLog::start(&workloads, name, |mw| Some((phase_of(mw)?, mw.status.as_ref()?.observed_generation?)))
                    .await;
            let edited = apply(&workloads, name, broken).await.unwrap().metadata.generation.unwrap();
            let what = "Stalled=True at the edit's generation";
            let mw = wait_until(&workloads, name, what, TIMEOUT, |mw: Option<&ManagedWorkload>| {
                mw.is_some_and(|mw| support::workload::condition_current(mw, "Stalled", "True"))
            })
            .await
            .unwrap();
            phases.alive().await;
            (name, edited, phases.seen(), condition(&mw, "Stalled").reason.clone())
        }
    });
    for (name, edited, seen, reason) in futures::future::join_all(edits).await {
        assert_eq!(reason, "CrashLoopBackOff", "{name}");
        assert!(
            !seen.contains(&(Phase::Running, edited)),
            "{name}: the broken edit (generation {edited}) was reported Running: {seen:?}"
        );
    }
}

#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn a_real_image_pull_failure_is_failed_and_stays_still() {
    let ns = real_node_namespace("real-pull").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    // .invalid is reserved: this name resolves nowhere, so the pull really fails.
    apply(&workloads, "pull", json!({"image": "mw-test.invalid/does-not-exist:1", "progressDeadlineSeconds": 3600}))
        .await
        .unwrap();
    let mw = wait_condition_real(&workloads, "pull", "Stalled").await;
    assert_eq!(phase_of(&mw), Some(Phase::Failed));
    assert_eq!(condition(&mw, "Stalled").reason, "ImagePullBackOff");
    let before = audit::settled_writes(&ns.name).await;
    let mut states = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The kubelet alternates ErrImagePull and ImagePullBackOff; see both (or time out).
    while states.len() < 2 {
        assert!(Instant::now() < deadline, "the kubelet's pull states: {states:?}");
        for p in pods_of(&pods, "pull").await {
            states.insert(container_state(&p));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        states.iter().all(|s| s == "ErrImagePull" || s == "ImagePullBackOff"),
        "only pull failures were expected: {states:?}"
    );
    let after = audit::operator_writes(&ns.name);
    let window = &after[before.len()..];
    eprintln!("real image pull failure: states {states:?}, operator writes meanwhile: {window:?}");
    assert_eq!(window, [], "the operator wrote while the kubelet retried the pull");
    let mw = workloads.get("pull").await.unwrap();
    assert_eq!(condition(&mw, "Stalled").reason, "ImagePullBackOff");
    audit::stop_and_see_a_write(&workloads, &ns.name, "pull", after.len()).await;
}

async fn wait_condition_real(api: &Api<ManagedWorkload>, name: &str, type_: &str) -> ManagedWorkload {
    wait_until(api, name, &format!("{type_}=True"), TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| support::workload::condition_current(mw, type_, "True"))
    })
    .await
    .unwrap()
}

#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn a_real_oom_kill_is_reported_as_a_crash_loop_naming_oomkilled() {
    let ns = real_node_namespace("real-oom").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    // 256 MiB touched against a 32 MiB limit: the kernel's OOM killer, not a simulated status.
    let spec = json!({
        "image": "mw-test.invalid/oom:1",
        "resources": {"requests": {"memory": "32Mi"}, "limits": {"memory": "32Mi"}},
        "progressDeadlineSeconds": 3600,
    });
    apply(&workloads, "oom", spec).await.unwrap();
    let mw =
        wait_until(&workloads, "oom", "a Stalled status naming OOMKilled", TIMEOUT, |mw: Option<&ManagedWorkload>| {
            mw.is_some_and(|mw| {
                support::workload::condition_current(mw, "Stalled", "True")
                    && condition(mw, "Stalled").message.contains("OOMKilled")
            })
        })
        .await
        .unwrap();
    assert_eq!(phase_of(&mw), Some(Phase::Failed));
    assert_eq!(condition(&mw, "Stalled").reason, "CrashLoopBackOff");
    assert_eq!(condition(&mw, "Ready").status, "False");
    let pod = pods_of(&pods, "oom").await.into_iter().next().expect("the workload's Pod");
    let cs = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
    let last = cs.first().and_then(|c| c.last_state.as_ref()?.terminated.clone()).expect("a terminated last state");
    assert_eq!(last.reason.as_deref(), Some("OOMKilled"), "{last:?}");
    assert_eq!(last.exit_code, 137, "killed by SIGKILL: {last:?}");
    eprintln!("real OOM kill: {}", condition(&mw, "Stalled").message);
}

#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn stop_is_graceful_and_stopped_waits_for_a_process_that_ignores_sigterm() {
    let ns = real_node_namespace("real-stop").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    let busybox = "mw-test.invalid/busybox:1";
    // One exits on SIGTERM; the other ignores it and is killed at the end of the Pod's
    // 30 s grace period.
    let polite = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"];
    let stubborn = ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"];
    for (name, command) in [("polite", polite), ("stubborn", stubborn)] {
        apply(&workloads, name, json!({"image": busybox, "command": command})).await.unwrap();
    }
    for name in ["polite", "stubborn"] {
        wait_real(&workloads, name, Phase::Running).await;
        on_real_node(&pods_of(&pods, name).await);
    }
    let polite_log = PhaseLog::start(&workloads, "polite").await;
    let stubborn_log = PhaseLog::start(&workloads, "stubborn").await;
    let started = Instant::now();
    for (name, command) in [("polite", polite), ("stubborn", stubborn)] {
        apply(&workloads, name, json!({"image": busybox, "command": command, "state": "Stopped"})).await.unwrap();
    }
    wait_real(&workloads, "polite", Phase::Stopped).await;
    let polite_took = started.elapsed();
    // Stopping, not Stopped, while the stubborn container still runs out its grace period.
    let mw = workloads.get("stubborn").await.unwrap();
    assert_eq!(phase_of(&mw), Some(Phase::Stopping), "the stubborn Pod is still terminating: {:#?}", mw.status);
    assert!(!pods_of(&pods, "stubborn").await.is_empty(), "the stubborn Pod is still there");
    wait_real(&workloads, "stubborn", Phase::Stopped).await;
    let stubborn_took = started.elapsed();
    eprintln!(
        "graceful stop: SIGTERM honoured → Stopped in {polite_took:?}; SIGTERM ignored → Stopped in {stubborn_took:?}"
    );
    assert!(polite_took < Duration::from_secs(15), "a process that exits on SIGTERM took {polite_took:?} to stop");
    assert!(
        stubborn_took >= Duration::from_secs(25),
        "Stopped after {stubborn_took:?}, before the 30 s grace period could have ended"
    );
    assert_eq!(polite_log.until(Phase::Stopped).await, [Phase::Running, Phase::Stopping, Phase::Stopped]);
    assert_eq!(stubborn_log.until(Phase::Stopped).await, [Phase::Running, Phase::Stopping, Phase::Stopped]);
}

/// Serves `/data/www` on port 8080, writing its page only when the disk has none yet: a page
/// written by an earlier start (`$WRITER` then) proves the disk was kept. Exits on SIGTERM.
const KEEPS_ITS_PAGE: &str = "mkdir -p /data/www && { [ -f /data/www/index.html ] || echo \"written by $WRITER\" > /data/www/index.html; } \
     && trap 'kill $pid; exit 0' TERM; httpd -f -p 8080 -h /data/www & pid=$!; wait $pid";

#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn a_file_written_before_stop_is_read_back_after_start_and_after_a_rollout() {
    let ns = real_node_namespace("real-volume").await;
    let storage = Storage::new(&ns, 1, "1Gi").await;
    let workloads = ns.api::<ManagedWorkload>();
    let claims = ns.api::<PersistentVolumeClaim>();
    let pods = ns.api::<Pod>();
    let spec = |writer: &str, state: &str| {
        json!({
            "image": "mw-test.invalid/busybox:1",
            "command": ["/bin/sh", "-c", KEEPS_ITS_PAGE],
            "env": [{"name": "WRITER", "value": writer}],
            "state": state,
            "ports": [{"containerPort": 8080, "name": "http"}],
            "volumes": [{"name": "data", "mountPath": "/data", "size": "1Gi", "storageClassName": storage.class}],
        })
    };

    apply(&workloads, "disk", spec("the first Pod", "Running")).await.unwrap();
    let mw = wait_real(&workloads, "disk", Phase::Running).await;
    on_real_node(&pods_of(&pods, "disk").await);
    answers(&mw, "written by the first Pod").await;
    let claim = claims.get("disk-data").await.unwrap();
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
    assert!(volume.is_some(), "the claim is bound: {:?}", claim.status);

    // Stop deletes the Pod and its container; the disk stays and the next Pod reads it.
    apply(&workloads, "disk", spec("the first Pod", "Stopped")).await.unwrap();
    wait_real(&workloads, "disk", Phase::Stopped).await;
    eventually("the stopped Pod to be deleted by the kubelet", TIMEOUT, || async {
        let n = pods_of(&pods, "disk").await.len();
        if n == 0 { Ok(()) } else { Err(format!("{n} Pods")) }
    })
    .await;
    apply(&workloads, "disk", spec("the first Pod", "Running")).await.unwrap();
    let mw = wait_real(&workloads, "disk", Phase::Running).await;
    answers(&mw, "written by the first Pod").await;

    // A rollout (an env change, so a new Pod with another $WRITER) mounts the same disk: the
    // new Pod finds the page and serves it unchanged.
    let updated = apply(&workloads, "disk", spec("a rolled-out Pod", "Running")).await.unwrap();
    let mw =
        wait_until(&workloads, "disk", "Running at the new generation", TIMEOUT, |mw: Option<&ManagedWorkload>| {
            mw.is_some_and(|mw| {
                phase_of(mw) == Some(Phase::Running)
                    && mw.status.as_ref().and_then(|s| s.observed_generation) == updated.metadata.generation
                    && support::workload::condition_current(mw, "Ready", "True")
            })
        })
        .await
        .unwrap();
    answers(&mw, "written by the first Pod").await;

    let after = claims.get("disk-data").await.unwrap();
    assert_eq!(after.uid(), claim.uid(), "the same claim throughout");
    assert_eq!(after.spec.as_ref().and_then(|s| s.volume_name.clone()), volume, "bound to the same volume");
    drop(storage);
}

#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn a_failing_readiness_probe_keeps_a_running_container_from_ready() {
    let ns = real_node_namespace("real-readiness").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    let spec = |path: &str| {
        json!({
            "image": HTTPD_1,
            "ports": [{"containerPort": 8080, "name": "http"}],
            "readinessProbe": {"httpGet": {"path": path, "port": "http"}, "periodSeconds": 1, "failureThreshold": 1},
        })
    };

    // httpd answers 404 for a page it does not have: the container runs, the Pod never Ready.
    apply(&workloads, "gated", spec("/missing")).await.unwrap();
    eventually("the container to run", TIMEOUT, || async {
        let states: Vec<_> = pods_of(&pods, "gated").await.iter().map(container_state).collect();
        if states == ["running"] { Ok(()) } else { Err(format!("{states:?}")) }
    })
    .await;
    // Several probe periods later: still not Ready, and the workload says it is still starting.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mw = workloads.get("gated").await.unwrap();
    assert_eq!(phase_of(&mw), Some(Phase::Creating), "{:#?}", mw.status);
    assert_eq!(condition(&mw, "Ready").status, "False");
    let pod = pods_of(&pods, "gated").await.remove(0);
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready").cloned());
    assert_eq!(ready.map(|c| c.status).as_deref(), Some("False"), "the kubelet holds the Pod unready");

    // A probe that passes rolls out and the workload is Running.
    apply(&workloads, "gated", spec("/")).await.unwrap();
    let mw = wait_real(&workloads, "gated", Phase::Running).await;
    answers(&mw, "mw-test httpd v1").await;
}

/// Issue 15: the workload's Service, through the real node's kube-proxy: an HTTP request from
/// this host to the Service's cluster IP (`status.address`) reaches the workload, and still
/// does, at the same address, after a rollout to a new Pod.
#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn the_service_address_answers_http_through_kube_proxy_across_a_rollout() {
    let ns = real_node_namespace("real-service").await;
    let workloads = ns.api::<ManagedWorkload>();
    let spec = |image: &str| json!({"image": image, "ports": [{"containerPort": 8080, "name": "http"}], "service": {"type": "ClusterIP"}});
    apply(&workloads, "web", spec(HTTPD_1)).await.unwrap();
    let mw = wait_real(&workloads, "web", Phase::Running).await;
    let status = mw.status.clone().unwrap();
    let address = status.address.clone().expect("status.address");
    assert_eq!(status.service.as_ref().and_then(|s| s.cluster_ip.clone()).as_ref(), Some(&address));
    assert_ne!(Some(&address), status.pod_ip.as_ref(), "the Service's address, not the Pod's");
    answers_at(&address, "mw-test httpd v1").await;

    apply(&workloads, "web", spec(HTTPD_2)).await.unwrap();
    let mw = wait_real(&workloads, "web", Phase::Running).await;
    let after = mw.status.unwrap();
    assert_eq!(after.address.as_ref(), Some(&address), "the address did not move with the Pod");
    assert_ne!(after.pod_ip, status.pod_ip, "a new Pod");
    answers_at(&address, "mw-test httpd v2").await;
}

/// A new bridged row's CR is created before its env Secret (docs/bridge.md): the kubelet must
/// not start the container until the Secret is there, and must start it once it is. Here the
/// Secret comes 10 s late: the container waits (`CreateContainerConfigError`, never started,
/// the workload `Creating` and saying what it waits for), then starts, and serves.
#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn a_container_waits_for_its_env_secret_and_starts_once_it_exists() {
    use k8s_openapi::api::core::v1::Secret;
    let ns = real_node_namespace("real-late-env").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    let env =
        json!([{"name": "GREETING", "valueFrom": {"secretKeyRef": {"name": "late-manager-env", "key": "GREETING"}}}]);
    apply(
        &workloads,
        "late",
        json!({"image": HTTPD_1, "env": env, "ports": [{"containerPort": 8080, "name": "http"}]}),
    )
    .await
    .unwrap();
    eventually("the container to wait for its Secret", TIMEOUT, || async {
        let states: Vec<String> = pods_of(&pods, "late").await.iter().map(container_state).collect();
        if states.iter().any(|s| s == "CreateContainerConfigError") { Ok(()) } else { Err(format!("{states:?}")) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    for p in pods_of(&pods, "late").await {
        assert_eq!(container_state(&p), "CreateContainerConfigError", "started without its Secret");
    }
    assert_eq!(restarts(&pods, "late").await, 0, "never started");
    // Meanwhile the workload says it waits, and for what: not a failure.
    let waiting = workloads.get("late").await.unwrap();
    let status = waiting.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(Phase::Creating), "{status:?}");
    let reconciling = status.conditions.iter().find(|c| c.type_ == "Reconciling").expect("Reconciling");
    assert_eq!((reconciling.status.as_str(), reconciling.reason.as_str()), ("True", "CreateContainerConfigError"));
    assert!(reconciling.message.contains("late-manager-env"), "{}", reconciling.message);
    let mut secret = Secret::default();
    secret.metadata.name = Some("late-manager-env".into());
    secret.string_data = Some([("GREETING".to_string(), "hello".to_string())].into());
    ns.api::<Secret>().create(&Default::default(), &secret).await.unwrap();
    let mw = wait_real(&workloads, "late", Phase::Running).await;
    on_real_node(&pods_of(&pods, "late").await);
    answers(&mw, "mw-test httpd v1").await;
}

/// The machine's state, as the system-container test image serves it (hack/systemd-image.sh).
async fn machine_state(ip: &str) -> Result<String, String> {
    support::realnode::http_get_path(ip, 8080, "/cgi-bin/state").await
}

/// Issue 43: a Debian 13 systemd image, as Manager's templates are, boots on the real node as
/// a system container to multi-user with sshd answering, keeps its disk through stop and
/// start, and stops on its own signal (SIGRTMIN+3) at once, not at its grace period's end.
/// This node (cgroup v1, containerd 1.6) gives systemd a writable cgroup only to a privileged
/// container: the explicit opt-in is the one way here (docs/testing.md says what a cgroup v2,
/// containerd 2.1 node would add).
#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn a_system_container_boots_keeps_its_disk_and_stops_on_its_own_signal() {
    use support::realnode::SYSTEMD;
    use tokio::io::AsyncReadExt;
    let ns = real_node_namespace("real-systemd").await;
    let storage = Storage::new(&ns, 1, "1Gi").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    let spec = |state: &str| {
        json!({
            "image": SYSTEMD,
            "state": state,
            "systemContainer": {"privileged": true},
            "ports": [{"containerPort": 22, "name": "ssh"}, {"containerPort": 8080, "name": "http"}],
            "volumes": [{"name": "data", "mountPath": "/data", "size": "1Gi", "storageClassName": storage.class}],
        })
    };
    apply(&workloads, "machine", spec("Running")).await.unwrap();
    let mw = wait_real(&workloads, "machine", Phase::Running).await;
    on_real_node(&pods_of(&pods, "machine").await);
    let ip = mw.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a Pod IP");
    eventually("systemd to reach multi-user with sshd", TIMEOUT, || async {
        let state = machine_state(&ip).await?;
        let up =
            state.contains("system: running") && state.contains("ssh: active") && state.contains("hostname: machine");
        if up { Ok(()) } else { Err(state) }
    })
    .await;
    let mut banner = [0u8; 32];
    let mut ssh = tokio::net::TcpStream::connect((ip.as_str(), 22)).await.expect("sshd accepts");
    let n = tokio::time::timeout(Duration::from_secs(10), ssh.read(&mut banner)).await.expect("a banner").unwrap();
    assert!(String::from_utf8_lossy(&banner[..n]).starts_with("SSH-2.0-OpenSSH"), "{:?}", &banner[..n]);
    let marked = support::realnode::http_get_path(&ip, 8080, "/cgi-bin/mark?kept-through-stop").await;
    assert_eq!(marked.as_deref().map(str::trim), Ok("marked"));

    // Stopped: systemd gets SIGRTMIN+3 (the image's STOPSIGNAL) and halts; with SIGTERM it
    // would re-execute and wait out the whole grace period (120 s) for the kill.
    let stopping = Instant::now();
    apply(&workloads, "machine", spec("Stopped")).await.unwrap();
    eventually("the machine's Pod to go", TIMEOUT, || async {
        let n = pods_of(&pods, "machine").await.len();
        if n == 0 { Ok(()) } else { Err(format!("{n} Pods")) }
    })
    .await;
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(60), "stopped in {took:?}: not on its own signal, but at the grace's end");
    wait_real(&workloads, "machine", Phase::Stopped).await;

    apply(&workloads, "machine", spec("Running")).await.unwrap();
    let mw = wait_real(&workloads, "machine", Phase::Running).await;
    let ip = mw.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a Pod IP");
    eventually("the machine back, its disk with it", TIMEOUT, || async {
        let state = machine_state(&ip).await?;
        if state.contains("system: running") && state.contains("mark: kept-through-stop") { Ok(()) } else { Err(state) }
    })
    .await;
    drop(storage);
}

/// Issue 43: the default system container (a user namespace of its own) on a node whose
/// runtime has none, and one without (an unprivileged container, whose cgroup this node mounts
/// read-only), are Failed within moments, each naming what the node lacks; never a bare
/// CrashLoopBackOff or a Pod forever ContainerCreating.
#[tokio::test]
#[ignore = "needs the real node (make test runs it)"]
async fn a_system_container_on_a_node_that_cannot_run_it_says_what_the_node_lacks() {
    use support::realnode::SYSTEMD;
    let ns = real_node_namespace("real-systemd-unsupported").await;
    let workloads = ns.api::<ManagedWorkload>();
    for (name, system, reason, says) in [
        ("userns", json!({}), "UserNamespacesUnsupported", "containerd 2.0+"),
        ("cgroup", json!({"userNamespace": false}), "CgroupReadOnly", "cgroup_writable = true"),
    ] {
        apply(&workloads, name, json!({"image": SYSTEMD, "systemContainer": system})).await.unwrap();
        let failed = wait_until(&workloads, name, &format!("Failed with {reason}"), TIMEOUT, |mw| {
            mw.is_some_and(|mw| {
                let stalled = mw.status.iter().flat_map(|s| &s.conditions).find(|c| c.type_ == "Stalled");
                phase_of(mw) == Some(Phase::Failed) && stalled.is_some_and(|c| c.status == "True" && c.reason == reason)
            })
        })
        .await
        .unwrap();
        let message = &condition(&failed, "Stalled").message;
        assert!(message.contains(says), "{name}: {message}");
    }
}
