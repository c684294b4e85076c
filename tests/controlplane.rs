//! Proof that the local control plane is real: the Deployment controller, the scheduler and
//! kwok turn a Deployment into a Ready Pod with an IP, and the garbage collector removes the
//! ReplicaSet and Pods when the Deployment goes.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use support::{TestNamespace, wait_until};

const TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_deployment_becomes_available_and_is_garbage_collected() {
    let ns = TestNamespace::new("plain-deployment").await;
    let deployments = ns.api::<Deployment>();
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "nginx"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "nginx"}},
            "template": {
                "metadata": {"labels": {"app": "nginx"}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:latest"}]}
            }
        }
    }))
    .unwrap();
    deployments.create(&PostParams::default(), &deployment).await.unwrap();

    wait_until(&deployments, "nginx", "Available=True", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Available" && c.status == "True"))
            && d.and_then(|d| d.status.as_ref()?.available_replicas) == Some(1)
    })
    .await;

    let pods = ns.api::<Pod>().list(&ListParams::default().labels("app=nginx")).await.unwrap();
    assert_eq!(pods.items.len(), 1, "one Pod for one replica");
    let status = pods.items[0].status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let ip = status.pod_ip.expect("kwok assigns a Pod IP");
    assert!(ip.parse::<std::net::Ipv4Addr>().is_ok(), "pod IP {ip} is an IPv4 address");
    assert!(status.conditions.unwrap().iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    assert!(pods.items[0].spec.as_ref().unwrap().node_name.is_some(), "the scheduler bound it to a node");

    deployments.delete("nginx", &DeleteParams::background()).await.unwrap();
    let replica_sets = ns.api::<ReplicaSet>();
    let pods_api = ns.api::<Pod>();
    let selector = ListParams::default().labels("app=nginx");
    support::eventually("the garbage collector to remove the ReplicaSet and Pods", TIMEOUT, || async {
        let rs = replica_sets.list(&selector).await.map_err(|e| e.to_string())?.items.len();
        let pods = pods_api.list(&selector).await.map_err(|e| e.to_string())?.items.len();
        if rs + pods == 0 { Ok(()) } else { Err(format!("{rs} ReplicaSet(s) and {pods} Pod(s) left")) }
    })
    .await;
}
