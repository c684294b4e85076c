//! Every label and annotation name the operator, the bridge and Manager's provider write or
//! read, in one place: the modules that build objects and those that read them both import
//! from here, never from each other.

// Who a Manager container is and who made it: on the CR, copied to what the operator makes.
/// Identity labels Manager puts on a CR; copied to the Deployment and its Pods.
pub const NODE_ID_LABEL: &str = "opensource-server.mieweb.org/node-id";
pub const CONTAINER_ID_LABEL: &str = "opensource-server.mieweb.org/container-id";
/// The Manager user owning the container (`Containers.username`), set by whoever makes the CR
/// for Manager (the bridge, Manager's provider). With the node id it says whose data a
/// retained claim holds: a claim goes back only to a workload of the same owner.
pub const OWNER_ANNOTATION: &str = "opensource-server.mieweb.org/owner";
/// Says which bridge (by its field manager) made a CR or Secret. The bridge touches nothing
/// without it: it never adopts, overwrites or deletes another's objects.
pub const SYNCED_BY_LABEL: &str = "opensource-server.mieweb.org/synced-by";
/// Marks what Manager's own jobs made through its Kubernetes provider (`integrations/manager`).
/// The bridge never touches an object that carries it, even one with its own label (a node
/// moved from the bridge to the provider): a node is served by one or the other, never both.
pub const PROVIDER_LABEL: &str = "opensource-server.mieweb.org/provider";

// What the operator marks its objects with.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Selects every object the operator manages (its watches use it).
pub const MANAGED_LABEL: &str = "opensource-server.mieweb.org/managed";
/// Fingerprint of the whole desired object, so "is it up to date?" needs no write.
pub const APPLIED_HASH_ANNOTATION: &str = "opensource-server.mieweb.org/applied-hash";

// A claim's own marks (the operator's).
/// The operator's mark on every claim it makes: `<workload>/<volume>`.
pub const VOLUME_OF_ANNOTATION: &str = "opensource-server.mieweb.org/volume-of";
/// The UID of the workload a claim is attached to now.
pub const WORKLOAD_UID_ANNOTATION: &str = "opensource-server.mieweb.org/workload-uid";
/// On a claim made where a claim of that name had just been deleted: it started empty. Kept
/// for as long as the claim lives, so `status.volumes` keeps saying so.
pub const REPLACED_ANNOTATION: &str = "opensource-server.mieweb.org/replaced-deleted-claim";

// The pod template's mark.
/// Fingerprint of the pod template, stamped on it so a Pod tells which template it runs.
pub const TEMPLATE_HASH_ANNOTATION: &str = "opensource-server.mieweb.org/template-hash";

// The bridge's marks on a CR and its env Secret.
/// The row's `createdAt`: with the id labels it tells a re-used SQLite id from the container
/// the CR was made for.
pub const ROW_CREATED_ANNOTATION: &str = "opensource-server.mieweb.org/row-created-at";
/// Fingerprint of what the bridge last applied, so an unchanged row costs no API write.
pub const BRIDGE_HASH_ANNOTATION: &str = "opensource-server.mieweb.org/bridge-hash";
/// SHA-256 of the env Secret's data, on the pod template: a changed value rolls out a new
/// Pod although the CR only references the Secret (the Helm `checksum/secret` pattern). On
/// the Secret too, saying which env it holds.
pub const ENV_DIGEST_ANNOTATION: &str = "opensource-server.mieweb.org/env-sha256";
/// Set by an administrator on each CR of a held mass deletion, with the token the bridge logs
/// for that set, to let the bridge delete exactly that set (see `plan::DeleteGuard`).
pub const APPROVE_DELETION_ANNOTATION: &str = "opensource-server.mieweb.org/approve-deletion";
