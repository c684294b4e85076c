//! The Deployment room: the Deployment a ManagedWorkload should have, a pure function of the
//! CR, so every rule about names, labels, replicas and the pod template is unit-tested without
//! a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, Container, ContainerPort, EnvVar, EnvVarSource, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, ResourceRequirements, SecretKeySelector, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use super::ownership::{fingerprint, labels, selector_labels, stamp_applied_hash};
use crate::resource::{
    AccessMode, DesiredState, ManagedWorkload, ManagedWorkloadSpec, Protocol, ResourceList, UpdateStrategy,
};

/// Name of the single container in every workload Pod.
pub const CONTAINER_NAME: &str = "workload";
/// Fingerprint of the pod template, stamped on it so a Pod tells which template it runs.
pub const TEMPLATE_HASH_ANNOTATION: &str = "opensource-server.mieweb.org/template-hash";

/// Old ReplicaSets kept per workload; each costs etcd space and watch traffic, and the
/// operator reverts a `kubectl rollout undo` anyway.
const REVISION_HISTORY_LIMIT: i32 = 3;

/// The desired Deployment, ready for server-side apply. `None` when the CR has no UID yet
/// (it was never stored, so nothing can be owned by it).
pub fn deployment(mw: &ManagedWorkload) -> Option<Deployment> {
    let owner = mw.controller_owner_ref(&())?;
    let labels = labels(mw);
    let mut template = pod_template(mw, &labels);
    let hash = fingerprint(&template);
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(Default::default)
        .insert(TEMPLATE_HASH_ANNOTATION.into(), hash);

    let spec = &mw.spec;
    let strategy = match update_strategy(spec) {
        // Spelled out rather than left to API defaults: fields this manager owns are removed
        // when a later apply switches to Recreate, which rejects any rollingUpdate block.
        UpdateStrategy::RollingUpdate => DeploymentStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: Some(IntOrString::Int(1)),
                max_unavailable: Some(IntOrString::Int(0)),
            }),
        },
        UpdateStrategy::Recreate => DeploymentStrategy { type_: Some("Recreate".into()), rolling_update: None },
    };

    let mut deployment = Deployment {
        metadata: ObjectMeta {
            name: Some(mw.name_any()),
            namespace: mw.namespace(),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(desired_replicas(mw)),
            selector: LabelSelector { match_labels: Some(selector_labels(mw)), ..Default::default() },
            template,
            strategy: Some(strategy),
            progress_deadline_seconds: Some(spec.progress_deadline_seconds.unwrap_or(600)),
            revision_history_limit: Some(REVISION_HISTORY_LIMIT),
            ..Default::default()
        }),
        status: None,
    };
    stamp_applied_hash(&mut deployment);
    Some(deployment)
}

/// The rollout strategy: the spec's, else `Recreate` when a volume can be mounted by one node
/// or Pod at a time (a surge Pod could never mount it while the old one holds it), else
/// `RollingUpdate`. An explicit `RollingUpdate` with such a volume is refused by the CRD.
pub fn update_strategy(spec: &ManagedWorkloadSpec) -> UpdateStrategy {
    spec.update_strategy.unwrap_or(if spec.volumes.iter().any(|v| v.access_mode() != AccessMode::ReadWriteMany) {
        UpdateStrategy::Recreate
    } else {
        UpdateStrategy::RollingUpdate
    })
}

/// The Pod's volumes: one per `spec.volumes` entry, each its claim, named as in the spec.
fn pod_volumes(mw: &ManagedWorkload) -> Option<Vec<Volume>> {
    let volumes = &mw.spec.volumes;
    (!volumes.is_empty()).then(|| {
        volumes
            .iter()
            .map(|v| Volume {
                name: v.name.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: super::claims::claim_name(&mw.name_any(), &v.name),
                    read_only: None,
                }),
                ..Default::default()
            })
            .collect()
    })
}

/// The container's mounts of those volumes.
fn volume_mounts(mw: &ManagedWorkload) -> Option<Vec<VolumeMount>> {
    let volumes = &mw.spec.volumes;
    (!volumes.is_empty()).then(|| {
        volumes
            .iter()
            .map(|v| VolumeMount { name: v.name.clone(), mount_path: v.mount_path.clone(), ..Default::default() })
            .collect()
    })
}

