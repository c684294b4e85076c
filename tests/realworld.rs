//! What every real cluster produces and the happy path does not: evicted Pods, values the API
//! server normalises, other field managers' list entries, a kubelet's crash-loop and
//! image-pull cycles, a blocking Deployment that goes away, an apply rejected by admission, a
//! namespace being deleted.
//! Write counts come from the API server's audit log.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::json;
use support::workload::{PhaseLog, TIMEOUT, apply, condition, wait_condition, wait_phase, wait_ready};
use support::{TestNamespace, audit, eventually, wait_until};

async fn pods_of(pods: &Api<Pod>, name: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"))).await.unwrap().items
}

fn event_reasons(writes: &[audit::Write]) -> usize {
    writes.iter().filter(|w| w.resource == "events").count()
}

/// Condition messages are stable: nothing that names one Pod, or changes with time or tries.
fn assert_stable_messages(mw: &ManagedWorkload, pods: &[Pod]) {
    let duration = |m: &str| {
        m.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| {
            w.len() > 1 && w.ends_with(['s', 'm', 'h']) && w[..w.len() - 1].chars().all(|c| c.is_ascii_digit())
        })
    };
    for c in &mw.status.as_ref().unwrap().conditions {
        for p in pods {
            assert!(!c.message.contains(&p.name_any()), "{} names the Pod: {}", c.type_, c.message);
            assert!(!c.message.contains(p.uid().unwrap().as_str()), "{} names the Pod's UID: {}", c.type_, c.message);
        }
        assert!(!duration(&c.message), "{} carries a duration: {}", c.type_, c.message);
    }
}

