//! The `ManagedWorkload` custom resource (`opensource-server.mieweb.org/v1alpha1`): one
//! Manager container, run as a single-replica Deployment.
//!
//! Validation lives in the schema (OpenAPI + CEL) so the API server rejects bad input with a
//! message naming the field, before the operator ever sees it. Defaults are applied in code,
//! never in the schema: a schema default would be written into the stored object and make
//! GitOps tools (Argo CD, Flux) see a permanent diff.
//!
//! Doc comments here become the CRD's descriptions (`make crds`). Enums used as fields carry
//! `//` comments instead: a doc comment on the type would replace the field's description.

use std::collections::BTreeMap;
use std::fmt;

use crate::names::{PROVIDER_LABEL, SYNCED_BY_LABEL};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every resource this project defines.
pub const GROUP: &str = "opensource-server.mieweb.org";

/// Made for a Manager container (by the bridge or Manager's provider), whose spec Manager's
/// side re-applies: advice to edit the spec by hand would not hold.
pub fn made_for_manager(mw: &ManagedWorkload) -> bool {
    let labels = mw.metadata.labels.as_ref();
    labels.is_some_and(|l| l.contains_key(SYNCED_BY_LABEL) || l.contains_key(PROVIDER_LABEL))
}

/// A Manager container, run on Kubernetes as a Deployment of one replica (or zero when
/// stopped). The operator writes only `status`; `spec` belongs to whoever applies it.
// clippy reads each printcolumn's `type_ = ...` as a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "opensource-server.mieweb.org",
    version = "v1alpha1",
    kind = "ManagedWorkload",
    namespaced,
    shortname = "mw",
    category = "manager",
    status = "ManagedWorkloadStatus",
    doc = "A Manager container run as a single-replica Deployment. spec.state starts (Running) and stops (Stopped) it; status reports the Deployment's real state.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".spec.state",
        description = "Desired state (empty means Running)"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", description = "Observed phase"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Desired state reached"
    ),
    printcolumn(
        name = "Pod IP",
        type_ = "string",
        json_path = ".status.podIP",
        description = "Current Pod IP (ephemeral)"
    ),
    printcolumn(
        name = "Address",
        type_ = "string",
        json_path = ".status.address",
        priority = 1,
        description = "Stable address: load balancer, else cluster IP, else Pod IP"
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".spec.image",
        priority = 1,
        description = "Container image"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    // The name becomes a label value on the Deployment and its Pods (at most 63 characters);
    // reject a longer one at admission instead of failing later as DeploymentRejected.
    validation = Rule::new("self.metadata.name.size() <= 63")
        .message("metadata.name must be at most 63 characters: it is used as a label value"),
    validation = Rule::new("!has(self.spec.service) || (has(self.spec.ports) && self.spec.ports.size() > 0)")
        .message("spec.service needs at least one port in spec.ports: the Service's ports are the workload's")
        .field_path(".spec.service"),
    validation = Rule::new(ROLLING_UPDATE_NEEDS_SHARED_VOLUMES)
        .message(ROLLING_UPDATE_NEEDS_SHARED_VOLUMES_MESSAGE)
        .field_path(".spec.updateStrategy"),
    validation = Rule::new(MIN_READY_WITHIN_DEADLINE)
        .message("minReadySeconds must be less than progressDeadlineSeconds (600 when unset): a Pod must be able to \
                  become available before the rollout is reported failed")
        .field_path(".spec.minReadySeconds"),
    validation = Rule::new(SYSTEM_CONTAINER_VOLUMES)
        .message("a system container's volumes may not be named system-run, system-run-lock or system-tmp, nor \
                  mounted at /run, /run/lock or /tmp: those are its memory-backed directories")
        .field_path(".spec.volumes")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(probe_port_named("readinessProbe")).message("readinessProbe: a named port must be the name of one of spec.ports").field_path(".readinessProbe"))]
#[x_kube(validation = Rule::new(probe_port_named("livenessProbe")).message("livenessProbe: a named port must be the name of one of spec.ports").field_path(".livenessProbe"))]
#[x_kube(validation = Rule::new(probe_port_named("startupProbe")).message("startupProbe: a named port must be the name of one of spec.ports").field_path(".startupProbe"))]
pub struct ManagedWorkloadSpec {
    /// Container image to run, e.g. `nginx:1.27` or `registry.example.com/app@sha256:...`.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = Rule::new("!self.matches('\\\\s')").message("must not contain whitespace"))]
    pub image: String,

    /// Entrypoint, replacing the image's ENTRYPOINT. Not run in a shell.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    pub command: Vec<String>,

    /// Arguments to the entrypoint, replacing the image's CMD.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    pub args: Vec<String>,

    /// Environment variables. Names are unique; each has a literal `value` or a `valueFrom`
    /// reference to a Secret or ConfigMap key, passed through to the Pod (the operator never
    /// reads Secrets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Vec<EnvVar>,

    /// CPU and memory requests and limits, and GPUs, for the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,

