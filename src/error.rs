//! Errors of the operator, each with the context an operator on call needs.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("ManagedWorkload {0} has no namespace; the resource is namespaced")]
    MissingNamespace(String),

    /// The API server failed a read, apply or delete of one of a workload's objects.
    #[error("{operation} {kind} {object}: {source}")]
    Owned {
        operation: Operation,
        /// The object's kind, as the API names it (`Deployment`).
        kind: &'static str,
        /// `namespace/name` (one string keeps the error small: it is returned everywhere).
        object: String,
        #[source]
        source: kube::Error,
    },

    #[error("writing status of ManagedWorkload {namespace}/{name}: {source}")]
    WriteStatus {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("the watch caches closed; the controller is shutting down")]
    CacheClosed,

    #[error("loading Kubernetes client configuration: {0}")]
    Config(String),

    #[error("creating the Kubernetes client: {0}")]
    Client(#[source] kube::Error),

    #[error(
        "listing ManagedWorkloads in {scope} failed: {message} (`mw-operator check` with the same flags tells which of \
         connection, TLS, CRD or RBAC is wrong)"
    )]
    Access { scope: String, message: String },

    #[error("the ManagedWorkload CRD is not installed or not served ({0}); install it with `kubectl apply -f crds/`")]
    CrdMissing(#[source] kube::Error),
}

/// What the operator was doing to an object of a workload's when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Get,
    Apply,
    Delete,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::Get => "reading",
            Operation::Apply => "applying",
            Operation::Delete => "deleting",
        })
    }
}

impl Error {
    pub fn owned(operation: Operation, kind: &'static str, namespace: &str, name: &str, source: kube::Error) -> Error {
        Error::Owned { operation, kind, object: format!("{namespace}/{name}"), source }
    }

    /// The API server's own words when it refused the operator for lack of a permission
    /// (403): they name the user, verb, resource and namespace.
    pub fn forbidden(&self) -> Option<&str> {
        let source = match self {
            Error::Owned { source, .. } | Error::WriteStatus { source, .. } => source,
            _ => return None,
        };
        match source {
            kube::Error::Api(status) if is_authorization_denial(status) => Some(&status.message),
            _ => None,
        }
    }

    /// The workload's namespace is being deleted: it refused to create one of the workload's
    /// objects. Its deletion takes the workload too, so nothing is left to do for it.
    pub fn namespace_terminating(&self) -> bool {
        match self {
            Error::Owned { source: kube::Error::Api(status), .. } => is_namespace_terminating(status),
            _ => false,
        }
    }

    /// Every `kind()` a reconcile can fail with, as `mw_operator_reconcile_errors_total`'s `kind`
    /// label (exported from the start). The other kinds are start-up errors that end the process.
    pub const RECONCILE_KINDS: [&'static str; 12] = [
        "missing_namespace",
        "get_deployment",
        "apply_deployment",
        "get_claim",
        "apply_claim",
        "get_service",
        "apply_service",
        "delete_service",
        "get_network_policy",
        "apply_network_policy",
        "delete_network_policy",
        "write_status",
    ];

    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::MissingNamespace(_) => "missing_namespace",
            Error::Owned { operation, kind, .. } => owned_kind(*operation, kind),
            Error::WriteStatus { .. } => "write_status",
            Error::CacheClosed => "cache_closed",
            Error::Config(_) => "config",
            Error::Client(_) => "client",
            Error::CrdMissing(_) => "crd_missing",
            Error::Access { .. } => "access",
        }
    }

    /// Whether retrying the same object cannot help: the API server judged the request itself
    /// (400, 422), the object is gone (404), or it cannot be handled at all; such a reconcile
    /// waits for a change. Everything else (unreachable, overloaded, an RBAC 403, a timeout) is
    /// retried with backoff.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::MissingNamespace(_) => true,
            Error::Owned { source, .. } | Error::WriteStatus { source, .. } => permanent_api_error(source),
            Error::CacheClosed | Error::Config(_) | Error::Client(_) | Error::Access { .. } | Error::CrdMissing(_) => {
                false
            }
        }
    }
}

/// The metric label of a failed operation on an owned object, `<operation>_<object>`: a fixed
/// set (`Error::RECONCILE_KINDS`), so every series exists from the start.
fn owned_kind(operation: Operation, kind: &str) -> &'static str {
    match (operation, kind) {
        (Operation::Get, "Deployment") => "get_deployment",
        (Operation::Apply, "Deployment") => "apply_deployment",
        (Operation::Get, "PersistentVolumeClaim") => "get_claim",
        (Operation::Apply, "PersistentVolumeClaim") => "apply_claim",
        (Operation::Get, "Service") => "get_service",
        (Operation::Apply, "Service") => "apply_service",
        (Operation::Delete, "Service") => "delete_service",
        (Operation::Get, "NetworkPolicy") => "get_network_policy",
        (Operation::Apply, "NetworkPolicy") => "apply_network_policy",
        (Operation::Delete, "NetworkPolicy") => "delete_network_policy",
        _ => "owned_object",
    }
}