#[tokio::test]
async fn an_evicted_pod_is_history_and_a_stopped_workload_with_only_finished_pods_is_stopped() {
    let ns = TestNamespace::new("evicted").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    apply(&workloads, "web", json!({"image": "nginx:latest"})).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    // kwok writes a new Pod's status in several patches; one landing after the eviction patch
    // below would undo it. Wait until the Pod has not changed for a second.
    let victim = pods_of(&pods, "web").await.remove(0).name_any();
    let mut version = pods.get(&victim).await.unwrap().metadata.resource_version;
    let mut settled = false;
    for _ in 0..30 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let now = pods.get(&victim).await.unwrap().metadata.resource_version;
        if now == version {
            settled = true;
            break;
        }
        version = now;
    }
    // Going on with a Pod kwok still writes to would test kwok's race, not the operator.
    assert!(settled, "the Pod {victim} kept changing for 30 s; logs: {}", support::log_dir());
    let phases = PhaseLog::start(&workloads, "web").await;

    // What the kubelet leaves after an eviction: phase Failed, reason Evicted, until Pod GC.
    let evicted = json!({"status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
        "conditions": [{"type": "Ready", "status": "False"}]}});
    pods.patch_status(&victim, &PatchParams::default(), &Patch::Merge(&evicted)).await.unwrap();

    eventually("a Ready replacement next to the evicted Pod", TIMEOUT, || async {
        let all = pods_of(&pods, "web").await;
        let ready = all.iter().filter(|p| {
            p.name_any() != victim
                && p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        if ready.count() == 1 && all.iter().any(|p| p.name_any() == victim) {
            Ok(())
        } else {
            Err(format!("{} Pods", all.len()))
        }
    })
    .await;
    // The operator has seen the replacement once its status carries the replacement's IP.
    let replacement_ip = pods_of(&pods, "web")
        .await
        .into_iter()
        .find(|p| p.name_any() != victim)
        .and_then(|p| p.status?.pod_ip)
        .expect("the replacement has an IP");
    support::wait_until(
        &workloads,
        "web",
        "the status to show the replacement",
        TIMEOUT,
        |mw: Option<&ManagedWorkload>| {
            mw.and_then(|mw| mw.status.as_ref()?.pod_ip.as_deref()) == Some(replacement_ip.as_str())
        },
    )
    .await;
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    // What the operator showed in between depends on timing: kwok makes the replacement Ready
    // within about 100 ms of the eviction, and the Deployment's status trails its Pods (the
    // ReplicaSet controller counts them from its own cache). So `Creating` may be seen once,
    // several times (alternating with Running while kube-controller-manager catches up) or not
    // at all (status::tests pins the verdicts). What must hold whatever the
    // timing: never Updating (a replacement without a spec change is no update), never Failed
    // (the evicted Pod is history), and Running at the end (wait_ready above).
    phases.alive().await;
    let seen = phases.seen();
    assert_eq!(seen.first(), Some(&Phase::Running), "{seen:?}");
    assert!(seen.iter().all(|p| matches!(p, Phase::Running | Phase::Creating)), "a replacement is no update: {seen:?}");
    assert_stable_messages(&mw, &pods_of(&pods, "web").await);
    drop(phases);

    // Stopped: the replacement goes, the evicted Pod stays (Pod GC's job), and it is Stopped.
    apply(&workloads, "web", json!({"image": "nginx:latest", "state": "Stopped"})).await.unwrap();
    wait_ready(&workloads, "web", Phase::Stopped).await;
    let left = pods_of(&pods, "web").await;
    assert_eq!(left.len(), 1, "only the evicted Pod is left");
    assert_eq!(left[0].name_any(), victim);
}

#[tokio::test]
async fn normalised_values_and_other_managers_entries_are_not_drift_but_a_hand_edit_is() {
    let ns = TestNamespace::new("normalised").await;
    let workloads = ns.api::<ManagedWorkload>();
    let deployments = ns.api::<Deployment>();
    let spec = json!({
        "image": "nginx:latest",
        "env": [{"name": "EMPTY", "value": ""}, {"name": "A", "value": "1"}],
        "resources": {"requests": {"cpu": "1000m", "memory": "1024Mi"}},
    });
    apply(&workloads, "web", spec).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let before = audit::settled_writes(&ns.name).await;
    let count = |writes: &[audit::Write], resource: &str| writes.iter().filter(|w| w.resource == resource).count();
    assert_eq!(count(&before, "deployments"), 1, "one apply created it: {before:?}");
    assert_eq!(event_reasons(&before), 1, "one Event, Running (a new workload's Creating is not news): {before:?}");

    // `kubectl set env deployment/web EXTRA=1`: another manager's entry in a list we set.
    let set_env = json!({"spec": {"template": {"spec": {"containers": [{"name": "workload", "env": [{"name": "EXTRA", "value": "1"}]}]}}}});
    let params = PatchParams { field_manager: Some("kubectl-set".into()), ..Default::default() };
    deployments.patch("web", &params, &Patch::Strategic(&set_env)).await.unwrap();
    // The Deployment rolls that out (a new ReplicaSet): the workload comes back to Running.
    wait_until(&deployments, "web", "the foreign rollout to finish", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref()).is_some_and(|s| s.updated_replicas == Some(1) && s.replicas == Some(1))
    })
    .await;
    wait_phase(&workloads, "web", Phase::Running).await;
    let after = audit::settled_writes(&ns.name).await;
    let new = &after[before.len()..];
    assert_eq!(count(new, "deployments"), 0, "nothing to correct: {new:?}");
    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    let drift_events = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("DriftCorrected"))
            .count()
    };
    assert_eq!(drift_events().await, 0);
    let env =
        deployments.get("web").await.unwrap().spec.unwrap().template.spec.unwrap().containers[0].env.clone().unwrap();
    assert!(env.iter().any(|e| e.name == "EXTRA"), "their entry stays: {env:?}");

    // A real hand edit of a field the operator owns is reverted, with one DriftCorrected.
    let edit = json!({"spec": {"template": {"spec": {"containers": [{"name": "workload", "image": "evil:1"}]}}}});
    deployments.patch("web", &PatchParams::default(), &Patch::Strategic(&edit)).await.unwrap();
    wait_until(&deployments, "web", "image restored", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(|d| d.spec.as_ref()?.template.spec.as_ref()?.containers[0].image.clone()).as_deref()
            == Some("nginx:latest")
    })
    .await;
    audit::settled_writes(&ns.name).await;
    wait_phase(&workloads, "web", Phase::Running).await;
    assert_eq!(drift_events().await, 1, "exactly one DriftCorrected");
    let all = audit::operator_writes(&ns.name);
    assert_eq!(count(&all[after.len()..], "deployments"), 1, "one apply restored it: {:?}", &all[after.len()..]);
}

