//! A workload's disk (issue 14), against the real control plane: claims bound for real by
//! kube-controller-manager's PersistentVolume binder to hostPath volumes each test provides
//! (a StorageClass of its own, no provisioner, Immediate binding). The same claim (by UID)
//! through stop, start, an image rollout, growth and an operator restart; Retain keeps it and
//! a re-created workload re-attaches it; Delete removes it with the workload; refused changes
//! name their field; an unbindable claim fails naming it; a foreign claim blocks, untouched;
//! no writes in the steady state.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::{Value, json};
use support::storage::Storage;
use support::workload::{TIMEOUT, apply, wait_condition, wait_phase, wait_ready};
use support::{TestNamespace, audit, wait_until};

fn spec(image: &str, state: &str, volumes: Value) -> Value {
    json!({"image": image, "state": state, "volumes": volumes})
}

fn data(class: &str, size: &str, policy: &str) -> Value {
    json!([{"name": "data", "mountPath": "/data", "size": size, "storageClassName": class, "retentionPolicy": policy}])
}

async fn claim(claims: &Api<PersistentVolumeClaim>, name: &str) -> PersistentVolumeClaim {
    wait_until(claims, name, "the claim to be Bound", TIMEOUT, |c: Option<&PersistentVolumeClaim>| {
        c.and_then(|c| c.status.as_ref()?.phase.as_deref()) == Some("Bound")
    })
    .await
    .unwrap()
}

fn volume_status(mw: &ManagedWorkload) -> &mw_operator::resource::VolumeStatus {
    &mw.status.as_ref().unwrap().volumes[0]
}

#[tokio::test]
async fn the_same_claim_through_stop_start_rollout_and_growth() {
    let ns = TestNamespace::new("volumes-same-claim").await;
    let storage = Storage::new(&ns, 1, "5Gi").await;
    let (workloads, claims, deployments) =
        (ns.api::<ManagedWorkload>(), ns.api::<PersistentVolumeClaim>(), ns.api::<Deployment>());
    let volumes = data(&storage.class, "1Gi", "Retain");

    apply(&workloads, "web", spec("nginx:1", "Running", volumes.clone())).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    let first = claim(&claims, "web-data").await;
    let uid = first.uid().unwrap();
    assert!(first.owner_references().is_empty(), "Retain: no owner reference");
    let d = deployments.get("web").await.unwrap();
    let dspec = d.spec.unwrap();
    assert_eq!(dspec.strategy.unwrap().type_.as_deref(), Some("Recreate"), "a ReadWriteOnce volume recreates");
    let pod = dspec.template.spec.unwrap();
    assert_eq!(pod.volumes.unwrap()[0].persistent_volume_claim.as_ref().unwrap().claim_name, "web-data");
    assert_eq!(pod.containers[0].volume_mounts.as_ref().unwrap()[0].mount_path, "/data");
    let vs = wait_until(&workloads, "web", "status.volumes to show the bound claim", TIMEOUT, |mw| {
        mw.and_then(|mw| mw.status.as_ref()?.volumes.first().cloned())
            .is_some_and(|v| v.phase.as_deref() == Some("Bound"))
    })
    .await
    .unwrap();
    let v = volume_status(&vs);
    assert_eq!((v.name.as_str(), v.claim.as_str(), v.capacity.as_deref()), ("data", "web-data", Some("5Gi")));
    drop(mw);

    // Stop, start, an image rollout: the same claim.
    apply(&workloads, "web", spec("nginx:1", "Stopped", volumes.clone())).await.unwrap();
    wait_ready(&workloads, "web", Phase::Stopped).await;
    assert_eq!(claims.get("web-data").await.unwrap().uid(), Some(uid.clone()), "after stop");
    apply(&workloads, "web", spec("nginx:1", "Running", volumes.clone())).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(claims.get("web-data").await.unwrap().uid(), Some(uid.clone()), "after start");
    apply(&workloads, "web", spec("nginx:2", "Running", volumes.clone())).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(claims.get("web-data").await.unwrap().uid(), Some(uid.clone()), "after an image rollout");

    // Steady state: nothing to change, nothing written.
    let before = audit::settled_writes(&ns.name).await;
    tokio::time::sleep(audit::QUIET).await;
    let after = audit::operator_writes(&ns.name);
    assert_eq!(after[before.len()..], [], "writes in the steady state");
    assert!(
        before.iter().filter(|w| w.resource == "persistentvolumeclaims").all(|w| w.verb == "patch"),
        "claims are only ever applied, never deleted: {before:?}"
    );

    // Growth patches the claim in place (and is the positive control of the quiet window: the
    // same reading of the audit log sees the operator's write).
    apply(&workloads, "web", spec("nginx:2", "Running", data(&storage.class, "2Gi", "Retain"))).await.unwrap();
    audit::wait_for_operator_write(&ns.name, after.len()).await;
    let grown = wait_until(&claims, "web-data", "the claim to ask for 2Gi", TIMEOUT, |c| {
        c.and_then(mw_operator::operator::claims::requested).as_deref() == Some("2Gi")
    })
    .await
    .unwrap();
    assert_eq!(grown.uid(), Some(uid.clone()), "grown in place");
    wait_phase(&workloads, "web", Phase::Running).await;
}

