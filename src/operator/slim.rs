//! What the operator's caches keep of each watched object: only the fields `status`, `drift`
//! and the watch mapping read. Each workload costs a cached CR, Deployment and Pod, so at
//! thousands of workloads the rest (Pod specs, other managers' field records, termination
//! logs) would be most of the operator's memory.
//!
//! Kept vectors are shrunk to fit (a parsed list may have twice the capacity it needs). The
//! few labels and annotations kept are `Marks`, not maps: a one-entry B-tree map allocates
//! a 544-byte node. Deployments and Pods are cached as `CachedDeployment` and `CachedPod`,
//! without the ~2 KiB their spec structs take even when empty; a reconcile turns cached types
//! back into the Kubernetes types the pure parts read. The tests check that a trimmed object
//! derives exactly what the full one does.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStatus, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    Pod, PodSpec, PodStatus, PodTemplateSpec, Service, ServicePort, ServiceSpec, ServiceStatus,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use kube::ResourceExt;
use serde_json::Value;

use super::drift::{Live, OwnedFields};
use super::ownership::FIELD_MANAGER;
use crate::cached::stands_for;
use crate::names::{
    APPLIED_HASH_ANNOTATION, INSTANCE_LABEL, MANAGED_BY_LABEL, NODE_ID_LABEL, OWNER_ANNOTATION, REPLACED_ANNOTATION,
    TEMPLATE_HASH_ANNOTATION, VOLUME_OF_ANNOTATION, WORKLOAD_UID_ANNOTATION,
};
use crate::resource::ManagedWorkload;
/// Set by client-side `kubectl apply`: a copy of the whole manifest, read by kubectl only.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What the Deployment cache holds of each Deployment (see `deployment`), trimmed as it is
/// read from the watch.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(from = "Deployment")]
pub struct CachedDeployment {
    /// Without `managedFields` (the operator's own record is `owned`), labels and annotations.
    metadata: ObjectMeta,
    annotations: Marks,
    /// The pod template's `template-hash` annotation.
    template_hash: Option<String>,
    status: Option<DeploymentStatus>,
    /// The operator's server-side apply record, as a fingerprint (drift.rs).
    owned: Option<OwnedFields>,
}

impl From<Deployment> for CachedDeployment {
    fn from(mut d: Deployment) -> Self {
        let owned = owned_fingerprint(&mut d.metadata);
        deployment(&mut d);
        d.metadata.managed_fields = None;
        let annotations = Marks::take(&mut d.metadata.annotations, DEPLOYMENT_ANNOTATIONS);
        let template_hash = super::deployment::current_template_hash(&d).map(str::to_owned);
        CachedDeployment { metadata: d.metadata, annotations, template_hash, status: d.status, owned }
    }
}

impl Live for CachedDeployment {
    fn owned(&self) -> Option<Cow<'_, OwnedFields>> {
        self.owned.as_ref().map(Cow::Borrowed)
    }

    fn applied_hash(&self) -> Option<&str> {
        self.annotations.get(APPLIED_HASH_ANNOTATION)
    }
}

impl CachedDeployment {
    /// The trimmed Deployment, as `status` reads it (without the apply record, which drift reads
    /// from the cached Deployment itself).
    pub fn to_deployment(&self) -> Deployment {
        Deployment {
            metadata: ObjectMeta { annotations: self.annotations.to_map(), ..self.metadata.clone() },
            spec: Some(template_only(self.template_hash.clone())),
            status: self.status.clone(),
        }
    }
}

/// What the Pod cache holds of each Pod (see `pod` for what is kept).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(from = "Pod")]
pub struct CachedPod {
    /// Without labels and annotations.
    metadata: ObjectMeta,
    labels: Marks,
    annotations: Marks,
    /// The node it is placed on.
    node_name: Option<String>,
    status: Option<PodStatus>,
}

impl From<Pod> for CachedPod {
    fn from(mut p: Pod) -> Self {
        pod(&mut p);
        let labels = Marks::take(&mut p.metadata.labels, POD_LABELS);
        let annotations = Marks::take(&mut p.metadata.annotations, POD_ANNOTATIONS);
        let node_name = p.spec.and_then(|s| s.node_name);
        CachedPod { metadata: p.metadata, labels, annotations, node_name, status: p.status }
    }
}