/// A 403 from the authorizer (RBAC), not from admission: a ResourceQuota, a
/// ValidatingAdmissionPolicy or a webhook also answer 403, and granting a Role cures none of
/// them. Only an authorization denial reads `... is forbidden: User "<user>" cannot <verb>
/// resource ...` (k8s.io/apiserver's `forbiddenMessage`).
pub fn is_authorization_denial(status: &kube::core::Status) -> bool {
    status.code == 403 && status.message.contains("forbidden: User \"") && status.message.contains("\" cannot ")
}

/// A create refused because its namespace is being deleted: the NamespaceLifecycle admission
/// plugin's 403 names the cause `NamespaceTerminating`.
pub fn is_namespace_terminating(status: &kube::core::Status) -> bool {
    status.code == 403
        && status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}

fn permanent_api_error(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => matches!(status.code, 400 | 404 | 422),
        // The answer does not parse as the object: the same request gets the same answer.
        kube::Error::SerdeError(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("refused", "Reason").with_code(code).boxed())
    }

    #[test]
    fn reconcile_kinds_are_the_kinds_of_the_errors_a_reconcile_returns() {
        let (ns, name) = (String::new, String::new);
        let reconcile = [
            Error::MissingNamespace(name()),
            Error::owned(Operation::Get, "Deployment", "", "", api(500)),
            Error::owned(Operation::Apply, "Deployment", "", "", api(500)),
            Error::owned(Operation::Get, "PersistentVolumeClaim", "", "", api(500)),
            Error::owned(Operation::Apply, "PersistentVolumeClaim", "", "", api(500)),
            Error::owned(Operation::Get, "Service", "", "", api(500)),
            Error::owned(Operation::Apply, "Service", "", "", api(500)),
            Error::owned(Operation::Delete, "Service", "", "", api(500)),
            Error::owned(Operation::Get, "NetworkPolicy", "", "", api(500)),
            Error::owned(Operation::Apply, "NetworkPolicy", "", "", api(500)),
            Error::owned(Operation::Delete, "NetworkPolicy", "", "", api(500)),
            Error::WriteStatus { namespace: ns(), name: name(), source: api(500) },
        ];
        let mut kinds: Vec<&str> = reconcile.iter().map(Error::kind).collect();
        let mut listed = Error::RECONCILE_KINDS.to_vec();
        kinds.sort_unstable();
        listed.sort_unstable();
        assert_eq!(kinds, listed);
        let start_up = [
            Error::Config(name()),
            Error::Client(api(500)),
            Error::Access { scope: ns(), message: name() },
            Error::CacheClosed,
            Error::CrdMissing(api(404)),
        ];
        for err in start_up {
            assert!(!Error::RECONCILE_KINDS.contains(&err.kind()), "{} is a start-up error", err.kind());
        }
    }

    fn write(code: u16) -> Error {
        Error::WriteStatus { namespace: "a".into(), name: "b".into(), source: api(code) }
    }

    fn status(code: u16, message: &str) -> kube::core::Status {
        kube::core::Status::failure(message, "Forbidden").with_code(code)
    }

    #[test]
    fn only_the_authorizer_s_403_is_a_missing_permission() {
        // As kube-apiserver 1.36 words them.
        let rbac = r#"deployments.apps "web" is forbidden: User "system:serviceaccount:ops:mw-operator" cannot patch resource "deployments" in API group "apps" in the namespace "apps""#;
        let quota = r#"deployments.apps "web" is forbidden: exceeded quota: deployments, requested: count/deployments.apps=1, used: count/deployments.apps=1, limited: count/deployments.apps=1"#;
        let webhook = r#"admission webhook "policy.example.com" denied the request: User "x" cannot run this image"#;
        let policy = r#"deployments.apps "web" is forbidden: ValidatingAdmissionPolicy 'no-latest' with binding 'b' denied request: failed expression"#;
        assert!(is_authorization_denial(&status(403, rbac)));
        for other in [quota, webhook, policy] {
            assert!(!is_authorization_denial(&status(403, other)), "{other}");
        }
        assert!(!is_authorization_denial(&status(409, rbac)), "only a 403");
        let write = |message: &str| Error::WriteStatus {
            namespace: "a".into(),
            name: "b".into(),
            source: kube::Error::Api(status(403, message).boxed()),
        };
        assert_eq!(write(rbac).forbidden(), Some(rbac));
        assert_eq!(write(quota).forbidden(), None, "a quota is not reported as a missing permission");
    }

    #[test]
    fn refusals_of_the_request_itself_are_permanent_and_outages_are_not() {
        for code in [400, 404, 422] {
            assert!(write(code).is_permanent(), "{code}");
        }
        for code in [403, 409, 429, 500, 503, 504] {
            assert!(!write(code).is_permanent(), "{code}");
        }
        assert!(Error::MissingNamespace("x".into()).is_permanent());
        assert!(!Error::CacheClosed.is_permanent());
        let unreachable =
            Error::owned(Operation::Apply, "Deployment", "a", "b", kube::Error::Service("connection refused".into()));
        assert!(!unreachable.is_permanent());
    }
}
