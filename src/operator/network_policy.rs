//! The NetworkPolicy a ManagedWorkload with `spec.isolation` asks for, built purely from the
//! CR, and the kind as `step` sees it; everything else (observe, decide, apply, drift,
//! conflicts, removal once `spec.isolation` goes) is the step's, as for every kind. This is
//! what a whole owned kind looks like.
//!
//! The policy lets connections in only to the workload's ports and only from `allowFrom`. A
//! rule without `from` admits every source and one without `ports` every port, so with no
//! port or no peer there is no rule at all and nothing gets in. Egress is left alone.

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};

use super::context::Context;
use super::ownership::{labels, selector_labels, stamp_applied_hash};
use super::status::Blocked;
use super::step::{self, Flow, Owned};
use crate::error::Error;
use crate::resource::{ManagedWorkload, Peer, Protocol};

/// The desired NetworkPolicy, named as the workload; `None` when no isolation is asked for,
/// or the CR has no UID yet.
pub fn network_policy(mw: &ManagedWorkload) -> Option<NetworkPolicy> {
    let isolation = mw.spec.isolation.as_ref()?;
    let owner = mw.controller_owner_ref(&())?;
    let ports: Vec<NetworkPolicyPort> = mw
        .spec
        .ports
        .iter()
        .map(|p| NetworkPolicyPort {
            port: Some(IntOrString::Int(p.container_port)),
            protocol: Some(p.protocol.unwrap_or(Protocol::TCP).as_str().into()),
            end_port: None,
        })
        .collect();
    let from: Vec<NetworkPolicyPeer> = isolation.allow_from.iter().map(peer).collect();
    let ingress = if ports.is_empty() || from.is_empty() {
        vec![]
    } else {
        vec![NetworkPolicyIngressRule { from: Some(from), ports: Some(ports) }]
    };
    let mut policy = NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(mw.name_any()),
            namespace: mw.namespace(),
            labels: Some(labels(mw)),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some(selector_labels(mw)), match_expressions: None }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            egress: None,
        }),
    };
    stamp_applied_hash(&mut policy);
    Some(policy)
}

fn peer(peer: &Peer) -> NetworkPolicyPeer {
    let selector = |labels: &Option<std::collections::BTreeMap<String, String>>| {
        labels.as_ref().map(|l| LabelSelector { match_labels: Some(l.clone()), match_expressions: None })
    };
    NetworkPolicyPeer {
        ip_block: peer.cidr.as_ref().map(|cidr| IPBlock { cidr: cidr.clone(), except: None }),
        namespace_selector: selector(&peer.namespace_labels),
        pod_selector: selector(&peer.pod_labels),
    }
}

/// The isolation step of a reconcile: why the policy is blocked, if it is.
pub async fn reconcile(ctx: &Context, mw: &ManagedWorkload, namespace: &str) -> Result<Flow<Option<Blocked>>, Error> {
    Ok(match step::ensure(ctx, mw, namespace, &mw.name_any(), network_policy(mw)).await? {
        Flow::Done((_, blocked)) => Flow::Done(blocked),
        Flow::Requeue(after) => Flow::Requeue(after),
    })
}

impl Owned for NetworkPolicy {
    /// Kept whole: a workload has at most one, and few workloads ask for one.
    type Cached = NetworkPolicy;
    const CONFLICT: &'static str = "NetworkPolicyConflict";
    const REJECTED: &'static str = "NetworkPolicyRejected";

    fn cache(ctx: &Context) -> &Store<NetworkPolicy> {
        &ctx.caches.network_policies
    }