/// 1 while the workload should run, 0 when stopped.
pub fn desired_replicas(mw: &ManagedWorkload) -> i32 {
    match mw.spec.desired_state() {
        DesiredState::Running => 1,
        DesiredState::Stopped => 0,
    }
}

fn pod_template(mw: &ManagedWorkload, labels: &BTreeMap<String, String>) -> PodTemplateSpec {
    let spec = &mw.spec;
    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(spec.image.clone()),
        command: non_empty(&spec.command),
        args: non_empty(&spec.args),
        env: (!spec.env.is_empty()).then(|| spec.env.iter().map(env_var).collect()),
        resources: spec.resources.as_ref().map(|r| ResourceRequirements {
            requests: r.requests.as_ref().and_then(resource_list),
            limits: r.limits.as_ref().and_then(resource_list),
            ..Default::default()
        }),
        ports: (!spec.ports.is_empty()).then(|| {
            spec.ports
                .iter()
                .map(|p| ContainerPort {
                    container_port: p.container_port,
                    name: p.name.clone(),
                    protocol: Some(p.protocol.unwrap_or(Protocol::TCP).as_str().to_string()),
                    ..Default::default()
                })
                .collect()
        }),
        volume_mounts: volume_mounts(mw),
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            // The template hash is inserted after these, so no annotation can replace it.
            annotations: (!spec.pod_annotations.is_empty()).then(|| spec.pod_annotations.clone()),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            hostname: spec.hostname.clone(),
            automount_service_account_token: Some(spec.automount_service_account_token.unwrap_or(false)),
            enable_service_links: Some(spec.enable_service_links.unwrap_or(false)),
            volumes: pod_volumes(mw),
            ..Default::default()
        }),
    }
}

fn non_empty(list: &[String]) -> Option<Vec<String>> {
    (!list.is_empty()).then(|| list.to_vec())
}

fn env_var(var: &crate::resource::EnvVar) -> EnvVar {
    EnvVar {
        name: var.name.clone(),
        // The API server drops an empty value (`value: ""` means unset to a Pod anyway);
        // sending it would make the stored object differ from the applied one.
        value: var.value.clone().filter(|v| !v.is_empty()),
        value_from: var.value_from.as_ref().map(|from| EnvVarSource {
            secret_key_ref: from.secret_key_ref.as_ref().map(|r| SecretKeySelector {
                name: r.name.clone(),
                key: r.key.clone(),
                optional: r.optional,
            }),
            config_map_key_ref: from.config_map_key_ref.as_ref().map(|r| ConfigMapKeySelector {
                name: r.name.clone(),
                key: r.key.clone(),
                optional: r.optional,
            }),
            ..Default::default()
        }),
    }
}

fn resource_list(list: &ResourceList) -> Option<BTreeMap<String, Quantity>> {
    let map: BTreeMap<String, Quantity> = [("cpu", &list.cpu), ("memory", &list.memory)]
        .into_iter()
        .filter_map(|(name, q)| q.as_ref().map(|q| (name.to_string(), Quantity(q.0.clone()))))
        .collect();
    (!map.is_empty()).then_some(map)
}

