//! The bridge (docs/bridge.md): Manager's database rows become ManagedWorkloads, and their
//! live state flows back into the rows. Pure parts: `rows`, `env`, `image`, `mapping` (row →
//! CR and Secret), `plan` (what to do). I/O: `db` (PostgreSQL or SQLite), `cluster` (the CRs
//! and Secrets it made), `sync` (the loop).

pub mod cached;
pub mod cluster;
pub mod db;
pub mod env;
pub mod error;
pub mod image;
pub mod mapping;
pub mod metrics;
pub mod plan;
pub mod rows;
pub mod sync;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Notify, watch};
use tracing::info;

use crate::client;
use crate::election::{Election, Leadership};
pub use error::{BridgeError, RowError};
pub use sync::{NodeMapping, Settings};

/// `mw-operator bridge` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct BridgeArgs {
    #[command(flatten)]
    pub connection: client::ConnectionArgs,
    /// Manager's database: `postgres://USER@HOST:PORT/DB?sslmode=verify-full&sslrootcert=/ca.crt`
    /// or `sqlite:///path/to/database.sqlite`. No password here: see --database-password-file.
    #[arg(long, env = "MW_DATABASE_URL")]
    pub database_url: String,
    /// File holding the database password (its first line). Or set MW_DATABASE_PASSWORD.
    #[arg(long, env = "MW_DATABASE_PASSWORD_FILE")]
    pub database_password_file: Option<PathBuf>,
    /// A Manager node to serve and the namespace its containers go to, as
    /// `NODE_NAME=NAMESPACE` (a `"Nodes"` row with nodeType 'kubernetes'). Repeat or
    /// comma-separate.
    #[arg(long = "node", env = "MW_BRIDGE_NODES", value_delimiter = ',', required = true, value_parser = parse_mapping)]
    pub nodes: Vec<NodeMapping>,
    /// How often to look for changed rows.
    #[arg(long, default_value = "2s", env = "MW_POLL_INTERVAL", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// How often to re-read every row and delete the workloads whose row is gone (also done
    /// at once when a row disappears).
    #[arg(long, default_value = "5m", env = "MW_RESYNC_INTERVAL", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// Field manager of everything the bridge applies; also marks what it owns.
    #[arg(long, default_value = "mw-bridge", env = "MW_BRIDGE_FIELD_MANAGER")]
    pub field_manager: String,
    /// CPU and memory requests as a percentage of the limits Manager grants (100: the
    /// workload reserves all it may use).
    #[arg(long, default_value_t = 100, env = "MW_REQUESTS_PERCENT", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub requests_percent: u32,
    /// Where the approved rootfs (Manager's disk; 50 GB when none is approved) is mounted in
    /// the workload's container, as a persistent volume (claim `<hostname>-rootfs`). Empty:
    /// no volume, and the workload's files live only as long as its Pod.
    #[arg(long, default_value = "/data", env = "MW_ROOTFS_MOUNT_PATH")]
    pub rootfs_mount_path: String,
    /// StorageClass of the rootfs claims; empty: the cluster's default class.
    #[arg(long, default_value = "", env = "MW_ROOTFS_STORAGE_CLASS")]
    pub rootfs_storage_class: String,
    /// What deleting a container in Manager does to its disk: `retain` (the claim and its
    /// data stay, and a container re-created with the same hostname gets them back) or
    /// `delete` (the claim is deleted with the workload).
    #[arg(long, default_value = "retain", env = "MW_ROOTFS_ON_DELETE", value_parser = parse_retention)]
    pub rootfs_on_delete: crate::resource::RetentionPolicy,
    /// What the bridge writes to `Containers.ipv4Address`, the address Manager's nginx routes
    /// to: `service` (the workload's `status.address`: its load balancer's address, else its
    /// Service's cluster IP, else, without a Service, the serving Pod's IP) or `pod` (always
    /// the serving Pod's IP, for an nginx that reaches Pod IPs directly, e.g. over a routed
    /// Pod network). See docs/networking.md for which Manager topology needs which.
    #[arg(long = "ipv4-address", default_value = "service", env = "MW_IPV4_ADDRESS", value_parser = parse_address_source)]
    pub ipv4_address: plan::AddressSource,
    /// The Service each container with http or transport services gets: `ClusterIP`,
    /// `NodePort`, `LoadBalancer`, or `none` (the ports are declared on the Pod only).
    #[arg(long, default_value = "ClusterIP", env = "MW_SERVICE_TYPE", value_parser = parse_service_type)]
    pub service_type: ServiceTypeArg,
    /// With `--service-type LoadBalancer`: the load-balancer implementation to ask (empty: the
    /// cluster's default).
    #[arg(long, default_value = "", env = "MW_SERVICE_LOAD_BALANCER_CLASS")]
    pub service_load_balancer_class: String,
    /// An annotation on every Service the bridge asks for, as `KEY=VALUE` (e.g.
    /// `metallb.io/address-pool=manager`). Repeat for several.
    #[arg(long = "service-annotation", value_parser = parse_annotation)]
    pub service_annotations: Vec<(String, String)>,
    /// Image prefixes whose containers run as system containers (systemd as process 1:
    /// `spec.systemContainer`); repeat or comma-separate. Empty: none.
    #[arg(long = "system-container-images", env = "MW_SYSTEM_CONTAINER_IMAGES", value_delimiter = ',',
          default_value = mapping::MANAGER_TEMPLATES)]
    pub system_container_images: Vec<String>,
    /// Isolate every container (`spec.isolation`: connections only to its ports, and only
    /// from these): `cidr:<range>` (the hosts of Manager's agent), `namespace:<name>` (every
    /// Pod there: an ingress controller's), or `none` (nothing); repeat or comma-separate.
    /// Unset: no isolation. Needs a network plugin that enforces NetworkPolicies.
    #[arg(long = "isolation-allow-from", env = "MW_ISOLATION_ALLOW_FROM", value_delimiter = ',')]
    pub isolation_allow_from: Vec<String>,
    /// Where to serve /healthz, /readyz (ready while sync passes succeed) and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", env = "MW_METRICS_ADDRESS")]
    pub metrics_address: std::net::SocketAddr,
    /// API requests in flight at once while syncing.
    #[arg(long, default_value_t = 16, env = "MW_BRIDGE_CONCURRENCY", value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// The longest one sync pass may take; then it is abandoned (what it finished is kept)
    /// and retried with backoff, so a hung database or API server connection cannot pin it.
    #[arg(long, default_value = "5m", env = "MW_BRIDGE_PASS_TIMEOUT", value_parser = parse_duration)]
    pub pass_timeout: Duration,
    /// Hold back, until an administrator approves them, confirmed deletions of more than this
    /// percentage of the bridge's workloads (a wrong database makes every workload look
    /// orphaned). 100 lets every confirmed deletion through.
    #[arg(long, default_value_t = 50, env = "MW_BRIDGE_MAX_DELETE_PERCENT", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub max_delete_percent: u32,
    /// Confirmed deletions of fewer workloads than this go through whatever their share (the
    /// default, 2: one container deleted in Manager goes even from an install of one).
    #[arg(long, default_value_t = 2, env = "MW_BRIDGE_DELETE_GUARD_MINIMUM", value_parser = clap::value_parser!(u32).range(1..))]
    pub delete_guard_minimum: u32,
    /// Leader election among the bridge's replicas, on a Lease of its own (`mw-bridge` unless
    /// --lease-name says otherwise), fenced as the operator's.
    #[command(flatten)]
    pub election: crate::election::ElectionArgs,
}

