//! Errors of the bridge. A `RowError` concerns one Manager row: it is logged with the row's
//! id, counted by reason, and every other row keeps syncing. A `BridgeError` concerns the
//! bridge as a whole (configuration, the database, the API server).

use thiserror::Error;

/// Why one row could not be synced. Messages name the column at fault and never carry an
/// environment value (Manager's env holds secrets).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum RowError {
    #[error("template is NULL: Manager has no image for this container")]
    MissingImage,
    #[error("template {template:?} is not a container image reference: {why}")]
    BadImage { template: String, why: &'static str },
    #[error("Services row ({kind}, internalPort {port}): {why}")]
    BadService { kind: String, port: i64, why: &'static str },
    #[error("hostname {0:?} is not a valid Kubernetes name (RFC 1123 label, at most 63 characters)")]
    BadHostname(String),
    #[error("environmentVars is not a JSON object: {0}")]
    EnvNotJson(String),
    #[error("environmentVars key {0:?} is not a variable name (letters, digits and '_', not starting with a digit)")]
    EnvKey(String),
    #[error("entrypoint cannot be split into words as a POSIX shell would: {0}")]
    BadEntrypoint(String),
    #[error("the approved {resource} request ({value}) is not a positive number")]
    BadResource { resource: &'static str, value: i64 },
    #[error(
        "node {node_id} is a kubernetes node this bridge is not configured for; map it with --node <name>=<namespace>"
    )]
    UnmappedNode { node_id: i64 },
    #[error("hostname {name:?} is taken in namespace {namespace} by a ManagedWorkload the bridge does not own")]
    NameTaken { namespace: String, name: String },
    #[error("hostname {name:?} in namespace {namespace} is also used by {other}")]
    HostnameCollision { namespace: String, name: String, other: String },
    #[error("Secret {namespace}/{name} exists and was not created by the bridge; rename or delete it")]
    SecretTaken { namespace: String, name: String },
    #[error("the API server rejected {object}: {message}")]
    Rejected { object: String, message: String },
    #[error("ManagedWorkload {namespace}/{name} of an earlier container is still being deleted; retrying")]
    Replacing { namespace: String, name: String },
    #[error(
        "ManagedWorkload {namespace}/{name} stands for a container whose row is gone; this row's workload is created \
         once the deletion guard lets that one go (see the bridge's log)"
    )]
    AwaitingDeletion { namespace: String, name: String, uid: String },
    #[error("writing back containerId/ipv4Address violates {constraint}: another row holds the same value; retrying")]
    UniqueWriteBack { constraint: String },
    #[error(
        "this container runs as ManagedWorkload {from}/{name} (its containerId), but its node is now mapped to \
         namespace {to}, where it would start again on an empty disk; map the node back, or move the container \
         yourself: delete {from}/{name} (its disk is kept there) and clear the row's containerId"
    )]
    NodeMoved { from: String, name: String, to: String },
}

impl RowError {
    /// Every `reason()`, in the order of docs/bridge.md's table: the label values of
    /// `mw_bridge_row_errors_total`, each exported from the start.
    pub const REASONS: [&'static str; 17] = [
        "missing_image",
        "bad_service",
        "bad_image",
        "bad_hostname",
        "bad_env_json",
        "bad_env_key",
        "bad_entrypoint",
        "bad_resource",
        "unmapped_node",
        "name_taken",
        "hostname_collision",
        "secret_taken",
        "rejected",
        "replacing",
        "awaiting_deletion",
        "unique_violation",
        "node_moved",
    ];

    /// A short, stable label for the per-reason counter and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            RowError::MissingImage => "missing_image",
            RowError::BadImage { .. } => "bad_image",
            RowError::BadHostname(_) => "bad_hostname",
            RowError::BadService { .. } => "bad_service",
            RowError::EnvNotJson(_) => "bad_env_json",
            RowError::EnvKey(_) => "bad_env_key",
            RowError::BadEntrypoint(_) => "bad_entrypoint",
            RowError::BadResource { .. } => "bad_resource",
            RowError::UnmappedNode { .. } => "unmapped_node",
            RowError::NameTaken { .. } => "name_taken",
            RowError::HostnameCollision { .. } => "hostname_collision",
            RowError::SecretTaken { .. } => "secret_taken",
            RowError::Rejected { .. } => "rejected",
            RowError::Replacing { .. } => "replacing",
            RowError::AwaitingDeletion { .. } => "awaiting_deletion",
            RowError::UniqueWriteBack { .. } => "unique_violation",
            RowError::NodeMoved { .. } => "node_moved",
        }
    }
}

/// Errors that stop a sync pass (retried with backoff) or the bridge (at start-up).
#[derive(Debug, Error)]
pub enum BridgeError {
    #[error("bridge configuration: {0}")]
    Config(String),
    #[error("database {operation}: {source}")]
    Database {
        operation: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("Kubernetes API {operation}: {source}")]
    Kube {
        operation: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Operator(#[from] crate::error::Error),
    /// A write-back this replica refused because it may no longer write as leader.
    #[error("writing back to Manager: {0}")]
    NotLeading(#[source] crate::election::NotLeading),
    /// The pass was abandoned at its time limit (`--pass-timeout`): a database or API server
    /// connection that hangs without failing must not pin the loop.
    #[error(
        "the sync pass did not finish within {limit:?} and was abandoned (a hung database or API server connection?)"
    )]
    PassTimeout { limit: std::time::Duration },
}

impl BridgeError {
    pub fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> BridgeError {
        move |source| BridgeError::Database { operation, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_lists_every_reason_once() {
        let s = String::new;
        let every = [
            RowError::MissingImage,
            RowError::BadImage { template: s(), why: "" },
            RowError::BadService { kind: s(), port: 0, why: "" },
            RowError::BadHostname(s()),
            RowError::EnvNotJson(s()),
            RowError::EnvKey(s()),
            RowError::BadEntrypoint(s()),
            RowError::BadResource { resource: "cpus", value: 0 },
            RowError::UnmappedNode { node_id: 0 },
            RowError::NameTaken { namespace: s(), name: s() },
            RowError::HostnameCollision { namespace: s(), name: s(), other: s() },
            RowError::SecretTaken { namespace: s(), name: s() },
            RowError::Rejected { object: s(), message: s() },
            RowError::Replacing { namespace: s(), name: s() },
            RowError::AwaitingDeletion { namespace: s(), name: s(), uid: s() },
            RowError::UniqueWriteBack { constraint: s() },
            RowError::NodeMoved { from: s(), name: s(), to: s() },
        ];
        let mut reasons: Vec<&str> = every.iter().map(RowError::reason).collect();
        let mut listed = RowError::REASONS.to_vec();
        reasons.sort_unstable();
        listed.sort_unstable();
        assert_eq!(reasons, listed);
    }
}
