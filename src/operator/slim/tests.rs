//! Objects as a control plane serves them (tests/fixtures/cluster: one workload, its
//! Deployment and its Pod, read back with `kubectl get -o json --show-managed-fields`), and
//! variants of them in the states status.rs tells apart: whatever the state, the trimmed
//! objects must derive exactly what the full ones do.

use super::*;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStateWaiting, PodCondition, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::operator::status::{self, Observed};
use crate::resource::{DesiredState, ManagedWorkload};

fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let text = match name {
        "deployment" => include_str!("../../../tests/fixtures/cluster/deployment.json"),
        "pod" => include_str!("../../../tests/fixtures/cluster/pod.json"),
        _ => include_str!("../../../tests/fixtures/cluster/managedworkload.json"),
    };
    serde_json::from_str(text).expect("a fixture that parses")
}

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(second).unwrap())
}

/// The captured Pod in the states a kubelet reports, each with the fields slim.rs drops
/// filled in, so that dropping them is what is tested.
fn pod_variants() -> Vec<(&'static str, Pod)> {
    let running: Pod = fixture("pod");
    let started = || running.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0].clone();
    let with = |f: &dyn Fn(&mut Pod, &mut ContainerStatus)| {
        let mut p = running.clone();
        let mut cs = started();
        cs.container_id = Some("containerd://0123".into());
        cs.image_id = "docker.io/library/nginx@sha256:0123".into();
        f(&mut p, &mut cs);
        p.status.as_mut().unwrap().container_statuses = Some(vec![cs]);
        p
    };
    let terminated = |reason: &str| ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 1,
            reason: Some(reason.into()),
            message: Some("panic: the termination log, up to 4 KiB".into()),
            container_id: Some("containerd://0123".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let waiting = |reason: &str, message: &str| ContainerState {
        waiting: Some(ContainerStateWaiting { reason: Some(reason.into()), message: Some(message.into()) }),
        ..Default::default()
    };
    vec![
        ("running and ready", with(&|_, _| {})),
        (
            "crash loop, waiting",
            with(&|_, cs| {
                cs.restart_count = 3;
                cs.ready = false;
                cs.state = Some(waiting("CrashLoopBackOff", "back-off 40s restarting failed container"));
                cs.last_state = Some(terminated("Error"));
            }),
        ),
        (
            "crash loop, running again",
            with(&|_, cs| {
                cs.restart_count = 4;
                cs.last_state = Some(terminated("OOMKilled"));
            }),
        ),
        (
            "config error",
            with(&|_, cs| {
                cs.ready = false;
                cs.state = Some(waiting("CreateContainerConfigError", "secret \"env\" not found"));
            }),
        ),
        (
            "not ready",
            with(&|p, cs| {
                cs.ready = false;
                for c in p.status.as_mut().unwrap().conditions.as_mut().unwrap() {
                    c.status = "False".into();
                }
            }),
        ),
        ("terminating", with(&|p, _| p.metadata.deletion_timestamp = Some(at(1_800_000_000)))),
        (
            "unschedulable",
            with(&|p, _| {
                let status = p.status.as_mut().unwrap();
                status.phase = Some("Pending".into());
                status.pod_ip = None;
                status.container_statuses = None;
                status.conditions = Some(vec![
                    PodCondition {
                        type_: "PodScheduled".into(),
                        status: "False".into(),
                        reason: Some("Unschedulable".into()),
                        message: Some("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.".into()),
                        last_probe_time: Some(at(1_800_000_000)),
                        ..Default::default()
                    },
                    PodCondition { type_: "Ready".into(), status: "False".into(), ..Default::default() },
                ]);
            }),
        ),
        (
            "evicted",
            with(&|p, cs| {
                let status = p.status.as_mut().unwrap();
                status.phase = Some("Failed".into());
                status.reason = Some("Evicted".into());
                status.message = Some("The node was low on resource: memory.".into());
                cs.state = Some(terminated("Error"));
            }),
        ),
    ]
}

fn workload_variants() -> Vec<(&'static str, ManagedWorkload)> {
    let running: ManagedWorkload = fixture("managedworkload");
    let mut stopped = running.clone();
    stopped.spec.state = Some(DesiredState::Stopped);
    let mut fresh = running.clone();
    fresh.status = None;
    let mut annotated = running.clone();
    annotated.metadata.annotations = Some(BTreeMap::from([(LAST_APPLIED.to_string(), "{\"kind\":\"...\"}".into())]));
    vec![("running", running), ("stopped", stopped), ("no status yet", fresh), ("kubectl-applied", annotated)]
}

