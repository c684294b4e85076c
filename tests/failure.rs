//! A Pod that cannot start makes the workload Failed within seconds, with the kubelet's
//! reason, and the workload recovers when the spec is fixed. kwok holds Pods with these
//! images in the given state (hack/kwok/stages.yaml).

mod support;

use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::json;
use support::TestNamespace;
use support::workload::{apply, condition, wait_condition, wait_ready};

/// `reason` is the Stalled reason reported; ErrImagePull and ImagePullBackOff, which a kubelet
/// alternates between, are both reported as ImagePullBackOff.
async fn fails_with(image: &str, reason: &str) {
    let ns = TestNamespace::new(&format!("fail-{reason}")).await;
    let workloads = ns.api::<ManagedWorkload>();
    // A long progress deadline: the failure must come from the Pod, not the deadline.
    apply(&workloads, "web", json!({"image": image, "progressDeadlineSeconds": 3600})).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Failed));
    let stalled = condition(&mw, "Stalled");
    assert_eq!(stalled.reason, reason);
    assert!(stalled.message.starts_with(&format!("container workload: {reason}")), "{}", stalled.message);
    assert_eq!(condition(&mw, "Ready").status, "False");
    assert_eq!(condition(&mw, "Reconciling").status, "False");

    // Fixing the image recovers it.
    apply(&workloads, "web", json!({"image": "nginx:latest", "progressDeadlineSeconds": 3600})).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(condition(&mw, "Stalled").status, "False");
}

#[tokio::test]
async fn image_pull_back_off() {
    fails_with("kwok.example/image-pull-backoff", "ImagePullBackOff").await;
}

#[tokio::test]
async fn err_image_pull() {
    fails_with("kwok.example/err-image-pull", "ImagePullBackOff").await;
}

#[tokio::test]
async fn crash_loop_back_off() {
    fails_with("kwok.example/crash-loop-backoff", "CrashLoopBackOff").await;
}

/// A ConfigMap (or Secret) the container reads that is not there yet is a wait, not a
/// failure: someone may still create it. Creating, saying what it waits for; Failed once the
/// rollout's progress deadline has passed.
#[tokio::test]
async fn create_container_config_error_waits_until_the_progress_deadline() {
    use support::wait_until;
    let ns = TestNamespace::new("fail-config-wait").await;
    let workloads = ns.api::<ManagedWorkload>();
    let image = "kwok.example/create-container-config-error";
    apply(&workloads, "web", json!({"image": image, "progressDeadlineSeconds": 3600})).await.unwrap();
    let mw = wait_until(&workloads, "web", "Reconciling for its ConfigMap", support::workload::TIMEOUT, |mw| {
        mw.is_some_and(|mw| {
            let waits =
                mw.status.iter().flat_map(|s| &s.conditions).any(|c| {
                    c.type_ == "Reconciling" && c.status == "True" && c.reason == "CreateContainerConfigError"
                });
            waits && mw.status.as_ref().and_then(|s| s.observed_generation) == mw.metadata.generation
        })
    })
    .await
    .unwrap();
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Creating));
    assert_eq!(condition(&mw, "Stalled").status, "False");
    assert!(condition(&mw, "Reconciling").message.contains("configmap \"missing-config\" not found"));

    // Past the rollout's progress deadline it is a failure.
    apply(&workloads, "web", json!({"image": image, "progressDeadlineSeconds": 5})).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Failed));
    assert_eq!(condition(&mw, "Stalled").reason, "ProgressDeadlineExceeded");
}

#[tokio::test]
async fn invalid_image_name() {
    fails_with("kwok.example/invalid-image-name", "InvalidImageName").await;
}

#[tokio::test]
async fn progress_deadline_exceeded() {
    let ns = TestNamespace::new("fail-deadline").await;
    let workloads = ns.api::<ManagedWorkload>();
    // Requests no node can satisfy: the Pod stays Pending with no container error, so only the
    // Deployment's progress deadline can tell that the rollout is stuck.
    let spec = json!({
        "image": "nginx:latest",
        "progressDeadlineSeconds": 5,
        "resources": {"requests": {"cpu": "10000"}},
    });
    apply(&workloads, "web", spec).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Failed));
    assert_eq!(condition(&mw, "Stalled").reason, "ProgressDeadlineExceeded");
    assert_eq!(condition(&mw, "Progressing").status, "False");
}

/// A ResourceQuota answers 403 Forbidden too, but it is no missing permission: the workload is
/// Failed at once with the quota's own words (not a `Forbidden` Event telling the admin to
/// grant a Role, retried forever with no phase), and recovers by itself once the quota allows
/// it, with no change of the workload.
#[tokio::test]
async fn a_full_quota_is_a_rejection_not_a_missing_permission() {
    use k8s_openapi::api::core::v1::{Event, ResourceQuota};
    use kube::api::{ListParams, Patch, PatchParams, PostParams};
    use support::eventually;

    let ns = TestNamespace::new("quota").await;
    let quotas = ns.api::<ResourceQuota>();
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "deployments"},
        "spec": {"hard": {"count/deployments.apps": "0"}},
    }))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    // The quota controller fills in the usage; until then admission refuses everything counted.
    eventually("the quota's usage is counted", std::time::Duration::from_secs(30), || async {
        let q = quotas.get("deployments").await.map_err(|e| e.to_string())?;
        let used = q.status.and_then(|s| s.used).unwrap_or_default();
        if used.contains_key("count/deployments.apps") { Ok(()) } else { Err("no usage yet".into()) }
    })
    .await;

    let workloads = ns.api::<ManagedWorkload>();
    apply(&workloads, "web", json!({"image": "nginx:latest"})).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Failed));
    let stalled = condition(&mw, "Stalled");
    assert_eq!(stalled.reason, "DeploymentRejected");
    assert!(stalled.message.contains("exceeded quota"), "the quota's own words: {}", stalled.message);

    let events: kube::Api<Event> = ns.api();
    let list = events.list(&ListParams::default()).await.unwrap();
    let forbidden: Vec<_> = list.items.iter().filter(|e| e.reason.as_deref() == Some("Forbidden")).collect();
    assert!(forbidden.is_empty(), "a quota is not reported as a missing permission: {forbidden:?}");

    // Room in the quota: the workload recovers within its recheck, untouched.
    let room = json!({"spec": {"hard": {"count/deployments.apps": "1"}}});
    quotas.patch("deployments", &PatchParams::default(), &Patch::Merge(&room)).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(condition(&mw, "Stalled").status, "False");
}