#[tokio::test]
async fn retain_keeps_the_claim_and_a_recreated_workload_reattaches_it() {
    let ns = TestNamespace::new("volumes-retain").await;
    let storage = Storage::new(&ns, 1, "1Gi").await;
    let (workloads, claims, deployments) =
        (ns.api::<ManagedWorkload>(), ns.api::<PersistentVolumeClaim>(), ns.api::<Deployment>());
    let volumes = data(&storage.class, "1Gi", "Retain");
    apply(&workloads, "web", spec("nginx:1", "Running", volumes.clone())).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let uid = claim(&claims, "web-data").await.uid();

    workloads.delete("web", &DeleteParams::background()).await.unwrap();
    wait_until(&deployments, "web", "the Deployment to go with the workload", TIMEOUT, |d| d.is_none()).await;
    wait_until(&workloads, "web", "the workload to go", TIMEOUT, |mw| mw.is_none()).await;
    let kept = claims.get("web-data").await.unwrap();
    assert_eq!(kept.uid(), uid, "a retained claim survives its workload");
    assert!(kept.metadata.deletion_timestamp.is_none());

    // Re-created under the same name: the same claim, the same volume.
    apply(&workloads, "web", spec("nginx:1", "Running", volumes)).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let again = claims.get("web-data").await.unwrap();
    assert_eq!(again.uid(), uid, "re-attached");
    assert_eq!(again.spec.as_ref().unwrap().volume_name, kept.spec.as_ref().unwrap().volume_name);
}

#[tokio::test]
async fn delete_removes_the_claim_with_the_workload() {
    let ns = TestNamespace::new("volumes-delete").await;
    let storage = Storage::new(&ns, 1, "1Gi").await;
    let (workloads, claims) = (ns.api::<ManagedWorkload>(), ns.api::<PersistentVolumeClaim>());
    apply(&workloads, "web", spec("nginx:1", "Running", data(&storage.class, "1Gi", "Delete"))).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    let owned = claim(&claims, "web-data").await;
    let owner = &owned.owner_references()[0];
    assert_eq!((owner.uid.as_str(), owner.controller), (mw.uid().unwrap().as_str(), Some(true)));
    workloads.delete("web", &DeleteParams::background()).await.unwrap();
    wait_until(&claims, "web-data", "garbage collection to delete the claim", TIMEOUT, |c| c.is_none()).await;
}