/// The least time between the full read that finds CRs to delete and the one that confirms
/// them (never more than the resync interval).
pub const DELETE_CONFIRM_AFTER: Duration = Duration::from_secs(30);

/// The bridge's Lease unless --lease-name names another.
pub const DEFAULT_LEASE: &str = "mw-bridge";

fn parse_address_source(s: &str) -> Result<plan::AddressSource, String> {
    match s {
        "service" => Ok(plan::AddressSource::Service),
        "pod" => Ok(plan::AddressSource::Pod),
        other => Err(format!("{other:?}: expected service or pod")),
    }
}

/// `--service-type`: a Service type, or `none`. Its own type because clap reads an
/// `Option<T>` field as "the flag may be absent".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceTypeArg(pub Option<crate::resource::ServiceType>);

fn parse_service_type(s: &str) -> Result<ServiceTypeArg, String> {
    use crate::resource::ServiceType;
    let type_ = match s {
        "none" | "None" | "" => None,
        "ClusterIP" => Some(ServiceType::ClusterIP),
        "NodePort" => Some(ServiceType::NodePort),
        "LoadBalancer" => Some(ServiceType::LoadBalancer),
        other => return Err(format!("{other:?}: expected ClusterIP, NodePort, LoadBalancer or none")),
    };
    Ok(ServiceTypeArg(type_))
}

fn parse_annotation(s: &str) -> Result<(String, String), String> {
    let (key, value) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))?;
    if key.trim().is_empty() {
        return Err(format!("{s:?}: the annotation key is empty"));
    }
    Ok((key.trim().to_string(), value.to_string()))
}