/// The template hash the desired Deployment carries, for comparing against Pods.
pub fn current_template_hash(deployment: &Deployment) -> Option<&str> {
    deployment
        .spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(TEMPLATE_HASH_ANNOTATION)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::ownership::{INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGED_LABEL, MANAGER_NAME};
    use crate::resource::{CONTAINER_ID_LABEL, NODE_ID_LABEL};
    use crate::resource::{EnvVarSource as MwEnvVarSource, KeyRef, ManagedWorkloadSpec, Resources};

    fn workload(spec: ManagedWorkloadSpec) -> ManagedWorkload {
        let mut mw = ManagedWorkload::new("web", spec);
        mw.metadata.namespace = Some("apps".into());
        mw.metadata.uid = Some("uid-1".into());
        mw
    }

    fn nginx() -> ManagedWorkloadSpec {
        ManagedWorkloadSpec { image: "nginx:latest".into(), ..Default::default() }
    }

    fn container(d: &Deployment) -> &Container {
        &d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
    }

    #[test]
    fn running_is_one_replica_and_stopped_is_zero() {
        let d = deployment(&workload(nginx())).unwrap();
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(1));
        let d = deployment(&workload(ManagedWorkloadSpec { state: Some(DesiredState::Stopped), ..nginx() })).unwrap();
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(0));
    }

    #[test]
    fn owned_by_the_workload_as_controller() {
        let d = deployment(&workload(nginx())).unwrap();
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("ManagedWorkload", "web", "uid-1"));
        assert_eq!(owner.controller, Some(true));
        assert_eq!(d.metadata.name.as_deref(), Some("web"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("apps"));
    }

    #[test]
    fn no_deployment_for_an_unstored_workload() {
        let mut mw = workload(nginx());
        mw.metadata.uid = None;
        assert!(deployment(&mw).is_none());
    }

    #[test]
    fn identity_labels_are_copied_and_ours_cannot_be_overridden() {
        let mut mw = workload(nginx());
        mw.metadata.labels = Some(BTreeMap::from([
            (NODE_ID_LABEL.to_string(), "3".to_string()),
            (CONTAINER_ID_LABEL.to_string(), "42".to_string()),
            (INSTANCE_LABEL.to_string(), "hijack".to_string()),
            (MANAGED_BY_LABEL.to_string(), "someone-else".to_string()),
            ("team".to_string(), "x".to_string()),
        ]));
        let d = deployment(&mw).unwrap();
        let template_labels = d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.clone().unwrap();
        for l in [d.metadata.labels.clone().unwrap(), template_labels] {
            assert_eq!(l[INSTANCE_LABEL], "web");
            assert_eq!(l[MANAGED_BY_LABEL], MANAGER_NAME);
            assert_eq!(l[MANAGED_LABEL], "true");
            assert_eq!(l[NODE_ID_LABEL], "3");
            assert_eq!(l[CONTAINER_ID_LABEL], "42");
            assert!(!l.contains_key("team"));
        }
        let selector = d.spec.unwrap().selector.match_labels.unwrap();
        assert_eq!(
            selector,
            BTreeMap::from([(INSTANCE_LABEL.into(), "web".into()), (MANAGED_LABEL.into(), "true".into())])
        );
    }

    #[test]
    fn pod_template_carries_the_spec() {
        let spec = ManagedWorkloadSpec {
            command: vec!["/bin/sh".into(), "-c".into()],
            args: vec!["sleep infinity".into()],
            env: vec![
                crate::resource::EnvVar { name: "A".into(), value: Some("1".into()), value_from: None },
                crate::resource::EnvVar {
                    name: "PASSWORD".into(),
                    value: None,
                    value_from: Some(MwEnvVarSource {
                        secret_key_ref: Some(KeyRef { name: "db".into(), key: "password".into(), optional: None }),
                        config_map_key_ref: None,
                    }),
                },
            ],
            resources: Some(Resources {
                requests: Some(ResourceList { cpu: Some(crate::resource::Quantity("250m".into())), memory: None }),
                limits: Some(ResourceList { cpu: None, memory: Some(crate::resource::Quantity("1Gi".into())) }),
            }),
            hostname: Some("box".into()),
            ports: vec![crate::resource::ContainerPort {
                container_port: 80,
                name: Some("http".into()),
                protocol: None,
            }],
            ..nginx()
        };
        let d = deployment(&workload(spec)).unwrap();
        let c = container(&d);
        assert_eq!(c.name, CONTAINER_NAME);
        assert_eq!(c.image.as_deref(), Some("nginx:latest"));
        assert_eq!(c.command.as_deref(), Some(&["/bin/sh".to_string(), "-c".to_string()][..]));
        assert_eq!(c.args.as_deref(), Some(&["sleep infinity".to_string()][..]));
        let env = c.env.as_ref().unwrap();
        assert_eq!(env[0].value.as_deref(), Some("1"));
        let secret = env[1].value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((secret.name.as_str(), secret.key.as_str()), ("db", "password"));
        let res = c.resources.as_ref().unwrap();
        assert_eq!(res.requests.as_ref().unwrap()["cpu"].0, "250m");
        assert_eq!(res.limits.as_ref().unwrap()["memory"].0, "1Gi");
        assert!(!res.requests.as_ref().unwrap().contains_key("memory"));
        assert_eq!(c.ports.as_ref().unwrap()[0].protocol.as_deref(), Some("TCP"));
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(pod.hostname.as_deref(), Some("box"));
    }

    #[test]
    fn service_account_token_and_service_links_are_off_unless_asked() {
        let d = deployment(&workload(nginx())).unwrap();
        let pod = d.spec.as_ref().unwrap().template.spec.clone().unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.enable_service_links, Some(false));
        let spec = ManagedWorkloadSpec {
            automount_service_account_token: Some(true),
            enable_service_links: Some(true),
            ..nginx()
        };
        let pod = deployment(&workload(spec)).unwrap().spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(true));
        assert_eq!(pod.enable_service_links, Some(true));
    }

    #[test]
    fn strategy_defaults_to_a_surging_rolling_update_and_can_recreate() {
        let d = deployment(&workload(nginx())).unwrap();
        let s = d.spec.as_ref().unwrap().strategy.clone().unwrap();
        assert_eq!(s.type_.as_deref(), Some("RollingUpdate"));
        let ru = s.rolling_update.unwrap();
        assert_eq!((ru.max_surge, ru.max_unavailable), (Some(IntOrString::Int(1)), Some(IntOrString::Int(0))));
        assert_eq!(d.spec.as_ref().unwrap().progress_deadline_seconds, Some(600));

        let spec = ManagedWorkloadSpec {
            update_strategy: Some(UpdateStrategy::Recreate),
            progress_deadline_seconds: Some(30),
            ..nginx()
        };
        let d = deployment(&workload(spec)).unwrap();
        let s = d.spec.as_ref().unwrap().strategy.clone().unwrap();
        assert_eq!(s.type_.as_deref(), Some("Recreate"));
        assert!(s.rolling_update.is_none());
        assert_eq!(d.spec.as_ref().unwrap().progress_deadline_seconds, Some(30));
    }

    #[test]
    fn volumes_are_mounted_from_their_claims_and_one_node_volumes_recreate() {
        let data = |mode| crate::resource::Volume {
            name: "data".into(),
            mount_path: "/var/lib/data".into(),
            size: "1Gi".into(),
            storage_class_name: None,
            access_mode: mode,
            retention_policy: None,
        };
        let d = deployment(&workload(ManagedWorkloadSpec { volumes: vec![data(None)], ..nginx() })).unwrap();
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let v = &pod.volumes.as_ref().unwrap()[0];
        assert_eq!(v.name, "data");
        assert_eq!(v.persistent_volume_claim.as_ref().unwrap().claim_name, "web-data");
        let m = &container(&d).volume_mounts.as_ref().unwrap()[0];
        assert_eq!((m.name.as_str(), m.mount_path.as_str()), ("data", "/var/lib/data"));
        assert_eq!(d.spec.as_ref().unwrap().strategy.as_ref().unwrap().type_.as_deref(), Some("Recreate"));
        let shared = ManagedWorkloadSpec { volumes: vec![data(Some(AccessMode::ReadWriteMany))], ..nginx() };
        assert_eq!(update_strategy(&shared), UpdateStrategy::RollingUpdate);
        let rwop = ManagedWorkloadSpec { volumes: vec![data(Some(AccessMode::ReadWriteOncePod))], ..nginx() };
        assert_eq!(update_strategy(&rwop), UpdateStrategy::Recreate);
        assert_eq!(update_strategy(&nginx()), UpdateStrategy::RollingUpdate);
        let none = deployment(&workload(nginx())).unwrap();
        assert!(none.spec.unwrap().template.spec.unwrap().volumes.is_none());
    }

    #[test]
    fn template_hash_follows_the_template_but_not_replicas() {
        let hash = |spec| current_template_hash(&deployment(&workload(spec)).unwrap()).unwrap().to_string();
        let base = hash(nginx());
        assert_eq!(base.len(), 16);
        assert_eq!(base, hash(nginx()), "deterministic");
        assert_eq!(base, hash(ManagedWorkloadSpec { state: Some(DesiredState::Stopped), ..nginx() }));
        assert_ne!(base, hash(ManagedWorkloadSpec { image: "nginx:1.27".into(), ..nginx() }));
    }
}