    /// Desired state: `Running` (the default when unset) keeps one replica, `Stopped` scales
    /// to zero while keeping the Deployment and its configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<DesiredState>,

    /// Pod hostname (an RFC 1123 label). Defaults to the Pod name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub hostname: Option<String>,

    /// Annotations put on the workload's Pods, e.g. a checksum of the Secret data the Pod reads
    /// so that a change of that data rolls out a new Pod. Changing them rolls out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    #[x_kube(validation = Rule::new("self.all(k, k.size() <= 253 && self[k].size() <= 4096)").message("annotation keys are at most 253 characters and values at most 4096"))]
    pub pod_annotations: BTreeMap<String, String>,

    /// Container ports. They appear on the Pod and, with `service`, are the Service's ports
    /// (same numbers and protocols, targeting the container port by name when it has one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new(
        "self.all(p, self.exists_one(q, q.containerPort == p.containerPort && \
         (has(q.protocol) ? q.protocol : 'TCP') == (has(p.protocol) ? p.protocol : 'TCP')))"
    ).message("each containerPort/protocol pair must be unique"))]
    #[x_kube(validation = Rule::new(
        "self.all(p, !has(p.name) || self.exists_one(q, has(q.name) && q.name == p.name))"
    ).message("port names must be unique"))]
    pub ports: Vec<ContainerPort>,

    /// How a pod-template change is rolled out: `RollingUpdate` (the new Pod is started
    /// before the old one stops) or `Recreate` (the old Pod stops first). The default is
    /// `Recreate` when the workload has any volume (a disk is mounted by one Pod at a time)
    /// or asks for GPUs (a surge Pod would wait for the GPU the old one holds), otherwise
    /// `RollingUpdate`. `RollingUpdate` with a volume is allowed only when every volume is
    /// `ReadWriteMany`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,

    /// Seconds a rollout may take before it is reported as failed (`ProgressDeadlineExceeded`).
    /// Defaults to Kubernetes' 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub progress_deadline_seconds: Option<i32>,

    /// Seconds a new Pod must stay Ready, with no container exiting, before it counts as
    /// available and the workload as Running (the Deployment's `minReadySeconds`). The
    /// default, 5, keeps a container that starts and exits at once from being reported Running
    /// for the moment it ran. Must be less than `progressDeadlineSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub min_ready_seconds: Option<i32>,

    /// Mount the namespace's ServiceAccount token into the Pod. Off unless set to true: a
    /// Manager container has no business calling the Kubernetes API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automount_service_account_token: Option<bool>,

    /// Inject environment variables for every Service in the namespace. Off unless set to true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_service_links: Option<bool>,

    /// Persistent volumes: each is one PersistentVolumeClaim named `<workload>-<volume>`,
    /// mounted into the container, kept through stop, start and every rollout, and kept
    /// after the workload's deletion unless its `retentionPolicy` is `Delete`. At most 8.
    /// With any volume the workload rolls out with `Recreate` unless `updateStrategy` says
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("self.all(v, self.exists_one(w, w.mountPath == v.mountPath))")
        .message("each volume's mountPath must be unique within the workload"))]
    #[x_kube(validation = Rule::new(
        "oldSelf.all(o, self.exists(n, n.name == o.name) || !self.exists(n, n.mountPath == o.mountPath))"
    ).message(
        "a volume's mountPath is taken by a volume of another name: renaming a volume makes a new, empty claim \
         and would mount it where the old volume's data was; keep the name, or remove the old volume in a \
         change of its own first"
    ))]
    pub volumes: Vec<Volume>,

    /// A Service with the workload's ports: a stable address that does not move when the Pod
    /// is replaced (`status.address`). Named as the workload, or `mw-<name>` when the
    /// workload's name starts with a digit (a Service name must start with a letter; see
    /// docs/networking.md). Unset: no Service, and `status.address` is the serving Pod's IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceSpec>,
    // --- Where and as what the Pod runs: registry, identity, placement, security, health. ---
    // (types in the block "Pod options" below; each maps to the pod template field of the
    // same name, see src/operator/deployment.rs)
    /// Secrets in the workload's namespace holding credentials for private registries (type
    /// `kubernetes.io/dockerconfigjson`), e.g. `[{name: regcred}]`. Added to those of the
    /// ServiceAccount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// When the image is pulled: `Always`, `IfNotPresent` or `Never`. Unset, Kubernetes decides:
    /// `Always` for a `:latest` or untagged image, else `IfNotPresent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,

    /// ServiceAccount the Pod runs as, in the workload's namespace (its imagePullSecrets apply
    /// too). The namespace's `default` when unset. Its token is mounted only when
    /// `automountServiceAccountToken` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account_name: Option<String>,

    /// Labels a node must carry to run the Pod, e.g. `{"nvidia.com/gpu.product": "NVIDIA-A100"}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    #[x_kube(validation = Rule::new(NODE_SELECTOR_RULE).message("keys must be label keys ([prefix/]name) and values label values (at most 63 characters: letters, digits, '-', '_', '.')"))]
    pub node_selector: BTreeMap<String, String>,

    /// Node taints the Pod tolerates, e.g. `[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,

    /// PriorityClass of the Pod: its scheduling priority, and whether it may preempt others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub priority_class_name: Option<String>,

    /// Users, groups, capabilities and seccomp profile of the Pod and its container. Unset, the
    /// image's own user applies (often root) and nothing is restricted, which a namespace
    /// enforcing the `restricted` Pod Security Standard refuses; it needs `runAsNonRoot: true`,
    /// `allowPrivilegeEscalation: false`, `capabilities: {drop: [ALL]}` and `seccompProfile:
    /// {type: RuntimeDefault}`.
    // Boxed, as the probes below: every workload's spec is cached, and these are seldom set;
    // unset, a box costs 8 bytes where the struct costs its whole size (136 and 144).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<Box<SecurityContext>>,

    /// Checked while the container runs (exactly one of httpGet, tcpSocket or exec); the Pod,
    /// and so the workload, is Ready only while it passes. Without one, Ready means the
    /// container started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Box<Probe>>,

    /// Checked while the container runs (exactly one of httpGet, tcpSocket or exec); the
    /// container is restarted when it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!has(self.successThreshold) || self.successThreshold == 1").message("successThreshold must be 1 for a liveness probe"))]
    pub liveness_probe: Option<Box<Probe>>,

    /// Checked from the start until it passes once (exactly one of httpGet, tcpSocket or exec);
    /// the other probes wait for it, and the container is restarted when it fails (for slow
    /// starters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!has(self.successThreshold) || self.successThreshold == 1").message("successThreshold must be 1 for a startup probe"))]
    pub startup_probe: Option<Box<Probe>>,

    /// Run the image as a system container: its own init (systemd) as process 1 with its
    /// services, as an LXC container runs on Proxmox (Manager's templates are such images).
    /// The Pod gets what systemd needs: memory-backed `/run`, `/run/lock` and `/tmp`, a
    /// console, a user namespace of its own, a stop grace period longer than systemd's, the
    /// hostname, `Recreate`. The node must support it (docs/install.md, "System containers").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_container: Option<Box<SystemContainer>>,

    /// Isolation: a NetworkPolicy (named as the workload) lets connections reach its Pods only
    /// on its `ports` and only from the peers in `allowFrom`; every other connection to them
    /// is dropped, other workloads' of the namespace included. Unset: no NetworkPolicy (the
    /// namespace's own policies apply). Needs a network plugin that enforces NetworkPolicies
    /// (Calico, Cilium, ...); without one the policy is made and has no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
}

