//! The workload lifecycle against the real control plane and the running operator:
//! create → Running, stop → Stopped, start → Running, env change and resource change roll
//! out (Updating → Running), delete → Deployment and Pods gone.

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::json;
use support::workload::{PhaseLog, TIMEOUT, apply, condition, wait_ready};
use support::{TestNamespace, wait_until};

const SELECTOR: &str = "app.kubernetes.io/instance=web";

async fn live_pods(pods: &Api<Pod>) -> Vec<Pod> {
    live_pods_named(pods, "web").await
}

fn container_env(pod: &Pod, name: &str) -> Option<String> {
    let c = &pod.spec.as_ref()?.containers[0];
    c.env.as_ref()?.iter().find(|e| e.name == name)?.value.clone()
}

#[tokio::test]
async fn create_stop_start_update_delete() {
    let ns = TestNamespace::new("lifecycle").await;
    let workloads = ns.api::<ManagedWorkload>();
    let deployments = ns.api::<Deployment>();
    let pods = ns.api::<Pod>();
    let spec = |env: &str, cpu: &str, state: &str| {
        json!({
            "image": "nginx:latest",
            "state": state,
            "env": [{"name": "GREETING", "value": env}],
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}},
            "ports": [{"containerPort": 80, "name": "http"}],
        })
    };

    // Create: a Deployment of one replica, a Ready Pod, the CR Running with its Pod IP.
    apply(&workloads, "web", spec("hello", "100m", "Running")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    let status = mw.status.clone().unwrap();
    assert_eq!(status.provider_id.as_deref(), Some(format!("{}/web", ns.name).as_str()));
    assert_eq!((status.desired_replicas, status.available_replicas, status.updated_replicas), (1, 1, 1));
    let d = deployments.get("web").await.unwrap();
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(1));
    let owner = &d.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("ManagedWorkload", mw.uid().unwrap().as_str(), Some(true))
    );
    let running = live_pods(&pods).await;
    assert_eq!(running.len(), 1);
    let pod_ip = running[0].status.as_ref().unwrap().pod_ip.clone();
    assert!(pod_ip.is_some());
    assert_eq!(status.pod_ip, pod_ip, "status.podIP is the Pod's IP");
    for type_ in ["Ready", "Reconciling", "Stalled", "Available", "Progressing"] {
        let c = condition(&mw, type_);
        assert_eq!(c.observed_generation, mw.metadata.generation, "{type_} carries the generation");
    }
    assert_eq!(condition(&mw, "Reconciling").status, "False");
    assert_eq!(condition(&mw, "Stalled").status, "False");

    // Stop: scaled to zero, Pods gone, Stopped (and Ready: the desired state is reached).
    let phases = PhaseLog::start(&workloads, "web").await;
    apply(&workloads, "web", spec("hello", "100m", "Stopped")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Stopped).await;
    assert_eq!(deployments.get("web").await.unwrap().spec.unwrap().replicas, Some(0));
    assert!(live_pods(&pods).await.is_empty(), "no Pods once Stopped");
    assert_eq!(mw.status.as_ref().unwrap().pod_ip, None, "no Pod IP while stopped");
    assert_eq!(mw.status.as_ref().unwrap().desired_replicas, 0);
    let seen = phases.until(Phase::Stopped).await;
    assert!(seen.contains(&Phase::Stopping), "went through Stopping: {seen:?}");
    drop(phases);

    // Start: a new Ready Pod, Running again.
    apply(&workloads, "web", spec("hello", "100m", "Running")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert!(mw.status.as_ref().unwrap().pod_ip.is_some());
    assert_eq!(live_pods(&pods).await.len(), 1);

    // Change an env var: a rollout, Updating then Running on the new template.
    let phases = PhaseLog::start(&workloads, "web").await;
    apply(&workloads, "web", spec("bonjour", "100m", "Running")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let seen = phases.until(Phase::Running).await;
    assert_eq!(seen[seen.len() - 2..], [Phase::Updating, Phase::Running], "{seen:?}");
    let current = live_pods(&pods).await;
    assert_eq!(current.len(), 1, "the old Pod is gone once Running");
    assert_eq!(container_env(&current[0], "GREETING").as_deref(), Some("bonjour"));
    drop(phases);

    // Change a resource request: the same.
    let phases = PhaseLog::start(&workloads, "web").await;
    apply(&workloads, "web", spec("bonjour", "250m", "Running")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let seen = phases.until(Phase::Running).await;
    assert!(seen.contains(&Phase::Updating), "{seen:?}");
    let current = live_pods(&pods).await;
    assert_eq!(current.len(), 1);
    let requests = current[0].spec.as_ref().unwrap().containers[0].resources.clone().unwrap().requests.unwrap();
    assert_eq!(requests["cpu"].0, "250m");

    // Its Events: where each change ended (Running, Stopped), never the transition the user's
    // own change started (Creating, Stopping, Updating). One sender sends them in order, so
    // once Stopped is there a Stopping would be too.
    let events = ns.api::<k8s_openapi::api::events::v1::Event>();
    let reasons = || async {
        let listed = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let reasons: std::collections::BTreeSet<String> = listed
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().is_some_and(|r| r.kind.as_deref() == Some("ManagedWorkload")))
            .filter_map(|e| e.reason)
            .collect();
        Ok::<_, String>(reasons)
    };
    support::eventually("the Running and Stopped Events", TIMEOUT, || async {
        let reasons = reasons().await?;
        if reasons.contains("Running") && reasons.contains("Stopped") { Ok(()) } else { Err(format!("{reasons:?}")) }
    })
    .await;
    let reasons = reasons().await.unwrap();
    assert!(!reasons.iter().any(|r| ["Creating", "Stopping", "Updating"].contains(&r.as_str())), "{reasons:?}");

    // Delete: garbage collection removes the Deployment and its Pods. (This can take up to
    // ~30 s on a fresh control plane: the garbage collector starts watching a newly installed
    // CRD's kind only at its next resource discovery, every 30 s.)
    workloads.delete("web", &DeleteParams::background()).await.unwrap();
    wait_until(&deployments, "web", "the Deployment to be garbage collected", TIMEOUT, |d: Option<&Deployment>| {
        d.is_none()
    })
    .await;
    support::eventually("the Pods to be garbage collected", TIMEOUT, || async {
        let left = pods.list(&ListParams::default().labels(SELECTOR)).await.map_err(|e| e.to_string())?.items.len();
        if left == 0 { Ok(()) } else { Err(format!("{left} Pod(s) left")) }
    })
    .await;
}

#[tokio::test]
async fn switching_to_recreate_and_back_rolls_out() {
    // Server-side apply pitfall: a Deployment that ever had a rollingUpdate block rejects
    // `type: Recreate` unless the block is removed in the same write.
    let ns = TestNamespace::new("strategy").await;
    let workloads = ns.api::<ManagedWorkload>();
    let deployments = ns.api::<Deployment>();
    apply(&workloads, "web", json!({"image": "nginx:latest"})).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;

    apply(&workloads, "web", json!({"image": "nginx:1.27", "updateStrategy": "Recreate"})).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(condition(&mw, "Stalled").status, "False");
    let strategy = deployments.get("web").await.unwrap().spec.unwrap().strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("Recreate"));
    assert!(strategy.rolling_update.is_none());

    apply(&workloads, "web", json!({"image": "nginx:1.28"})).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let strategy = deployments.get("web").await.unwrap().spec.unwrap().strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let pods = live_pods_named(&ns.api::<Pod>(), "web").await;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].spec.as_ref().unwrap().containers[0].image.as_deref(), Some("nginx:1.28"));
}