/// Reach Failed with `reason`, then hold still while the kubelet (kwok) cycles: the status
/// and Events written in that window are counted.
/// `cycling` names the Pod's state; at least `states` distinct ones must be seen.
async fn failure_cycle_writes_nothing(image: &str, reason: &str, cycling: fn(&Pod) -> String, states: usize) {
    let ns = TestNamespace::new(&format!("cycle-{reason}")).await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    apply(&workloads, "web", json!({"image": image, "progressDeadlineSeconds": 3600})).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(condition(&mw, "Stalled").reason, reason);
    let before = audit::settled_writes(&ns.name).await;

    // Watch the Pod go through its cycle for a while.
    let min_states = states;
    let mut states = std::collections::BTreeSet::new();
    for _ in 0..40 {
        for p in pods_of(&pods, "web").await {
            states.insert(cycling(&p));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let after = audit::operator_writes(&ns.name);
    let window = &after[before.len()..];
    let mw = workloads.get("web").await.unwrap();
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Failed));
    assert_eq!(condition(&mw, "Stalled").reason, reason);
    eprintln!("{image}: Pod states seen in 10 s: {states:?}; operator writes in that window: {}", window.len());
    assert!(states.len() >= min_states, "the Pod was meant to cycle: {states:?}");
    assert_eq!(window, [], "status writes or Events while the Pod cycled ({states:?})");
    assert_stable_messages(&mw, &pods_of(&pods, "web").await);
    audit::stop_and_see_a_write(&workloads, &ns.name, "web", after.len()).await;
}

fn container_state(p: &Pod) -> String {
    let cs = &p.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
    let Some(cs) = cs.first() else { return "none".into() };
    let state = cs.state.clone().unwrap_or_default();
    let step = if let Some(w) = state.waiting {
        w.reason.unwrap_or_default()
    } else if state.running.is_some() {
        "running".into()
    } else {
        "terminated".into()
    };
    format!("{step} #{}", cs.restart_count)
}

#[tokio::test]
async fn a_crash_loop_stays_failed_through_the_kubelets_cycle_with_no_writes() {
    failure_cycle_writes_nothing("kwok.example/crash-loop-backoff", "CrashLoopBackOff", container_state, 6).await;
}

#[tokio::test]
async fn alternating_image_pull_errors_write_nothing() {
    let reason = |p: &Pod| container_state(p).split(' ').next().unwrap_or_default().to_string();
    failure_cycle_writes_nothing("kwok.example/err-image-pull", "ImagePullBackOff", reason, 2).await;
}