#[tokio::test]
async fn an_unbindable_claim_fails_the_workload_naming_it() {
    let ns = TestNamespace::new("volumes-unbindable").await;
    let workloads = ns.api::<ManagedWorkload>();
    let mut s = spec("nginx:1", "Running", data(&format!("{}-no-such-class", ns.name), "1Gi", "Retain"));
    s["progressDeadlineSeconds"] = json!(10);
    apply(&workloads, "web", s).await.unwrap();
    let creating = wait_until(&workloads, "web", "Creating, waiting for the claim", TIMEOUT, |mw| {
        mw.and_then(|mw| mw.status.as_ref()).is_some_and(|s| {
            s.phase == Some(Phase::Creating)
                && s.conditions.iter().any(|c| c.type_ == "Reconciling" && c.message.contains("claim web-data"))
        })
    })
    .await
    .unwrap();
    assert_eq!(volume_status(&creating).phase.as_deref(), Some("Pending"));
    let failed = wait_condition(&workloads, "web", "Stalled", "True").await;
    let stalled = support::workload::condition(&failed, "Stalled");
    assert_eq!(failed.status.as_ref().unwrap().phase, Some(Phase::Failed));
    assert_eq!(stalled.reason, "ClaimNotBound");
    assert!(stalled.message.contains("claim web-data"), "{}", stalled.message);
}

#[tokio::test]
async fn a_foreign_claim_blocks_the_workload_untouched() {
    let ns = TestNamespace::new("volumes-foreign").await;
    let (workloads, claims, deployments) =
        (ns.api::<ManagedWorkload>(), ns.api::<PersistentVolumeClaim>(), ns.api::<Deployment>());
    let foreign: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "web-data", "labels": {"app.kubernetes.io/instance": "web"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": format!("{}-none", ns.name)},
    }))
    .unwrap();
    let foreign = claims.create(&PostParams::default(), &foreign).await.unwrap();
    apply(&workloads, "web", spec("nginx:1", "Running", data(&format!("{}-none", ns.name), "1Gi", "Retain")))
        .await
        .unwrap();
    let failed = wait_condition(&workloads, "web", "Stalled", "True").await;
    let stalled = support::workload::condition(&failed, "Stalled");
    assert_eq!(stalled.reason, "ClaimConflict");
    assert!(stalled.message.contains("web-data"), "{}", stalled.message);
    // Past two of the blocked workload's rechecks: a recheck that wrote would show.
    tokio::time::sleep(mw_operator::operator::reconcile::CONFLICT_RECHECK * 2 + Duration::from_secs(1)).await;
    let after = claims.get("web-data").await.unwrap();
    assert_eq!(after.metadata.resource_version, foreign.metadata.resource_version, "untouched");
    assert!(deployments.get_opt("web").await.unwrap().is_none(), "never started against someone else's claim");
    // No GET before the create: the create-only apply was the look, refused (409) without
    // touching the claim; the rechecks since look with a GET.
    let user = std::env::var("MW_TEST_OPERATOR_USER").unwrap_or_else(|_| "mw-operator".into());
    let accepted: Vec<_> = audit::timed_accepted_writes_by(&user, &ns.name).into_iter().map(|(_, w)| w).collect();
    assert!(accepted.iter().all(|w| w.resource != "persistentvolumeclaims"), "no write to the foreign claim");
    let attempts = audit::operator_writes(&ns.name).into_iter().filter(|w| w.resource == "persistentvolumeclaims");
    assert_eq!(attempts.count(), 1, "one refused create, then GETs");

    // Removed: the workload makes its own and proceeds.
    claims.delete("web-data", &DeleteParams::background()).await.unwrap();
    wait_until(&claims, "web-data", "the operator's own claim", TIMEOUT, |c: Option<&PersistentVolumeClaim>| {
        c.is_some_and(|c| {
            c.uid() != foreign.uid() && c.annotations().contains_key("opensource-server.mieweb.org/volume-of")
        })
    })
    .await;
}