/// Where connections to an isolated workload may come from (`spec.isolation`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Isolation {
    /// The peers that may connect to the workload's ports. Empty: none may.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub allow_from: Vec<Peer>,
}

/// One source of connections: an address range, or Pods chosen by their namespace's labels
/// and/or their own.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.cidr) != (has(self.namespaceLabels) || has(self.podLabels))")
    .message("a peer is either a cidr, or namespaceLabels and/or podLabels"))]
pub struct Peer {
    /// Addresses in this range (CIDR), e.g. the hosts Manager's agent runs on: `10.0.0.0/24`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub cidr: Option<String>,
    /// Pods in the namespaces with these labels (`kubernetes.io/metadata.name: ingress-nginx`
    /// names one namespace; `{}` is every namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_labels: Option<BTreeMap<String, String>>,
    /// Pods with these labels: in this namespace, or with `namespaceLabels`, in those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_labels: Option<BTreeMap<String, String>>,
}

/// A ManagedWorkload as watched: parsed, or the reason it could not be.
pub type Workload = kube::core::DeserializeGuard<ManagedWorkload>;

/// How a system container runs (`spec.systemContainer`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.privileged) && self.privileged && has(self.userNamespace) && self.userNamespace)")
    .message("a privileged container cannot run in a user namespace: leave userNamespace unset or false")
    .field_path(".userNamespace"))]
pub struct SystemContainer {
    /// Run in a user namespace of its own (`hostUsers: false`), so that root in the container
    /// is an unprivileged user on the node. On unless set to false, or `privileged`. Needs
    /// Kubernetes 1.33+, containerd 2.0+, runc 1.2+ and Linux 6.3+ on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_namespace: Option<bool>,
    /// The Pod's RuntimeClass: a runtime handler that gives the container a writable cgroup
    /// (containerd 2.1+ with `cgroup_writable = true`). The operator's
    /// `--system-container-runtime-class` unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub runtime_class_name: Option<String>,
    /// Run privileged: every device and capability of the node, and its cgroups writable.
    /// Root in the container is then root on the node: only for nodes that cannot give
    /// systemd a writable cgroup otherwise (cgroup v1, containerd before 2.1), and only where
    /// whoever may create the workload may own the node. Off unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileged: Option<bool>,
    /// Seconds from the stop signal (the image's, SIGRTMIN+3 for systemd) to the kill: longer
    /// than systemd's own stop timeout (90 s by default). 120 unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub stop_grace_period_seconds: Option<i64>,
}