/// A ValidatingAdmissionPolicy that refuses Deployments running `image` in `namespace`, bound
/// for the life of the returned guard's namespace.
async fn refuse_image(client: &kube::Client, namespace: &str, image: &str) -> (String, String) {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    let name = format!("refuse-{namespace}");
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
            "validations": [{"expression": format!("object.spec.template.spec.containers.all(c, c.image != '{image}')"), "message": "this image is not allowed here"}]
        }
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
        }
    }))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(client.clone()).create(&PostParams::default(), &policy).await.unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // Policies take effect asynchronously: wait until a dry run is refused.
    let probe: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": image}]}}}
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    eventually("the admission policy to take effect", TIMEOUT, || async {
        match deployments.create(&PostParams { dry_run: true, ..Default::default() }, &probe).await {
            Err(kube::Error::Api(s)) if s.message.contains("not allowed here") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    (name.clone(), name)
}

#[tokio::test]
async fn a_rejected_spec_keeps_mirrored_conditions_at_their_generation_and_recovers_when_admitted() {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    let ns = TestNamespace::new("rejected").await;
    let workloads = ns.api::<ManagedWorkload>();
    apply(&workloads, "web", json!({"image": "nginx:latest"})).await.unwrap();
    let first = wait_ready(&workloads, "web", Phase::Running).await;
    let generation_1 = first.metadata.generation;
    let (policy, binding) = refuse_image(&ns.client, &ns.name, "nginx:1.27").await;

    let updated = apply(&workloads, "web", json!({"image": "nginx:1.27"})).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(condition(&mw, "Stalled").reason, "DeploymentRejected");
    assert!(condition(&mw, "Stalled").message.contains("not allowed here"), "{}", condition(&mw, "Stalled").message);
    assert_eq!(condition(&mw, "Ready").observed_generation, updated.metadata.generation);
    for type_ in ["Available", "Progressing"] {
        assert_eq!(
            condition(&mw, type_).observed_generation,
            generation_1,
            "{type_} describes the Deployment still built from the first spec"
        );
    }

    // The cause goes away: the workload rolls out within seconds, with no spec change.
    Api::<ValidatingAdmissionPolicyBinding>::all(ns.client.clone())
        .delete(&binding, &DeleteParams::default())
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(ns.client.clone()).delete(&policy, &DeleteParams::default()).await.unwrap();
    let started = std::time::Instant::now();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    eprintln!("rolled out {:?} after the policy was removed", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(condition(&mw, "Available").observed_generation, updated.metadata.generation);
}

/// Pods count as a workload's only when they belong to its Deployment's ReplicaSets: a Pod
/// that anyone could create with the workload's labels and template hash (here one kwok keeps
/// crash-looping, with its own IP) neither fails the workload nor puts its IP in the status.
#[tokio::test]
async fn a_pod_with_the_workload_s_labels_but_not_its_replica_set_counts_for_nothing() {
    let ns = TestNamespace::new("forged-pod").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    apply(&workloads, "web", json!({"image": "nginx:latest"})).await.unwrap();
    let running = wait_ready(&workloads, "web", Phase::Running).await;
    let ip = running.status.as_ref().unwrap().pod_ip.clone();
    assert!(ip.is_some());
    let real = pods_of(&pods, "web").await.remove(0);

    // The real Pod's labels and annotations (instance, managed, template hash), no owner.
    let mut forged: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-forged", "labels": real.labels(), "annotations": real.annotations()},
        "spec": {"containers": [{"name": "workload", "image": "kwok.example/crash-loop-backoff"}]},
    }))
    .unwrap();
    forged.metadata.labels.get_or_insert_with(Default::default).remove("pod-template-hash");
    pods.create(&PostParams::default(), &forged).await.unwrap();
    eventually("kwok has the forged Pod crash-looping", TIMEOUT, || async {
        let p = pods.get("web-forged").await.map_err(|e| e.to_string())?;
        let waiting =
            p.status.and_then(|s| s.container_statuses).into_iter().flatten().any(|c| {
                c.state.and_then(|s| s.waiting).is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
            });
        if waiting { Ok(()) } else { Err("not yet in CrashLoopBackOff".into()) }
    })
    .await;
    // Give the operator the time to react (the Pod's events were reconciled) and check that
    // nothing moved: the workload is still Running with its own Pod's IP.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mw = workloads.get("web").await.unwrap();
    let status = mw.status.as_ref().unwrap();
    assert_eq!(status.phase, Some(Phase::Running), "{status:?}");
    assert_eq!(status.pod_ip, ip);
    assert_eq!(condition(&mw, "Ready").status, "True");
}

