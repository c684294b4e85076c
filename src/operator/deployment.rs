//! The Deployment a ManagedWorkload should have: a pure function of the CR, so every rule
//! about names, labels, replicas and the pod template is unit-tested without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapKeySelector, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    ExecAction, HTTPGetAction, LocalObjectReference, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, TCPSocketAction,
    Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use super::ownership::{fingerprint, labels, selector_labels, stamp_applied_hash};
use crate::names::TEMPLATE_HASH_ANNOTATION;
use crate::resource::{
    DesiredState, ManagedWorkload, ManagedWorkloadSpec, Protocol, ResourceList, Resources, SYSTEM_CONTAINER_TMPFS,
    SystemContainer, UpdateStrategy,
};

/// Name of the single container in every workload Pod.
pub const CONTAINER_NAME: &str = "workload";

/// Old ReplicaSets kept per workload; each costs etcd space and watch traffic, and the
/// operator reverts a `kubectl rollout undo` anyway.
const REVISION_HISTORY_LIMIT: i32 = 3;

/// The extended resource a GPU is requested as, unless the operator is told otherwise.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The Deployment's `progressDeadlineSeconds` unless the spec sets it (the Deployment API's
/// own default); waits of the workload's are bounded by it too.
pub const PROGRESS_DEADLINE_SECONDS: i32 = 600;

/// The Deployment's `minReadySeconds` unless the spec sets it. A kubelet reports a container
/// that starts and exits at once as running and Ready for about a second before it sees the
/// exit; without this the Deployment counts that Pod available and the workload is reported
/// Running (for a moment, at the new generation) after an edit that broke it.
pub const MIN_READY_SECONDS: i32 = 5;

/// Operator settings the pod template depends on (`run` flags, the same for every workload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSettings {
    /// Extended resource name `spec.resources.gpus` is requested as (`--gpu-resource-name`).
    pub gpu_resource: String,
    /// RuntimeClass of system containers that name none (`--system-container-runtime-class`).
    pub system_container_runtime_class: Option<String>,
}

impl Default for PodSettings {
    fn default() -> Self {
        PodSettings { gpu_resource: DEFAULT_GPU_RESOURCE.into(), system_container_runtime_class: None }
    }
}

/// The stop grace period of a system container that names none: longer than systemd's own
/// stop timeout (`DefaultTimeoutStopSec`, 90 s), so its services stop in order.
pub const SYSTEM_CONTAINER_STOP_GRACE_SECONDS: i64 = 120;

/// An extended resource name as Kubernetes accepts it: `domain/name`, outside the reserved
/// `kubernetes.io` domain (e.g. `nvidia.com/gpu`, `gpu.intel.com/i915`).
pub fn check_gpu_resource(name: &str) -> Result<String, String> {
    let label = |s: &str, allowed: &dyn Fn(u8) -> bool| {
        !s.is_empty()
            && s.bytes().all(allowed)
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
    };
    let Some((domain, resource)) = name.split_once('/') else {
        return Err(format!("{name:?} is not an extended resource name (domain/name, e.g. nvidia.com/gpu)"));
    };
    let domain_ok = domain.len() <= 253
        && domain
            .split('.')
            .all(|l| l.len() <= 63 && label(l, &|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    let resource_ok =
        resource.len() <= 63 && label(resource, &|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !domain_ok || !resource_ok {
        return Err(format!("{name:?} is not an extended resource name (domain/name, e.g. nvidia.com/gpu)"));
    }
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Err(format!("{name:?}: the kubernetes.io domain is reserved for native resources"));
    }
    Ok(name.to_string())
}

/// The desired Deployment, ready for server-side apply. `None` when the CR has no UID yet
/// (never stored, so nothing can be owned by it).
pub fn deployment(mw: &ManagedWorkload, settings: &PodSettings) -> Option<Deployment> {
    let owner = mw.controller_owner_ref(&())?;
    let labels = labels(mw);
    let mut template = pod_template(mw, &labels, settings);
    let hash = fingerprint(&template);
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(Default::default)
        .insert(TEMPLATE_HASH_ANNOTATION.into(), hash);

    let spec = &mw.spec;
    let strategy = match update_strategy(spec) {
        // Spelled out, not left to API defaults: fields this manager owns are then removed when a
        // later apply switches to Recreate, which rejects any rollingUpdate block.
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
            progress_deadline_seconds: Some(spec.progress_deadline_seconds.unwrap_or(PROGRESS_DEADLINE_SECONDS)),
            min_ready_seconds: Some(min_ready_seconds(spec)),
            revision_history_limit: Some(REVISION_HISTORY_LIMIT),
            ..Default::default()
        }),
        status: None,
    };
    stamp_applied_hash(&mut deployment);
    Some(deployment)
}

