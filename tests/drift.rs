//! Drift is corrected, foreign Deployments are never touched, and a reconcile that finds
//! nothing to change writes nothing (checked in the API server's audit log).

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::json;
use support::workload::{TIMEOUT, apply, apply_with_labels, condition, wait_condition, wait_ready};
use support::{TestNamespace, audit, wait_until};

fn image(d: &Deployment) -> Option<String> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers[0].image.clone()
}

async fn hand_patch(deployments: &Api<Deployment>, patch: serde_json::Value) {
    deployments.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

#[tokio::test]
async fn hand_edits_and_deletion_are_undone() {
    let ns = TestNamespace::new("drift").await;
    let workloads = ns.api::<ManagedWorkload>();
    let deployments = ns.api::<Deployment>();
    apply(&workloads, "web", json!({"image": "nginx:latest"})).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;

    // kubectl scale deployment web --replicas=3
    hand_patch(&deployments, json!({"spec": {"replicas": 3}})).await;
    wait_until(&deployments, "web", "replicas restored to 1", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(|d| d.spec.as_ref()?.replicas) == Some(1)
    })
    .await;

    // The correction is announced on the CR.
    support::wait_for_event(&ns, "DriftCorrected", TIMEOUT).await;

    // kubectl set image deployment/web workload=evil:1
    hand_patch(
        &deployments,
        json!({"spec": {"template": {"spec": {"containers": [{"name": "workload", "image": "evil:1"}]}}}}),
    )
    .await;
    wait_until(&deployments, "web", "image restored", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(image).as_deref() == Some("nginx:latest")
    })
    .await;

    // kubectl delete deployment web
    let old_uid = deployments.get("web").await.unwrap().uid();
    deployments.delete("web", &DeleteParams::background()).await.unwrap();
    wait_until(&deployments, "web", "the Deployment recreated", TIMEOUT, |d: Option<&Deployment>| {
        d.is_some_and(|d| d.uid() != old_uid)
    })
    .await;
    wait_ready(&workloads, "web", Phase::Running).await;
}

#[tokio::test]
async fn a_deployment_it_does_not_control_is_never_modified() {
    let ns = TestNamespace::new("conflict").await;
    let workloads = ns.api::<ManagedWorkload>();
    let deployments = ns.api::<Deployment>();
    let theirs: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app": "theirs"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {"metadata": {"labels": {"app": "theirs"}}, "spec": {"containers": [{"name": "c", "image": "redis:7"}]}}
        }
    }))
    .unwrap();
    deployments.create(&PostParams::default(), &theirs).await.unwrap();

    apply(&workloads, "web", json!({"image": "nginx:latest"})).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(condition(&mw, "Stalled").reason, "DeploymentConflict");
    assert_eq!(condition(&mw, "Ready").status, "False");
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Failed));
    assert!(condition(&mw, "Stalled").message.contains("not controlled by this ManagedWorkload"));

    let after = deployments.get("web").await.unwrap();
    assert_eq!(after.metadata.generation, Some(1), "their Deployment's spec was never changed");
    assert!(after.owner_references().is_empty());
    assert_eq!(image(&after).as_deref(), Some("redis:7"));
    // No GET before the create: the create-only apply was the look, refused (409) without
    // touching their Deployment; the rechecks since look with a GET.
    let user = std::env::var("MW_TEST_OPERATOR_USER").unwrap_or_else(|_| "mw-operator".into());
    let accepted: Vec<_> = audit::timed_accepted_writes_by(&user, &ns.name).into_iter().map(|(_, w)| w).collect();
    assert!(
        accepted.iter().all(|w| w.resource != "deployments"),
        "the operator wrote to their Deployment: {accepted:?}"
    );
    let attempts = audit::operator_writes(&ns.name).into_iter().filter(|w| w.resource == "deployments").count();
    assert_eq!(attempts, 1, "one refused create, then GETs");

    // Their Deployment goes: the workload recovers within seconds, far sooner than the
    // 10-minute resync (that Deployment was outside the operator's label-selected watch).
    deployments.delete("web", &DeleteParams::foreground()).await.unwrap();
    let started = std::time::Instant::now();
    let recovered = wait_until(&workloads, "web", "Running after the conflict went", Duration::from_secs(30), |mw| {
        mw.is_some_and(|mw| support::workload::condition_current(mw, "Ready", "True"))
    })
    .await
    .unwrap();
    eprintln!("recovered {:?} after the foreign Deployment's deletion", started.elapsed());
    assert_eq!(recovered.status.unwrap().phase, Some(Phase::Running));
    let ours = deployments.get("web").await.unwrap();
    assert_eq!(ours.owner_references()[0].uid, mw.uid().unwrap(), "now the workload's own Deployment");
}

#[tokio::test]
async fn reconciles_that_find_nothing_to_change_write_nothing() {
    let ns = TestNamespace::new("idle").await;
    let workloads = ns.api::<ManagedWorkload>();
    let deployments = ns.api::<Deployment>();
    for name in ["a", "b", "c"] {
        apply_with_labels(
            &workloads,
            name,
            json!({"opensource-server.mieweb.org/node-id": "1"}),
            json!({"image": "nginx:latest"}),
        )
        .await
        .unwrap();
    }
    for name in ["a", "b", "c"] {
        wait_ready(&workloads, name, Phase::Running).await;
    }
    // Let the last status writes (e.g. a Deployment condition that changes reason just after
    // availability) and their events settle.
    let before = audit::settled_writes(&ns.name).await;

    // Events that trigger reconciles without changing anything the operator owns: a label on
    // the CR (passes the controller's label predicate), a label on a Deployment. (Not an
    // annotation: for Deployments that bumps metadata.generation, and until the Deployment
    // controller observes it the rollout is, by the strict rule, not complete.)
    for name in ["a", "b", "c"] {
        let patch = json!({"metadata": {"labels": {"team": "blue"}}});
        workloads.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        deployments.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }
    // All three are Running (a steady phase), so nothing is held back longer than QUIET.
    tokio::time::sleep(audit::QUIET).await;
    let after = audit::operator_writes(&ns.name);
    assert_eq!(
        after[before.len()..],
        [],
        "writes by the operator while nothing changed (before the pokes it had made {} writes)",
        before.len()
    );
    // And every workload is still Running.
    for name in ["a", "b", "c"] {
        wait_ready(&workloads, name, Phase::Running).await;
    }
    // "No writes" must not be the silence of an operator that stopped watching: a real change
    // made now is still corrected.
    let patch = json!({"spec": {"replicas": 2}});
    deployments.patch("a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_until(&deployments, "a", "replicas restored to 1", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(|d| d.spec.as_ref()?.replicas) == Some(1)
    })
    .await;
    // And the same reading of the audit log that saw nothing above sees that correction.
    audit::wait_for_operator_write(&ns.name, after.len()).await;
}
