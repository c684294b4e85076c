//! Row → desired ManagedWorkload and Secret: a pure function of one `"Containers"` row and
//! its context (namespace, system env defaults, approved resources). The rules of
//! docs/bridge.md ("How a row becomes a ManagedWorkload") live here.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use super::env::{self, DefaultEnv};
use super::error::RowError;
use super::image;
use super::rows::{ContainerRow, Grants, RowKey, ServiceRow};
use crate::names::{
    BRIDGE_HASH_ANNOTATION, CONTAINER_ID_LABEL, ENV_DIGEST_ANNOTATION, NODE_ID_LABEL, OWNER_ANNOTATION,
    ROW_CREATED_ANNOTATION, SYNCED_BY_LABEL,
};
use crate::operator::ownership as desired;
use crate::resource::{
    ContainerPort, EnvVar, EnvVarSource, Isolation, KeyRef, ManagedWorkload, ManagedWorkloadSpec, Peer, Protocol,
    Quantity, ResourceList, Resources, RetentionPolicy, ServiceSpec, ServiceType, Volume,
};
/// Suffix of the per-workload env Secret's name.
pub const SECRET_SUFFIX: &str = "-manager-env";

/// Manager's defaults when no resource request was approved (`bin/create-container.js`).
pub const DEFAULT_CPUS: i64 = 4;
pub const DEFAULT_MEMORY_MB: i64 = 4096;
/// Manager's default disk when no rootfs request was approved, in GB.
pub const DEFAULT_ROOTFS_GB: i64 = 50;
/// Name of the volume the approved rootfs becomes (claim `<hostname>-rootfs`).
pub const ROOTFS_VOLUME: &str = "rootfs";

/// How Manager's rootfs becomes the workload's volume (bridge flags `--rootfs-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootfsVolume {
    /// Where the volume is mounted in the container; None: no volume (the workload's files
    /// live as long as its Pod).
    pub mount_path: Option<String>,
    /// The claim's StorageClass; None: the cluster's default class.
    pub storage_class: Option<String>,
    /// What deleting the container in Manager does to the data: Retain (the default) keeps the
    /// claim.
    pub on_delete: RetentionPolicy,
}

impl Default for RootfsVolume {
    fn default() -> Self {
        RootfsVolume { mount_path: Some("/data".into()), storage_class: None, on_delete: RetentionPolicy::Retain }
    }
}

/// How a row's http and transport services become the workload's Service (bridge flags
/// `--service-type`, `--service-load-balancer-class`, `--service-annotation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSettings {
    /// The Service's type; None: the ports are only declared on the Pod, and no Service is made
    /// (Manager's nginx must then reach Pod IPs: `--ipv4-address pod`).
    pub type_: Option<ServiceType>,
    /// With `LoadBalancer`: which implementation serves it.
    pub load_balancer_class: Option<String>,
    /// Annotations on every Service (a MetalLB address pool, a cloud's load-balancer options).
    pub annotations: BTreeMap<String, String>,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings { type_: Some(ServiceType::ClusterIP), load_balancer_class: None, annotations: BTreeMap::new() }
    }
}

/// Manager's own templates (its UI's choices, `images/` in its repository): Debian with systemd
/// as process 1, as LXC containers run on Proxmox.
pub const MANAGER_TEMPLATES: &str = "ghcr.io/mieweb/opensource-server/";

/// Images whose reference starts with one of these prefixes run as system containers
/// (`spec.systemContainer`). Default: Manager's own templates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemImages(pub Vec<String>);

impl Default for SystemImages {
    fn default() -> Self {
        SystemImages(vec![MANAGER_TEMPLATES.to_string()])
    }
}

impl SystemImages {
    pub fn matches(&self, image: &str) -> bool {
        self.0.iter().any(|prefix| !prefix.is_empty() && image.starts_with(prefix.as_str()))
    }
}