impl SystemContainer {
    pub fn privileged(&self) -> bool {
        self.privileged.unwrap_or(false)
    }

    /// Whether the Pod gets a user namespace of its own.
    pub fn user_namespace(&self) -> bool {
        !self.privileged() && self.user_namespace.unwrap_or(true)
    }
}

/// The memory-backed directories a system container gets, as (volume name, mount path): its
/// volumes may use neither.
pub const SYSTEM_CONTAINER_TMPFS: [(&str, &str); 3] =
    [("system-run", "/run"), ("system-run-lock", "/run/lock"), ("system-tmp", "/tmp")];

/// CEL: a system container's volumes leave its memory-backed directories alone.
const SYSTEM_CONTAINER_VOLUMES: &str = "!has(self.spec.systemContainer) || !has(self.spec.volumes) \
     || self.spec.volumes.all(v, !(v.name in ['system-run', 'system-run-lock', 'system-tmp']) \
     && !(v.mountPath in ['/run', '/run/lock', '/tmp']))";

/// CEL: the Deployment API's own rule, checked at admission so that the workload is refused
/// instead of its Deployment (600: Kubernetes' default progress deadline, also the operator's).
const MIN_READY_WITHIN_DEADLINE: &str = "!has(self.spec.minReadySeconds) \
     || self.spec.minReadySeconds < (has(self.spec.progressDeadlineSeconds) ? self.spec.progressDeadlineSeconds : 600)";

/// CEL: an explicit `RollingUpdate` only when every volume can be mounted by two Pods at once.
const ROLLING_UPDATE_NEEDS_SHARED_VOLUMES: &str = "!has(self.spec.updateStrategy) \
     || self.spec.updateStrategy != 'RollingUpdate' || !has(self.spec.volumes) \
     || self.spec.volumes.all(v, has(v.accessMode) && v.accessMode == 'ReadWriteMany')";
const ROLLING_UPDATE_NEEDS_SHARED_VOLUMES_MESSAGE: &str = "updateStrategy RollingUpdate cannot be used with a \
     ReadWriteOnce or ReadWriteOncePod volume: the new Pod would wait forever for the volume the old Pod holds; \
     use Recreate (the default with volumes)";

// --- Volumes -----------------------------------------------------------------------------------

/// One persistent volume of a workload: a PersistentVolumeClaim the operator creates and
/// mounts. Its claim may grow, never shrink; its class and access mode are fixed once made.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "(has(self.storageClassName) ? self.storageClassName : '') \
     == (has(oldSelf.storageClassName) ? oldSelf.storageClassName : '')"
).message("storageClassName cannot be changed: a claim's class is fixed once it is made").field_path(".storageClassName"))]
#[x_kube(validation = Rule::new(
    "(has(self.accessMode) ? self.accessMode : 'ReadWriteOnce') \
     == (has(oldSelf.accessMode) ? oldSelf.accessMode : 'ReadWriteOnce')"
).message("accessMode cannot be changed: a claim's access mode is fixed once it is made").field_path(".accessMode"))]
pub struct Volume {
    /// Volume name, a DNS label; the claim is named `<workload>-<name>`. Renaming a volume
    /// makes a new, empty claim (the old one is kept).
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Absolute path in the container where the volume is mounted; unique in the workload.
    #[schemars(length(min = 2, max = 1024), regex(pattern = r"^/[^:]*$"))]
    pub mount_path: String,
    /// Requested size, a quantity such as `10Gi`. Growing it expands the claim when its
    /// StorageClass allows it (a refused expansion is reported on `status.volumes`, and the
    /// workload goes on with the claim as it is). The claim never shrinks: a smaller size,
    /// such as putting a refused expansion back, is accepted and leaves the claim as it is.
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("isQuantity(self)").message("must be a quantity such as 512Mi, 10Gi or 1Ti"))]
    #[x_kube(validation = Rule::new("!isQuantity(self) || quantity(self).isGreaterThan(quantity('0'))").message("size must be greater than zero"))]
    pub size: String,
    /// StorageClass of the claim; the cluster's default class when unset. Fixed once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub storage_class_name: Option<String>,
    /// `ReadWriteOnce` (the default), `ReadWriteOncePod` or `ReadWriteMany`. Fixed once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessMode>,
    /// What deleting the workload does to the claim: `Retain` (the default) keeps it, with
    /// the data, for a workload of the same name to re-attach; `Delete` deletes it with the
    /// workload (garbage collection). The operator itself never deletes a claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<RetentionPolicy>,
}

// How a volume can be mounted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum AccessMode {
    /// Read-write by one node at a time.
    #[default]
    ReadWriteOnce,
    /// Read-write by one Pod at a time.
    ReadWriteOncePod,
    /// Read-write by many nodes at once.
    ReadWriteMany,
}

impl AccessMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteOncePod => "ReadWriteOncePod",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        }
    }
}

// What deleting the workload does to a volume's claim.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum RetentionPolicy {
    /// Keep the claim and its data.
    #[default]
    Retain,
    /// Delete the claim with the workload.
    Delete,
}

