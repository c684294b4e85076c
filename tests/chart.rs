//! The Helm chart: it lints, renders both install modes with the same permissions as
//! config/rbac, and what it renders is accepted by the real API server and runs (under kwok).

mod support;

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client};
use serde_json::Value;
use support::workload::TIMEOUT;
use support::{TestNamespace, wait_until};

const CHART: &str = "charts/mw-operator";

fn helm(args: &[&str]) -> String {
    let helm = std::env::var("MW_TEST_HELM").expect("MW_TEST_HELM: the helm binary (make test sets it)");
    let out = Command::new(&helm).args(args).output().unwrap_or_else(|e| panic!("running {helm}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "helm {args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The chart rendered for `release` in `namespace`, as JSON documents.
fn render(release: &str, namespace: &str, watch: &[&str]) -> Vec<Value> {
    let set = format!("watchNamespaces={{{}}}", watch.join(","));
    let mut args = vec!["template", release, CHART, "--namespace", namespace];
    if !watch.is_empty() {
        args.extend(["--set", &set]);
    }
    helm(&args)
        .split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(|doc| doc.is_object())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn shipped_rules() -> Value {
    let text = std::fs::read_to_string("config/rbac/cluster-role.yaml").unwrap();
    serde_saphyr::from_str::<Value>(&text).unwrap()["rules"].clone()
}

/// Server-side apply of rendered documents, the way `helm install` would create them.
async fn apply_all(client: &Client, namespace: &str, docs: &[Value]) {
    for doc in docs {
        let (group, version) = match doc["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), doc["apiVersion"].as_str().unwrap().to_string()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, doc["kind"].as_str().unwrap());
        let (resource, caps) = pinned_kind(client, &gvk).await.unwrap();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                doc["metadata"]["namespace"].as_str().unwrap_or(namespace),
                &resource,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let name = doc["metadata"]["name"].as_str().unwrap();
        api.patch(name, &PatchParams::apply("chart-test").force(), &Patch::Apply(doc))
            .await
            .unwrap_or_else(|e| panic!("the API server rejected {} {name}: {e}", doc["kind"]));
    }
}

async fn delete_cluster_scoped(client: &Client, docs: &[Value]) {
    for doc in docs.iter().filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding") {
        let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", doc["kind"].as_str().unwrap());
        let (resource, _) = pinned_kind(client, &gvk).await.unwrap();
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let _ = api.delete(doc["metadata"]["name"].as_str().unwrap(), &DeleteParams::default()).await;
    }
}

async fn wait_available(ns: &TestNamespace, name: &str) -> Deployment {
    let deployments = ns.api::<Deployment>();
    wait_until(&deployments, name, "the operator Deployment to be Available", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref()?.available_replicas) == Some(1)
    })
    .await
    .unwrap()
}

#[test]
fn the_chart_lints_in_both_modes() {
    helm(&["lint", CHART]);
    helm(&["lint", CHART, "--set", "watchNamespaces={a,b}"]);
}

#[tokio::test]
async fn cluster_wide_install_is_accepted_and_runs() {
    let ns = TestNamespace::new("chart-cluster").await;
    let release = ns.name.clone();
    let docs = render(&release, &ns.name, &[]);
    let roles = of_kind(&docs, "ClusterRole");
    assert_eq!(roles.len(), 1);
    assert_eq!(roles[0]["rules"], shipped_rules(), "the chart grants what config/rbac grants");
    assert_eq!(of_kind(&docs, "ClusterRoleBinding").len(), 1);
    assert!(of_kind(&docs, "Role").is_empty());

    apply_all(&ns.client, &ns.name, &docs).await;
    let deployment = wait_available(&ns, &format!("{release}-mw-operator")).await;
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let container = &pod.containers[0];
    assert_eq!(container.args.as_ref().unwrap()[0], "run");
    assert!(!container.args.as_ref().unwrap().iter().any(|a| a.starts_with("--namespace")));
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    delete_cluster_scoped(&ns.client, &docs).await;
}

#[tokio::test]
async fn namespace_scoped_install_grants_nothing_cluster_wide() {
    let ns = TestNamespace::new("chart-scoped").await;
    let release = ns.name.clone();
    let docs = render(&release, &ns.name, &[&ns.name]);
    assert!(of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty());
    let roles = of_kind(&docs, "Role");
    assert_eq!(roles.len(), 1);
    assert_eq!(roles[0]["metadata"]["namespace"], ns.name.as_str());
    assert_eq!(roles[0]["rules"], shipped_rules());
    assert_eq!(of_kind(&docs, "RoleBinding").len(), 1);

    apply_all(&ns.client, &ns.name, &docs).await;
    let deployment = wait_available(&ns, &format!("{release}-mw-operator")).await;
    let args = deployment.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(args.contains(&format!("--namespace={}", ns.name)), "{args:?}");

    // Two namespaces: a Role and RoleBinding in each, one comma-separated flag.
    let docs = render("two", "ops", &["a", "b"]);
    assert_eq!(of_kind(&docs, "Role").len(), 2);
    assert_eq!(of_kind(&docs, "RoleBinding").len(), 2);
    let deployment = of_kind(&docs, "Deployment")[0];
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap();
    assert!(args.iter().any(|a| a == "--namespace=a,b"), "{args:?}");
}