impl CachedPod {
    /// The trimmed Pod, as `status` reads it.
    pub fn to_pod(&self) -> Pod {
        let metadata = ObjectMeta {
            labels: self.labels.to_map(),
            annotations: self.annotations.to_map(),
            ..self.metadata.clone()
        };
        Pod { metadata, spec: placed_on(self.node_name.clone()), status: self.status.clone() }
    }

    /// The workload it belongs to, by its instance label.
    pub fn instance(&self) -> Option<&str> {
        self.labels.get(INSTANCE_LABEL)
    }
}

/// A pod spec holding only the node the Pod is placed on, if any.
fn placed_on(node_name: Option<String>) -> Option<PodSpec> {
    node_name.map(|node_name| PodSpec { node_name: Some(node_name), ..Default::default() })
}

/// What the Service cache holds of each Service (see `service`): only the three spec fields
/// it reads.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(from = "Service")]
pub struct CachedService {
    /// Without `managedFields` (the operator's own record is `owned`), labels and annotations.
    pub metadata: ObjectMeta,
    annotations: Marks,
    type_: Option<String>,
    cluster_ip: Option<String>,
    ports: Option<Vec<ServicePort>>,
    status: Option<ServiceStatus>,
    /// The operator's server-side apply record, as a fingerprint (drift.rs).
    owned: Option<OwnedFields>,
}

impl From<Service> for CachedService {
    fn from(mut s: Service) -> Self {
        let owned = owned_fingerprint(&mut s.metadata);
        service(&mut s);
        s.metadata.managed_fields = None;
        let annotations = Marks::take(&mut s.metadata.annotations, SERVICE_ANNOTATIONS);
        let spec = s.spec.unwrap_or_default();
        CachedService {
            metadata: s.metadata,
            annotations,
            type_: spec.type_,
            cluster_ip: spec.cluster_ip,
            ports: spec.ports,
            status: s.status,
            owned,
        }
    }
}

impl Live for CachedService {
    fn owned(&self) -> Option<Cow<'_, OwnedFields>> {
        self.owned.as_ref().map(Cow::Borrowed)
    }

    fn applied_hash(&self) -> Option<&str> {
        self.annotations.get(APPLIED_HASH_ANNOTATION)
    }
}

/// What the claim cache holds of each claim (see `claim`): the apply record as a fingerprint,
/// and the one storage size each map would hold as a plain field (the maps would take most of
/// a small claim's memory). `to_claim` turns it back into a claim.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(from = "PersistentVolumeClaim")]
pub struct CachedClaim {
    /// Without managed fields (the operator's record is `owned`; `applied` says it exists),
    /// labels and annotations.
    metadata: ObjectMeta,
    labels: Marks,
    annotations: Marks,
    applied: bool,
    /// The operator's server-side apply record, as a fingerprint (drift.rs).
    owned: Option<OwnedFields>,
    /// Without resources: the storage it asks for is `requested`.
    spec: Option<PersistentVolumeClaimSpec>,
    requested: Option<Quantity>,
    /// Without capacity: the bound volume's storage is `capacity`.
    status: Option<PersistentVolumeClaimStatus>,
    capacity: Option<Quantity>,
}

/// The resources' name the operator asks for and reads.
const STORAGE: &str = "storage";

impl From<PersistentVolumeClaim> for CachedClaim {
    fn from(mut c: PersistentVolumeClaim) -> Self {
        claim(&mut c);
        let owned = super::drift::owned_fields(&c.metadata).and_then(OwnedFields::of);
        let applied = c.metadata.managed_fields.take().is_some_and(|m| !m.is_empty());
        let labels = Marks::take(&mut c.metadata.labels, CLAIM_LABELS);
        let annotations = Marks::take(&mut c.metadata.annotations, CLAIM_ANNOTATIONS);
        let mut spec = c.spec;
        let requested = spec.as_mut().and_then(|s| s.resources.take()?.requests?.remove(STORAGE));
        let mut status = c.status;
        let capacity = status.as_mut().and_then(|s| s.capacity.take()?.remove(STORAGE));
        CachedClaim { metadata: c.metadata, labels, annotations, applied, owned, spec, requested, status, capacity }
    }
}