impl Volume {
    pub fn access_mode(&self) -> AccessMode {
        self.access_mode.unwrap_or_default()
    }
    pub fn retention_policy(&self) -> RetentionPolicy {
        self.retention_policy.unwrap_or_default()
    }
}

/// What the operator observed of one volume's claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// The volume's name in `spec.volumes`.
    pub name: String,
    /// The PersistentVolumeClaim's name.
    pub claim: String,
    /// The claim's phase: Pending, Bound or Lost; unset while the claim does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The size the bound volume provides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
    /// What the claim waits on, when anything: binding, an expansion, a deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

// --- end of volumes ---------------------------------------------------------------------------

// --- Service -----------------------------------------------------------------------------------

/// The workload's Service. Its ports are always the workload's `spec.ports`; what is set here
/// is how it is exposed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.loadBalancerClass) || (has(self.type) && self.type == 'LoadBalancer')")
    .message("loadBalancerClass is only allowed with type LoadBalancer").field_path(".loadBalancerClass"))]
#[x_kube(validation = Rule::new("!has(self.loadBalancerSourceRanges) || (has(self.type) && self.type == 'LoadBalancer')")
    .message("loadBalancerSourceRanges is only allowed with type LoadBalancer").field_path(".loadBalancerSourceRanges"))]
#[x_kube(validation = Rule::new("!has(self.externalTrafficPolicy) || (has(self.type) && self.type != 'ClusterIP')")
    .message("externalTrafficPolicy is only allowed with type NodePort or LoadBalancer").field_path(".externalTrafficPolicy"))]
pub struct ServiceSpec {
    /// `ClusterIP` (the default: an address inside the cluster), `NodePort` (also a port on
    /// every node) or `LoadBalancer` (also an address from a load balancer: a cloud's, or
    /// MetalLB's). Changing it is applied in place; the cluster IP stays.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<ServiceType>,

    /// Which load-balancer implementation serves the Service (e.g. `service.k8s.aws/nlb`),
    /// when the cluster has several. Only with `LoadBalancer`; fixed once the Service exists
    /// (Kubernetes refuses changing it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 316))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("loadBalancerClass cannot be changed once set"))]
    pub load_balancer_class: Option<String>,

    /// Client address ranges (CIDRs) allowed to reach a `LoadBalancer`, e.g. `["203.0.113.0/24"]`.
    /// Unset: any client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 43)))]
    #[x_kube(validation = Rule::new("self.all(r, isCIDR(r))").message("each entry must be a CIDR such as 203.0.113.0/24"))]
    pub load_balancer_source_ranges: Vec<String>,

    /// `Cluster` (the default) or `Local`: with `Local`, a node forwards only to a Pod on
    /// itself and the client's source address is preserved (what Manager's nginx logs and
    /// access rules see). Only with `NodePort` or `LoadBalancer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<TrafficPolicy>,

    /// Annotations on the Service: what a load balancer is driven by, e.g.
    /// `metallb.io/address-pool: public` or `metallb.io/loadBalancerIPs: 192.0.2.10` for
    /// MetalLB, `service.beta.kubernetes.io/aws-load-balancer-scheme: internet-facing` on AWS.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    #[x_kube(validation = Rule::new("self.all(k, k.size() <= 253 && self[k].size() <= 4096)").message("annotation keys are at most 253 characters and values at most 4096"))]
    pub annotations: BTreeMap<String, String>,
}

impl ServiceSpec {
    /// The type with its default applied.
    pub fn service_type(&self) -> ServiceType {
        self.type_.unwrap_or_default()
    }
}

// How the Service is exposed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

// Where external traffic may be sent.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TrafficPolicy {
    Cluster,
    Local,
}

impl TrafficPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficPolicy::Cluster => "Cluster",
            TrafficPolicy::Local => "Local",
        }
    }
}

/// What the operator observed of the workload's Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    /// The Service's name (the workload's, or `mw-<name>` for a name that starts with a digit).
    pub name: String,
    /// ClusterIP, NodePort or LoadBalancer, as the live Service has it.
    #[serde(rename = "type")]
    pub type_: String,
    /// The Service's address inside the cluster; stable for the Service's life.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    /// The Service's ports, with the node port each was given (NodePort, LoadBalancer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServicePortStatus>,
    /// Addresses (IPs or host names) the load balancer serves the Service on (LoadBalancer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_ingress: Vec<String>,
    /// The name the Service answers to inside the cluster: `<service>.<namespace>.svc`
    /// (resolvable from any Pod; the fully qualified form adds the cluster domain,
    /// `cluster.local` unless the cluster says otherwise).
    pub dns_name: String,
}

/// One port of the workload's Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServicePortStatus {
    /// The port's name: the container port's, or `<protocol>-<number>` for an unnamed one.
    pub name: String,
    /// The Service's port: the container port's number.
    pub port: i32,
    /// TCP, UDP or SCTP.
    pub protocol: String,
    /// The port on every node (NodePort and LoadBalancer Services).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<i32>,
}