fn parse_retention(s: &str) -> Result<crate::resource::RetentionPolicy, String> {
    match s {
        "retain" | "Retain" => Ok(crate::resource::RetentionPolicy::Retain),
        "delete" | "Delete" => Ok(crate::resource::RetentionPolicy::Delete),
        other => Err(format!("{other:?}: expected retain or delete")),
    }
}

fn parse_mapping(s: &str) -> Result<NodeMapping, String> {
    let (node, namespace) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected NODE_NAME=NAMESPACE"))?;
    let (node, namespace) = (node.trim(), namespace.trim());
    if node.is_empty() {
        return Err(format!("{s:?}: the node name is empty"));
    }
    if !mapping::is_dns_label(namespace) {
        return Err(format!("{s:?}: {namespace:?} is not a namespace name"));
    }
    Ok(NodeMapping { node: node.to_string(), namespace: namespace.to_string() })
}

/// `500ms`, `2s`, `5m`, `1h`, or a number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a duration such as 2s, 500ms or 5m"))?;
    let d = match unit {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if d.is_zero() { Err("must be more than zero".into()) } else { Ok(d) }
}

/// The password, from the file or `MW_DATABASE_PASSWORD`; never from a flag.
fn password(args: &BridgeArgs) -> Result<Option<String>, BridgeError> {
    if let Some(path) = &args.database_password_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BridgeError::Config(format!("reading the database password file {}: {e}", path.display())))?;
        return Ok(Some(text.lines().next().unwrap_or_default().to_string()));
    }
    Ok(std::env::var("MW_DATABASE_PASSWORD").ok().filter(|p| !p.is_empty()))
}