impl Live for CachedClaim {
    fn owned(&self) -> Option<Cow<'_, OwnedFields>> {
        self.owned.as_ref().map(Cow::Borrowed)
    }

    fn applied_hash(&self) -> Option<&str> {
        self.annotations.get(APPLIED_HASH_ANNOTATION)
    }
}

impl CachedClaim {
    /// The trimmed claim, as `claims` and `status` read it. Its managed fields hold only an empty
    /// operator Apply entry, so claims.rs can tell the operator applied it.
    pub fn to_claim(&self) -> PersistentVolumeClaim {
        let mut metadata = ObjectMeta {
            labels: self.labels.to_map(),
            annotations: self.annotations.to_map(),
            ..self.metadata.clone()
        };
        if self.applied {
            metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some(FIELD_MANAGER.into()),
                operation: Some("Apply".into()),
                ..Default::default()
            }]);
        }
        let mut spec = self.spec.clone();
        if let (Some(spec), Some(requested)) = (spec.as_mut(), &self.requested) {
            spec.resources = Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(STORAGE.to_string(), requested.clone())])),
                ..Default::default()
            });
        }
        let mut status = self.status.clone();
        if let (Some(status), Some(capacity)) = (status.as_mut(), &self.capacity) {
            status.capacity = Some(BTreeMap::from([(STORAGE.to_string(), capacity.clone())]));
        }
        PersistentVolumeClaim { metadata, spec, status }
    }

    /// The workload it was made for, by its instance label.
    pub fn instance(&self) -> Option<&str> {
        self.labels.get(INSTANCE_LABEL)
    }
}

/// The operator's own apply record as a fingerprint, and no managed fields left.
fn owned_fingerprint(meta: &mut ObjectMeta) -> Option<OwnedFields> {
    let owned = super::drift::owned_fields(meta).and_then(OwnedFields::of);
    meta.managed_fields = None;
    owned
}

impl CachedService {
    /// The trimmed Service, as `status` and `drift` read it.
    pub fn to_service(&self) -> Service {
        Service {
            metadata: ObjectMeta { annotations: self.annotations.to_map(), ..self.metadata.clone() },
            spec: Some(ServiceSpec {
                type_: self.type_.clone(),
                cluster_ip: self.cluster_ip.clone(),
                ports: self.ports.clone(),
                ..Default::default()
            }),
            status: self.status.clone(),
        }
    }
}

stands_for!(CachedDeployment, Deployment);
stands_for!(CachedPod, Pod);
stands_for!(CachedService, Service);
stands_for!(CachedClaim, PersistentVolumeClaim);
stands_for!(StatusWritten, ManagedWorkload);

/// What a reconcile reads of its status write's answer: only the resourceVersion. Parsing the
/// whole ManagedWorkload (spec, conditions, every field record) only to drop it would be the
/// largest allocation of a reconcile, times `--concurrency` in a burst.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct StatusWritten {
    #[serde(deserialize_with = "resource_version_only")]
    metadata: ObjectMeta,
}

impl StatusWritten {
    pub fn resource_version(self) -> Option<String> {
        self.metadata.resource_version
    }
}

/// Object metadata of which only the resourceVersion is read; the rest is skipped unparsed.
fn resource_version_only<'de, D: serde::Deserializer<'de>>(metadata: D) -> Result<ObjectMeta, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Version {
        resource_version: Option<String>,
    }
    let Version { resource_version } = serde::Deserialize::deserialize(metadata)?;
    Ok(ObjectMeta { resource_version, ..ObjectMeta::default() })
}

/// A Deployment spec holding only the pod template's hash annotation.
fn template_only(template_hash: Option<String>) -> DeploymentSpec {
    DeploymentSpec {
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta {
                annotations: template_hash.map(|h| BTreeMap::from([(TEMPLATE_HASH_ANNOTATION.to_string(), h)])),
                ..Default::default()
            }),
            spec: None,
        },
        ..Default::default()
    }
}

/// A Deployment as the operator needs it: identity and owner, the two hashes, the operator's
/// own apply record (for drift, see drift.rs) and the status.
pub fn deployment(d: &mut Deployment) {
    let template_hash = super::deployment::current_template_hash(d).map(str::to_owned);
    d.spec = Some(template_only(template_hash));
    keep(&mut d.metadata.annotations, DEPLOYMENT_ANNOTATIONS);
    d.metadata.labels = None;
    own_apply_only(&mut d.metadata);
    if let Some(conditions) = d.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        conditions.shrink_to_fit();
    }
}