    fn conflict(_mw: &ManagedWorkload, name: &str, _live: Option<&NetworkPolicy>) -> String {
        format!(
            "a NetworkPolicy named {name} already exists and is not controlled by this ManagedWorkload; it is left \
             untouched (it still applies to the Pods it selects): delete or rename it, or rename the \
             ManagedWorkload (or remove spec.isolation)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{ContainerPort, Isolation, ManagedWorkloadSpec};
    use std::collections::BTreeMap;

    fn workload(ports: &[(i32, Option<Protocol>)], allow_from: Vec<Peer>) -> ManagedWorkload {
        let mut mw = ManagedWorkload::new(
            "web",
            ManagedWorkloadSpec {
                image: "nginx:1.27".into(),
                ports: ports
                    .iter()
                    .map(|&(container_port, protocol)| ContainerPort { container_port, name: None, protocol })
                    .collect(),
                isolation: Some(Isolation { allow_from }),
                ..Default::default()
            },
        );
        mw.metadata.namespace = Some("apps".into());
        mw.metadata.uid = Some("u1".into());
        mw
    }

    fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    fn spec(policy: &NetworkPolicy) -> &NetworkPolicySpec {
        policy.spec.as_ref().unwrap()
    }

    #[test]
    fn only_the_declared_ports_from_the_named_peers() {
        let agent = Peer { cidr: Some("10.0.0.0/24".into()), ..Default::default() };
        let ingress = Peer {
            namespace_labels: labels(&[("kubernetes.io/metadata.name", "ingress-nginx")]),
            ..Default::default()
        };
        let mw = workload(&[(22, None), (8080, None), (53, Some(Protocol::UDP))], vec![agent, ingress]);
        let policy = network_policy(&mw).unwrap();
        assert_eq!(policy.metadata.name.as_deref(), Some("web"));
        assert_eq!(policy.metadata.owner_references.as_ref().unwrap()[0].uid, "u1");
        let spec = spec(&policy);
        assert_eq!(spec.pod_selector.as_ref().unwrap().match_labels, Some(selector_labels(&mw)));
        assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string()][..]));
        assert!(spec.egress.is_none(), "egress is left alone");
        let rules = spec.ingress.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        let ports: Vec<_> =
            rules[0].ports.as_ref().unwrap().iter().map(|p| (p.port.clone(), p.protocol.clone().unwrap())).collect();
        assert_eq!(
            ports,
            [
                (Some(IntOrString::Int(22)), "TCP".to_string()),
                (Some(IntOrString::Int(8080)), "TCP".to_string()),
                (Some(IntOrString::Int(53)), "UDP".to_string())
            ]
        );
        let from = rules[0].from.as_ref().unwrap();
        assert_eq!(from[0].ip_block.as_ref().unwrap().cidr, "10.0.0.0/24");
        assert!(from[0].namespace_selector.is_none() && from[0].pod_selector.is_none());
        assert_eq!(
            from[1].namespace_selector.as_ref().unwrap().match_labels,
            labels(&[("kubernetes.io/metadata.name", "ingress-nginx")])
        );
        assert!(from[1].pod_selector.is_none(), "every Pod of those namespaces");
    }

    #[test]
    fn no_peer_or_no_port_lets_nothing_in_rather_than_everything() {
        // An ingress rule without `from` (or without `ports`) would admit every source (port).
        let anyone = Peer { namespace_labels: labels(&[]), ..Default::default() };
        for mw in [workload(&[(80, None)], vec![]), workload(&[], vec![anyone])] {
            let policy = network_policy(&mw).unwrap();
            assert_eq!(spec(&policy).ingress.as_deref(), Some(&[][..]), "isolated, nothing admitted");
            let json = serde_json::to_value(&policy).unwrap();
            assert_eq!(json["spec"]["ingress"], serde_json::json!([]), "sent as an empty list, not left out");
        }
    }

    #[test]
    fn pods_of_other_namespaces_by_both_selectors_in_one_peer() {
        let agents = Peer {
            namespace_labels: labels(&[("team", "manager")]),
            pod_labels: labels(&[("app", "agent")]),
            ..Default::default()
        };
        let policy = network_policy(&workload(&[(80, None)], vec![agents])).unwrap();
        let from = &spec(&policy).ingress.as_ref().unwrap()[0].from.as_ref().unwrap()[0];
        // One peer with both selectors: those Pods in those namespaces (not either).
        assert_eq!(from.namespace_selector.as_ref().unwrap().match_labels, labels(&[("team", "manager")]));
        assert_eq!(from.pod_selector.as_ref().unwrap().match_labels, labels(&[("app", "agent")]));
    }

    #[test]
    fn none_without_isolation() {
        let mut mw = workload(&[(80, None)], vec![]);
        mw.spec.isolation = None;
        assert!(network_policy(&mw).is_none());
    }
}