fn trimmed<T: Clone>(object: &T, trim: fn(&mut T)) -> T {
    let mut t = object.clone();
    trim(&mut t);
    t
}

#[test]
fn trimmed_objects_derive_what_full_ones_do() {
    let deployment: Deployment = fixture("deployment");
    let slim_deployment = CachedDeployment::from(deployment.clone()).to_deployment();
    // The cached Deployment keeps its apply record as a fingerprint (drift reads it there).
    let mut text_trimmed = trimmed(&deployment, super::deployment);
    text_trimmed.metadata.managed_fields = None;
    assert_eq!(slim_deployment, text_trimmed);
    let now = at(1_900_000_000);
    let mut checked = 0;
    for (w, mw) in workload_variants() {
        let slim_mw = trimmed(&mw, super::workload);
        for (p, pod) in pod_variants() {
            let slim_pod = CachedPod::from(pod.clone()).to_pod();
            assert_eq!(slim_pod, trimmed(&pod, super::pod));
            for with_deployment in [true, false] {
                let full = Observed {
                    desired_hash: &status::desired_hash(&mw),
                    deployment: with_deployment.then_some(&deployment),
                    pods: vec![&pod],
                    blocked: None,
                    claims: vec![],
                    refused: &[],
                    service: None,
                    sandbox: None,
                };
                let slim = Observed {
                    desired_hash: &status::desired_hash(&slim_mw),
                    deployment: with_deployment.then_some(&slim_deployment),
                    pods: vec![&slim_pod],
                    blocked: None,
                    claims: vec![],
                    refused: &[],
                    service: None,
                    sandbox: None,
                };
                let case = format!("{w}, pod {p}, deployment {with_deployment}");
                assert_eq!(status::derive(&mw, &full, &now), status::derive(&slim_mw, &slim, &now), "{case}");
                assert_eq!(
                    status::revisit_after(&mw, &full, &now),
                    status::revisit_after(&slim_mw, &slim, &now),
                    "{case}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 4 * 8 * 2);
    let phases: std::collections::HashSet<_> = pod_variants()
        .iter()
        .map(|(_, pod)| {
            let observed = Observed {
                desired_hash: &status::desired_hash(&workload_variants()[0].1),
                deployment: Some(&slim_deployment),
                pods: vec![pod],
                blocked: None,
                claims: vec![],
                refused: &[],
                service: None,
                sandbox: None,
            };
            status::derive(&workload_variants()[0].1, &observed, &now).phase.map(|p| p.as_str())
        })
        .collect();
    assert!(phases.len() >= 3, "the variants reach several phases: {phases:?}");
}

#[test]
fn cached_objects_are_read_from_the_api_as_the_kubernetes_type_and_trimmed() {
    use kube::Resource;
    assert_eq!(CachedDeployment::api_version(&()), Deployment::api_version(&()));
    assert_eq!(CachedDeployment::plural(&()), Deployment::plural(&()));
    assert_eq!(CachedPod::kind(&()), Pod::kind(&()));
    assert_eq!(CachedPod::plural(&()), Pod::plural(&()));
    let d: CachedDeployment =
        serde_json::from_str(include_str!("../../../tests/fixtures/cluster/deployment.json")).unwrap();
    assert_eq!(d, CachedDeployment::from(fixture::<Deployment>("deployment")));
    assert_eq!(d.meta().name.as_deref(), Some("w1"));
    let p: CachedPod = serde_json::from_str(include_str!("../../../tests/fixtures/cluster/pod.json")).unwrap();
    assert_eq!(p.to_pod(), trimmed(&fixture::<Pod>("pod"), super::pod));
    // The cached types save the space of a spec struct.
    assert!(std::mem::size_of::<CachedDeployment>() * 3 < std::mem::size_of::<Deployment>());
    assert!(std::mem::size_of::<CachedPod>() * 2 < std::mem::size_of::<Pod>());
}

#[test]
fn a_status_write_is_read_back_as_its_resource_version_alone() {
    use kube::Resource;
    assert_eq!(StatusWritten::api_version(&()), ManagedWorkload::api_version(&()));
    assert_eq!(StatusWritten::plural(&()), ManagedWorkload::plural(&()));
    // The API server's answer to a status write carries the field records too: give the
    // fixture some, so the test shows they are dropped with the rest.
    let mut answer: serde_json::Value =
        serde_json::from_str(include_str!("../../../tests/fixtures/cluster/managedworkload.json")).unwrap();
    answer["metadata"]["managedFields"] = serde_json::json!([{
        "manager": "mw-operator", "operation": "Apply", "apiVersion": "opensource-server.mieweb.org/v1alpha1",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:phase": {}}}, "subresource": "status"
    }]);
    let full: ManagedWorkload = serde_json::from_value(answer.clone()).unwrap();
    assert!(full.metadata.managed_fields.is_some() && full.status.is_some(), "the answer is whole");
    let written: StatusWritten = serde_json::from_value(answer).unwrap();
    assert_eq!(
        written.meta(),
        &ObjectMeta { resource_version: full.metadata.resource_version.clone(), ..Default::default() }
    );
    assert_eq!(written.resource_version(), full.metadata.resource_version);
}

#[test]
fn trimmed_deployments_judge_drift_as_full_ones_do() {
    let mw: ManagedWorkload = fixture("managedworkload");
    let desired = crate::operator::deployment::deployment(&mw, &Default::default()).unwrap();
    let live: Deployment = fixture("deployment");
    assert!(
        crate::operator::drift::up_to_date(&desired, &live),
        "the fixture is the Deployment applied from the fixture CR"
    );
    assert!(crate::operator::drift::up_to_date(&desired, &CachedDeployment::from(live.clone())));
    assert!(
        !crate::operator::drift::up_to_date(&desired, &CachedDeployment::from(live.clone()).to_deployment()),
        "without the apply record (to_deployment is for status) nothing says it is ours"
    );

    // Someone else took over a field the operator sets: drift, in either form.
    let mut taken = live.clone();
    let own = taken.managed_fields_mut().iter_mut().find(|m| m.manager.as_deref() == Some(FIELD_MANAGER)).unwrap();
    let FieldsV1(Value::Object(fields)) = own.fields_v1.as_mut().unwrap() else { panic!("a field set") };
    let Some(Value::Object(spec)) = fields.get_mut("f:spec") else { panic!("spec fields") };
    assert!(spec.remove("f:replicas").is_some());
    assert!(!crate::operator::drift::up_to_date(&desired, &taken));
    assert!(!crate::operator::drift::up_to_date(&desired, &trimmed(&taken, super::deployment)));
    assert!(!crate::operator::drift::up_to_date(&desired, &CachedDeployment::from(taken)));

    // A spec change of the CR: a different applied hash.
    let mut changed = mw.clone();
    changed.spec.image = "nginx:1.27".into();
    let desired = crate::operator::deployment::deployment(&changed, &Default::default()).unwrap();
    assert!(!crate::operator::drift::up_to_date(&desired, &trimmed(&live, super::deployment)));
    assert!(!crate::operator::drift::up_to_date(&desired, &CachedDeployment::from(live)));
}

#[test]
fn trimming_keeps_identity_and_drops_the_rest() {
    let live: Deployment = fixture("deployment");
    let d = trimmed(&live, super::deployment);
    assert_eq!((d.metadata.name.as_deref(), d.metadata.namespace.as_deref()), (Some("w1"), Some("default")));
    assert_eq!(d.metadata.uid, live.metadata.uid);
    assert_eq!(d.metadata.resource_version, live.metadata.resource_version);
    assert_eq!(d.metadata.generation, live.metadata.generation);
    assert_eq!(d.metadata.owner_references, live.metadata.owner_references);
    assert_eq!(d.status, live.status);
    assert_eq!(
        crate::operator::deployment::current_template_hash(&d),
        crate::operator::deployment::current_template_hash(&live)
    );
    assert!(crate::operator::deployment::current_template_hash(&d).is_some());
    assert_eq!(crate::operator::ownership::applied_hash(&d), crate::operator::ownership::applied_hash(&live));
    assert!(d.spec.as_ref().unwrap().template.spec.is_none(), "no pod spec");
    assert_eq!(d.managed_fields().len(), 1, "only the operator's own apply record");
    assert!(d.managed_fields()[0].fields_v1.as_ref().unwrap().0.is_string());
    assert_eq!(trimmed(&d, super::deployment), d, "trimming twice changes nothing");

    let full: Pod = fixture("pod");
    let p = trimmed(&full, super::pod);
    assert!(p.managed_fields().is_empty());
    let node = full.spec.as_ref().unwrap().node_name.clone();
    assert!(node.is_some(), "the fixture is a scheduled Pod");
    assert_eq!(p.spec, Some(PodSpec { node_name: node, ..Default::default() }), "of the spec, only the node");
    let controller = full.owner_references().iter().find(|o| o.controller == Some(true)).unwrap();
    assert_eq!(p.owner_references().len(), 1, "only the controller");
    assert_eq!((p.owner_references()[0].kind.as_str(), &p.owner_references()[0].uid), ("ReplicaSet", &controller.uid));
    assert_eq!(p.labels().get(INSTANCE_LABEL), full.labels().get(INSTANCE_LABEL));
    assert_eq!(p.labels().len(), 1);
    let status = p.status.as_ref().unwrap();
    assert_eq!(status.pod_ip, full.status.as_ref().unwrap().pod_ip);
    assert!(status.conditions.iter().flatten().all(|c| c.type_ == "Ready"));
    assert_eq!(trimmed(&p, super::pod), p);

    // PodScheduled is kept while it says the Pod cannot be placed (and only then).
    let (_, unschedulable) = pod_variants().into_iter().find(|(name, _)| *name == "unschedulable").unwrap();
    let kept = trimmed(&unschedulable, super::pod).status.unwrap().conditions.unwrap();
    assert_eq!(kept.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["PodScheduled", "Ready"]);
    assert_eq!(kept[0].reason.as_deref(), Some("Unschedulable"));
    assert!(kept[0].message.as_deref().unwrap().contains("nvidia.com/gpu"));
    assert_eq!(kept[0].last_probe_time, None);
    let mut scheduled = unschedulable.clone();
    scheduled.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
    let kept = trimmed(&scheduled, super::pod).status.unwrap().conditions.unwrap();
    assert!(kept.iter().all(|c| c.type_ == "Ready"));
}

/// A claim as the API server returns it, trimmed: whose it is, whether it is up to date and
/// the status it derives are all the same as from the full claim.
#[test]
fn a_trimmed_claim_tells_the_same() {
    use crate::operator::{claims, drift};
    let mut mw = ManagedWorkload::new("web", serde_json::from_value(serde_json::json!({"image": "nginx"})).unwrap());
    mw.metadata.namespace = Some("apps".into());
    mw.metadata.uid = Some("uid-1".into());
    mw.spec.volumes = vec![crate::resource::Volume {
        name: "data".into(),
        mount_path: "/data".into(),
        size: "1Gi".into(),
        storage_class_name: Some("local".into()),
        access_mode: None,
        retention_policy: None,
    }];
    let desired = claims::claim(&mw, &mw.spec.volumes[0], None, false).unwrap();
    let mut full: PersistentVolumeClaim = serde_json::from_value(serde_json::to_value(&desired).unwrap()).unwrap();
    let fields = serde_json::json!({"f:metadata": {
        "f:annotations": {"f:opensource-server.mieweb.org/applied-hash": {}, "f:opensource-server.mieweb.org/volume-of": {},
                          "f:opensource-server.mieweb.org/workload-uid": {}},
        "f:labels": {"f:app.kubernetes.io/instance": {}, "f:app.kubernetes.io/managed-by": {}, "f:opensource-server.mieweb.org/managed": {}}},
        "f:spec": {"f:accessModes": {}, "f:resources": {"f:requests": {"f:storage": {}}}, "f:storageClassName": {}}});
    let entry = |manager: &str, operation: &str, fields: serde_json::Value| {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(fields)),
            time: Some(at(5)),
            ..Default::default()
        }
    };
    full.metadata.managed_fields = Some(vec![
        entry(FIELD_MANAGER, "Apply", fields),
        entry("kube-controller-manager", "Update", serde_json::json!({"f:status": {"f:phase": {}}})),
    ]);
    full.metadata.finalizers = Some(vec!["kubernetes.io/pvc-protection".into()]);
    full.annotations_mut().insert("pv.kubernetes.io/bind-completed".into(), "yes".into());
    full.labels_mut().insert("team".into(), "x".into());
    full.status = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
        phase: Some("Bound".into()),
        capacity: Some(
            [("storage".to_string(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()))].into(),
        ),
        ..Default::default()
    });
    let cached = CachedClaim::from(full.clone());
    let slim = cached.to_claim();
    assert!(claims::is_own(&full, &mw, &mw.spec.volumes[0]) && claims::is_own(&slim, &mw, &mw.spec.volumes[0]));
    // Its marks kept, whatever else it carries: the workload's, by kept key, and nobody else's.
    assert_eq!(cached.instance(), Some("web"));
    let mut kept = full.metadata.labels.clone().unwrap();
    kept.retain(|k, _| k != "team" && k != "opensource-server.mieweb.org/managed");
    assert_eq!(slim.metadata.labels, Some(kept));
    let mut kept = full.metadata.annotations.clone().unwrap();
    kept.remove("pv.kubernetes.io/bind-completed");
    assert_eq!(slim.metadata.annotations, Some(kept));
    assert!(drift::up_to_date(&desired, &full) && drift::up_to_date(&desired, &cached));
    assert_eq!((claims::requested(&slim), claims::capacity(&slim)), (Some("1Gi".into()), Some("1Gi".into())));
    let mut bigger = mw.clone();
    bigger.spec.volumes[0].size = "2Gi".into();
    let grown = claims::claim(&bigger, &bigger.spec.volumes[0], None, false).unwrap();
    assert!(!drift::up_to_date(&grown, &full) && !drift::up_to_date(&grown, &cached), "a change is seen in both");
    // The operator's record as the fingerprint keeps it: a field it no longer owns is seen.
    let mut taken = full.clone();
    let record = &mut taken.metadata.managed_fields.as_mut().unwrap()[0];
    record.fields_v1.as_mut().unwrap().0["f:spec"].as_object_mut().unwrap().remove("f:storageClassName");
    assert!(!drift::up_to_date(&desired, &taken) && !drift::up_to_date(&desired, &CachedClaim::from(taken.clone())));
    let derive = |c: &PersistentVolumeClaim| {
        let observed = Observed {
            desired_hash: &status::desired_hash(&mw),
            deployment: None,
            pods: vec![],
            blocked: None,
            claims: vec![c],
            refused: &[],
            service: None,
            sandbox: None,
        };
        status::derive(&mw, &observed, &at(10)).volumes
    };
    assert_eq!(derive(&full), derive(&slim));
    let records = slim.metadata.managed_fields.as_ref().unwrap();
    assert_eq!(records.len(), 1, "only the operator's own record");
    assert!(records[0].fields_v1.is_none(), "its field set is kept as a fingerprint, not as text");
    assert!(!slim.labels().contains_key("team") && slim.metadata.finalizers.is_none());
}

