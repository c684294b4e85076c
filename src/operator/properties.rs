//! Property tests of the pure parts: for any CR and any observed world, building the desired
//! Deployment and deriving the status never panic, always give a well-formed result, and are
//! idempotent (a second pass over the same world changes nothing, so writes nothing).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

use super::deployment::{self as desired, CONTAINER_NAME};
use super::{drift, status};
use crate::names::TEMPLATE_HASH_ANNOTATION;
use crate::resource::{
    ContainerPort, DesiredState, EnvVar, EnvVarSource, KeyRef, ManagedWorkload, ManagedWorkloadSpec,
    ManagedWorkloadStatus, Phase, Protocol, Quantity, ResourceList, Resources, UpdateStrategy,
};

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(second).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn quantity() -> impl Strategy<Value = Option<Quantity>> {
    proptest::option::of(prop_oneof![Just("1000m".to_string()), Just("1Gi".to_string()), ".{0,8}"].prop_map(Quantity))
}

fn resource_list() -> impl Strategy<Value = Option<ResourceList>> {
    proptest::option::of((quantity(), quantity()).prop_map(|(cpu, memory)| ResourceList { cpu, memory }))
}

fn env_var() -> impl Strategy<Value = EnvVar> {
    let key_ref = ("[a-z]{1,5}", "[a-z]{1,5}", proptest::option::of(any::<bool>()))
        .prop_map(|(name, key, optional)| KeyRef { name, key, optional });
    let source = (any::<bool>(), key_ref).prop_map(|(secret, r)| EnvVarSource {
        secret_key_ref: secret.then(|| r.clone()),
        config_map_key_ref: (!secret).then_some(r),
    });
    (".{0,6}", proptest::option::of(".{0,6}"), proptest::option::of(source))
        .prop_map(|(name, value, value_from)| EnvVar { name, value, value_from })
}

prop_compose! {
    fn spec()(
        image in ".{0,20}",
        command in proptest::collection::vec(".{0,6}", 0..3),
        args in proptest::collection::vec(".{0,6}", 0..3),
        env in proptest::collection::vec(env_var(), 0..4),
        resources in proptest::option::of((resource_list(), resource_list(), proptest::option::of(0i32..3)).prop_map(|(requests, limits, gpus)| Resources { requests, limits, gpus })),
        pull_secrets in proptest::collection::vec("[a-z]{1,5}", 0..2),
        service_account in proptest::option::of("[a-z]{1,5}"),
        node_selector in proptest::collection::btree_map("[a-z]{1,5}", "[a-z]{0,5}", 0..2),
        non_root in proptest::option::of(any::<bool>()),
        readiness_port in proptest::option::of(1i32..65536),
        state in proptest::option::of(prop_oneof![Just(DesiredState::Running), Just(DesiredState::Stopped)]),
        hostname in proptest::option::of("[a-z0-9-]{0,10}"),
        ports in proptest::collection::vec((any::<i32>(), proptest::option::of("[a-z]{1,4}"), proptest::option::of(prop_oneof![Just(Protocol::TCP), Just(Protocol::UDP), Just(Protocol::SCTP)])), 0..3),
        update_strategy in proptest::option::of(prop_oneof![Just(UpdateStrategy::RollingUpdate), Just(UpdateStrategy::Recreate)]),
        (progress_deadline_seconds, min_ready_seconds) in (proptest::option::of(any::<i32>()), proptest::option::of(any::<i32>())),
        automount in proptest::option::of(any::<bool>()),
        links in proptest::option::of(any::<bool>()),
        pod_annotations in proptest::collection::btree_map(".{0,12}", ".{0,6}", 0..3),
        volumes in proptest::collection::vec(volume(), 0..3),
        service in proptest::option::of(service()),
        probes in (probe(), probe(), probe()),
        system in proptest::option::of(system_container()),
    ) -> ManagedWorkloadSpec {
        ManagedWorkloadSpec {
            image, command, args, env, resources, state, hostname,
            ports: ports.into_iter().map(|(container_port, name, protocol)| ContainerPort { container_port, name, protocol }).collect(),
            update_strategy, progress_deadline_seconds, min_ready_seconds,
            automount_service_account_token: automount, enable_service_links: links,
            pod_annotations,
            image_pull_secrets: pull_secrets.into_iter().map(|name| crate::resource::LocalObjectReference { name }).collect(),
            service_account_name: service_account,
            node_selector,
            security_context: non_root
                .map(|n| Box::new(crate::resource::SecurityContext { run_as_non_root: Some(n), ..Default::default() })),
            readiness_probe: readiness_port
                .map(|port| {
                    Box::new(crate::resource::Probe {
                        tcp_socket: Some(crate::resource::TcpSocketAction { port: crate::resource::PortRef::Number(port) }),
                        ..Default::default()
                    })
                })
                .or(probes.0),
            liveness_probe: probes.1,
            startup_probe: probes.2,
            volumes,
            service,
            system_container: system.map(Box::new),
            ..Default::default()
        }
    }
}