// --- end of Service ---------------------------------------------------------------------------

// Start/stop: the desired state of the workload.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DesiredState {
    /// One replica.
    #[default]
    Running,
    /// Zero replicas; the Deployment and its configuration are kept.
    Stopped,
}

// Deployment rollout strategy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategy {
    /// Start the new Pod, then stop the old one.
    RollingUpdate,
    /// Stop the old Pod, then start the new one.
    Recreate,
}

/// One environment variable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.value) != has(self.valueFrom)").message("exactly one of value or valueFrom must be set"))]
pub struct EnvVar {
    /// Variable name: letters, digits, `_`, `-` and `.`, not starting with a digit.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"))]
    pub name: String,
    /// Literal value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,
    /// Value taken from a Secret or ConfigMap key when the Pod starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// Where an environment variable's value comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretKeyRef) != has(self.configMapKeyRef)").message("exactly one of secretKeyRef or configMapKeyRef must be set"))]
pub struct EnvVarSource {
    /// A key of a Secret in the workload's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    /// A key of a ConfigMap in the workload's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// A key of a Secret or ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// Name of the Secret or ConfigMap.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
    /// Key within it.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
    /// Start the Pod even if the Secret/ConfigMap or key is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Compute resources of the container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(within_limit("cpu")).message("requests.cpu must be less than or equal to limits.cpu").field_path(".requests.cpu"))]
#[x_kube(validation = Rule::new(within_limit("memory")).message("requests.memory must be less than or equal to limits.memory").field_path(".requests.memory"))]
pub struct Resources {
    /// Minimum resources the scheduler reserves for the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<ResourceList>,
    /// Maximum resources the container may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceList>,
    /// Whole GPUs for the container, requested as the extended resource the operator is set
    /// up with (`nvidia.com/gpu` by default). The Pod runs only on a node advertising that
    /// many free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 64))]
    pub gpus: Option<i32>,
}

/// The CEL rule "requests.R <= limits.R when both are set and well-formed". Malformed values
/// are reported by the quantity's own rule, so this one stays quiet about them.
fn within_limit(resource: &str) -> String {
    let (req, lim) = (format!("self.requests.{resource}"), format!("self.limits.{resource}"));
    format!(
        "!has(self.requests) || !has(self.limits) || !has({req}) || !has({lim}) \
         || !isQuantity(string({req})) || !isQuantity(string({lim})) \
         || quantity(string({req})).compareTo(quantity(string({lim}))) <= 0"
    )
}

/// CPU and memory quantities.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceList {
    /// CPU, e.g. `500m` or `2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory, e.g. `512Mi` or `2Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

/// A Kubernetes resource quantity, written as a string (`500m`, `1Gi`) or a whole number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // The schema is int-or-string, so the API server stores `cpu: 2` as a JSON number.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
        }
        Ok(match Raw::deserialize(deserializer)? {
            Raw::Text(s) => Quantity(s),
            Raw::Int(i) => Quantity(i.to_string()),
        })
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "x-kubernetes-validations": [
                {"rule": "isQuantity(string(self))", "message": "must be a quantity such as 500m, 2, 256Mi or 1Gi"},
                {"rule": "!isQuantity(string(self)) || !quantity(string(self)).isLessThan(quantity('0'))", "message": "must not be negative"}
            ]
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

/// A container port.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    /// Port number, 1 to 65535.
    #[schemars(range(min = 1, max = 65535))]
    pub container_port: i32,
    /// Optional IANA service name (lowercase letters, digits and '-', at most 15 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: Option<String>,
    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

// Transport protocol of a port.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[allow(clippy::upper_case_acronyms)]
pub enum Protocol {
    TCP,
    UDP,
    SCTP,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::TCP => "TCP",
            Protocol::UDP => "UDP",
            Protocol::SCTP => "SCTP",
        }
    }
}

// =============================================================================================
// Pod options: registry, identity, placement, Pod security and health checks. Each type is the
// typed, validated subset of the Kubernetes field of the same name that a Manager container
// needs; src/operator/deployment.rs copies it into the pod template.
// =============================================================================================

/// Label key (`[prefix/]name`) and label value rules, for `nodeSelector`.
const NODE_SELECTOR_RULE: &str = "self.all(k, k.size() <= 317 && k.indexOf('/') <= 253 && \
    k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && \
    self[k].matches('^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$'))";

/// An object in the workload's namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the object (here: a Secret).
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
}