/// A LoadBalancer Service as the control plane served it (tests/fixtures/cluster/service.json:
/// applied by the operator for service-workload.json, its load-balancer address written as a
/// cloud controller would, a label added by hand), trimmed: the same drift verdict, the same
/// `status.service` and address.
#[test]
fn a_trimmed_service_tells_the_same() {
    use crate::operator::{drift, service};
    use k8s_openapi::api::core::v1::Service;
    use kube::Resource;
    let mw: ManagedWorkload =
        serde_json::from_str(include_str!("../../../tests/fixtures/cluster/service-workload.json")).unwrap();
    let full: Service = serde_json::from_str(include_str!("../../../tests/fixtures/cluster/service.json")).unwrap();
    let cached: CachedService =
        serde_json::from_str(include_str!("../../../tests/fixtures/cluster/service.json")).unwrap();
    let slim = cached.to_service();
    let mut text_trimmed = trimmed(&full, super::service);
    text_trimmed.metadata.managed_fields = None;
    assert_eq!(slim, text_trimmed, "the apply record is kept as a fingerprint");
    assert_eq!(CachedService::plural(&()), Service::plural(&()));

    let desired = service::service(&mw).unwrap();
    assert!(drift::up_to_date(&desired, &full), "the fixture is the Service applied from the fixture CR");
    assert!(drift::up_to_date(&desired, &cached));
    assert_eq!(service::status(&slim), service::status(&full));
    assert_eq!(service::address(&slim).as_deref(), Some("192.0.2.10"));
    assert_eq!(service::address(&full), service::address(&slim));
    assert!(service::status(&slim).ports.iter().all(|p| p.node_port.is_some()));

    // Someone else took the selector over: drift, in either form.
    let mut taken = full.clone();
    let own = taken.managed_fields_mut().iter_mut().find(|m| m.manager.as_deref() == Some(FIELD_MANAGER)).unwrap();
    let FieldsV1(Value::Object(fields)) = own.fields_v1.as_mut().unwrap() else { panic!("a field set") };
    let Some(Value::Object(spec)) = fields.get_mut("f:spec") else { panic!("spec fields") };
    assert!(spec.remove("f:selector").is_some());
    assert!(!drift::up_to_date(&desired, &taken));
    assert!(!drift::up_to_date(&desired, &trimmed(&taken, super::service)));
    assert!(!drift::up_to_date(&desired, &CachedService::from(taken)));

    // What the trimmed Service drops: other managers' records, labels, the selector and the
    // API server's defaults.
    assert!(slim.metadata.labels.is_none());
    assert!(slim.metadata.managed_fields.is_none() && cached.metadata.managed_fields.is_none());
    let spec = slim.spec.as_ref().unwrap();
    assert!(spec.selector.is_none() && spec.cluster_ips.is_none() && spec.ip_families.is_none());
    assert!(std::mem::size_of::<CachedService>() < std::mem::size_of::<Service>());
}
