//! The I/O of `check`: asks the API server and records every answer, including failures, as
//! `Facts`. Nothing here fails as a whole: a problem is a fact for the checklist to report.

use futures::{StreamExt, stream};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};

use super::{
    Ask, Component, Crd, Facts, GROUP, Identity, LeaseScope, PLURAL, Permission, Review, VERSION, asks, error_chain,
    explain_connect_error,
};
use crate::client::{self, ConnectionArgs};
use crate::resource::ManagedWorkload;

/// Output format of the checklist.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(clap::Args, Clone, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Namespaces the operator (or bridge) will serve (repeat or comma-separate). All
    /// namespaces when omitted, as `run` does.
    #[arg(long = "namespace", short = 'n', env = "MW_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Check the bridge's permissions (config/rbac/bridge-role.yaml) instead of the operator's.
    #[arg(long)]
    pub bridge: bool,
    /// Namespace of the leader-election Lease, as `run --lease-namespace` (or `bridge
    /// --lease-namespace`): the component's own ($POD_NAMESPACE inside its Pod), else
    /// "default". Its Lease permissions (config/rbac/leader-election-role.yaml, or
    /// bridge-leader-election-role.yaml) are checked there and nowhere else.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the Lease, as `run --lease-name` (or `bridge --lease-name`): `mw-operator`, or
    /// with --bridge `mw-bridge`, unless named.
    #[arg(long, env = "MW_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// It runs without leader election (`--no-leader-election`): no Lease permissions to
    /// check.
    #[arg(long, env = "MW_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Checklist format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// SelfSubjectAccessReviews asked at once: a handful per namespace, each a small POST.
const CONCURRENT_REVIEWS: usize = 8;

pub async fn gather(args: &CheckArgs) -> Facts {
    let component = if args.bridge { Component::Bridge } else { Component::Operator };
    let mut facts = Facts {
        component,
        server: "(no server)".into(),
        connection: Err(String::new()),
        identity: None,
        crd: None,
        lists: None,
        reviews: Vec::new(),
    };
    let config = match client::config(&args.connection).await {
        Ok(config) => config,
        Err(e) => {
            facts.connection = Err(e.to_string());
            return facts;
        }
    };
    // Scheme, host and port: never the user-info part a URL may carry.
    let url = &config.cluster_url;
    facts.server = format!("{}://{}", url.scheme_str().unwrap_or("https"), url.host().unwrap_or("?"));
    if let Some(port) = url.port_u16() {
        facts.server.push_str(&format!(":{port}"));
    }
    // The operator's own client (`client::client`), so the check connects as it will.
    let client = match crate::client::client(config) {
        Ok(client) => client,
        Err(e) => {
            facts.connection = Err(explain_connect_error(&error_chain(&e)));
            return facts;
        }
    };
    match client.apiserver_version().await {
        Ok(info) => facts.connection = Ok(info.git_version),
        Err(e) => {
            facts.connection = Err(explain_connect_error(&message(&e)));
            return facts;
        }
    }
    facts.identity = Some(identity(&client).await);
    facts.crd = Some(crd(&client).await);
    if let Some(Ok(Crd::Served { .. })) = facts.crd {
        // As `run` and `bridge` ask it: in the first namespace served, else cluster-wide.
        let api = match args.namespaces.first() {
            Some(ns) => Api::<ManagedWorkload>::namespaced(client.clone(), ns),
            None => Api::<ManagedWorkload>::all(client.clone()),
        };
        facts.lists = Some(crate::reflect::probe_lists(&api).await);
    }
    let lease = (!args.no_leader_election)
        .then(|| LeaseScope { namespace: args.lease_namespace.clone(), name: lease_name(args) });
    facts.reviews = match asks(component, &args.namespaces, lease.as_ref()) {
        Ok(asks) => reviews(&client, asks).await,
        // Cannot happen with the binary's own embedded manifests (a unit test parses them).
        Err(e) => vec![Review {
            namespace: None,
            permission: Permission {
                verb: "?".into(),
                group: String::new(),
                resource: "?".into(),
                subresource: None,
                name: None,
            },
            required: true,
            allowed: Err(e.to_string()),
        }],
    };
    facts
}

/// An API error as the API server words it (kube's Display adds a debug dump of the Status);
/// anything else with its sources, where TLS and connection reasons are.
fn message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
        other => error_chain(other),
    }
}

async fn identity(client: &Client) -> Result<Identity, String> {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| format!("SelfSubjectReview (authentication.k8s.io/v1): {}", message(&e)))?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    Ok(Identity { username: user.username.unwrap_or_default(), groups: user.groups.unwrap_or_default() })
}

/// Discovery, which every authenticated user may read: the operator needs no permission on
/// CustomResourceDefinitions themselves.
async fn crd(client: &Client) -> Result<Crd, String> {
    let groups = client.list_api_groups().await.map_err(|e| message(&e))?;
    let Some(group) = groups.groups.iter().find(|g| g.name == GROUP) else { return Ok(Crd::GroupMissing) };
    let served: Vec<String> = group.versions.iter().map(|v| v.version.clone()).collect();
    if !served.iter().any(|v| v == VERSION) {
        return Ok(Crd::VersionMissing { served });
    }
    let resources = client.list_api_group_resources(&format!("{GROUP}/{VERSION}")).await.map_err(|e| message(&e))?;
    let has = |name: &str| resources.resources.iter().any(|r| r.name == name);
    if !has(PLURAL) {
        return Ok(Crd::GroupMissing);
    }
    Ok(Crd::Served { status_subresource: has(&format!("{PLURAL}/status")) })
}

async fn reviews(client: &Client, asks: Vec<Ask>) -> Vec<Review> {
    let api = Api::<SelfSubjectAccessReview>::all(client.clone());
    stream::iter(asks)
        .map(|Ask { namespace, permission, required }| {
            let api = api.clone();
            async move {
                let review = SelfSubjectAccessReview {
                    spec: SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(ResourceAttributes {
                            namespace: namespace.clone(),
                            verb: Some(permission.verb.clone()),
                            group: Some(permission.group.clone()),
                            resource: Some(permission.resource.clone()),
                            subresource: permission.subresource.clone(),
                            name: permission.name.clone(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let allowed = api
                    .create(&PostParams::default(), &review)
                    .await
                    .map(|r| r.status.is_some_and(|s| s.allowed))
                    .map_err(|e| message(&e));
                Review { namespace, permission, required, allowed }
            }
        })
        .buffered(CONCURRENT_REVIEWS)
        .collect()
        .await
}

/// The Lease checked: the one named, else the component's own.
fn lease_name(args: &CheckArgs) -> String {
    let default = if args.bridge { crate::bridge::DEFAULT_LEASE } else { crate::metrics::DEFAULT_LEASE };
    args.lease_name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| default.to_string())
}