/// The spec's `minReadySeconds`, else the default, lowered below a progress deadline of 5 s
/// or less (the Deployment API refuses a minReadySeconds that is not below it; the CRD
/// refuses such a pair when both are set).
fn min_ready_seconds(spec: &ManagedWorkloadSpec) -> i32 {
    let progress_deadline = spec.progress_deadline_seconds.unwrap_or(PROGRESS_DEADLINE_SECONDS);
    spec.min_ready_seconds.unwrap_or(MIN_READY_SECONDS.min(progress_deadline.saturating_sub(1)).max(0))
}

/// The rollout strategy: the spec's, else `Recreate` when a surge Pod cannot or should not
/// run beside the old one, else `RollingUpdate`:
/// - any volume: a ReadWriteOnce(Pod) claim cannot be mounted twice, and a ReadWriteMany one
///   would get two writers on one disk (a Manager container expects to be alone on it);
/// - GPUs: on a full GPU pool the surge Pod could never be scheduled, and every rollout would
///   fail at its deadline;
/// - a system container: a whole machine with its hostname, one at a time.
///
/// An explicit `RollingUpdate` stays the user's choice where the CRD allows it (ReadWriteMany
/// volumes only; with GPUs, for a pool with spare capacity).
pub fn update_strategy(spec: &ManagedWorkloadSpec) -> UpdateStrategy {
    let gpus = spec.resources.as_ref().and_then(|r| r.gpus).unwrap_or(0) > 0;
    spec.update_strategy.unwrap_or(if gpus || !spec.volumes.is_empty() || spec.system_container.is_some() {
        UpdateStrategy::Recreate
    } else {
        UpdateStrategy::RollingUpdate
    })
}

/// The Pod's volumes: each `spec.volumes` entry's claim, named as in the spec, and a system
/// container's memory-backed directories (systemd mounts nothing itself in a container and
/// exits without a writable `/run`).
fn pod_volumes(mw: &ManagedWorkload) -> Option<Vec<Volume>> {
    let claims = mw.spec.volumes.iter().map(|v| Volume {
        name: v.name.clone(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: super::claims::claim_name(&mw.name_any(), &v.name),
            read_only: None,
        }),
        ..Default::default()
    });
    let memory = system_tmpfs(mw).map(|(name, _)| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource { medium: Some("Memory".into()), size_limit: None }),
        ..Default::default()
    });
    non_empty_vec(claims.chain(memory).collect())
}

fn volume_mounts(mw: &ManagedWorkload) -> Option<Vec<VolumeMount>> {
    let mut paths: Vec<(&str, &str)> =
        mw.spec.volumes.iter().map(|v| (v.name.as_str(), v.mount_path.as_str())).collect();
    for tmpfs in system_tmpfs(mw) {
        paths.push(tmpfs);
    }
    let mounts = paths.into_iter().map(|(name, path)| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    });
    non_empty_vec(mounts.collect())
}

/// A system container's memory-backed directories, as (volume name, mount path).
fn system_tmpfs(mw: &ManagedWorkload) -> impl Iterator<Item = (&'static str, &'static str)> + use<> {
    let system = mw.spec.system_container.is_some();
    SYSTEM_CONTAINER_TMPFS.into_iter().filter(move |_| system)
}

fn non_empty_vec<T>(items: Vec<T>) -> Option<Vec<T>> {
    (!items.is_empty()).then_some(items)
}

pub fn desired_replicas(mw: &ManagedWorkload) -> i32 {
    match mw.spec.desired_state() {
        DesiredState::Running => 1,
        DesiredState::Stopped => 0,
    }
}