// When the kubelet pulls the image.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// A node taint the Pod tolerates. A taint is tolerated when key and effect match and, with
/// operator `Equal`, the value too.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')").message("a toleration without a key must have operator Exists (it then tolerates every taint)"))]
#[x_kube(validation = Rule::new("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''").message("value must be empty when operator is Exists"))]
#[x_kube(validation = Rule::new("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')").message("tolerationSeconds is only allowed with effect NoExecute"))]
#[x_kube(validation = Rule::new("!has(self.key) || self.key.indexOf('/') <= 253").message("the key's prefix (before '/') must be at most 253 characters").field_path(".key"))]
pub struct Toleration {
    /// Taint key, e.g. `nvidia.com/gpu`. Empty with operator `Exists`: every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 317),
        regex(
            pattern = r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
        )
    )]
    pub key: Option<String>,
    /// `Equal` (the default: key and value match) or `Exists` (any value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TolerationOperator>,
    /// Taint value, with operator `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"))]
    pub value: Option<String>,
    /// Taint effect to tolerate: `NoSchedule`, `PreferNoSchedule` or `NoExecute`; all when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
    /// With effect `NoExecute`: seconds the Pod stays on a node after the taint appears
    /// (forever when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31536000))]
    pub toleration_seconds: Option<i64>,
}

// How a toleration matches a taint's value.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TolerationOperator {
    Equal,
    Exists,
}

// A taint's effect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// Security settings. `runAsUser`, `runAsGroup`, `runAsNonRoot`, `fsGroup` and
/// `seccompProfile` apply to the Pod; `readOnlyRootFilesystem`, `allowPrivilegeEscalation` and
/// `capabilities` to its container. The `restricted` Pod Security Standard needs
/// `runAsNonRoot: true`, `allowPrivilegeEscalation: false`, `capabilities: {drop: [ALL]}` and
/// `seccompProfile: {type: RuntimeDefault}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.runAsNonRoot) && self.runAsNonRoot && has(self.runAsUser) && self.runAsUser == 0)").message("runAsNonRoot: true contradicts runAsUser: 0"))]
pub struct SecurityContext {
    /// User id the container's process runs as; the image's user when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub run_as_user: Option<i64>,
    /// Primary group id of the container's process; the image's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub run_as_group: Option<i64>,
    /// Refuse to start the container as root (user id 0): the kubelet checks the image's user
    /// when `runAsUser` is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_non_root: Option<bool>,
    /// Group that owns the Pod's volumes and is added to the process's groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub fs_group: Option<i64>,
    /// Mount the container's root filesystem read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_root_filesystem: Option<bool>,
    /// Whether a process may gain more privileges than its parent (setuid binaries). Set it to
    /// false for `restricted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_privilege_escalation: Option<bool>,
    /// Linux capabilities added to or dropped from the container runtime's default set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    /// The seccomp profile of the Pod's containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp_profile: Option<SeccompProfile>,
}

/// Linux capabilities, named as in `capabilities(7)` without the `CAP_` prefix (`NET_ADMIN`),
/// or `ALL`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Capabilities to add, e.g. `[NET_BIND_SERVICE]` (the only one `restricted` allows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 64), regex(pattern = r"^[A-Z][A-Z0-9_]*$")))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub add: Vec<String>,
    /// Capabilities to drop, e.g. `[ALL]` (what `restricted` requires).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 64), regex(pattern = r"^[A-Z][A-Z0-9_]*$")))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub drop: Vec<String>,
}

/// A seccomp profile.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type == 'Localhost' ? has(self.localhostProfile) : !has(self.localhostProfile)").message("localhostProfile is required with type Localhost and allowed only with it"))]
#[x_kube(validation = Rule::new("!has(self.localhostProfile) || (!self.localhostProfile.startsWith('/') && !self.localhostProfile.split('/').exists(p, p == '..'))").message("localhostProfile must be a path relative to the kubelet's seccomp directory, without '..'").field_path(".localhostProfile"))]
pub struct SeccompProfile {
    /// `RuntimeDefault` (the container runtime's profile), `Localhost` (a profile file on the
    /// node) or `Unconfined`.
    #[serde(rename = "type")]
    pub type_: SeccompProfileType,
    /// With type `Localhost`: the profile's path, relative to the kubelet's seccomp directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub localhost_profile: Option<String>,
}

// Kind of seccomp profile.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SeccompProfileType {
    RuntimeDefault,
    Localhost,
    Unconfined,
}

/// A health check of the container: exactly one of `httpGet`, `tcpSocket` or `exec`, with
/// Kubernetes' timing (defaults: period 10 s, timeout 1 s, failure threshold 3).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.httpGet) ? 1 : 0) + (has(self.tcpSocket) ? 1 : 0) + (has(self.exec) ? 1 : 0) == 1").message("exactly one of httpGet, tcpSocket or exec must be set"))]
pub struct Probe {
    /// Passes when an HTTP GET to the container answers 200 to 399.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetAction>,
    /// Passes when a TCP connection to the container's port opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketAction>,
    /// Passes when the command, run in the container (not in a shell), exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    /// Seconds after the container starts before the first check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub initial_delay_seconds: Option<i32>,
    /// Seconds between checks (10 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub period_seconds: Option<i32>,
    /// Seconds a check may take (1 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<i32>,
    /// Consecutive passes after a failure to count as passing (1 when unset; must be 1 for
    /// liveness and startup probes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub success_threshold: Option<i32>,
    /// Consecutive failures to count as failing (3 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_threshold: Option<i32>,
}

