//! The `ManagedWorkload` custom resource (`opensource-server.mieweb.org/v1alpha1`): one
//! Manager container, run as a single-replica Deployment.
//!
//! Validation lives in the schema (OpenAPI + CEL) so the API server rejects bad input with a
//! message naming the field, before the operator ever sees it. Defaults are applied in code,
//! never in the schema: a schema default would be written into the stored object and make
//! GitOps tools (Argo CD, Flux) see a permanent diff.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every resource this project defines.
pub const GROUP: &str = "opensource-server.mieweb.org";

/// Identity labels Manager puts on a CR; copied to the Deployment and its Pods.
pub const NODE_ID_LABEL: &str = "opensource-server.mieweb.org/node-id";
pub const CONTAINER_ID_LABEL: &str = "opensource-server.mieweb.org/container-id";

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
    validation = Rule::new(ROLLING_UPDATE_NEEDS_SHARED_VOLUMES)
        .message(ROLLING_UPDATE_NEEDS_SHARED_VOLUMES_MESSAGE)
        .field_path(".spec.updateStrategy")
)]
#[serde(rename_all = "camelCase")]
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

    /// CPU and memory requests and limits for the container.
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

    /// Container ports. Informational (no Service is created), but they appear on the Pod.
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

    /// How a pod-template change is rolled out: `RollingUpdate` (the default: the new Pod
    /// is started before the old one stops) or `Recreate` (the old Pod stops first; use it
    /// when two copies must never run at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,

    /// Seconds a rollout may take before it is reported as failed (`ProgressDeadlineExceeded`).
    /// Defaults to Kubernetes' 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub progress_deadline_seconds: Option<i32>,

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
    /// With a ReadWriteOnce or ReadWriteOncePod volume the workload rolls out with `Recreate`.
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
}

/// CEL: an explicit `RollingUpdate` only when every volume can be mounted by two Pods at once.
const ROLLING_UPDATE_NEEDS_SHARED_VOLUMES: &str = "!has(self.spec.updateStrategy) \
     || self.spec.updateStrategy != 'RollingUpdate' || !has(self.spec.volumes) \
     || self.spec.volumes.all(v, has(v.accessMode) && v.accessMode == 'ReadWriteMany')";
const ROLLING_UPDATE_NEEDS_SHARED_VOLUMES_MESSAGE: &str = "updateStrategy RollingUpdate cannot be used with a \
     ReadWriteOnce or ReadWriteOncePod volume: the new Pod would wait forever for the volume the old Pod holds; \
     use Recreate (the default with such volumes)";

// --- Volumes (issue 14) -------------------------------------------------------------------

/// One persistent volume of a workload: a PersistentVolumeClaim the operator creates and
/// mounts. Its size may grow, never shrink; its class and access mode are fixed once made.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!isQuantity(self.size) || !isQuantity(oldSelf.size) \
     || quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0"
).message("size may grow but never shrink: a claim cannot be made smaller").field_path(".size"))]
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
    /// Requested size, a quantity such as `10Gi`. May grow (the claim is expanded when its
    /// StorageClass allows it), never shrink.
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

// How a volume can be mounted. (a `//` comment: a doc comment here would replace the
// field's own description in the CRD).
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

// What deleting the workload does to a volume's claim. (a `//` comment: a doc comment here
// would replace the field's own description in the CRD).
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

// Start/stop: the desired state of the workload. (a `//` comment: a doc comment here would replace the
// field's own description in the CRD).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DesiredState {
    /// One replica.
    #[default]
    Running,
    /// Zero replicas; the Deployment and its configuration are kept.
    Stopped,
}

// Deployment rollout strategy. (a `//` comment: a doc comment here would replace the
// field's own description in the CRD).
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

// Transport protocol of a port. (a `//` comment: a doc comment here would replace the
// field's own description in the CRD).
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

/// Observed state of a ManagedWorkload, written only by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
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

// The workload's phase (see docs/resource.md for the exact rules). (a `//` comment: a doc comment here would replace the
// field's own description in the CRD).
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
}

impl ManagedWorkloadSpec {
    /// The desired state with its default applied.
    pub fn desired_state(&self) -> DesiredState {
        self.state.unwrap_or_default()
    }
}
