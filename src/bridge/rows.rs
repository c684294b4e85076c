//! Manager's rows as the bridge reads them: plain data. The SQL in `db` casts every column to
//! a type both engines decode alike, so nothing here knows the engine.

use std::collections::HashMap;

/// Which Manager container a row or a CR stands for. `Containers.id` alone is not enough:
/// the same id under another node is another container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowKey {
    pub node_id: i64,
    pub id: i64,
}

impl std::fmt::Display for RowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Containers.id={} (node {})", self.id, self.node_id)
    }
}

/// One `"Containers"` row.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ContainerRow {
    pub id: i64,
    pub node_id: i64,
    pub site_id: i64,
    pub hostname: String,
    pub username: String,
    pub template: Option<String>,
    pub environment_vars: Option<String>,
    pub entrypoint: Option<String>,
    pub nvidia_requested: i64,
    pub container_id: Option<String>,
    pub ipv4_address: Option<String>,
    pub mac_address: Option<String>,
    /// Sequelize's text form, `YYYY-MM-DD HH:MM:SS.fff +00:00`. With the key, it tells a
    /// re-used SQLite id (no AUTOINCREMENT) from the same container.
    pub created_at: String,
    pub updated_at: String,
    /// The container's http and transport `"Services"` rows (read separately, see
    /// `db::services`): what becomes the workload's ports and Service.
    #[sqlx(skip)]
    pub services: Vec<ServiceRow>,
}

/// One `"Services"` row of type `http` or `transport`, with its transport protocol.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ServiceRow {
    pub container_id: i64,
    /// `http` or `transport`.
    pub kind: String,
    pub internal_port: i64,
    /// `TransportServices.protocol` (tcp or udp); None for http.
    pub protocol: Option<String>,
}

impl ContainerRow {
    pub fn key(&self) -> RowKey {
        RowKey { node_id: self.node_id, id: self.id }
    }

    /// The columns the bridge writes back, as the row holds them now.
    pub fn written(&self) -> RowState {
        RowState {
            container_id: self.container_id.clone(),
            ipv4_address: self.ipv4_address.clone(),
            mac_address: self.mac_address.clone(),
        }
    }
}

/// The columns the bridge owns on a row: `containerId`, `ipv4Address`, `macAddress`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowState {
    pub container_id: Option<String>,
    pub ipv4_address: Option<String>,
    pub mac_address: Option<String>,
}

/// One `"Nodes"` row of type `kubernetes`.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct NodeRow {
    pub id: i64,
    pub name: String,
    pub site_id: i64,
}

/// One approved `"ResourceRequests"` row for cpus, memory or rootfs.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct GrantRow {
    pub site_id: i64,
    pub hostname: String,
    pub username: String,
    pub resource_type: String,
    pub value: i64,
}

/// Approved cpu, memory and rootfs per (site, hostname, username), latest approval winning, as
/// Manager's `ResourceRequest.getApprovedResources` reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants(HashMap<(i64, String, String), Approved>);

/// What has been approved for one container; `None` means Manager's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Approved {
    pub cpus: Option<i64>,
    pub memory_mb: Option<i64>,
    /// Disk, in GB (Manager's unit; sized here as GiB, as Proxmox does).
    pub rootfs_gb: Option<i64>,
}

impl Grants {
    /// From rows ordered oldest approval first, so a later one replaces an earlier one.
    pub fn from_rows(rows: impl IntoIterator<Item = GrantRow>) -> Self {
        let mut map: HashMap<(i64, String, String), Approved> = HashMap::new();
        for row in rows {
            let entry = map.entry((row.site_id, row.hostname, row.username)).or_default();
            match row.resource_type.as_str() {
                "cpus" => entry.cpus = Some(row.value),
                "memory" => entry.memory_mb = Some(row.value),
                "rootfs" => entry.rootfs_gb = Some(row.value),
                _ => {}
            }
        }
        Grants(map)
    }

    pub fn for_row(&self, row: &ContainerRow) -> Approved {
        self.0.get(&(row.site_id, row.hostname.clone(), row.username.clone())).copied().unwrap_or_default()
    }
}

/// A cheap summary of what the incremental poll cannot see by `Containers."updatedAt"`:
/// deleted rows (count and id sum) and changed nodes, settings and resource requests. When it
/// changes, the bridge runs a full resync at once.
#[derive(Clone, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct Fingerprint {
    pub containers: i64,
    pub id_sum: i64,
    pub nodes_updated: Option<String>,
    pub settings_updated: Option<String>,
    pub grants_updated: Option<String>,
    /// `"Services"` and `"TransportServices"` (a container's ports): changed, every row is re-read.
    pub services_updated: Option<String>,
    /// The database's clock when the fingerprint was read (`Engine::ts` form): the bound of
    /// the incremental poll that follows.
    pub db_now: String,
}