/// Where an isolated container accepts connections from (`spec.isolation`): entries
/// `cidr:<range>` (the hosts of Manager's agent) or `namespace:<name>` (every Pod there, say
/// an ingress controller's); `none` allows nothing. Empty: no isolation.
pub fn isolation(entries: &[String]) -> Result<Option<Isolation>, String> {
    let entries: Vec<&str> = entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()).collect();
    if entries.is_empty() {
        return Ok(None);
    }
    if entries == ["none"] {
        return Ok(Some(Isolation::default()));
    }
    let allow_from = entries.iter().map(|e| peer(e)).collect::<Result<_, _>>()?;
    Ok(Some(Isolation { allow_from }))
}

fn peer(entry: &str) -> Result<Peer, String> {
    match entry.split_once(':') {
        Some(("cidr", range)) if is_cidr(range) => Ok(Peer { cidr: Some(range.to_string()), ..Default::default() }),
        Some(("namespace", name)) if is_dns_label(name) => Ok(Peer {
            namespace_labels: Some(BTreeMap::from([("kubernetes.io/metadata.name".to_string(), name.to_string())])),
            ..Default::default()
        }),
        _ => Err(format!("{entry:?}: expected cidr:<address>/<bits>, namespace:<name> or none")),
    }
}

fn is_cidr(range: &str) -> bool {
    let Some((address, bits)) = range.split_once('/') else { return false };
    match (address.parse::<std::net::IpAddr>(), bits.parse::<u8>()) {
        (Ok(std::net::IpAddr::V4(_)), Ok(bits)) => bits <= 32,
        (Ok(std::net::IpAddr::V6(_)), Ok(bits)) => bits <= 128,
        _ => false,
    }
}

/// Most ports a workload may declare (the CRD's limit on `spec.ports`).
const MAX_PORTS: usize = 64;

/// The row's services as ports: one per distinct (port, protocol), in port order, named
/// `http-<port>`, `tcp-<port>` or `udp-<port>`. Services sharing a port share the first's name.
pub fn ports(services: &[ServiceRow]) -> Result<Vec<ContainerPort>, RowError> {
    let mut ports: BTreeMap<(i32, &'static str), ContainerPort> = BTreeMap::new();
    for s in services {
        let bad = |why| RowError::BadService { kind: s.kind.clone(), port: s.internal_port, why };
        let number = i32::try_from(s.internal_port)
            .ok()
            .filter(|p| (1..=65535).contains(p))
            .ok_or(bad("not a port number (1 to 65535)"))?;
        let (protocol, prefix) = match (s.kind.as_str(), s.protocol.as_deref()) {
            ("http", _) => (Protocol::TCP, "http"),
            ("transport", Some("tcp")) => (Protocol::TCP, "tcp"),
            ("transport", Some("udp")) => (Protocol::UDP, "udp"),
            ("transport", _) => {
                return Err(bad("a transport service needs a TransportServices row with protocol tcp or udp"));
            }
            _ => continue,
        };
        ports.entry((number, protocol.as_str())).or_insert_with(|| ContainerPort {
            container_port: number,
            name: Some(format!("{prefix}-{number}")),
            protocol: Some(protocol),
        });
    }
    if ports.len() > MAX_PORTS {
        let last = services.last().map_or(0, |s| s.internal_port);
        return Err(RowError::BadService { kind: "all".into(), port: last, why: "more than 64 distinct ports" });
    }
    Ok(ports.into_values().collect())
}

/// Where and how a row is mapped.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// Namespace of the row's node.
    pub namespace: &'a str,
    /// The bridge's field manager, also the value of `SYNCED_BY_LABEL`.
    pub field_manager: &'a str,
    pub defaults: &'a DefaultEnv,
    pub grants: &'a Grants,
    /// Requests as a percentage of the limits Manager grants (100: requests = limits).
    pub requests_percent: u32,
    /// The rootfs volume's mount path, class and retention.
    pub rootfs: &'a RootfsVolume,
    /// Whether and how the row's services become a Service.
    pub service: &'a ServiceSettings,
    /// Which templates run as system containers.
    pub system_images: &'a SystemImages,
    /// Isolation for every container (`isolation`).
    pub isolation: &'a Option<Isolation>,
}