/// Run the bridge until SIGTERM or SIGINT: fill the caches, then sync while leading. A
/// standby keeps its caches warm, reports ready and alive, and writes nothing.
pub async fn run(args: BridgeArgs) -> Result<(), BridgeError> {
    // Before anything starts: a bad entry stops the bridge, naming the flag.
    let isolation = mapping::isolation(&args.isolation_allow_from)
        .map_err(|e| BridgeError::Config(format!("--isolation-allow-from: {e}")))?;
    let election =
        args.election.election(DEFAULT_LEASE, crate::election::default_identity).map_err(BridgeError::Config)?;
    let target = db::Target { url: args.database_url.clone(), password: password(&args)? };
    // Every write (CRs, Secrets, deletions, the write-back to Manager) is fenced by the leader's
    // deadline; the Lease requests and the watches use the plain clients.
    let leadership = election.as_ref().map_or_else(Leadership::unfenced, Election::leadership);
    let database = db::Database::connect(&target)?.fenced(leadership.clone());
    let clients = client::connect_all(&args.connection).await?;
    let writer = client::Clients {
        requests: leadership.client(clients.config.clone()).map_err(crate::error::Error::Client)?,
        ..clients.clone()
    };
    let mut namespaces: Vec<String> = args.nodes.iter().map(|m| m.namespace.clone()).collect();
    namespaces.sort();
    namespaces.dedup();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = metrics::Metrics::register(&mut registry);
    let settings = Settings {
        nodes: args.nodes.clone(),
        field_manager: args.field_manager.clone(),
        poll_interval: args.poll_interval,
        resync_interval: args.resync_interval,
        requests_percent: args.requests_percent,
        rootfs: mapping::RootfsVolume {
            mount_path: Some(args.rootfs_mount_path.clone()).filter(|p| !p.is_empty()),
            storage_class: Some(args.rootfs_storage_class.clone()).filter(|c| !c.is_empty()),
            on_delete: args.rootfs_on_delete,
        },
        service: mapping::ServiceSettings {
            type_: args.service_type.0,
            load_balancer_class: Some(args.service_load_balancer_class.clone()).filter(|c| !c.is_empty()),
            annotations: args.service_annotations.iter().cloned().collect(),
        },
        system_images: mapping::SystemImages(
            args.system_container_images.iter().map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect(),
        ),
        isolation,
        address: args.ipv4_address,
        concurrency: usize::from(args.concurrency),
        pass_timeout: args.pass_timeout,
        delete_guard: plan::DeleteGuard {
            max_percent: args.max_delete_percent,
            minimum: usize::try_from(args.delete_guard_minimum).unwrap_or(usize::MAX),
            confirm_after: DELETE_CONFIRM_AFTER.min(args.resync_interval),
        },
    };
    // The stall clock starts now, so a start-up that hangs (a watch that never lists) counts.
    let health = Arc::new(crate::telemetry::Health::with_stall_limit(sync::stall_limit(&settings)));
    crate::telemetry::serve(args.metrics_address, Arc::new(registry), health.clone())
        .await
        .map_err(|e| BridgeError::Config(format!("serving probes and metrics on {}: {e}", args.metrics_address)))?;
    let changed = Arc::new(Notify::new());
    let cluster = Arc::new(
        cluster::Cluster::start(&writer, &namespaces, &args.field_manager, changed.clone(), metrics.clone()).await?,
    );
    cluster.ready().await;
    info!(
        engine = ?database.engine(),
        nodes = ?args.nodes.iter().map(|m| format!("{}={}", m.node, m.namespace)).collect::<Vec<_>>(),
        poll = ?args.poll_interval,
        resync = ?args.resync_interval,
        pass_timeout = ?args.pass_timeout,
        max_delete_percent = args.max_delete_percent,
        delete_guard_minimum = args.delete_guard_minimum,
        field_manager = %args.field_manager,
        "bridge started"
    );
    // A standby is ready once its caches are, and alive while it stands by (it has no loop to
    // show progress); a leader's readiness follows its passes.
    health.set_ready(true);
    let leading = Arc::new(AtomicBool::new(false));
    tokio::spawn(standby_heartbeat(health.clone(), leading.clone()));

    // Each term starts afresh (with a full resync) from the shared caches.
    let term = |stop: watch::Receiver<bool>| {
        let bridge =
            sync::Bridge::new(database.clone(), cluster.clone(), settings.clone(), metrics.clone(), health.clone());
        let changed = changed.clone();
        async move {
            let mut stop = stop;
            bridge
                .run(changed, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
        }
    };
    let shutdown = crate::shutdown::signal();
    match election {
        None => crate::shutdown::until_stopped(crate::shutdown::STOP_GRACE, shutdown.clone(), term(shutdown)).await,
        Some(election) => {
            let on_leading = |lease: &str, leads: bool| {
                metrics.set_leader(lease, leads);
                leading.store(leads, Ordering::Relaxed);
                if !leads {
                    health.set_ready(true);
                }
            };
            election
                .run(clients.requests.clone(), &leadership, on_leading, shutdown, term)
                .await
                .map_err(|e| BridgeError::Config(e.to_string()))?;
        }
    }
    Ok(())
}

/// A standby has no loop to show progress, so it beats for liveness on its own.
async fn standby_heartbeat(health: Arc<crate::telemetry::Health>, leading: Arc<AtomicBool>) {
    loop {
        if !leading.load(Ordering::Relaxed) {
            health.beat();
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_mappings_and_durations() {
        assert_eq!(
            parse_mapping("k8s-lab-1=workloads").unwrap(),
            NodeMapping { node: "k8s-lab-1".into(), namespace: "workloads".into() }
        );
        assert!(parse_mapping("k8s-lab-1").is_err());
        assert!(parse_mapping("k8s=Bad_NS").is_err());
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("2d").is_err());
    }

    /// The flags as `mw-operator bridge` parses them (a flag's type and its parser must agree,
    /// which only parsing shows).
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: BridgeArgs,
    }

    fn parse(extra: &[&str]) -> Result<BridgeArgs, clap::Error> {
        use clap::Parser;
        let base = ["bridge", "--database-url", "sqlite:///m.sqlite", "--node", "k8s=apps"];
        Cli::try_parse_from(base.iter().chain(extra)).map(|c| c.args)
    }

    #[test]
    fn service_and_address_flags() {
        use crate::resource::ServiceType;
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.ipv4_address, plan::AddressSource::Service);
        assert_eq!(defaults.service_type, ServiceTypeArg(Some(ServiceType::ClusterIP)));
        assert!(defaults.service_load_balancer_class.is_empty() && defaults.service_annotations.is_empty());

        let set = parse(&[
            "--ipv4-address=pod",
            "--service-type=LoadBalancer",
            "--service-load-balancer-class=metallb.io/metallb",
            "--service-annotation=metallb.io/address-pool=manager",
            "--service-annotation=note=a=b",
        ])
        .unwrap();
        assert_eq!(set.ipv4_address, plan::AddressSource::Pod);
        assert_eq!(set.service_type, ServiceTypeArg(Some(ServiceType::LoadBalancer)));
        assert_eq!(set.service_load_balancer_class, "metallb.io/metallb");
        assert_eq!(
            set.service_annotations,
            [("metallb.io/address-pool".into(), "manager".into()), ("note".into(), "a=b".into())]
        );
        assert_eq!(parse(&["--service-type=none"]).unwrap().service_type, ServiceTypeArg(None));
        assert!(parse(&["--service-type=External"]).is_err());
        assert!(parse(&["--ipv4-address=mac"]).is_err());
        assert!(parse(&["--service-annotation=novalue"]).is_err());
    }
}
