//! `mw-operator check`: can the operator (or the bridge) work with this kubeconfig, in these
//! namespaces? Connects, names the server version and the authenticated identity, finds the
//! CRD at this binary's version, and asks (one SelfSubjectAccessReview per verb and resource)
//! whether every permission the shipped RBAC grants is held, in each watched namespace and
//! the Lease's namespace, and whether a few it must not need (Secrets, cluster-admin) are
//! absent. The permissions are parsed from config/rbac/*.yaml, embedded at build time, so the
//! check and the manifests cannot drift apart. Pure; the I/O is in `probe`.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub mod probe;

/// API group and version of the ManagedWorkload this binary reads and writes.
pub const GROUP: &str = "opensource-server.mieweb.org";
pub const VERSION: &str = "v1alpha1";
pub const PLURAL: &str = "managedworkloads";

/// Which identity is being checked: its permissions come from its own shipped Role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Component {
    /// The controller (`mw-operator run`): config/rbac/role.yaml, and
    /// leader-election-role.yaml in the Lease's namespace.
    Operator,
    /// The database bridge (`mw-operator bridge`): config/rbac/bridge-role.yaml.
    Bridge,
}

const OPERATOR_ROLE: &str = include_str!("../config/rbac/role.yaml");
const BRIDGE_ROLE: &str = include_str!("../config/rbac/bridge-role.yaml");
const BRIDGE_LEADER_ELECTION_ROLE: &str = include_str!("../config/rbac/bridge-leader-election-role.yaml");
const LEADER_ELECTION_ROLE: &str = include_str!("../config/rbac/leader-election-role.yaml");

#[derive(Debug, Error)]
pub enum CheckError {
    #[error("the embedded {file} does not parse as a Role: {message}")]
    EmbeddedRole { file: &'static str, message: String },
}

/// One verb on one resource (or subresource) of one API group, on any object or on the one
/// named.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    /// Some: only the object of this name (an RBAC rule's `resourceNames`).
    pub name: Option<String>,
}

impl Permission {
    fn new(verb: &str, group: &str, resource: &str) -> Self {
        let (resource, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r.to_string(), Some(s.to_string())),
            None => (resource.to_string(), None),
        };
        Permission { verb: verb.into(), group: group.into(), resource, subresource, name: None }
    }

    fn named(self, name: &str) -> Self {
        Permission { name: Some(name.into()), ..self }
    }
}