/// What one row should look like in the cluster.
#[derive(Clone, Debug)]
pub struct Desired {
    pub key: RowKey,
    pub created_at: String,
    pub namespace: String,
    pub name: String,
    pub secret_name: String,
    /// The CR to apply: no `spec.state` (start/stop belongs to others) and no status.
    pub workload: ManagedWorkload,
    /// The effective env; only ever written into the Secret.
    pub env: BTreeMap<String, String>,
    /// Fingerprint of everything above; carried by the applied CR.
    pub hash: String,
}

impl Desired {
    /// The env digest the Pod template carries; the Secret carries it too, so a stale Secret is
    /// recognised without reading its values.
    pub fn env_digest(&self) -> &str {
        self.workload.spec.pod_annotations.get(ENV_DIGEST_ANNOTATION).map_or("", String::as_str)
    }
}

/// Map one row. Errors name the column at fault.
pub fn desired(row: &ContainerRow, cx: &Context<'_>) -> Result<Desired, RowError> {
    let name = row.hostname.clone();
    if !is_dns_label(&name) {
        return Err(RowError::BadHostname(name));
    }
    let template = row.template.as_deref().map(str::trim).ok_or(RowError::MissingImage)?;
    image::check(template).map_err(|why| RowError::BadImage { template: template.to_string(), why })?;
    let command = match row.entrypoint.as_deref().map(str::trim).filter(|e| !e.is_empty()) {
        // An empty entrypoint means "keep the image's", as in Manager.
        None => Vec::new(),
        Some(entrypoint) => shell_words::split(entrypoint).map_err(|e| RowError::BadEntrypoint(e.to_string()))?,
    };
    let env = env::effective(cx.defaults, row.nvidia_requested != 0, row.environment_vars.as_deref())?;
    let secret_name = format!("{name}{SECRET_SUFFIX}");

    let approved = cx.grants.for_row(row);
    let cpus = approved.cpus.unwrap_or(DEFAULT_CPUS);
    let memory_mb = approved.memory_mb.unwrap_or(DEFAULT_MEMORY_MB);
    if cpus < 1 {
        return Err(RowError::BadResource { resource: "cpus", value: cpus });
    }
    if memory_mb < 1 {
        return Err(RowError::BadResource { resource: "memory", value: memory_mb });
    }
    let rootfs_gb = approved.rootfs_gb.unwrap_or(DEFAULT_ROOTFS_GB);
    if rootfs_gb < 1 {
        return Err(RowError::BadResource { resource: "rootfs", value: rootfs_gb });
    }
    // A smaller rootfs than the workload's claim has is synced as it is: the operator never
    // shrinks a claim, so the workload keeps its disk.
    let volumes = match &cx.rootfs.mount_path {
        None => Vec::new(),
        Some(mount_path) => vec![Volume {
            name: ROOTFS_VOLUME.into(),
            mount_path: mount_path.clone(),
            size: format!("{rootfs_gb}Gi"),
            storage_class_name: cx.rootfs.storage_class.clone(),
            access_mode: None,
            retention_policy: Some(cx.rootfs.on_delete),
        }],
    };
    let percent = i64::from(cx.requests_percent.clamp(1, 100));
    let resources = Resources {
        limits: Some(ResourceList {
            cpu: Some(Quantity(cpus.to_string())),
            memory: Some(Quantity(format!("{memory_mb}Mi"))),
        }),
        requests: Some(ResourceList {
            cpu: Some(Quantity(format!("{}m", (cpus * 1000 * percent / 100).max(1)))),
            memory: Some(Quantity(format!("{}Mi", (memory_mb * percent / 100).max(1)))),
        }),
        // `nvidiaRequested` is a yes/no in Manager: one GPU.
        gpus: (row.nvidia_requested != 0).then_some(1),
    };

    let ports = ports(&row.services)?;
    // No ports, no Service: Kubernetes refuses a Service without one (and the CRD too).
    let service = cx.service.type_.filter(|_| !ports.is_empty()).map(|type_| ServiceSpec {
        type_: Some(type_),
        load_balancer_class: cx.service.load_balancer_class.clone().filter(|_| type_ == ServiceType::LoadBalancer),
        annotations: cx.service.annotations.clone(),
        ..Default::default()
    });
    let env_refs = env
        .keys()
        .map(|key| EnvVar {
            name: key.clone(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(KeyRef { name: secret_name.clone(), key: key.clone(), optional: None }),
                config_map_key_ref: None,
            }),
        })
        .collect();
    let spec = ManagedWorkloadSpec {
        image: template.to_string(),
        command,
        env: env_refs,
        resources: Some(resources),
        hostname: Some(name.clone()),
        pod_annotations: BTreeMap::from([(ENV_DIGEST_ANNOTATION.to_string(), env_digest(&env))]),
        volumes,
        ports,
        service,
        system_container: cx.system_images.matches(template).then(Box::default),
        isolation: cx.isolation.clone(),
        ..Default::default()
    };
    let mut workload = ManagedWorkload::new(&name, spec);
    workload.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(cx.namespace.to_string()),
        labels: Some(labels(row.key(), cx.field_manager)),
        annotations: Some(BTreeMap::from([
            (ROW_CREATED_ANNOTATION.to_string(), row.created_at.clone()),
            (OWNER_ANNOTATION.to_string(), row.username.clone()),
        ])),
        ..Default::default()
    };
    let hash = desired::fingerprint(&(&workload, &secret_name));
    workload.annotations_mut().insert(BRIDGE_HASH_ANNOTATION.to_string(), hash.clone());
    Ok(Desired {
        key: row.key(),
        created_at: row.created_at.clone(),
        namespace: cx.namespace.to_string(),
        name,
        secret_name,
        workload,
        env,
        hash,
    })
}