/// Each refused change is refused by the API server, naming the field.
#[tokio::test]
async fn refused_volume_changes_name_their_field() {
    let ns = TestNamespace::new("volumes-refused").await;
    let workloads = ns.api::<ManagedWorkload>();
    let base = json!([{"name": "data", "mountPath": "/data", "size": "2Gi", "storageClassName": "a"}]);
    apply(&workloads, "web", json!({"image": "nginx:1", "state": "Stopped", "volumes": base})).await.unwrap();
    let cases = [
        (
            "another class",
            json!([{"name": "data", "mountPath": "/data", "size": "2Gi", "storageClassName": "b"}]),
            vec!["spec.volumes[0].storageClassName", "cannot be changed"],
        ),
        (
            "another access mode",
            json!([{"name": "data", "mountPath": "/data", "size": "2Gi", "storageClassName": "a",
                    "accessMode": "ReadWriteMany"}]),
            vec!["spec.volumes[0].accessMode", "cannot be changed"],
        ),
        (
            "a renamed volume at the same path",
            json!([{"name": "disk", "mountPath": "/data", "size": "2Gi", "storageClassName": "a"}]),
            vec!["spec.volumes", "renaming a volume makes a new, empty claim"],
        ),
    ];
    for (case, volumes, want) in cases {
        let err = apply(&workloads, "web", json!({"image": "nginx:1", "state": "Stopped", "volumes": volumes}))
            .await
            .expect_err(case);
        let message = err.to_string();
        for w in want {
            assert!(message.contains(w), "{case}: {message:?} should contain {w:?}");
        }
    }
    // Growth is fine, and so is a smaller size (a refused expansion put back): the claim never
    // shrinks, but the spec must be able to go back (tests below).
    let grown = json!([{"name": "data", "mountPath": "/data", "size": "3Gi", "storageClassName": "a"}]);
    apply(&workloads, "web", json!({"image": "nginx:1", "state": "Stopped", "volumes": grown})).await.unwrap();
    let smaller = json!([{"name": "data", "mountPath": "/data", "size": "1Gi", "storageClassName": "a"}]);
    apply(&workloads, "web", json!({"image": "nginx:1", "state": "Stopped", "volumes": smaller})).await.unwrap();

    // New objects: RollingUpdate with a ReadWriteOnce volume; duplicate mount paths; a relative path.
    let creates = [
        (
            json!({"image": "nginx:1", "updateStrategy": "RollingUpdate",
                   "volumes": [{"name": "data", "mountPath": "/data", "size": "1Gi"}]}),
            vec!["spec.updateStrategy", "Recreate"],
        ),
        (
            json!({"image": "nginx:1", "volumes": [{"name": "a", "mountPath": "/data", "size": "1Gi"},
                                                      {"name": "b", "mountPath": "/data", "size": "1Gi"}]}),
            vec!["spec.volumes", "mountPath must be unique"],
        ),
        (
            json!({"image": "nginx:1", "volumes": [{"name": "a", "mountPath": "data", "size": "1Gi"}]}),
            vec!["spec.volumes[0].mountPath"],
        ),
        (
            json!({"image": "nginx:1", "volumes": [{"name": "a", "mountPath": "/data", "size": "lots"}]}),
            vec!["spec.volumes[0].size", "must be a quantity"],
        ),
    ];
    for (i, (s, want)) in creates.into_iter().enumerate() {
        let err = apply(&workloads, &format!("new-{i}"), s).await.expect_err("refused");
        let message = err.to_string();
        for w in want {
            assert!(message.contains(w), "case {i}: {message:?} should contain {w:?}");
        }
    }
    // RollingUpdate with only ReadWriteMany volumes is fine.
    apply(
        &workloads,
        "shared",
        json!({"image": "nginx:1", "state": "Stopped", "updateStrategy": "RollingUpdate",
               "volumes": [{"name": "data", "mountPath": "/data", "size": "1Gi", "accessMode": "ReadWriteMany"}]}),
    )
    .await
    .unwrap();
}