fn pod_template(mw: &ManagedWorkload, labels: &BTreeMap<String, String>, settings: &PodSettings) -> PodTemplateSpec {
    let spec = &mw.spec;
    let system = spec.system_container.as_deref();
    let (pod_security, mut container_security) = security_contexts(spec.security_context.as_deref());
    if system.is_some_and(SystemContainer::privileged) {
        container_security.get_or_insert_with(Default::default).privileged = Some(true);
    }
    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(spec.image.clone()),
        command: non_empty(&spec.command),
        args: non_empty(&spec.args),
        env: (!spec.env.is_empty()).then(|| spec.env.iter().map(env_var).collect()),
        resources: spec.resources.as_ref().map(|r| resources(r, settings)),
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
        image_pull_policy: spec.image_pull_policy.map(wire),
        security_context: container_security,
        readiness_probe: spec.readiness_probe.as_deref().map(probe),
        liveness_probe: spec.liveness_probe.as_deref().map(probe),
        startup_probe: spec.startup_probe.as_deref().map(probe),
        // systemd writes to a console; without one its output is lost.
        tty: system.map(|_| true),
        // Its last lines say why a system container could not boot (say, a read-only cgroup); the
        // status reads them from the termination message.
        termination_message_policy: system.map(|_| "FallbackToLogsOnError".into()),
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
            // A machine has its name (systemd reads it from the kernel); a Pod's is its own.
            hostname: spec.hostname.clone().or_else(|| system.map(|_| mw.name_any())),
            automount_service_account_token: Some(spec.automount_service_account_token.unwrap_or(false)),
            enable_service_links: Some(spec.enable_service_links.unwrap_or(false)),
            volumes: pod_volumes(mw),
            image_pull_secrets: (!spec.image_pull_secrets.is_empty()).then(|| {
                spec.image_pull_secrets.iter().map(|s| LocalObjectReference { name: s.name.clone() }).collect()
            }),
            service_account_name: spec.service_account_name.clone(),
            node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
            tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.iter().map(toleration).collect()),
            priority_class_name: spec.priority_class_name.clone(),
            security_context: pod_security,
            host_users: system.filter(|s| s.user_namespace()).map(|_| false),
            runtime_class_name: system
                .and_then(|s| s.runtime_class_name.clone().or_else(|| settings.system_container_runtime_class.clone())),
            termination_grace_period_seconds: system
                .map(|s| s.stop_grace_period_seconds.unwrap_or(SYSTEM_CONTAINER_STOP_GRACE_SECONDS)),
            ..Default::default()
        }),
    }
}

/// Requests and limits. GPUs are an extended resource, which cannot be overcommitted, so the
/// count is both request and limit.
fn resources(r: &Resources, settings: &PodSettings) -> ResourceRequirements {
    let gpus = r.gpus.filter(|&n| n > 0).map(|n| (settings.gpu_resource.clone(), Quantity(n.to_string())));
    let with_gpus = |list: Option<BTreeMap<String, Quantity>>| {
        let mut list = list.unwrap_or_default();
        list.extend(gpus.clone());
        (!list.is_empty()).then_some(list)
    };
    ResourceRequirements {
        requests: with_gpus(r.requests.as_ref().and_then(resource_list)),
        limits: with_gpus(r.limits.as_ref().and_then(resource_list)),
        ..Default::default()
    }
}

/// The CR's one security context split as Kubernetes places it: user, group, fsGroup and
/// seccomp on the Pod; filesystem, privilege escalation and capabilities on the container.
/// Nothing set, nothing emitted.
fn security_contexts(
    sc: Option<&crate::resource::SecurityContext>,
) -> (Option<PodSecurityContext>, Option<SecurityContext>) {
    let Some(sc) = sc else { return (None, None) };
    let pod = PodSecurityContext {
        run_as_user: sc.run_as_user,
        run_as_group: sc.run_as_group,
        run_as_non_root: sc.run_as_non_root,
        fs_group: sc.fs_group,
        seccomp_profile: sc
            .seccomp_profile
            .as_ref()
            .map(|p| SeccompProfile { type_: wire(p.type_), localhost_profile: p.localhost_profile.clone() }),
        ..Default::default()
    };
    let container = SecurityContext {
        read_only_root_filesystem: sc.read_only_root_filesystem,
        allow_privilege_escalation: sc.allow_privilege_escalation,
        capabilities: sc
            .capabilities
            .as_ref()
            .map(|c| Capabilities { add: non_empty(&c.add), drop: non_empty(&c.drop) }),
        ..Default::default()
    };
    (
        (pod != PodSecurityContext::default()).then_some(pod),
        (container != SecurityContext::default()).then_some(container),
    )
}

/// A CR enum as Kubernetes spells it (variants are named exactly as the API's values).
fn wire(value: impl std::fmt::Debug) -> String {
    format!("{value:?}")
}

fn toleration(t: &crate::resource::Toleration) -> Toleration {
    Toleration {
        key: t.key.clone(),
        operator: t.operator.map(wire),
        value: t.value.clone(),
        effect: t.effect.map(wire),
        toleration_seconds: t.toleration_seconds,
    }
}

fn port(p: &crate::resource::PortRef) -> IntOrString {
    match p {
        crate::resource::PortRef::Number(n) => IntOrString::Int(*n),
        crate::resource::PortRef::Name(name) => IntOrString::String(name.clone()),
    }
}