/// Identity labels (docs/resource.md, "Labels") plus the bridge's ownership label.
pub fn labels(key: RowKey, field_manager: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NODE_ID_LABEL.to_string(), key.node_id.to_string()),
        (CONTAINER_ID_LABEL.to_string(), key.id.to_string()),
        (SYNCED_BY_LABEL.to_string(), field_manager.to_string()),
    ])
}

/// The row a bridge-made object stands for, read back from its labels.
pub fn key_of(labels: &BTreeMap<String, String>) -> Option<RowKey> {
    Some(RowKey {
        node_id: labels.get(NODE_ID_LABEL)?.parse().ok()?,
        id: labels.get(CONTAINER_ID_LABEL)?.parse().ok()?,
    })
}

/// The env Secret, owned by its CR (`owner`), so garbage collection removes it with the CR;
/// its annotation tells which env it holds.
pub fn secret(desired: &Desired, field_manager: &str, owner: Option<OwnerReference>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(desired.secret_name.clone()),
            namespace: Some(desired.namespace.clone()),
            labels: Some(labels(desired.key, field_manager)),
            annotations: Some(BTreeMap::from([(ENV_DIGEST_ANNOTATION.to_string(), desired.env_digest().to_string())])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(desired.env.iter().map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes()))).collect()),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// Not a controller reference: the CR does not manage its Secret, it only bounds its life.
pub fn owner_reference(workload: &impl Resource<DynamicType = ()>) -> Option<OwnerReference> {
    let mut owner = workload.controller_owner_ref(&())?;
    owner.controller = None;
    owner.block_owner_deletion = None;
    Some(owner)
}

/// Hex SHA-256 of the env: the values are secret, and a cryptographic digest may be shown
/// (as Helm charts show `checksum/secret`).
pub fn env_digest(env: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha256::new();
    for (k, v) in env {
        // Length-prefixed, so ("AB","C") and ("A","BC") differ.
        hasher.update((k.len() as u64).to_be_bytes());
        hasher.update(k.as_bytes());
        hasher.update((v.len() as u64).to_be_bytes());
        hasher.update(v.as_bytes());
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`: Manager's hostname rule, also valid as a CR,
/// Deployment and label value name.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod shared_cases;
#[cfg(test)]
mod tests;