/// An operator restart is a fresh process with empty memory: it re-attaches the same claim and,
/// with nothing to change, writes nothing at all (the API server's audit log says so).
#[tokio::test]
#[ignore = "hack/test.sh runs it alone, after the main suite: it runs an operator of its own"]
async fn an_operator_restart_keeps_the_claim_and_writes_nothing() {
    use support::operator::{Operator, service_account_kubeconfig};
    let ns = TestNamespace::new("volumes-restart").await;
    let storage = Storage::new(&ns, 1, "1Gi").await;
    let (workloads, claims) = (ns.api::<ManagedWorkload>(), ns.api::<PersistentVolumeClaim>());
    let (config, _, user) = service_account_kubeconfig(&ns, "op").await;
    let args = vec![format!("--namespace={}", ns.name), format!("--lease-namespace={}", ns.name)];
    let mut first = Operator::start(&format!("{}-a", ns.name), &config, &args);
    first.wait_ready(TIMEOUT).await;
    apply(&workloads, "web", spec("nginx:1", "Running", data(&storage.class, "1Gi", "Retain"))).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let uid = claim(&claims, "web-data").await.uid();
    let writes = || -> Vec<audit::Write> {
        audit::writes_by(&user, &ns.name).into_iter().filter(|w| w.resource != "leases").collect()
    };
    // Settled: no write for a quiet window.
    let mut seen = writes();
    loop {
        tokio::time::sleep(audit::QUIET).await;
        let now = writes();
        if now.len() == seen.len() {
            break;
        }
        seen = now;
    }
    assert!(seen.iter().any(|w| w.resource == "persistentvolumeclaims"), "the first operator made the claim: {seen:?}");
    first.signal("TERM");
    assert!(first.wait_exit(Duration::from_secs(60)).await.is_some(), "the first operator exits on SIGTERM");

    let second = Operator::start(&format!("{}-b", ns.name), &config, &args);
    second.wait_ready(TIMEOUT).await;
    second.wait_leader("mw-operator", TIMEOUT).await;
    tokio::time::sleep(audit::QUIET.saturating_mul(2)).await;
    assert_eq!(writes()[seen.len()..], [], "writes by the restarted operator while nothing changed");
    assert_eq!(claims.get("web-data").await.unwrap().uid(), uid, "the same claim");
    wait_ready(&workloads, "web", Phase::Running).await;
}