/// A volume; names and mount paths may repeat (the CRD refuses that, the builders must not
/// panic on it).
fn volume() -> BoxedStrategy<crate::resource::Volume> {
    (
        prop_oneof![Just("data".to_string()), Just("rootfs".to_string()), "[a-z]{1,6}"],
        prop_oneof![Just("/data".to_string()), Just("/run".to_string()), "/[a-z]{1,6}"],
        prop_oneof![Just("1Gi".to_string()), Just("50Gi".to_string()), ".{0,6}"],
        proptest::option::of("[a-z]{1,6}"),
        proptest::option::of(prop_oneof![
            Just(crate::resource::AccessMode::ReadWriteOnce),
            Just(crate::resource::AccessMode::ReadWriteMany),
            Just(crate::resource::AccessMode::ReadWriteOncePod),
        ]),
        proptest::option::of(prop_oneof![
            Just(crate::resource::RetentionPolicy::Retain),
            Just(crate::resource::RetentionPolicy::Delete)
        ]),
    )
        .prop_map(|(name, mount_path, size, storage_class_name, access_mode, retention_policy)| {
            crate::resource::Volume { name, mount_path, size, storage_class_name, access_mode, retention_policy }
        })
        .boxed()
}

fn service() -> BoxedStrategy<crate::resource::ServiceSpec> {
    proptest::option::of(prop_oneof![
        Just(crate::resource::ServiceType::ClusterIP),
        Just(crate::resource::ServiceType::NodePort),
        Just(crate::resource::ServiceType::LoadBalancer),
    ])
    .prop_map(|type_| crate::resource::ServiceSpec { type_, ..Default::default() })
    .boxed()
}

/// A probe of any kind: HTTP (by number or by name), TCP, or a command.
fn probe() -> BoxedStrategy<Option<Box<crate::resource::Probe>>> {
    use crate::resource::{ExecAction, HttpGetAction, PortRef, Probe, TcpSocketAction};
    let port = prop_oneof![(1i32..65536).prop_map(PortRef::Number), "[a-z]{1,4}".prop_map(PortRef::Name)];
    let kind = prop_oneof![
        (port.clone(), proptest::option::of("/[a-z]{0,6}")).prop_map(|(port, path)| Probe {
            http_get: Some(HttpGetAction { path, port, scheme: None }),
            ..Default::default()
        }),
        port.prop_map(|port| Probe { tcp_socket: Some(TcpSocketAction { port }), ..Default::default() }),
        proptest::collection::vec(".{0,6}", 1..3)
            .prop_map(|command| Probe { exec: Some(ExecAction { command }), ..Default::default() }),
    ];
    proptest::option::of((kind, proptest::option::of(1i32..60)).prop_map(|(mut probe, period)| {
        probe.period_seconds = period;
        Box::new(probe)
    }))
    .boxed()
}