/// Deleting a namespace removes a workload's Deployment and Service before the workload itself
/// (the namespace controller deletes kind by kind, in no set order). The operator then tries
/// once to make them again, is refused (`NamespaceTerminating`) and leaves the workload to the
/// deletion: no more writes for it, neither retries nor a status or Event about the refusal.
/// Here an admission policy refuses to delete the workloads, so the namespace stays
/// terminating with them in it for as long as the test looks.
#[tokio::test]
async fn a_namespace_being_deleted_is_left_to_its_deletion() {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    use k8s_openapi::api::core::v1::{Namespace, Service};
    let ns = TestNamespace::new("terminating").await;
    let workloads = ns.api::<ManagedWorkload>();
    let names = ["a", "b", "c"];
    let spec = json!({"image": "nginx:latest", "ports": [{"containerPort": 80}], "service": {"type": "ClusterIP"}});
    for name in names {
        apply(&workloads, name, spec.clone()).await.unwrap();
    }
    for name in names {
        wait_ready(&workloads, name, Phase::Running).await;
    }

    let policy_name = format!("keep-{}", ns.name);
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [mw_operator::resource::GROUP], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["managedworkloads"]}]},
            "validations": [{"expression": "false", "message": "kept for the test"}]
        }
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "spec": {
            "policyName": policy_name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}}}
        }
    }))
    .unwrap();
    let (policies, bindings) = (
        Api::<ValidatingAdmissionPolicy>::all(ns.client.clone()),
        Api::<ValidatingAdmissionPolicyBinding>::all(ns.client.clone()),
    );
    policies.create(&PostParams::default(), &policy).await.unwrap();
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    // Policies take effect asynchronously: wait until a dry-run delete is refused.
    eventually("the admission policy to take effect", TIMEOUT, || async {
        match workloads.delete("a", &DeleteParams { dry_run: true, ..Default::default() }).await {
            Err(kube::Error::Api(s)) if s.message.contains("kept for the test") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let before = audit::settled_writes(&ns.name).await.len();

    Api::<Namespace>::all(ns.client.clone()).delete(&ns.name, &DeleteParams::background()).await.unwrap();
    let (deployments, services) = (ns.api::<Deployment>(), ns.api::<Service>());
    eventually("the namespace controller to delete the Deployments and Services", TIMEOUT, || async {
        let left = deployments.list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.len()
            + services.list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.len();
        if left == 0 { Ok(()) } else { Err(format!("{left} left")) }
    })
    .await;
    // Longer than the operator's recheck of a refused apply (10 s) and its first retries.
    tokio::time::sleep(Duration::from_secs(15)).await;

    let user = audit::operator_user();
    let window: Vec<_> = audit::timed_writes_by(&user, &ns.name).into_iter().skip(before).collect();
    eprintln!("the operator's writes while the namespace was terminating: {window:?}");
    let refused = audit::timed_refused_writes_by(&user, &ns.name);
    let is_refused = |at: &Timestamp, w: &audit::Write| refused.iter().any(|(t, r)| t == at && r == w);
    // An Event is named after its object: `<workload>.<suffix>`.
    let of = |w: &audit::Write, name: &str| w.name.as_deref().is_some_and(|n| n.split('.').next() == Some(name));
    for name in names {
        assert!(workloads.get_opt(name).await.unwrap().is_some(), "the policy kept {name}");
        // The first of its objects the operator tried to make again, and was refused.
        let first = window.iter().find(|(at, w)| of(w, name) && w.resource != "events" && is_refused(at, w));
        let first = first.map(|(at, _)| *at).unwrap_or_else(|| panic!("nothing made again for {name}: {window:?}"));
        // Nothing after it but refusals: no status or Event about the refusal. An Event queued
        // before it may still go out (and be refused); of the rest, the Deployment and the
        // Service are made side by side, so the other's refusal may land just after. No retry.
        let after: Vec<_> = window.iter().filter(|(at, w)| of(w, name) && *at > first).collect();
        let retried = after.iter().filter(|(_, w)| w.resource != "events").count();
        assert!(
            retried <= 1 && after.iter().all(|(at, w)| is_refused(at, w)),
            "writes for {name} after its first refused one: {after:?}"
        );
    }

    bindings.delete(&policy_name, &DeleteParams::default()).await.unwrap();
    policies.delete(&policy_name, &DeleteParams::default()).await.unwrap();
}
