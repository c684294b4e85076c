//! The workload's NetworkPolicy (`spec.isolation`) against the local control plane: what it
//! admits, drift put back, a foreign NetworkPolicy of the name holding the workload (never
//! started without its isolation) until it goes, and the policy deleted with `spec.isolation`.
//! This cluster's network plugin (kwok's nodes; the real node's CNI bridge) enforces no
//! NetworkPolicy, so these tests check the objects; docs/testing.md says so.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::json;
use support::workload::{TIMEOUT, apply, condition, wait_condition, wait_ready};
use support::{TestNamespace, audit, wait_until};

/// SSH and HTTP, open to the agent's hosts and to an ingress controller's namespace.
fn isolated(image: &str) -> serde_json::Value {
    json!({
        "image": image,
        "ports": [{"containerPort": 22}, {"containerPort": 8080, "name": "http"}],
        "isolation": {"allowFrom": [
            {"cidr": "10.0.0.0/24"},
            {"namespaceLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
        ]},
    })
}

fn ingress_ports(p: &NetworkPolicy) -> Vec<i32> {
    let rules = p.spec.as_ref().and_then(|s| s.ingress.clone()).unwrap_or_default();
    rules
        .iter()
        .flat_map(|r| r.ports.clone().unwrap_or_default())
        .filter_map(|port| match port.port {
            Some(IntOrString::Int(n)) => Some(n),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_policy_admits_the_declared_ports_from_the_named_peers_and_drift_is_reverted() {
    let ns = TestNamespace::new("iso-policy").await;
    let workloads = ns.api::<ManagedWorkload>();
    let policies = ns.api::<NetworkPolicy>();
    apply(&workloads, "web", isolated("nginx:latest")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;

    let policy = policies.get("web").await.unwrap();
    assert_eq!(policy.owner_references()[0].uid, mw.uid().unwrap(), "owned by the workload, as its controller");
    let spec = policy.spec.as_ref().unwrap();
    let selector = spec.pod_selector.as_ref().unwrap().match_labels.clone().unwrap();
    assert_eq!(selector["app.kubernetes.io/instance"], "web");
    assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string()][..]));
    assert_eq!(ingress_ports(&policy), [22, 8080]);
    let from = spec.ingress.as_ref().unwrap()[0].from.clone().unwrap();
    assert_eq!(from[0].ip_block.as_ref().unwrap().cidr, "10.0.0.0/24");
    assert_eq!(
        from[1].namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"],
        "ingress-nginx"
    );

    // Someone opens it to everyone (an ingress rule without `from`): the operator takes the
    // rules back.
    let patch = json!({"spec": {"ingress": [{}]}});
    policies.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_until(&policies, "web", "the rules restored", TIMEOUT, |p: Option<&NetworkPolicy>| {
        p.and_then(|p| p.spec.as_ref()?.ingress.clone())
            .is_some_and(|rules| rules.len() == 1 && rules[0].from.as_ref().is_some_and(|f| f.len() == 2))
    })
    .await;

    // A port added to the workload is admitted; one removed is not.
    let mut changed = isolated("nginx:latest");
    changed["ports"] = json!([{"containerPort": 8080, "name": "http"}, {"containerPort": 9090}]);
    apply(&workloads, "web", changed).await.unwrap();
    wait_until(&policies, "web", "the ports followed", TIMEOUT, |p: Option<&NetworkPolicy>| {
        p.is_some_and(|p| ingress_ports(p) == [8080, 9090])
    })
    .await;
}

#[tokio::test]
async fn a_foreign_policy_holds_the_workload_untouched_until_it_goes() {
    let ns = TestNamespace::new("iso-conflict").await;
    let workloads = ns.api::<ManagedWorkload>();
    let policies = ns.api::<NetworkPolicy>();
    let deployments = ns.api::<Deployment>();
    let theirs: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"podSelector": {"matchLabels": {"app": "theirs"}}, "policyTypes": ["Ingress"]}
    }))
    .unwrap();
    let theirs = policies.create(&PostParams::default(), &theirs).await.unwrap();

    apply(&workloads, "web", isolated("nginx:latest")).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(condition(&mw, "Stalled").reason, "NetworkPolicyConflict");
    assert!(condition(&mw, "Stalled").message.contains("not controlled by this ManagedWorkload"));
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Failed));
    assert!(deployments.get_opt("web").await.unwrap().is_none(), "not started without its isolation");
    let after = policies.get("web").await.unwrap();
    assert_eq!(after.resource_version(), theirs.resource_version(), "their NetworkPolicy was never written");

    policies.delete("web", &DeleteParams::foreground()).await.unwrap();
    wait_until(&workloads, "web", "Running after the conflict went", Duration::from_secs(60), |mw| {
        mw.is_some_and(|mw| support::workload::condition_current(mw, "Ready", "True"))
    })
    .await;
    let ours = policies.get("web").await.unwrap();
    assert_eq!(ours.owner_references()[0].uid, mw.uid().unwrap());
}

#[tokio::test]
async fn the_policy_goes_with_spec_isolation_and_only_the_workloads_own() {
    let ns = TestNamespace::new("iso-remove").await;
    let workloads = ns.api::<ManagedWorkload>();
    let policies: Api<NetworkPolicy> = ns.api();
    apply(&workloads, "web", isolated("nginx:latest")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    policies.get("web").await.unwrap();

    let mut open = isolated("nginx:latest");
    open.as_object_mut().unwrap().remove("isolation");
    apply(&workloads, "web", open).await.unwrap();
    wait_until(&policies, "web", "the policy deleted", TIMEOUT, |p: Option<&NetworkPolicy>| p.is_none()).await;
    wait_ready(&workloads, "web", Phase::Running).await;
    let deletes: Vec<_> = audit::operator_writes(&ns.name)
        .into_iter()
        .filter(|w| w.verb == "delete")
        .map(|w| (w.resource, w.name))
        .collect();
    assert_eq!(deletes, [("networkpolicies".to_string(), Some("web".to_string()))]);
}
