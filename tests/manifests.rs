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

/// Each sample is one ManagedWorkload, plus what it needs of core kinds (the Secret its env
/// names, say), and no other kind (`make demo` applies them all).
#[test]
fn samples_are_managed_workloads() {
    for entry in std::fs::read_dir("config/samples").unwrap() {
        let path = entry.unwrap().path();
        let docs = documents(path.to_str().unwrap());
        let workloads: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "ManagedWorkload").collect();
        assert_eq!(workloads.len(), 1, "{}: one ManagedWorkload per sample", path.display());
        let _: mw_operator::resource::ManagedWorkload = serde_json::from_value(workloads[0].clone())
            .unwrap_or_else(|e| panic!("{} does not parse as a ManagedWorkload: {e}", path.display()));
        for other in docs.iter().filter(|d| d["kind"] != "ManagedWorkload") {
            assert!(
                ["Secret", "ConfigMap"].contains(&other["kind"].as_str().unwrap_or("")),
                "{}: {other}",
                path.display()
            );
        }
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

/// Does any rule of this Role or ClusterRole name Leases?
fn grants_leases(role: &Value) -> bool {
    role["rules"].as_array().unwrap().iter().any(|r| r["resources"].as_array().unwrap().iter().any(|x| x == "leases"))
}

#[test]
fn leases_are_granted_in_one_namespace_and_by_name_where_rbac_allows() {
    for path in ["config/rbac/cluster-role.yaml", "config/rbac/role.yaml"] {
        assert!(!grants_leases(&load(path)), "{path} grants Leases in every namespace it is bound in");
    }
    let election = load("config/rbac/leader-election-role.yaml");
    assert_eq!(election["kind"], "Role", "never a ClusterRole: node heartbeats and kube-system's leases are Leases");
    for rule in election["rules"].as_array().unwrap() {
        assert_eq!(rule["resources"], serde_json::json!(["leases"]), "{rule}");
        let verbs: Vec<&str> = rule["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        if verbs == ["create"] {
            // RBAC cannot restrict create by name: the name is in the request's body.
            assert!(rule.get("resourceNames").is_none(), "{rule}");
        } else {
            assert!(!verbs.contains(&"create") && !verbs.contains(&"deletecollection"), "{rule}");
            assert_eq!(rule["resourceNames"], serde_json::json!(["mw-operator"]), "{rule}");
        }
    }
}

/// The documents of a multi-document YAML file.
fn documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    text.split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(|doc| doc.is_object())
        .collect()
}

#[test]
fn the_plain_manifests_grant_leases_only_in_the_operators_namespace() {
    let election = load("config/rbac/leader-election-role.yaml");
    for path in ["config/install/cluster-wide.yaml", "config/install/namespaced.yaml"] {
        let docs = documents(path);
        let roles: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole").collect();
        assert!(!roles.is_empty(), "{path}");
        let with_leases: Vec<&&Value> = roles.iter().filter(|r| grants_leases(r)).collect();
        assert_eq!(with_leases.len(), 1, "{path}: one Role grants Leases");
        let role = with_leases[0];
        assert_eq!(role["kind"], "Role", "{path}");
        assert_eq!(role["metadata"]["namespace"], "mw-system", "{path}");
        assert_eq!(role["metadata"]["name"], election["metadata"]["name"], "{path}");
        assert_eq!(role["rules"], election["rules"], "{path} grants what config/rbac/leader-election-role.yaml grants");
        let binding: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "RoleBinding" && d["roleRef"]["name"] == role["metadata"]["name"])
            .collect();
        assert_eq!(binding.len(), 1, "{path}");
        assert_eq!(binding[0]["metadata"]["namespace"], "mw-system");
        assert_eq!(
            binding[0]["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": "mw-operator", "namespace": "mw-system"}])
        );
    }
}