fn probe(p: &crate::resource::Probe) -> Probe {
    Probe {
        http_get: p.http_get.as_ref().map(|h| HTTPGetAction {
            path: h.path.clone(),
            port: port(&h.port),
            scheme: h.scheme.map(wire),
            ..Default::default()
        }),
        tcp_socket: p.tcp_socket.as_ref().map(|t| TCPSocketAction { port: port(&t.port), host: None }),
        exec: p.exec.as_ref().map(|e| ExecAction { command: Some(e.command.clone()) }),
        initial_delay_seconds: p.initial_delay_seconds,
        period_seconds: p.period_seconds,
        timeout_seconds: p.timeout_seconds,
        success_threshold: p.success_threshold,
        failure_threshold: p.failure_threshold,
        ..Default::default()
    }
}

fn non_empty(list: &[String]) -> Option<Vec<String>> {
    (!list.is_empty()).then(|| list.to_vec())
}

fn env_var(var: &crate::resource::EnvVar) -> EnvVar {
    EnvVar {
        name: var.name.clone(),
        // The API server drops an empty value (it means unset anyway); sending it would make the
        // stored object differ from the applied one.
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
    use crate::names::{CONTAINER_ID_LABEL, INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGED_LABEL, NODE_ID_LABEL};
    use crate::operator::ownership::MANAGER_NAME;

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
        let d = deployment(&workload(nginx()), &PodSettings::default()).unwrap();
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(1));
        let d = deployment(
            &workload(ManagedWorkloadSpec { state: Some(DesiredState::Stopped), ..nginx() }),
            &PodSettings::default(),
        )
        .unwrap();
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(0));
    }

    #[test]
    fn owned_by_the_workload_as_controller() {
        let d = deployment(&workload(nginx()), &PodSettings::default()).unwrap();
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
        assert!(deployment(&mw, &PodSettings::default()).is_none());
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
        let d = deployment(&mw, &PodSettings::default()).unwrap();
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
                gpus: None,
            }),
            hostname: Some("box".into()),
            ports: vec![crate::resource::ContainerPort {
                container_port: 80,
                name: Some("http".into()),
                protocol: None,
            }],
            ..nginx()
        };
        let d = deployment(&workload(spec), &PodSettings::default()).unwrap();
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
        let d = deployment(&workload(nginx()), &PodSettings::default()).unwrap();
        let pod = d.spec.as_ref().unwrap().template.spec.clone().unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.enable_service_links, Some(false));
        let spec = ManagedWorkloadSpec {
            automount_service_account_token: Some(true),
            enable_service_links: Some(true),
            ..nginx()
        };
        let pod = deployment(&workload(spec), &PodSettings::default()).unwrap().spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(true));
        assert_eq!(pod.enable_service_links, Some(true));
    }

    #[test]
    fn strategy_defaults_to_a_surging_rolling_update_and_can_recreate() {
        let d = deployment(&workload(nginx()), &PodSettings::default()).unwrap();
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
        let d = deployment(&workload(spec), &PodSettings::default()).unwrap();
        let s = d.spec.as_ref().unwrap().strategy.clone().unwrap();
        assert_eq!(s.type_.as_deref(), Some("Recreate"));
        assert!(s.rolling_update.is_none());
        assert_eq!(d.spec.as_ref().unwrap().progress_deadline_seconds, Some(30));
    }

    #[test]
    fn min_ready_seconds_defaults_to_five_and_stays_below_the_progress_deadline() {
        let min_ready = |spec: ManagedWorkloadSpec| {
            deployment(&workload(spec), &PodSettings::default()).unwrap().spec.unwrap().min_ready_seconds
        };
        assert_eq!(min_ready(nginx()), Some(MIN_READY_SECONDS));
        assert_eq!(min_ready(ManagedWorkloadSpec { min_ready_seconds: Some(0), ..nginx() }), Some(0));
        assert_eq!(min_ready(ManagedWorkloadSpec { min_ready_seconds: Some(30), ..nginx() }), Some(30));
        for (deadline, expected) in [(6, 5), (5, 4), (2, 1), (1, 0)] {
            let spec = ManagedWorkloadSpec { progress_deadline_seconds: Some(deadline), ..nginx() };
            assert_eq!(min_ready(spec), Some(expected), "progressDeadlineSeconds {deadline}");
        }
    }

    /// On a full GPU pool a surge Pod is Unschedulable while the old Pod holds the GPU: every
    /// rollout would deadlock until its deadline.
    #[test]
    fn gpu_workloads_recreate_unless_asked_otherwise() {
        let gpu = ManagedWorkloadSpec {
            resources: Some(crate::resource::Resources { gpus: Some(1), ..Default::default() }),
            ..nginx()
        };
        let d = deployment(&workload(gpu.clone()), &PodSettings::default()).unwrap();
        let s = d.spec.unwrap().strategy.unwrap();
        assert_eq!((s.type_.as_deref(), s.rolling_update), (Some("Recreate"), None));
        let zero = ManagedWorkloadSpec {
            resources: Some(crate::resource::Resources { gpus: Some(0), ..Default::default() }),
            ..nginx()
        };
        assert_eq!(update_strategy(&zero), UpdateStrategy::RollingUpdate);
        let chosen = ManagedWorkloadSpec { update_strategy: Some(UpdateStrategy::RollingUpdate), ..gpu };
        assert_eq!(update_strategy(&chosen), UpdateStrategy::RollingUpdate);
    }

    #[test]
    fn volumes_are_mounted_from_their_claims_and_volumes_recreate() {
        let data = |mode| crate::resource::Volume {
            name: "data".into(),
            mount_path: "/var/lib/data".into(),
            size: "1Gi".into(),
            storage_class_name: None,
            access_mode: mode,
            retention_policy: None,
        };
        let d = deployment(
            &workload(ManagedWorkloadSpec { volumes: vec![data(None)], ..nginx() }),
            &PodSettings::default(),
        )
        .unwrap();
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let v = &pod.volumes.as_ref().unwrap()[0];
        assert_eq!(v.name, "data");
        assert_eq!(v.persistent_volume_claim.as_ref().unwrap().claim_name, "web-data");
        let m = &container(&d).volume_mounts.as_ref().unwrap()[0];
        assert_eq!((m.name.as_str(), m.mount_path.as_str()), ("data", "/var/lib/data"));
        assert_eq!(d.spec.as_ref().unwrap().strategy.as_ref().unwrap().type_.as_deref(), Some("Recreate"));
        let shared =
            ManagedWorkloadSpec { volumes: vec![data(Some(crate::resource::AccessMode::ReadWriteMany))], ..nginx() };
        assert_eq!(update_strategy(&shared), UpdateStrategy::Recreate, "never two writers on one data directory");
        let chosen = ManagedWorkloadSpec { update_strategy: Some(UpdateStrategy::RollingUpdate), ..shared };
        assert_eq!(
            update_strategy(&chosen),
            UpdateStrategy::RollingUpdate,
            "an explicit choice where the CRD allows it"
        );
        let rwop =
            ManagedWorkloadSpec { volumes: vec![data(Some(crate::resource::AccessMode::ReadWriteOncePod))], ..nginx() };
        assert_eq!(update_strategy(&rwop), UpdateStrategy::Recreate);
        assert_eq!(update_strategy(&nginx()), UpdateStrategy::RollingUpdate);
        let none = deployment(&workload(nginx()), &PodSettings::default()).unwrap();
        assert!(none.spec.unwrap().template.spec.unwrap().volumes.is_none());
    }

    #[test]
    fn template_hash_follows_the_template_but_not_replicas() {
        let hash = |spec| {
            current_template_hash(&deployment(&workload(spec), &PodSettings::default()).unwrap()).unwrap().to_string()
        };
        let base = hash(nginx());
        assert_eq!(base.len(), 16);
        assert_eq!(base, hash(nginx()), "deterministic");
        assert_eq!(base, hash(ManagedWorkloadSpec { state: Some(DesiredState::Stopped), ..nginx() }));
        assert_ne!(base, hash(ManagedWorkloadSpec { image: "nginx:1.27".into(), ..nginx() }));
    }

    fn pod_spec(spec: ManagedWorkloadSpec, settings: &PodSettings) -> PodSpec {
        deployment(&workload(spec), settings).unwrap().spec.unwrap().template.spec.unwrap()
    }

    fn quantity(n: &str) -> Quantity {
        Quantity(n.into())
    }

    #[test]
    fn gpus_are_requested_and_limited_as_the_configured_extended_resource() {
        let spec = || ManagedWorkloadSpec {
            resources: Some(Resources {
                requests: Some(ResourceList { cpu: Some(crate::resource::Quantity("1".into())), memory: None }),
                limits: None,
                gpus: Some(2),
            }),
            ..nginx()
        };
        let res = pod_spec(spec(), &PodSettings::default()).containers[0].resources.clone().unwrap();
        assert_eq!(res.requests.as_ref().unwrap()["nvidia.com/gpu"], quantity("2"));
        assert_eq!(res.requests.as_ref().unwrap()["cpu"], quantity("1"));
        assert_eq!(res.limits.unwrap(), BTreeMap::from([("nvidia.com/gpu".to_string(), quantity("2"))]));

        let amd = PodSettings { gpu_resource: "amd.com/gpu".into(), ..Default::default() };
        let res = pod_spec(spec(), &amd).containers[0].resources.clone().unwrap();
        assert_eq!(res.limits.unwrap()["amd.com/gpu"], quantity("2"));
        assert!(!res.requests.unwrap().contains_key("nvidia.com/gpu"));

        // Zero GPUs is none at all.
        let none =
            ManagedWorkloadSpec { resources: Some(Resources { gpus: Some(0), ..Default::default() }), ..nginx() };
        let res = pod_spec(none, &PodSettings::default()).containers[0].resources.clone().unwrap();
        assert_eq!((res.requests, res.limits), (None, None));
    }

    #[test]
    fn the_gpu_resource_name_setting_is_checked() {
        for good in ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "example.org/a_b.c-d"] {
            assert_eq!(check_gpu_resource(good).as_deref(), Ok(good));
        }
        for bad in ["gpu", "nvidia.com/", "/gpu", "Nvidia.com/gpu", "kubernetes.io/gpu", "x.kubernetes.io/gpu", "a/b/c"]
        {
            assert!(check_gpu_resource(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn registry_identity_and_placement_reach_the_pod() {
        use crate::resource::{LocalObjectReference as Name, PullPolicy, TaintEffect, TolerationOperator};
        let spec = ManagedWorkloadSpec {
            image_pull_secrets: vec![Name { name: "regcred".into() }, Name { name: "mirror".into() }],
            image_pull_policy: Some(PullPolicy::IfNotPresent),
            service_account_name: Some("runner".into()),
            node_selector: BTreeMap::from([("gpu".to_string(), "a100".to_string())]),
            tolerations: vec![crate::resource::Toleration {
                key: Some("nvidia.com/gpu".into()),
                operator: Some(TolerationOperator::Exists),
                value: None,
                effect: Some(TaintEffect::NoSchedule),
                toleration_seconds: None,
            }],
            priority_class_name: Some("high".into()),
            ..nginx()
        };
        let pod = pod_spec(spec, &PodSettings::default());
        let secrets: Vec<_> = pod.image_pull_secrets.unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(secrets, ["regcred", "mirror"]);
        assert_eq!(pod.containers[0].image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(pod.service_account_name.as_deref(), Some("runner"));
        assert_eq!(pod.node_selector.unwrap()["gpu"], "a100");
        let t = &pod.tolerations.unwrap()[0];
        assert_eq!(
            (t.key.as_deref(), t.operator.as_deref(), t.effect.as_deref(), t.value.as_deref()),
            (Some("nvidia.com/gpu"), Some("Exists"), Some("NoSchedule"), None)
        );
        assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
    }

    #[test]
    fn none_of_the_pod_options_is_set_unless_asked() {
        let pod = pod_spec(nginx(), &PodSettings::default());
        assert!(pod.image_pull_secrets.is_none() && pod.service_account_name.is_none());
        assert!(pod.node_selector.is_none() && pod.tolerations.is_none() && pod.priority_class_name.is_none());
        assert!(pod.security_context.is_none(), "images that run as root keep running");
        let c = &pod.containers[0];
        assert!(c.security_context.is_none() && c.image_pull_policy.is_none());
        assert!(c.readiness_probe.is_none() && c.liveness_probe.is_none() && c.startup_probe.is_none());
    }

    #[test]
    fn security_context_is_split_between_pod_and_container_as_kubernetes_places_it() {
        use crate::resource::{Capabilities as Caps, SeccompProfile as Profile, SeccompProfileType};
        let restricted = crate::resource::SecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(1000),
            run_as_non_root: Some(true),
            fs_group: Some(2000),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Caps { add: vec!["NET_BIND_SERVICE".into()], drop: vec!["ALL".into()] }),
            seccomp_profile: Some(Profile { type_: SeccompProfileType::RuntimeDefault, localhost_profile: None }),
        };
        let pod = pod_spec(
            ManagedWorkloadSpec { security_context: Some(Box::new(restricted)), ..nginx() },
            &Default::default(),
        );
        let psc = pod.security_context.unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.run_as_non_root, psc.fs_group),
            (Some(1000), Some(1000), Some(true), Some(2000))
        );
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let csc = pod.containers[0].security_context.clone().unwrap();
        assert_eq!((csc.read_only_root_filesystem, csc.allow_privilege_escalation), (Some(true), Some(false)));
        let caps = csc.capabilities.unwrap();
        assert_eq!(
            (caps.add.unwrap(), caps.drop.unwrap()),
            (vec!["NET_BIND_SERVICE".to_string()], vec!["ALL".to_string()])
        );
        assert!(csc.run_as_user.is_none(), "said once, on the Pod");

        // Only container settings: no empty Pod security context, and the other way round.
        let only_container =
            crate::resource::SecurityContext { read_only_root_filesystem: Some(true), ..Default::default() };
        let pod = pod_spec(
            ManagedWorkloadSpec { security_context: Some(Box::new(only_container)), ..nginx() },
            &Default::default(),
        );
        assert!(pod.security_context.is_none() && pod.containers[0].security_context.is_some());
        let only_pod = crate::resource::SecurityContext { run_as_user: Some(0), ..Default::default() };
        let pod = pod_spec(
            ManagedWorkloadSpec { security_context: Some(Box::new(only_pod)), ..nginx() },
            &Default::default(),
        );
        assert!(pod.security_context.is_some() && pod.containers[0].security_context.is_none());
    }

    #[test]
    fn probes_of_each_kind_reach_the_container() {
        use crate::resource::{
            ExecAction as Exec, HttpGetAction as Http, PortRef, Probe as P, Scheme, TcpSocketAction as Tcp,
        };
        let spec = ManagedWorkloadSpec {
            readiness_probe: Some(Box::new(P {
                http_get: Some(Http {
                    path: Some("/healthz".into()),
                    port: PortRef::Number(8080),
                    scheme: Some(Scheme::HTTPS),
                }),
                period_seconds: Some(5),
                failure_threshold: Some(2),
                ..Default::default()
            })),
            liveness_probe: Some(Box::new(P {
                tcp_socket: Some(Tcp { port: PortRef::Name("postgres".into()) }),
                initial_delay_seconds: Some(30),
                ..Default::default()
            })),
            startup_probe: Some(Box::new(P {
                exec: Some(Exec { command: vec!["pg_isready".into(), "-q".into()] }),
                timeout_seconds: Some(3),
                success_threshold: Some(1),
                ..Default::default()
            })),
            ..nginx()
        };
        let c = pod_spec(spec, &Default::default()).containers.remove(0);
        let r = c.readiness_probe.unwrap();
        let http = r.http_get.unwrap();
        assert_eq!(
            (http.path.as_deref(), http.port, http.scheme.as_deref()),
            (Some("/healthz"), IntOrString::Int(8080), Some("HTTPS"))
        );
        assert_eq!((r.period_seconds, r.failure_threshold, r.timeout_seconds), (Some(5), Some(2), None));
        let l = c.liveness_probe.unwrap();
        assert_eq!(
            (l.tcp_socket.unwrap().port, l.initial_delay_seconds),
            (IntOrString::String("postgres".into()), Some(30))
        );
        let s = c.startup_probe.unwrap();
        assert_eq!(s.exec.unwrap().command.unwrap(), ["pg_isready", "-q"]);
        assert_eq!((s.timeout_seconds, s.success_threshold), (Some(3), Some(1)));
    }

    #[test]
    fn every_pod_option_rolls_out_and_the_gpu_resource_name_only_matters_with_gpus() {
        use crate::resource::{LocalObjectReference as Name, PullPolicy};
        let hash = |spec: ManagedWorkloadSpec, settings: &PodSettings| {
            current_template_hash(&deployment(&workload(spec), settings).unwrap()).unwrap().to_string()
        };
        let base = hash(nginx(), &PodSettings::default());
        let changed: Vec<(&str, ManagedWorkloadSpec)> = vec![
            (
                "imagePullSecrets",
                ManagedWorkloadSpec { image_pull_secrets: vec![Name { name: "r".into() }], ..nginx() },
            ),
            ("imagePullPolicy", ManagedWorkloadSpec { image_pull_policy: Some(PullPolicy::Always), ..nginx() }),
            ("serviceAccountName", ManagedWorkloadSpec { service_account_name: Some("sa".into()), ..nginx() }),
            (
                "nodeSelector",
                ManagedWorkloadSpec { node_selector: BTreeMap::from([("a".into(), "b".into())]), ..nginx() },
            ),
            (
                "tolerations",
                ManagedWorkloadSpec {
                    tolerations: vec![crate::resource::Toleration {
                        key: None,
                        operator: Some(crate::resource::TolerationOperator::Exists),
                        value: None,
                        effect: None,
                        toleration_seconds: None,
                    }],
                    ..nginx()
                },
            ),
            ("priorityClassName", ManagedWorkloadSpec { priority_class_name: Some("p".into()), ..nginx() }),
            (
                "securityContext",
                ManagedWorkloadSpec {
                    security_context: Some(Box::new(crate::resource::SecurityContext {
                        run_as_non_root: Some(true),
                        ..Default::default()
                    })),
                    ..nginx()
                },
            ),
            (
                "readinessProbe",
                ManagedWorkloadSpec {
                    readiness_probe: Some(Box::new(crate::resource::Probe {
                        tcp_socket: Some(crate::resource::TcpSocketAction {
                            port: crate::resource::PortRef::Number(80),
                        }),
                        ..Default::default()
                    })),
                    ..nginx()
                },
            ),
            (
                "gpus",
                ManagedWorkloadSpec { resources: Some(Resources { gpus: Some(1), ..Default::default() }), ..nginx() },
            ),
        ];
        for (field, spec) in changed {
            assert_ne!(hash(spec, &PodSettings::default()), base, "{field} rolls out");
        }
        let amd = PodSettings { gpu_resource: "amd.com/gpu".into(), ..Default::default() };
        assert_eq!(hash(nginx(), &amd), base, "no GPUs: the setting changes nothing");
        let gpu =
            || ManagedWorkloadSpec { resources: Some(Resources { gpus: Some(1), ..Default::default() }), ..nginx() };
        assert_ne!(hash(gpu(), &amd), hash(gpu(), &PodSettings::default()));
    }

    /// A system container's Pod (issue 43): what systemd needs to boot, and nothing more.
    #[test]
    fn a_system_container_gets_what_systemd_needs() {
        let system = |sc: SystemContainer| ManagedWorkloadSpec {
            system_container: Some(Box::new(sc)),
            volumes: vec![crate::resource::Volume {
                name: "rootfs".into(),
                mount_path: "/data".into(),
                size: "1Gi".into(),
                storage_class_name: None,
                access_mode: None,
                retention_policy: None,
            }],
            ..nginx()
        };
        let settings = PodSettings { system_container_runtime_class: Some("systemd".into()), ..Default::default() };
        let pod = pod_spec(system(SystemContainer::default()), &settings);
        let c = &pod.containers[0];
        let mounts: Vec<_> =
            c.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str())).collect();
        assert_eq!(
            mounts,
            [("rootfs", "/data"), ("system-run", "/run"), ("system-run-lock", "/run/lock"), ("system-tmp", "/tmp")]
        );
        let memory: Vec<_> = pod
            .volumes
            .iter()
            .flatten()
            .filter(|v| v.empty_dir.as_ref().is_some_and(|e| e.medium.as_deref() == Some("Memory")))
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(memory, ["system-run", "system-run-lock", "system-tmp"]);
        assert_eq!(c.tty, Some(true), "a console");
        assert_eq!(c.termination_message_policy.as_deref(), Some("FallbackToLogsOnError"));
        assert_eq!(c.security_context, None, "the default capabilities; never privileged unless asked");
        assert_eq!(pod.host_users, Some(false), "a user namespace of its own by default");
        assert_eq!(pod.runtime_class_name.as_deref(), Some("systemd"), "the operator's setting");
        assert_eq!(pod.termination_grace_period_seconds, Some(SYSTEM_CONTAINER_STOP_GRACE_SECONDS));
        const { assert!(SYSTEM_CONTAINER_STOP_GRACE_SECONDS > 90, "longer than systemd's stop timeout") };
        assert_eq!(pod.hostname.as_deref(), Some("web"), "the machine's name");
        assert_eq!(update_strategy(&system(SystemContainer::default())), UpdateStrategy::Recreate);
        let no_volumes = ManagedWorkloadSpec { volumes: vec![], ..system(SystemContainer::default()) };
        assert_eq!(update_strategy(&no_volumes), UpdateStrategy::Recreate, "one machine at a time");

        // Its own RuntimeClass, no user namespace when opted out.
        let own = SystemContainer {
            runtime_class_name: Some("kata".into()),
            user_namespace: Some(false),
            stop_grace_period_seconds: Some(300),
            ..Default::default()
        };
        let pod = pod_spec(system(own), &settings);
        assert_eq!((pod.runtime_class_name.as_deref(), pod.host_users), (Some("kata"), None));
        assert_eq!(pod.termination_grace_period_seconds, Some(300));

        // Privileged only when asked, and then in the node's user namespace.
        let privileged = SystemContainer { privileged: Some(true), ..Default::default() };
        let pod = pod_spec(system(privileged), &PodSettings::default());
        assert_eq!(pod.containers[0].security_context.as_ref().and_then(|s| s.privileged), Some(true));
        assert_eq!((pod.host_users, pod.runtime_class_name.as_deref()), (None, None));

        // Not a system container: none of it.
        let plain = pod_spec(nginx(), &settings);
        assert!(plain.volumes.is_none() && plain.host_users.is_none() && plain.runtime_class_name.is_none());
        assert!(plain.containers[0].tty.is_none() && plain.termination_grace_period_seconds.is_none());
    }
}