fn system_container() -> BoxedStrategy<crate::resource::SystemContainer> {
    (
        proptest::option::of(any::<bool>()),
        proptest::option::of("[a-z]{1,6}"),
        proptest::option::of(any::<bool>()),
        proptest::option::of(1i64..600),
    )
        .prop_map(|(user_namespace, runtime_class_name, privileged, stop_grace_period_seconds)| {
            crate::resource::SystemContainer {
                user_namespace,
                runtime_class_name,
                privileged,
                stop_grace_period_seconds,
            }
        })
        .boxed()
}

prop_compose! {
    fn workload()(
        spec in spec().boxed(),
        name in "[a-z][a-z0-9-]{0,20}",
        generation in 1i64..5,
        labels in proptest::collection::btree_map(".{0,12}", ".{0,6}", 0..3),
        node_id in proptest::option::of("[0-9]{1,3}"),
    ) -> ManagedWorkload {
        let mut mw = ManagedWorkload::new(&name, spec);
        mw.metadata.namespace = Some("apps".into());
        mw.metadata.uid = Some("uid-1".into());
        mw.metadata.generation = Some(generation);
        let mut labels: BTreeMap<String, String> = labels;
        if let Some(id) = node_id {
            labels.insert(crate::names::NODE_ID_LABEL.into(), id);
        }
        mw.metadata.labels = Some(labels);
        mw
    }
}

fn phase() -> impl Strategy<Value = Phase> {
    prop_oneof![
        Just(Phase::Creating),
        Just(Phase::Running),
        Just(Phase::Updating),
        Just(Phase::Stopping),
        Just(Phase::Stopped),
        Just(Phase::Failed),
    ]
}

fn deployment_condition() -> impl Strategy<Value = DeploymentCondition> {
    let type_ = prop_oneof![Just("Available"), Just("Progressing"), Just("ReplicaFailure")];
    let reason = prop_oneof![
        Just("MinimumReplicasAvailable"),
        Just("NewReplicaSetAvailable"),
        Just("ProgressDeadlineExceeded"),
        Just("FailedCreate"),
        Just("ReplicaSetUpdated"),
    ];
    (type_, any::<bool>(), reason, ".{0,10}", 0i64..2000).prop_map(|(type_, status, reason, message, t)| {
        DeploymentCondition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: Some(at(t)),
            last_update_time: Some(at(t)),
        }
    })
}