async fn live_pods_named(pods: &Api<Pod>, instance: &str) -> Vec<Pod> {
    let list =
        pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={instance}"))).await.unwrap();
    list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

/// The operator's watches list the way the API server can: streamed where the WatchList
/// feature is on by default (1.32, and 1.34 on), paged where it is off (1.31, the oldest
/// supported, and 1.33).
/// The lifecycle above runs on both (`make test`, `make test-compat`).
#[tokio::test]
async fn lists_are_streamed_where_the_api_server_streams_them() {
    use kube::runtime::watcher::InitialListStrategy::{ListWatch, StreamingList};
    let ns = TestNamespace::new("lists").await;
    let version = ns.client.apiserver_version().await.unwrap();
    let minor: u32 = version.minor.trim_end_matches('+').parse().unwrap();
    // WatchList is on by default in 1.32, off again in 1.33, and on from 1.34.
    let expected = match minor {
        32 | 34.. => StreamingList,
        _ => ListWatch,
    };
    assert_eq!(mw_operator::reflect::initial_lists(&ns.api::<ManagedWorkload>()).await, expected);
}

/// A status derived for a deleted workload never lands on the workload re-created under its
/// name: the API server checks no UID on `/status`, so the write itself tests it.
#[tokio::test]
async fn a_deleted_workloads_status_is_not_written_onto_its_successor() {
    use mw_operator::operator::status_write::{self, Written};
    let ns = TestNamespace::new("status-successor").await;
    let workloads = ns.api::<ManagedWorkload>();
    let spec = json!({"image": "nginx:latest"});
    apply(&workloads, "web", spec.clone()).await.unwrap();
    let deleted = wait_ready(&workloads, "web", Phase::Running).await;
    workloads.delete("web", &DeleteParams::foreground()).await.unwrap();
    wait_until(&workloads, "web", "the first workload gone", TIMEOUT, |mw| mw.is_none()).await;
    apply(&workloads, "web", spec).await.unwrap();
    let successor = wait_ready(&workloads, "web", Phase::Running).await;
    assert_ne!(successor.uid(), deleted.uid());

    // What a reconcile of the deleted workload, slow enough to outlive it, would write.
    let mut stale = deleted.status.clone().unwrap_or_default();
    stale.observed_generation = Some(99);
    let client = ns.client.clone();
    let written = status_write::write(&client, &deleted, &stale).await.unwrap();
    assert_eq!(written, Written::Superseded);
    let now = workloads.get("web").await.unwrap();
    assert_ne!(now.status.as_ref().and_then(|s| s.observed_generation), Some(99), "{:#?}", now.status);

    // The successor's own status is written as before.
    let current = now.status.clone().unwrap_or_default();
    let written = status_write::write(&client, &now, &current).await.unwrap();
    assert!(matches!(written, Written::Version(Some(_))), "{written:?}");
}

/// Issue 41, item 2: a forced apply changes the object it was decided on, never one made
/// under its name since. A cache behind the API server (a watch not yet re-listed after an
/// outage, or the Deployment the last apply returned) may still show `web`'s deleted
/// Deployment when a user has made their own `web`: the operator's apply, bound to the UID it
/// saw, is refused, and theirs is neither changed nor owned (so never collected with a
/// workload).
#[tokio::test]
async fn a_forced_apply_never_takes_over_an_object_made_since() {
    use mw_operator::operator::{deployment, step};
    use mw_operator::write::found_another;
    let ns = TestNamespace::new("apply-bound").await;
    let workloads = ns.api::<ManagedWorkload>();
    let deployments = ns.api::<Deployment>();
    apply(&workloads, "web", json!({"image": "nginx:latest"})).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    let seen = deployments.get("web").await.unwrap();
    workloads.delete("web", &DeleteParams::foreground()).await.unwrap();
    wait_until(&deployments, "web", "the workload's Deployment collected", TIMEOUT, |d| d.is_none()).await;

    let mut theirs: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "theirs"}},
                 "template": {"metadata": {"labels": {"app": "theirs"}},
                              "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}}))
    .unwrap();
    theirs = deployments.create(&Default::default(), &theirs).await.unwrap();

    let desired = deployment::deployment(&mw, &Default::default()).expect("the workload's Deployment");
    let metrics = mw_operator::metrics::Metrics::register(&mut Default::default());
    let update = mw_operator::operator::plan::Mode::Update { drift: false };
    let uid = seen.uid();
    match step::apply(&metrics, &deployments, "web", &desired, update.write(uid.as_deref())).await {
        Err(err) => assert!(found_another(&err), "refused, but not as another object: {err:?}"),
        Ok(applied) => panic!("the user's Deployment was taken over: {:?}", applied.metadata.owner_references),
    }
    // (Its status moves with kube-controller-manager; its spec and owners are the user's.)
    let now = deployments.get("web").await.unwrap();
    assert_eq!(now.metadata.generation, theirs.metadata.generation, "the user's Deployment spec was changed");
    assert!(now.owner_references().is_empty(), "{:?}", now.owner_references());
    let managers: Vec<_> = now.managed_fields().iter().filter_map(|f| f.manager.clone()).collect();
    let operator = mw_operator::operator::ownership::FIELD_MANAGER;
    assert!(!managers.iter().any(|m| m == operator), "the operator manages fields of it: {managers:?}");
}