/// Of the server-side apply records, keep only the operator's own, its field set as text.
fn own_apply_only(meta: &mut ObjectMeta) {
    let own_apply = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.operation.as_deref() == Some("Apply")
            && m.subresource.as_deref().is_none_or(str::is_empty)
    };
    let fields = meta.managed_fields.get_or_insert_with(Vec::new);
    fields.retain(own_apply);
    fields.shrink_to_fit();
    for entry in fields {
        entry.time = None;
        entry.api_version = None;
        entry.fields_type = None;
        // Parsed, a field set is a tree of maps about ten times the size of its text; drift.rs
        // reads either form.
        if let Some(FieldsV1(value)) = &mut entry.fields_v1
            && !value.is_string()
        {
            *value = Value::String(value.to_string());
        }
    }
}

/// A Service as the operator needs it: identity and owner, the applied fingerprint and apply
/// record (for drift), and what `status.service` and `status.address` report (type, cluster
/// IP, ports, load balancer addresses). The rest is never read back.
pub fn service(s: &mut Service) {
    keep(&mut s.metadata.annotations, SERVICE_ANNOTATIONS);
    s.metadata.labels = None;
    own_apply_only(&mut s.metadata);
    s.metadata.finalizers = None;
    if let Some(spec) = s.spec.take() {
        let mut ports = spec.ports;
        if let Some(ports) = &mut ports {
            for p in ports.iter_mut() {
                p.app_protocol = None;
                p.target_port = None;
            }
            ports.shrink_to_fit();
        }
        s.spec = Some(ServiceSpec { type_: spec.type_, cluster_ip: spec.cluster_ip, ports, ..Default::default() });
    }
    if let Some(status) = &mut s.status {
        status.conditions = None;
        if let Some(ingress) = status.load_balancer.as_mut().and_then(|lb| lb.ingress.as_mut()) {
            for i in ingress.iter_mut() {
                i.ports = None;
                i.ip_mode = None;
            }
            ingress.shrink_to_fit();
        }
    }
}

/// A claim as the operator needs it: identity, owner, the marks that say whose it is
/// (claims.rs), the operator's apply record, what it asks for, and its status.
pub fn claim(c: &mut PersistentVolumeClaim) {
    keep(&mut c.metadata.labels, CLAIM_LABELS);
    keep(&mut c.metadata.annotations, CLAIM_ANNOTATIONS);
    own_apply_only(&mut c.metadata);
    c.metadata.finalizers = None;
    // Of the spec, keep what it asks for and the volume it is bound to (named while deleting).
    if let Some(spec) = &mut c.spec {
        spec.selector = None;
        spec.data_source = None;
        spec.data_source_ref = None;
        spec.access_modes = None;
    }
    if let Some(status) = &mut c.status {
        status.access_modes = None;
        status.allocated_resources = None;
        status.allocated_resource_statuses = None;
    }
    if let Some(conditions) = c.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        for condition in conditions.iter_mut() {
            condition.last_probe_time = None;
        }
        conditions.shrink_to_fit();
    }
}