/// A claim being deleted is never started against: a clear condition naming it, not a hang;
/// once it is gone, a new claim is made and the workload starts.
#[tokio::test]
async fn a_claim_being_deleted_is_never_started_against() {
    use kube::api::{Patch, PatchParams};
    let ns = TestNamespace::new("volumes-deleting").await;
    let storage = Storage::new(&ns, 2, "1Gi").await;
    let (workloads, claims, deployments) =
        (ns.api::<ManagedWorkload>(), ns.api::<PersistentVolumeClaim>(), ns.api::<Deployment>());
    let volumes = data(&storage.class, "1Gi", "Retain");
    apply(&workloads, "web", spec("nginx:1", "Stopped", volumes.clone())).await.unwrap();
    wait_ready(&workloads, "web", Phase::Stopped).await;
    let old = claim(&claims, "web-data").await.uid();
    // Someone deletes the claim; a finalizer of the test's own holds it in deletion.
    let hold = json!({"metadata": {"finalizers": ["mw-operator.test/hold"]}});
    claims.patch("web-data", &PatchParams::default(), &Patch::Merge(&hold)).await.unwrap();
    claims.delete("web-data", &DeleteParams::background()).await.unwrap();

    apply(&workloads, "web", spec("nginx:1", "Running", volumes)).await.unwrap();
    let failed = wait_condition(&workloads, "web", "Stalled", "True").await;
    let stalled = support::workload::condition(&failed, "Stalled");
    assert_eq!(stalled.reason, "ClaimDeleting");
    assert!(stalled.message.contains("claim web-data is being deleted"), "{}", stalled.message);
    // The advice keeps the data: make the volume Retain first (naming it), before anything
    // that lets the deletion complete.
    let pv = claims.get("web-data").await.unwrap().spec.unwrap().volume_name.unwrap();
    assert!(stalled.message.contains(&format!("kubectl patch pv {pv}")), "{}", stalled.message);
    assert!(stalled.message.contains("persistentVolumeReclaimPolicy") && stalled.message.contains("Retain"));
    assert_eq!(deployments.get("web").await.unwrap().spec.unwrap().replicas, Some(0), "not started");

    // The deletion completes: a new claim, said so in status and an Event, and the workload runs.
    let release = json!({"metadata": {"finalizers": null}});
    claims.patch("web-data", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let new = claims.get("web-data").await.unwrap();
    assert_ne!(new.uid(), old, "a new claim");
    assert_eq!(
        new.annotations().get("opensource-server.mieweb.org/replaced-deleted-claim").map(String::as_str),
        Some("true")
    );
    let said = wait_until(&workloads, "web", "status.volumes to say the claim is new", TIMEOUT, |mw| {
        mw.and_then(|mw| mw.status.as_ref()?.volumes.first()?.message.clone())
            .is_some_and(|m| m.contains("new and empty"))
    })
    .await;
    assert!(said.is_some());
    support::wait_for_event(&ns, "ClaimReplaced", TIMEOUT).await;
}

/// Deleted by mistake and re-created by its Manager user: the data comes back. Another user
/// taking the freed hostname never gets it: the workload is held, naming the claim and whose
/// data it holds, and no Pod of it is made.
#[tokio::test]
async fn a_retained_disk_goes_back_only_to_its_owner() {
    let ns = TestNamespace::new("volumes-owner").await;
    let storage = Storage::new(&ns, 2, "1Gi").await;
    let (workloads, claims, deployments) =
        (ns.api::<ManagedWorkload>(), ns.api::<PersistentVolumeClaim>(), ns.api::<Deployment>());
    let volumes = data(&storage.class, "1Gi", "Retain");
    let of = |user: &str| {
        let mut mw = json!({"metadata": {"labels": {"opensource-server.mieweb.org/node-id": "3"},
                                         "annotations": {"opensource-server.mieweb.org/owner": user}}});
        mw["spec"] = spec("nginx:1", "Running", volumes.clone());
        mw
    };
    let create = |user: &str| {
        let body: ManagedWorkload = serde_json::from_value({
            let mut mw = of(user);
            mw["apiVersion"] = json!("opensource-server.mieweb.org/v1alpha1");
            mw["kind"] = json!("ManagedWorkload");
            mw["metadata"]["name"] = json!("app");
            mw
        })
        .unwrap();
        let workloads = workloads.clone();
        async move { workloads.create(&PostParams::default(), &body).await.unwrap() }
    };
    let gone = || async {
        workloads.delete("app", &DeleteParams::background()).await.unwrap();
        wait_until(&workloads, "app", "the workload to go", TIMEOUT, |mw| mw.is_none()).await;
        wait_until(&deployments, "app", "its Deployment to go", TIMEOUT, |d| d.is_none()).await;
    };

    create("alice").await;
    wait_ready(&workloads, "app", Phase::Running).await;
    let alices = claim(&claims, "app-data").await;
    gone().await;

    // Bob takes the hostname: held, told whose the disk is, never started.
    create("bob").await;
    let failed = wait_condition(&workloads, "app", "Stalled", "True").await;
    let stalled = support::workload::condition(&failed, "Stalled");
    assert_eq!(stalled.reason, "ClaimConflict");
    assert!(
        stalled.message.contains("app-data") && stalled.message.contains("Manager user alice on node 3"),
        "{}",
        stalled.message
    );
    // Past two of the blocked workload's rechecks: a recheck that wrote would show.
    tokio::time::sleep(mw_operator::operator::reconcile::CONFLICT_RECHECK * 2 + Duration::from_secs(1)).await;
    assert!(deployments.get_opt("app").await.unwrap().is_none(), "no Pod of bob's workload mounts alice's disk");
    let untouched = claims.get("app-data").await.unwrap();
    assert_eq!(untouched.metadata.resource_version, alices.metadata.resource_version, "untouched");
    gone().await;

    // Alice re-creates her container: her disk again.
    create("alice").await;
    wait_ready(&workloads, "app", Phase::Running).await;
    let again = claims.get("app-data").await.unwrap();
    assert_eq!(again.uid(), alices.uid(), "re-attached");
    let mounted = deployments.get("app").await.unwrap().spec.unwrap().template.spec.unwrap().volumes.unwrap();
    assert_eq!(mounted[0].persistent_volume_claim.as_ref().unwrap().claim_name, "app-data");
}

/// Growing a volume on a class that refuses expansion: reported on status.volumes, the
/// workload keeps running and rolling out, and the size can be put back.
#[tokio::test]
async fn a_refused_expansion_never_wedges_the_workload() {
    let ns = TestNamespace::new("volumes-no-expansion").await;
    let storage = Storage::with_expansion(&ns, 1, "5Gi", false).await;
    let (workloads, claims, deployments) =
        (ns.api::<ManagedWorkload>(), ns.api::<PersistentVolumeClaim>(), ns.api::<Deployment>());
    apply(&workloads, "web", spec("nginx:1", "Running", data(&storage.class, "1Gi", "Retain"))).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let uid = claim(&claims, "web-data").await.uid();

    apply(&workloads, "web", spec("nginx:1", "Running", data(&storage.class, "2Gi", "Retain"))).await.unwrap();
    let refused = wait_until(&workloads, "web", "status.volumes to report the refusal", TIMEOUT, |mw| {
        mw.and_then(|mw| mw.status.as_ref()?.volumes.first()?.message.clone()).is_some_and(|m| m.contains("refused"))
    })
    .await
    .unwrap();
    let message = volume_status(&refused).message.clone().unwrap();
    assert!(message.contains("stays at 1Gi") && message.contains("set the size back to 1Gi"), "{message}");
    let running = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(support::workload::condition(&running, "Stalled").status, "False", "a refused expansion stalls nothing");

    // An image change still rolls out.
    apply(&workloads, "web", spec("nginx:2", "Running", data(&storage.class, "2Gi", "Retain"))).await.unwrap();
    wait_until(&deployments, "web", "the new image in the Deployment", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(|d| d.spec.as_ref()?.template.spec.as_ref()?.containers[0].image.clone()).as_deref()
            == Some("nginx:2")
    })
    .await;
    let rolled = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(rolled.status.as_ref().unwrap().observed_generation, rolled.metadata.generation);
    // The rollout's reconciles did not send the refused expansion again: it waits out its
    // backoff (10 s after the first refusal) whatever else happens meanwhile.
    let user = std::env::var("MW_TEST_OPERATOR_USER").unwrap_or_else(|_| "mw-operator".into());
    let refused: Vec<_> = audit::timed_refused_writes_by(&user, &ns.name)
        .into_iter()
        .filter(|(_, w)| w.resource == "persistentvolumeclaims")
        .map(|(at, _)| at)
        .collect();
    let first = *refused.first().expect("the refused expansion in the audit log");
    let backoff = k8s_openapi::jiff::SignedDuration::from_secs(10);
    let within = refused.iter().filter(|at| **at < first + backoff).count();
    assert_eq!(within, 1, "the refused expansion was sent again within its backoff: {refused:?}");

    // Put back: accepted, the refusal cleared, the same claim.
    apply(&workloads, "web", spec("nginx:2", "Running", data(&storage.class, "1Gi", "Retain"))).await.unwrap();
    wait_until(&workloads, "web", "the refusal to clear", TIMEOUT, |mw| {
        mw.and_then(|mw| mw.status.as_ref()).is_some_and(|s| {
            s.observed_generation == mw.and_then(|m| m.metadata.generation)
                && s.volumes.first().is_some_and(|v| !v.message.as_deref().unwrap_or("").contains("refused"))
        })
    })
    .await;
    assert_eq!(claims.get("web-data").await.unwrap().uid(), uid);
}