/// As kubectl names it: `create deployments.apps`, `patch managedworkloads.<group>/status`.
impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.verb == "*" && self.resource == "*" && self.group == "*" {
            return write!(f, "every verb on every resource (cluster-admin)");
        }
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(sub) = &self.subresource {
            write!(f, "/{sub}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " named {name}")?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct RoleDoc {
    rules: Vec<RuleDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuleDoc {
    #[serde(default)]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

/// Every permission a Role's rules grant, one per verb and resource (and name: `name`
/// replaces a rule's `resourceNames`, since the shipped Role names the default Lease).
fn permissions(file: &'static str, text: &str, name: Option<&str>) -> Result<Vec<Permission>, CheckError> {
    let role: RoleDoc =
        serde_saphyr::from_str(text).map_err(|e| CheckError::EmbeddedRole { file, message: e.to_string() })?;
    let mut out = Vec::new();
    for rule in &role.rules {
        for group in &rule.api_groups {
            for resource in &rule.resources {
                for verb in &rule.verbs {
                    let permission = Permission::new(verb, group, resource);
                    out.push(match (rule.resource_names.first(), name) {
                        (None, _) => permission,
                        (Some(_), Some(name)) => permission.named(name),
                        (Some(shipped), None) => permission.named(shipped),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Every permission the component's shipped Role grants in each namespace it serves, one per
/// verb and resource.
pub fn required(component: Component) -> Result<Vec<Permission>, CheckError> {
    match component {
        Component::Operator => permissions("config/rbac/role.yaml", OPERATOR_ROLE, None),
        Component::Bridge => permissions("config/rbac/bridge-role.yaml", BRIDGE_ROLE, None),
    }
}

/// What `component`'s leader election needs on the Lease `lease_name`, in the Lease's
/// namespace only (config/rbac/leader-election-role.yaml, bridge-leader-election-role.yaml):
/// create (not restricted by name), and get and patch of that one Lease.
pub fn lease_required(component: Component, lease_name: &str) -> Result<Vec<Permission>, CheckError> {
    match component {
        Component::Operator => {
            permissions("config/rbac/leader-election-role.yaml", LEADER_ELECTION_ROLE, Some(lease_name))
        }
        Component::Bridge => {
            permissions("config/rbac/bridge-leader-election-role.yaml", BRIDGE_LEADER_ELECTION_ROLE, Some(lease_name))
        }
    }
}

/// Permissions the component must not hold where it serves: anything beyond its Role is a
/// risk nobody asked for. It never reads Secrets or writes Leases but its own (node heartbeats
/// are Leases too), and is never cluster-admin.
pub fn unwanted(component: Component) -> Vec<Permission> {
    let mut out = vec![Permission::new("*", "*", "*")];
    if component == Component::Operator {
        out.push(Permission::new("get", "", "secrets"));
        out.push(Permission::new("patch", "coordination.k8s.io", "leases"));
    }
    out
}

/// Where the operator's leader-election Lease lives (`run --lease-namespace`, `--lease-name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseScope {
    pub namespace: String,
    pub name: String,
}

/// One question for the API server: may the identity do this, here?
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// None: all namespaces (a cluster-wide install).
    pub namespace: Option<String>,
    pub permission: Permission,
    /// true: required (must be allowed); false: unwanted (should be denied).
    pub required: bool,
}

/// Everything to ask: the component's Role and its unwanted permissions in each namespace it
/// serves (all when `namespaces` is empty), then, with leader election, the Lease permissions
/// in the Lease's namespace only.
pub fn asks(component: Component, namespaces: &[String], lease: Option<&LeaseScope>) -> Result<Vec<Ask>, CheckError> {
    let needed = required(component)?;
    let unneeded = unwanted(component);
    let scopes: Vec<Option<String>> =
        if namespaces.is_empty() { vec![None] } else { namespaces.iter().cloned().map(Some).collect() };
    let mut out = Vec::new();
    for scope in &scopes {
        out.extend(needed.iter().map(|p| Ask { namespace: scope.clone(), permission: p.clone(), required: true }));
        out.extend(unneeded.iter().map(|p| Ask { namespace: scope.clone(), permission: p.clone(), required: false }));
    }
    if let Some(lease) = lease {
        out.extend(lease_required(component, &lease.name)?.into_iter().map(|permission| Ask {
            namespace: Some(lease.namespace.clone()),
            permission,
            required: true,
        }));
    }
    Ok(out)
}

/// Who the API server says the credentials belong to (SelfSubjectReview).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    pub groups: Vec<String>,
}

/// What discovery says about the CRD's API group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Crd {
    /// The group is not served at all: the CRD is not installed (or not yet Established).
    GroupMissing,
    /// The group is served, but not at the version this binary uses.
    VersionMissing { served: Vec<String> },
    /// Served at VERSION; whether the status subresource is there.
    Served { status_subresource: bool },
}

/// The answer to one SelfSubjectAccessReview.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Review {
    /// None: all namespaces (a cluster-wide install).
    pub namespace: Option<String>,
    pub permission: Permission,
    /// true: required (must be allowed); false: unwanted (should be denied).
    pub required: bool,
    /// allowed, or the error asking.
    pub allowed: Result<bool, String>,
}

/// Everything `probe` found out. Later facts are None when an earlier step failed (no
/// identity without a connection).
#[derive(Clone, Debug)]
pub struct Facts {
    pub component: Component,
    /// Scheme, host and port only: a URL can carry credentials in its user-info part.
    pub server: String,
    /// The server version, or why the API server could not be reached.
    pub connection: Result<String, String>,
    pub identity: Option<Result<Identity, String>>,
    pub crd: Option<Result<Crd, String>>,
    /// How its watches will list (asked only once the CRD is served: the question is a watch of
    /// ManagedWorkloads).
    pub lists: Option<crate::reflect::Lists>,
    pub reviews: Vec<Review>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

/// One line of the checklist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub check: &'static str,
    /// The namespace a permission check is about ("*" for all namespaces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub status: Status,
    pub detail: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    pub component: Component,
    pub ok: bool,
    pub checks: Vec<Check>,
}

fn line(check: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check { check, namespace: None, status, detail: detail.into() }
}

/// The checklist: one line per fact, in the order an installer fixes things.
pub fn checklist(facts: &Facts) -> Report {
    let mut checks = Vec::new();
    checks.push(match &facts.connection {
        Ok(version) if facts.server.starts_with("https://") => line(
            "connect",
            Status::Pass,
            format!("{}: Kubernetes {version}, server certificate verified", facts.server),
        ),
        Ok(version) => line(
            "connect",
            Status::Warn,
            format!("{}: Kubernetes {version}, but over plain HTTP: nothing to verify", facts.server),
        ),
        Err(e) => line("connect", Status::Fail, format!("{}: {e}", facts.server)),
    });
    match &facts.identity {
        Some(Ok(id)) if id.username == "system:anonymous" || id.username.is_empty() => checks.push(line(
            "identity",
            Status::Fail,
            "the API server treats these credentials as anonymous: the kubeconfig's user sends none it accepts",
        )),
        Some(Ok(id)) => checks.push(line(
            "identity",
            Status::Pass,
            format!("authenticated as {} (groups: {})", id.username, id.groups.join(", ")),
        )),
        Some(Err(e)) => checks.push(line("identity", Status::Fail, e.clone())),
        None => {}
    }
    let crd_name = format!("{PLURAL}.{GROUP}");
    match &facts.crd {
        Some(Ok(Crd::Served { status_subresource: true })) => {
            checks.push(line("crd", Status::Pass, format!("{crd_name} served at {VERSION}, with its status subresource")))
        }
        Some(Ok(Crd::Served { status_subresource: false })) => checks.push(line(
            "crd",
            Status::Fail,
            format!("{crd_name} is served at {VERSION} without a status subresource: reinstall it from crds/"),
        )),
        Some(Ok(Crd::VersionMissing { served })) => checks.push(line(
            "crd",
            Status::Fail,
            format!(
                "{GROUP} is served at [{}], not at {VERSION} that this binary uses: install the CRD from this release's crds/",
                served.join(", ")
            ),
        )),
        Some(Ok(Crd::GroupMissing)) => checks.push(line(
            "crd",
            Status::Fail,
            format!("{crd_name} is not installed (API group {GROUP} is not served): kubectl apply --server-side -f crds/"),
        )),
        Some(Err(e)) => checks.push(line("crd", Status::Fail, format!("discovering {GROUP}: {e}"))),
        None => {}
    }
    // Either way works; paged, an API server restart leaves more memory behind (see
    // `reflect::initial_lists`). Not knowing is worth a look: the watch itself may be refused.
    match &facts.lists {
        Some(lists @ crate::reflect::Lists::Unknown { .. }) => {
            checks.push(line("lists", Status::Warn, lists.to_string()))
        }
        Some(lists) => checks.push(line("lists", Status::Pass, lists.to_string())),
        None => {}
    }
    for review in &facts.reviews {
        let scope = review.namespace.clone().unwrap_or_else(|| "*".into());
        let where_ = match &review.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "in all namespaces".into(),
        };
        let p = &review.permission;
        let (check, status, detail) = match (&review.allowed, review.required) {
            (Ok(true), true) => ("rbac", Status::Pass, format!("{p}")),
            (Ok(false), true) => ("rbac", Status::Fail, format!("{p}: missing {where_} (cannot {p})")),
            (Ok(false), false) => ("least-privilege", Status::Pass, format!("{p}: not granted")),
            (Ok(true), false) => (
                "least-privilege",
                Status::Warn,
                format!("{p}: granted {where_}, but never needed; bind only the shipped Role"),
            ),
            (Err(e), _) => ("rbac", Status::Fail, format!("{p}: could not ask the API server: {e}")),
        };
        checks.push(Check { check, namespace: Some(scope), status, detail });
    }
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    Report { component: facts.component, ok, checks }
}

impl Report {
    /// Human checklist: one line per check, then a count.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let mark = match c.status {
                Status::Pass => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            let name = match &c.namespace {
                Some(ns) => format!("{} {ns}", c.check),
                None => c.check.to_string(),
            };
            out.push_str(&format!("[{mark}] {name:<24} {}\n", c.detail));
        }
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        out.push_str(&format!(
            "{} checks: {} passed, {} failed, {} warnings\n",
            self.checks.len(),
            count(Status::Pass),
            count(Status::Fail),
            count(Status::Warn)
        ));
        out
    }
}

/// A connection error, in words an installer can act on. `chain` is the error and its
/// sources joined with ": " (the TLS reason is usually several sources down).
pub fn explain_connect_error(chain: &str) -> String {
    let hint = if chain.contains("UnknownIssuer") || chain.contains("unknown issuer") {
        Some(
            "TLS: the API server's certificate is not signed by a CA this kubeconfig trusts; set the cluster's \
             certificate-authority(-data) to the CA that signed it (verification is never skipped)",
        )
    } else if chain.contains("NotValidForName") || chain.contains("not valid for name") {
        Some("TLS: the API server's certificate does not name the address in the kubeconfig's server URL")
    } else if chain.contains("Expired") || chain.contains("NotValidYet") {
        Some("TLS: the API server's certificate is outside its validity period (check the clocks, or renew it)")
    } else if chain.contains("invalid peer certificate") || chain.contains("certificate") {
        Some("TLS: the API server's certificate was not accepted")
    } else if chain.contains("Connection refused") || chain.contains("connection refused") {
        Some("nothing accepts connections at this address: is the API server up, and the URL right?")
    } else if chain.contains("timed out") || chain.contains("deadline") {
        Some("the API server did not answer in time (network, firewall or proxy?)")
    } else if chain.contains("Unauthorized") {
        Some("the API server rejected the credentials (401 Unauthorized): an expired token or a wrong certificate")
    } else {
        None
    };
    match hint {
        Some(h) => format!("{h} ({chain})"),
        None => chain.to_string(),
    }
}

/// An error and its sources, joined: kube's own Display stops at the outermost layer.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(verb: &str, group: &str, resource: &str) -> Permission {
        Permission::new(verb, group, resource)
    }

    #[test]
    fn the_operator_needs_exactly_what_its_shipped_role_grants() {
        let mut got: Vec<String> = required(Component::Operator).unwrap().iter().map(|p| p.to_string()).collect();
        got.sort();
        let mut want = vec![
            "get managedworkloads.opensource-server.mieweb.org",
            "list managedworkloads.opensource-server.mieweb.org",
            "watch managedworkloads.opensource-server.mieweb.org",
            "get managedworkloads.opensource-server.mieweb.org/status",
            "patch managedworkloads.opensource-server.mieweb.org/status",
            "get deployments.apps",
            "list deployments.apps",
            "watch deployments.apps",
            "create deployments.apps",
            "patch deployments.apps",
            "list replicasets.apps",
            "watch replicasets.apps",
            "get pods",
            "list pods",
            "watch pods",
            "get persistentvolumeclaims",
            "list persistentvolumeclaims",
            "watch persistentvolumeclaims",
            "create persistentvolumeclaims",
            "patch persistentvolumeclaims",
            "get services",
            "list services",
            "watch services",
            "create services",
            "patch services",
            "delete services",
            "get networkpolicies.networking.k8s.io",
            "list networkpolicies.networking.k8s.io",
            "watch networkpolicies.networking.k8s.io",
            "create networkpolicies.networking.k8s.io",
            "patch networkpolicies.networking.k8s.io",
            "delete networkpolicies.networking.k8s.io",
            "create events.events.k8s.io",
            "patch events.events.k8s.io",
            "list events",
        ];
        want.sort();
        // A change to config/rbac/role.yaml shows here; the check follows it by itself.
        assert_eq!(got, want);
        let operator = required(Component::Operator).unwrap();
        assert!(!operator.iter().any(|p| p.resource == "secrets"));
        assert!(!operator.iter().any(|p| p.resource == "leases"), "Leases are granted in one namespace only");
        assert!(
            operator
                .iter()
                .filter(|p| p.verb == "delete")
                .all(|p| ["services", "networkpolicies"].contains(&p.resource.as_str())),
            "the operator deletes nothing but a Service or NetworkPolicy its workload no longer asks for: a retained \
             claim outlives its workload, and the rest goes by garbage collection"
        );
    }

    #[test]
    fn leader_election_needs_one_named_lease_and_create() {
        let got: Vec<String> =
            lease_required(Component::Operator, "my-lease").unwrap().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            [
                "create leases.coordination.k8s.io",
                "get leases.coordination.k8s.io named my-lease",
                "patch leases.coordination.k8s.io named my-lease",
            ]
        );
        // The shipped Role names the default Lease.
        let shipped = permissions("config/rbac/leader-election-role.yaml", LEADER_ELECTION_ROLE, None).unwrap();
        assert!(shipped.iter().filter(|p| p.verb != "create").all(|p| p.name.as_deref() == Some("mw-operator")));
    }

    fn lease() -> LeaseScope {
        LeaseScope { namespace: "mw-system".into(), name: "mw-operator".into() }
    }

    #[test]
    fn lease_permissions_are_asked_in_the_lease_namespace_only() {
        let namespaces = vec!["team-a".to_string(), "team-b".to_string()];
        let all = asks(Component::Operator, &namespaces, Some(&lease())).unwrap();
        let leases: Vec<&Ask> = all.iter().filter(|a| a.permission.resource == "leases" && a.required).collect();
        assert_eq!(leases.len(), 3, "{all:#?}");
        assert!(leases.iter().all(|a| a.namespace.as_deref() == Some("mw-system")), "{leases:#?}");
        // In the watched namespaces: the Role, and that no Lease may be written there.
        for ns in ["team-a", "team-b"] {
            let here: Vec<&Ask> = all.iter().filter(|a| a.namespace.as_deref() == Some(ns)).collect();
            assert_eq!(here.iter().filter(|a| a.required).count(), required(Component::Operator).unwrap().len());
            assert!(here.iter().filter(|a| a.permission.resource == "leases").all(|a| !a.required), "{here:#?}");
        }
        assert!(!all.iter().any(|a| a.namespace.as_deref() == Some("mw-system") && !a.required));
        assert_eq!(all.len(), 2 * (35 + 3) + 3);

        // Cluster-wide: the Role in all namespaces, the Lease still in its own namespace.
        let all = asks(Component::Operator, &[], Some(&lease())).unwrap();
        assert!(
            all.iter()
                .filter(|a| a.permission.resource == "leases" && a.required)
                .all(|a| a.namespace.as_deref() == Some("mw-system"))
        );
        assert_eq!(all.iter().filter(|a| a.namespace.is_none() && a.required).count(), 35);

        // Without leader election: no Lease asked anywhere.
        let none = asks(Component::Operator, &namespaces, None).unwrap();
        assert!(!none.iter().any(|a| a.required && a.permission.resource == "leases"));
        // The bridge: its own Lease Role, in the Lease's namespace only.
        let bridge = asks(Component::Bridge, &namespaces, Some(&lease())).unwrap();
        let leases: Vec<&Ask> = bridge.iter().filter(|a| a.permission.resource == "leases" && a.required).collect();
        assert_eq!(leases.len(), 3, "{leases:#?}");
        assert!(leases.iter().all(|a| a.namespace.as_deref() == Some("mw-system")));
        let got: Vec<String> =
            lease_required(Component::Bridge, "mw-bridge").unwrap().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            [
                "create leases.coordination.k8s.io",
                "get leases.coordination.k8s.io named mw-bridge",
                "patch leases.coordination.k8s.io named mw-bridge"
            ]
        );
    }

    #[test]
    fn the_bridge_needs_its_own_role_and_may_read_secrets() {
        let bridge = required(Component::Bridge).unwrap();
        assert!(bridge.contains(&perm("create", "", "secrets")));
        assert!(bridge.contains(&perm("delete", GROUP, PLURAL)));
        assert!(!bridge.iter().any(|p| p.resource == "deployments" || p.resource == "pods"));
        assert!(!unwanted(Component::Bridge).iter().any(|p| p.resource == "secrets"));
        assert!(unwanted(Component::Operator).contains(&perm("get", "", "secrets")));
    }

    use crate::reflect::Lists;

    fn healthy() -> Facts {
        let review = |ns: &str, verb: &str, allowed: bool, required: bool| Review {
            namespace: Some(ns.into()),
            permission: perm(verb, "apps", "deployments"),
            required,
            allowed: Ok(allowed),
        };
        Facts {
            component: Component::Operator,
            server: "https://127.0.0.1:6443".into(),
            connection: Ok("v1.36.3".into()),
            identity: Some(Ok(Identity {
                username: "system:serviceaccount:mw-system:mw-operator".into(),
                groups: vec!["system:serviceaccounts".into(), "system:authenticated".into()],
            })),
            crd: Some(Ok(Crd::Served { status_subresource: true })),
            lists: Some(Lists::Streamed),
            reviews: vec![
                review("a", "create", true, true),
                review("b", "patch", true, true),
                Review {
                    namespace: Some("a".into()),
                    permission: perm("get", "", "secrets"),
                    required: false,
                    allowed: Ok(false),
                },
            ],
        }
    }

    #[test]
    fn a_healthy_install_passes_every_line() {
        let report = checklist(&healthy());
        assert!(report.ok);
        assert_eq!(report.checks.len(), 7);
        assert!(report.checks.iter().all(|c| c.status == Status::Pass), "{report:#?}");
        let text = report.to_text();
        assert!(text.contains("authenticated as system:serviceaccount:mw-system:mw-operator"), "{text}");
        assert!(text.contains("[ok  ] lists                    lists streamed as watch events\n"), "{text}");
        assert!(text.contains("[ok  ] rbac b"), "{text}");
        assert!(text.ends_with("7 checks: 7 passed, 0 failed, 0 warnings\n"), "{text}");
    }

    #[test]
    fn a_missing_permission_names_verb_resource_and_namespace() {
        let mut facts = healthy();
        facts.reviews[1].allowed = Ok(false);
        let report = checklist(&facts);
        assert!(!report.ok);
        let failed: Vec<_> = report.checks.iter().filter(|c| c.status == Status::Fail).collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].namespace.as_deref(), Some("b"));
        assert_eq!(failed[0].detail, "patch deployments.apps: missing in namespace b (cannot patch deployments.apps)");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["ok"], false);
        assert_eq!(json["checks"][5]["status"], "fail");
        assert_eq!(json["checks"][5]["namespace"], "b");
        assert_eq!(json["component"], "operator");
    }

    #[test]
    fn excess_privilege_warns_without_failing() {
        let mut facts = healthy();
        facts.reviews[2].allowed = Ok(true);
        let report = checklist(&facts);
        assert!(report.ok, "a warning is not a failure");
        let warn = report.checks.iter().find(|c| c.status == Status::Warn).unwrap();
        assert_eq!(warn.check, "least-privilege");
        assert!(warn.detail.starts_with("get secrets: granted in namespace a, but never needed"), "{}", warn.detail);
    }

    #[test]
    fn no_connection_stops_at_the_first_line() {
        let facts = Facts {
            connection: Err(explain_connect_error(
                "ServiceError: client error (Connect): invalid peer certificate: UnknownIssuer",
            )),
            identity: None,
            crd: None,
            lists: None,
            reviews: vec![],
            ..healthy()
        };
        let report = checklist(&facts);
        assert!(!report.ok);
        assert_eq!(report.checks.len(), 1);
        let detail = &report.checks[0].detail;
        assert!(
            detail.starts_with("https://127.0.0.1:6443: TLS: the API server's certificate is not signed"),
            "{detail}"
        );
        assert!(detail.contains("UnknownIssuer"), "the underlying reason stays visible: {detail}");
    }

    #[test]
    fn crd_problems_say_what_to_install() {
        for (crd, needle) in [
            (Crd::GroupMissing, "is not installed"),
            (Crd::VersionMissing { served: vec!["v1beta1".into()] }, "served at [v1beta1], not at v1alpha1"),
            (Crd::Served { status_subresource: false }, "without a status subresource"),
        ] {
            let report = checklist(&Facts { crd: Some(Ok(crd)), ..healthy() });
            let line = report.checks.iter().find(|c| c.check == "crd").unwrap();
            assert_eq!(line.status, Status::Fail);
            assert!(line.detail.contains(needle), "{}", line.detail);
            assert!(!report.ok);
        }
    }

    #[test]
    fn paged_lists_pass_and_an_unanswered_question_warns() {
        let refused = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
        let report = checklist(&Facts { lists: Some(Lists::Paged { refusal: Some(refused.into()) }), ..healthy() });
        let line = report.checks.iter().find(|c| c.check == "lists").unwrap();
        assert_eq!(line.status, Status::Pass);
        assert_eq!(
            line.detail,
            format!("lists paged, 100 objects a page: the API server does not stream them ({refused})")
        );

        let unknown = Lists::Unknown { reason: "no answer within 10s".into() };
        let report = checklist(&Facts { lists: Some(unknown), ..healthy() });
        let line = report.checks.iter().find(|c| c.check == "lists").unwrap();
        assert_eq!(line.status, Status::Warn);
        assert!(line.detail.ends_with("could not tell whether the API server streams them: no answer within 10s"));
        assert!(report.ok, "a warning is not a failure");
    }

    #[test]
    fn anonymous_is_not_an_identity() {
        let facts =
            Facts { identity: Some(Ok(Identity { username: "system:anonymous".into(), groups: vec![] })), ..healthy() };
        let report = checklist(&facts);
        assert_eq!(report.checks[1].status, Status::Fail);
    }

    #[test]
    fn connect_errors_are_explained() {
        assert!(explain_connect_error("x: invalid peer certificate: NotValidForName").contains("does not name"));
        assert!(explain_connect_error("tcp connect error: Connection refused (os error 111)").contains("nothing"));
        assert!(explain_connect_error("Unauthorized (401 Unauthorized)").contains("rejected the credentials"));
        assert_eq!(explain_connect_error("something else"), "something else");
    }
}