/// A Pod as the operator needs it: its workload and template, whether it is going away, and
/// what `status::derive` reads (phase, IP, readiness, scheduling, container states).
pub fn pod(p: &mut Pod) {
    // Of the spec, only the node (status/volumes.rs: is a volume still held on another node?).
    p.spec = p
        .spec
        .take()
        .and_then(|s| s.node_name)
        .map(|node_name| PodSpec { node_name: Some(node_name), ..Default::default() });
    p.metadata.managed_fields = None;
    keep(&mut p.metadata.labels, POD_LABELS);
    keep(&mut p.metadata.annotations, POD_ANNOTATIONS);
    // Only the controller (its ReplicaSet), by kind and UID: that says whose Pod it is.
    if let Some(owners) = &mut p.metadata.owner_references {
        owners.retain(|o| o.controller == Some(true));
        for o in owners.iter_mut() {
            o.api_version = String::new();
            o.name = String::new();
            o.block_owner_deletion = None;
        }
        owners.shrink_to_fit();
    }
    p.metadata.generate_name = None;
    p.metadata.finalizers = None;
    let Some(status) = &mut p.status else { return };
    if let Some(conditions) = &mut status.conditions {
        // Ready; PodScheduled while the Pod cannot be placed; the sandbox while not made
        // (status.rs reads them).
        conditions.retain(|c| {
            c.type_ == "Ready"
                || (c.status == "False" && (c.type_ == "PodScheduled" || c.type_ == super::status::SANDBOX_READY))
        });
        for c in conditions.iter_mut() {
            c.last_probe_time = None;
        }
        conditions.shrink_to_fit();
    }
    status.host_ip = None;
    status.host_ips = None;
    status.pod_ips = None;
    status.qos_class = None;
    status.nominated_node_name = None;
    status.resource_claim_statuses = None;
    status.ephemeral_container_statuses = None;
    for statuses in [&mut status.container_statuses, &mut status.init_container_statuses].into_iter().flatten() {
        statuses.shrink_to_fit();
        statuses.iter_mut().for_each(container);
    }
}

/// A ManagedWorkload as the operator needs it: everything but the records of who wrote it.
pub fn workload<K: kube::Resource>(mw: &mut K) {
    mw.meta_mut().managed_fields = None;
    mw.annotations_mut().remove(LAST_APPLIED);
}

/// Of a container's status: name, restart count, readiness and states.
fn container(cs: &mut ContainerStatus) {
    cs.image = String::new();
    cs.image_id = String::new();
    cs.container_id = None;
    cs.allocated_resources = None;
    cs.allocated_resources_status = None;
    cs.resources = None;
    cs.volume_mounts = None;
    cs.user = None;
    for state in [&mut cs.state, &mut cs.last_state].into_iter().flatten() {
        terminated(state);
    }
}

/// A termination message is the container's termination log (up to 4 KiB): keep only a line
/// the status knows how to explain (`status::known_termination`).
fn terminated(state: &mut ContainerState) {
    if let Some(t) = &mut state.terminated {
        t.message = t.message.as_deref().and_then(super::status::known_termination).map(String::from);
        t.container_id = None;
    }
}

/// The labels and annotations each kind keeps.
const DEPLOYMENT_ANNOTATIONS: &[&str] = &[APPLIED_HASH_ANNOTATION];
const SERVICE_ANNOTATIONS: &[&str] = &[APPLIED_HASH_ANNOTATION];
const POD_LABELS: &[&str] = &[INSTANCE_LABEL];
const POD_ANNOTATIONS: &[&str] = &[TEMPLATE_HASH_ANNOTATION];
/// What `claims::is_own` judges by (the owner marks too), and what status/volumes.rs reads.
const CLAIM_LABELS: &[&str] = &[INSTANCE_LABEL, MANAGED_BY_LABEL, NODE_ID_LABEL];
const CLAIM_ANNOTATIONS: &[&str] =
    &[APPLIED_HASH_ANNOTATION, VOLUME_OF_ANNOTATION, WORKLOAD_UID_ANNOTATION, OWNER_ANNOTATION, REPLACED_ANNOTATION];

/// A cached object's kept labels or annotations: (static key, value) pairs in one allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Marks(Box<[(&'static str, Box<str>)]>);

impl Marks {
    /// The entries of `keys` in `map`, which is left empty: what is not kept is dropped.
    fn take(map: &mut Option<BTreeMap<String, String>>, keys: &[&'static str]) -> Marks {
        let Some(map) = map.take() else { return Marks::default() };
        Marks(keys.iter().filter_map(|&k| Some((k, map.get(k)?.as_str().into()))).collect())
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| &**v)
    }

    /// As the map it was taken from (None when empty, as `keep` leaves one).
    fn to_map(&self) -> Option<BTreeMap<String, String>> {
        (!self.0.is_empty()).then(|| self.0.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }
}

fn keep(map: &mut Option<BTreeMap<String, String>>, keys: &[&str]) {
    if let Some(m) = map {
        m.retain(|k, _| keys.contains(&k.as_str()));
        if m.is_empty() {
            *map = None;
        }
    }
}

#[cfg(test)]
mod tests;
