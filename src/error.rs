//! Errors of the operator, each with the context an operator on call needs.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("ManagedWorkload {0} has no namespace; the resource is namespaced")]
    MissingNamespace(String),

    #[error("reading Deployment {namespace}/{name}: {source}")]
    GetDeployment {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("applying Deployment {namespace}/{name}: {source}")]
    ApplyDeployment {
        namespace: String,
        name: String,
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

impl Error {
    /// The API server's own words when it refused the operator for lack of a permission
    /// (403): they name the user, verb, resource and namespace.
    pub fn forbidden(&self) -> Option<&str> {
        let source = match self {
            Error::GetDeployment { source, .. }
            | Error::ApplyDeployment { source, .. }
            | Error::WriteStatus { source, .. } => source,
            _ => return None,
        };
        match source {
            kube::Error::Api(status) if status.code == 403 => Some(&status.message),
            _ => None,
        }
    }

    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::MissingNamespace(_) => "missing_namespace",
            Error::GetDeployment { .. } => "get_deployment",
            Error::ApplyDeployment { .. } => "apply_deployment",
            Error::WriteStatus { .. } => "write_status",
            Error::CacheClosed => "cache_closed",
            Error::Config(_) => "config",
            Error::Client(_) => "client",
            Error::CrdMissing(_) => "crd_missing",
            Error::Access { .. } => "access",
        }
    }
}