/// Deleted and at once re-created under its name: while garbage collection removes the
/// predecessor's Deployment, Service and claim, the new workload waits (Creating,
/// Reconciling), never Failed or Stalled, which would make Argo CD or Flux abort a sync.
/// Garbage collection takes moments; a finalizer of the test's own on each predecessor's
/// Deployment (and Service) holds them in deletion long enough to see the wait every time
/// (and the Deployment's Pods, so the `Delete` claim they use stays in deletion too).
#[tokio::test]
async fn delete_and_recreate_is_a_wait_not_a_failure() {
    use kube::api::{Patch, PatchParams};
    let ns = TestNamespace::new("volumes-recreate").await;
    let storage = Storage::new(&ns, 2, "1Gi").await;
    let (workloads, deployments, services, claims) =
        (ns.api::<ManagedWorkload>(), ns.api::<Deployment>(), ns.api::<Service>(), ns.api::<PersistentVolumeClaim>());
    // `web`: a Service, no volume (the Deployment's wait); `disk`: a `Delete` volume (the claim's).
    let web =
        json!({"image": "nginx:1", "ports": [{"containerPort": 80, "name": "http"}], "service": {"type": "ClusterIP"}});
    let disk = spec("nginx:1", "Running", data(&storage.class, "1Gi", "Delete"));
    let hold = json!({"metadata": {"finalizers": ["mw-operator.test/hold"]}});
    let release = json!({"metadata": {"finalizers": null}});
    let mut uids = Vec::new();
    for (name, s) in [("web", &web), ("disk", &disk)] {
        apply(&workloads, name, s.clone()).await.unwrap();
        uids.push(wait_ready(&workloads, name, Phase::Running).await.uid());
        deployments.patch(name, &PatchParams::default(), &Patch::Merge(&hold)).await.unwrap();
    }
    services.patch("web", &PatchParams::default(), &Patch::Merge(&hold)).await.unwrap();

    let mut logs = Vec::new();
    for (name, s, waits_for) in [("web", &web, "Deployment web"), ("disk", &disk, "PersistentVolumeClaim disk-data")] {
        workloads.delete(name, &DeleteParams::background()).await.unwrap();
        wait_until(&workloads, name, "the workload to go", TIMEOUT, |mw| mw.is_none()).await;
        wait_until(
            &deployments,
            name,
            "garbage collection to delete the Deployment",
            TIMEOUT,
            |d: Option<&Deployment>| d.is_some_and(|d| d.metadata.deletion_timestamp.is_some()),
        )
        .await;
        apply(&workloads, name, s.clone()).await.unwrap();
        logs.push(
            support::workload::WatchLog::start(&workloads, name, |mw| {
                let status = mw.status.as_ref()?;
                let stalled = status.conditions.iter().any(|c| c.type_ == "Stalled" && c.status == "True");
                Some((status.phase, stalled))
            })
            .await,
        );
        let waiting = wait_condition(&workloads, name, "Reconciling", "True").await;
        let reconciling = support::workload::condition(&waiting, "Reconciling");
        assert_eq!(reconciling.reason, "WaitingForDeletion", "{name}: {reconciling:?}");
        assert!(
            reconciling.message.contains(&format!("waiting for {waits_for} to be deleted")),
            "{}",
            reconciling.message
        );
        assert_eq!(waiting.status.as_ref().unwrap().phase, Some(Phase::Creating));
    }

    // Collected: each new workload gets its own objects, and runs.
    for name in ["web", "disk"] {
        deployments.patch(name, &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    }
    services.patch("web", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    for ((name, log), old) in ["web", "disk"].into_iter().zip(&logs).zip(&uids) {
        let again = wait_ready(&workloads, name, Phase::Running).await;
        assert_ne!(&again.uid(), old);
        log.alive().await;
        let seen = log.seen();
        assert!(seen.iter().all(|(phase, stalled)| *phase != Some(Phase::Failed) && !stalled), "{name}: {seen:?}");
    }
    let new_claim = claim(&claims, "disk-data").await;
    assert_eq!(
        new_claim.owner_references()[0].uid,
        workloads.get("disk").await.unwrap().uid().unwrap(),
        "its own claim"
    );
}
