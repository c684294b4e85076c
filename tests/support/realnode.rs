//! The real node (kubelet, containerd, runc, CNI) beside the kwok nodes: namespaces whose Pods
//! all go there, the test images imported into its containerd, HTTP from this host.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{TestNamespace, eventually};

pub const REAL_NODE: &str = "mw-real-node";
pub const REAL_NODE_KEY: &str = "mw-test/real-node";
pub const HTTPD_1: &str = "mw-test.invalid/httpd:1";
pub const HTTPD_2: &str = "mw-test.invalid/httpd:2";
/// Debian 13 with systemd as process 1 and sshd (hack/systemd-image.sh).
pub const SYSTEMD: &str = "mw-test.invalid/systemd:1";
pub const NEEDS: &str =
    "needs the real node: make test runs it (hack/controlplane.sh node-up NAME, MW_TEST_REAL_NODE=1)";

/// A fresh namespace whose every Pod runs on the real node (the PodNodeSelector and
/// PodTolerationRestriction annotations add the node's selector and toleration).
pub async fn real_node_namespace(test: &str) -> TestNamespace {
    assert_eq!(
        std::env::var("MW_TEST_REAL_NODE").as_deref(),
        Ok("1"),
        "these tests {NEEDS}; MW_TEST_REAL_NODE is not 1"
    );
    let ns = TestNamespace::new(test).await;
    let nodes: Api<Node> = Api::all(ns.client.clone());
    let node =
        nodes.get_opt(REAL_NODE).await.unwrap().unwrap_or_else(|| panic!("no Node {REAL_NODE}: these tests {NEEDS}"));
    let ready = node.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        ready.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
        "Node {REAL_NODE} is not Ready: {ready:?}\nlogs (kubelet.log, containerd.log): {}",
        super::log_dir()
    );
    let tolerations = json!([{"key": REAL_NODE_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
    let annotations = json!({"metadata": {"annotations": {
        "scheduler.alpha.kubernetes.io/node-selector": format!("{REAL_NODE_KEY}=true"),
        "scheduler.alpha.kubernetes.io/defaultTolerations": tolerations.to_string(),
    }}});
    Api::<Namespace>::all(ns.client.clone())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&annotations))
        .await
        .unwrap();
    ns
}

/// One HTTP/1.0 GET of `/` from this host, bounded; the body, or why not.
pub async fn http_get(ip: &str, port: u16) -> Result<String, String> {
    http_get_path(ip, port, "/").await
}

/// One HTTP/1.0 GET of `path` from this host, bounded; the body, or why not.
pub async fn http_get_path(ip: &str, port: u16, path: &str) -> Result<String, String> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((ip, port)).await.map_err(|e| format!("connect: {e}"))?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n");
        stream.write_all(request.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(response)
    };
    match tokio::time::timeout(Duration::from_secs(3), attempt).await {
        Ok(Ok(response)) if response.starts_with("HTTP/1.") && response.contains(" 200 ") => {
            Ok(response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
        }
        Ok(Ok(response)) => Err(format!("unexpected answer: {response:?}")),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("no answer within 3 s".into()),
    }
}

/// `http://ADDRESS:8080/` answers `body` from this host, within a bounded wait (an address on
/// the real node: a Pod's IP, or a Service's, through kube-proxy).
pub async fn answers_at(address: &str, body: &str) {
    eventually(&format!("http://{address}:8080/ to answer {body:?}"), Duration::from_secs(30), || async move {
        let got = http_get(address, 8080).await?;
        if got.trim() == body { Ok(()) } else { Err(format!("answered {got:?}")) }
    })
    .await;
}