/// One Pod in any state a kubelet (or an eviction) can leave it in.
fn pod() -> impl Strategy<Value = (bool, Pod)> {
    let phase = prop_oneof![Just("Pending"), Just("Running"), Just("Failed"), Just("Succeeded")];
    let waiting = proptest::option::of(prop_oneof![
        Just("ImagePullBackOff"),
        Just("ErrImagePull"),
        Just("CrashLoopBackOff"),
        Just("CreateContainerConfigError"),
        Just("InvalidImageName"),
        Just("ContainerCreating"),
    ]);
    let state = prop_oneof![
        // Kubelet messages; upper case, so they never spell a Pod name by chance.
        (waiting, "[A-Z ]{0,10}").prop_map(|(reason, message)| ContainerState {
            waiting: Some(ContainerStateWaiting { reason: reason.map(Into::into), message: Some(message) }),
            ..Default::default()
        }),
        (0i64..2000).prop_map(|t| ContainerState {
            running: Some(ContainerStateRunning { started_at: Some(at(t)) }),
            ..Default::default()
        }),
        Just(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                reason: Some("Error".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
    ];
    (
        any::<bool>(),
        phase,
        state,
        0i32..4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        "[a-z0-9]{1,6}",
        proptest::option::of("10\\.0\\.0\\.[0-9]"),
    )
        .prop_map(|(current, phase, state, restarts, last_terminated, ready, deleting, name, ip)| {
            let mut p = Pod::default();
            p.metadata.name = Some(format!("web-{name}"));
            p.metadata.uid = Some(format!("uid-{name}"));
            if deleting {
                p.metadata.deletion_timestamp = Some(at(1500));
            }
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                pod_ip: ip,
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                container_statuses: Some(vec![ContainerStatus {
                    name: CONTAINER_NAME.into(),
                    restart_count: restarts,
                    last_state: last_terminated.then(|| ContainerState {
                        terminated: Some(ContainerStateTerminated { exit_code: 2, ..Default::default() }),
                        ..Default::default()
                    }),
                    state: Some(state),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            (current, p)
        })
}

prop_compose! {
    fn world()(
        mw in workload(),
        previous in proptest::option::of((phase(), 0i64..5)),
        has_deployment in any::<bool>(),
        dep_generation in 1i64..5,
        observed in 0i64..5,
        counts in proptest::array::uniform4(0i32..3),
        conditions in proptest::collection::vec(deployment_condition(), 0..4),
        pods in proptest::collection::vec(pod(), 0..4),
        blocked in proptest::option::of((prop_oneof![Just("DeploymentConflict"), Just("DeploymentRejected")], "[A-Z ]{0,10}")),
        now in 1000i64..3000,
    ) -> (ManagedWorkload, Option<Deployment>, Vec<Pod>, Option<status::Blocked>, Time) {
        let mut mw = mw;
        mw.status = previous.map(|(phase, generation)| ManagedWorkloadStatus {
            phase: Some(phase),
            observed_generation: Some(generation),
            ..Default::default()
        });
        let deployment = desired::deployment(&mw, &Default::default()).filter(|_| has_deployment).map(|mut d| {
            d.metadata.generation = Some(dep_generation);
            let [replicas, updated, ready, available] = counts;
            d.status = Some(DeploymentStatus {
                observed_generation: Some(observed),
                replicas: Some(replicas),
                updated_replicas: Some(updated),
                ready_replicas: Some(ready),
                available_replicas: Some(available),
                conditions: Some(conditions),
                ..Default::default()
            });
            d
        });
        let hash = deployment.as_ref().and_then(desired::current_template_hash).unwrap_or("none").to_string();
        let pods = pods
            .into_iter()
            .map(|(current, mut p)| {
                let h = if current { hash.clone() } else { "0000000000000000".into() };
                p.metadata.annotations = Some([(TEMPLATE_HASH_ANNOTATION.to_string(), h)].into());
                p
            })
            .collect();
        let blocked = blocked.map(|(reason, message)| status::Blocked::conflict(reason, message));
        (mw, deployment, pods, blocked, at(now))
    }
}

/// metav1.Condition's reason format.
fn valid_reason(reason: &str) -> bool {
    let mut chars = reason.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && reason.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
        && !reason.ends_with([',', ':'])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_desired_deployment_is_always_well_formed_and_deterministic(mw in workload()) {
        let d = desired::deployment(&mw, &Default::default()).expect("a stored CR always has a Deployment");
        let again = desired::deployment(&mw, &Default::default());
        prop_assert_eq!(Some(&d), again.as_ref(), "deterministic");
        prop_assert!(drift::same_desired(&d, &d));
        let spec = d.spec.as_ref().unwrap();
        prop_assert_eq!(spec.replicas, Some(desired::desired_replicas(&mw)));
        prop_assert!(matches!(spec.replicas, Some(0 | 1)));
        let template_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        for (k, v) in spec.selector.match_labels.as_ref().unwrap() {
            prop_assert_eq!(template_labels.get(k), Some(v), "the selector selects the template");
        }
        let pod = spec.template.spec.as_ref().unwrap();
        prop_assert_eq!(pod.containers.len(), 1);
        prop_assert_eq!(pod.containers[0].image.as_deref(), Some(mw.spec.image.as_str()));
        prop_assert!(pod.containers[0].env.iter().flatten().all(|e| e.value.as_deref() != Some("")), "no empty values sent");
        prop_assert!(desired::current_template_hash(&d).is_some() && super::ownership::applied_hash(&d).is_some());
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        prop_assert_eq!(owner.controller, Some(true));
        // Every mount names a volume of the Pod; a system container has its memory-backed
        // directories, privileged only when asked and never in a user namespace then.
        let volumes: Vec<&str> = pod.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        for mount in pod.containers[0].volume_mounts.iter().flatten() {
            prop_assert!(volumes.contains(&mount.name.as_str()), "{} mounts no volume of the Pod", mount.name);
        }
        let privileged = pod.containers[0].security_context.as_ref().and_then(|s| s.privileged) == Some(true);
        match mw.spec.system_container.as_deref() {
            Some(system) => {
                for (name, _) in crate::resource::SYSTEM_CONTAINER_TMPFS {
                    prop_assert!(volumes.contains(&name), "{} missing", name);
                }
                prop_assert_eq!(privileged, system.privileged());
                prop_assert!(!(privileged && pod.host_users == Some(false)), "privileged in a user namespace");
                prop_assert_eq!(desired::update_strategy(&mw.spec), mw.spec.update_strategy.unwrap_or(UpdateStrategy::Recreate));
            }
            None => prop_assert!(!privileged && pod.host_users.is_none() && pod.runtime_class_name.is_none()),
        }
        // The Service, when asked for, and the claims build for any spec too.
        if mw.spec.service.is_some() {
            let service = super::service::service(&mw).expect("a stored CR that asks for one has its Service");
            let json = serde_json::to_value(&service).unwrap();
            prop_assert_eq!(serde_json::from_value::<k8s_openapi::api::core::v1::Service>(json).ok(), Some(service));
        }
        let json = serde_json::to_value(&d).unwrap();
        let back: Deployment = serde_json::from_value(json).unwrap();
        prop_assert_eq!(back, d, "survives a JSON round trip");
    }

    #[test]
    fn derived_status_is_well_formed_and_a_second_pass_changes_nothing(
        (mw, deployment, pods, blocked, now) in world()
    ) {
        let observed = status::Observed {
            desired_hash: &status::desired_hash(&mw),
            deployment: deployment.as_ref(),
            pods: pods.iter().collect(),
            blocked,
            claims: vec![],
            refused: &[], service: None,
 sandbox: None,
        };
        let first = status::derive(&mw, &observed, &now);

        prop_assert!(first.phase.is_some());
        prop_assert_eq!(first.observed_generation, mw.metadata.generation);
        prop_assert_eq!(first.desired_replicas, desired::desired_replicas(&mw));
        let mut types: Vec<&str> = first.conditions.iter().map(|c| c.type_.as_str()).collect();
        types.sort_unstable();
        types.dedup();
        prop_assert_eq!(types.len(), first.conditions.len(), "each condition type once");
        for type_ in [status::READY, status::RECONCILING, status::STALLED] {
            let c = first.conditions.iter().find(|c| c.type_ == type_);
            prop_assert!(c.is_some(), "{} missing", type_);
            prop_assert_eq!(c.unwrap().observed_generation, mw.metadata.generation);
        }
        let true_of = |t: &str| first.conditions.iter().any(|c| c.type_ == t && c.status == "True");
        let summary = [status::READY, status::RECONCILING, status::STALLED].iter().filter(|t| true_of(t)).count();
        prop_assert_eq!(summary, 1, "exactly one of Ready, Reconciling, Stalled holds");
        for c in &first.conditions {
            prop_assert!(valid_reason(&c.reason), "reason {:?}", c.reason);
            prop_assert!(c.status == "True" || c.status == "False");
            prop_assert!(c.observed_generation.is_none_or(|g| g <= mw.metadata.generation.unwrap_or(0)));
            if !status::MIRRORED.contains(&c.type_.as_str()) {
                for p in &pods {
                    let name = p.metadata.name.as_deref().unwrap();
                    prop_assert!(!c.message.contains(name), "{} names a Pod: {}", c.type_, c.message);
                }
            }
        }
        if mw.spec.desired_state() == DesiredState::Stopped {
            prop_assert!(first.pod_ip.is_none());
        }

        let mut again = mw.clone();
        again.status = Some(first.clone());
        prop_assert_eq!(&status::derive(&again, &observed, &now), &first, "idempotent");
    }
}
