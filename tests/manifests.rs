//! The shipped manifests agree with each other (no cluster needed).

use serde_json::Value;

fn load(path: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

#[test]
fn namespaced_role_grants_exactly_what_the_cluster_role_grants() {
    let cluster = load("config/rbac/cluster-role.yaml");
    let namespaced = load("config/rbac/role.yaml");
    assert_eq!(cluster["kind"], "ClusterRole");
    assert_eq!(namespaced["kind"], "Role");
    assert_eq!(cluster["rules"], namespaced["rules"]);
}

#[test]
fn samples_are_managed_workloads() {
    for entry in std::fs::read_dir("config/samples").unwrap() {
        let path = entry.unwrap().path();
        let sample = load(path.to_str().unwrap());
        assert_eq!(sample["kind"], "ManagedWorkload", "{}", path.display());
        let _: mw_operator::resource::ManagedWorkload = serde_json::from_value(sample)
            .unwrap_or_else(|e| panic!("{} does not parse as a ManagedWorkload: {e}", path.display()));
    }
}

#[test]
fn bridge_cluster_role_grants_exactly_what_the_bridge_role_grants() {
    let cluster = load("config/rbac/bridge-cluster-role.yaml");
    let namespaced = load("config/rbac/bridge-role.yaml");
    assert_eq!(cluster["kind"], "ClusterRole");
    assert_eq!(namespaced["kind"], "Role");
    assert_eq!(cluster["rules"], namespaced["rules"]);
    let rules = namespaced["rules"].as_array().unwrap();
    assert!(
        !rules.iter().any(|r| r["resources"].as_array().unwrap().iter().any(|x| x == "deployments" || x == "pods")),
        "the bridge never touches what the operator manages"
    );
}