/// An HTTP GET to the Pod's IP.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpGetAction {
    /// Path, starting with `/` (`/` when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^/\S*$"))]
    pub path: Option<String>,
    /// Container port: a number (1 to 65535) or the name of one of `spec.ports`.
    pub port: PortRef,
    /// `HTTP` (the default) or `HTTPS` (the certificate is not verified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<Scheme>,
}

// URI scheme of an HTTP probe.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[allow(clippy::upper_case_acronyms)]
pub enum Scheme {
    HTTP,
    HTTPS,
}

/// A TCP connection to the Pod's IP.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpSocketAction {
    /// Container port: a number (1 to 65535) or the name of one of `spec.ports`.
    pub port: PortRef,
}

/// A container port by number or by the name given in `spec.ports`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortRef {
    Number(i32),
    Name(String),
}

impl JsonSchema for PortRef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PortRef".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            // Bounds what the CEL rules below (and the spec's named-port rule) may cost, from
            // Kubernetes 1.34 on; older API servers price an int-or-string at the request's
            // size whatever its maxLength (see probe_port_named).
            "maxLength": 15,
            "x-kubernetes-validations": [{
                "rule": "type(self) == int ? (int(self) >= 1 && int(self) <= 65535) : string(self).matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
                "message": "must be a port number (1 to 65535) or a port name (at most 15 lowercase letters, digits and '-')"
            }]
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

/// The CEL rule "a probe's named port is one of `spec.ports`" for the spec field `probe`.
/// The name is compared with the int-or-string port as it is (CEL's equality across types is
/// false for an int), not through `string(port)`: before Kubernetes 1.34 the API server's cost
/// estimate takes that conversion to be of a string as long as the whole request, once per
/// item of `spec.ports`, and refuses the CRD for it (4x over the budget on 1.31), while an
/// equality costs at most the shorter side, a port name's 15 characters.
fn probe_port_named(probe: &str) -> String {
    let named = |handler: &str| {
        let port = format!("self.{probe}.{handler}.port");
        format!(
            "(!has(self.{probe}.{handler}) || type({port}) == int || \
             (has(self.ports) && self.ports.exists(p, has(p.name) && p.name == {port})))"
        )
    };
    format!("!has(self.{probe}) || ({} && {})", named("httpGet"), named("tcpSocket"))
}

/// A command run in the container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecAction {
    /// The command and its arguments, e.g. `[pg_isready, -q]`; not run in a shell.
    #[schemars(length(min = 1, max = 64), inner(length(max = 4096)))]
    pub command: Vec<String>,
}

// ============================================= end of Pod options =============================

/// Observed state of a ManagedWorkload, written only by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
// One value for the API server's field tracking: the operator sets the status whole, and is its
// only writer, so its managedFields entry is `f:status` alone instead of every field of every
// condition, which the API server converts and compares on each status write
// (docs/performance.md, "What a status write costs").
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ManagedWorkloadStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Summary of the workload's state: Creating, Running, Updating, Stopping, Stopped or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Permanent provider id, `namespace/name`; Manager stores it as the container id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// IP of the current Pod while it has one. Ephemeral: it changes when the Pod is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "podIP")]
    pub pod_ip: Option<String>,
    /// The address clients should use: the load balancer's (LoadBalancer), else the
    /// Service's cluster IP, else, without a Service, the IP of the Pod that serves (kept
    /// through a rollout until the new Pod serves). With a Service it does not change when the
    /// Pod is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The workload's Service (spec.service), as observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceStatus>,
    /// Replicas wanted: 1 when Running, 0 when Stopped.
    #[serde(default)]
    pub desired_replicas: i32,
    /// Pods of the Deployment (old and new template).
    #[serde(default)]
    pub replicas: i32,
    /// Pods running the current pod template.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Pods that are Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Pods that have been Ready for the Deployment's minReadySeconds.
    #[serde(default)]
    pub available_replicas: i32,
    /// Ready, Reconciling and Stalled (kstatus), plus the Deployment's Available, Progressing
    /// and ReplicaFailure mirrored. Each carries the generation it was computed for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The claim of each volume in `spec.volumes`: phase, capacity, what it waits on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub volumes: Vec<VolumeStatus>,
}

// The workload's phase (docs/resource.md gives the exact rules).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Creating,
    Running,
    Updating,
    Stopping,
    Stopped,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Creating => "Creating",
            Phase::Running => "Running",
            Phase::Updating => "Updating",
            Phase::Stopping => "Stopping",
            Phase::Stopped => "Stopped",
            Phase::Failed => "Failed",
        }
    }

    /// On the way somewhere: a rollout, a start or a stop under way.
    pub fn in_transition(self) -> bool {
        matches!(self, Phase::Creating | Phase::Updating | Phase::Stopping)
    }
}

impl ManagedWorkloadSpec {
    /// The desired state with its default applied.
    pub fn desired_state(&self) -> DesiredState {
        self.state.unwrap_or_default()
    }
}
