//! The Helm chart: it lints, renders both install modes with the same permissions as
//! config/rbac, and what it renders is accepted by the real API server and runs (under kwok).
//! The optional bridge renders with its own ServiceAccount and only namespaced permissions.
//! values.schema.json describes every value, refuses typos and wrong types, and accepts only
//! what the binary's flag parsers accept; every install command the docs show renders; the
//! optional PrometheusRule holds docs/operations.md's alerts, over series the operator's own
//! registry exports. The users' aggregated roles are config/rbac's; the disruption budgets,
//! the spread over nodes and the metrics NetworkPolicies render as docs/operations.md and
//! docs/security.md say.

mod support;
#[path = "support/versions.rs"]
mod versions;

use clap::Parser;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client};
use serde_json::Value;
use support::helm::{helm, run_helm};
use support::workload::TIMEOUT;
use support::{TestNamespace, documents, eventually, wait_until};

const CHART: &str = "charts/mw-operator";

/// The chart rendered for `release` in `namespace`, as JSON documents.
fn render(release: &str, namespace: &str, watch: &[&str]) -> Vec<Value> {
    let mut extra = Vec::new();
    if !watch.is_empty() {
        extra.extend(["--set".to_string(), format!("watchNamespaces={{{}}}", watch.join(","))]);
    }
    render_with(release, namespace, &extra)
}

/// The chart rendered with more `helm template` arguments (`--set …`).
fn render_with(release: &str, namespace: &str, extra: &[String]) -> Vec<Value> {
    let mut args: Vec<String> = ["template", release, CHART, "--namespace", namespace].map(String::from).into();
    args.extend_from_slice(extra);
    documents(&helm(&args))
}

/// `--set` arguments, one per value.
fn set(values: &[&str]) -> Vec<String> {
    values.iter().flat_map(|v| ["--set".to_string(), v.to_string()]).collect()
}

/// `helm template` with `extra` arguments must fail: its error output.
fn refusal(extra: &[String]) -> String {
    let mut args: Vec<String> = ["template", "r", CHART].map(String::from).into();
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = run_helm(&args);
    assert!(!ok, "helm {args:?} should fail, rendered:\n{stdout}");
    stderr
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn shipped_rules() -> Value {
    rules_of("config/rbac/cluster-role.yaml")
}

fn lease_rules() -> Value {
    rules_of("config/rbac/leader-election-role.yaml")
}

/// No rule of `doc` (a Role or ClusterRole) names Leases.
fn grants_no_lease(doc: &Value) -> bool {
    !doc["rules"].as_array().unwrap().iter().any(|r| r["resources"].as_array().unwrap().iter().any(|x| x == "leases"))
}

/// The leader-election Role and its binding: in `namespace` only, for the operator's account.
fn assert_lease_role_in(docs: &[Value], namespace: &str) {
    let with_leases: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
        .filter(|d| !grants_no_lease(d))
        .collect();
    assert_eq!(with_leases.len(), 1, "one Role grants Leases: {with_leases:#?}");
    let role = with_leases[0];
    assert_eq!(role["kind"], "Role", "Leases are never granted cluster-wide");
    assert_eq!(role["metadata"]["namespace"], namespace);
    assert_eq!(role["rules"], lease_rules(), "the chart grants what config/rbac/leader-election-role.yaml grants");
    let name = role["metadata"]["name"].as_str().unwrap();
    let bindings: Vec<&Value> =
        of_kind(docs, "RoleBinding").into_iter().filter(|b| b["roleRef"]["name"] == name).collect();
    assert_eq!(bindings.len(), 1);
    assert_eq!(bindings[0]["metadata"]["namespace"], namespace);
    let deployment = of_kind(docs, "Deployment")[0];
    assert_eq!(bindings[0]["subjects"][0]["name"], deployment["spec"]["template"]["spec"]["serviceAccountName"]);
    assert_eq!(bindings[0]["subjects"][0]["namespace"], namespace);
}

fn rules_of(path: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str::<Value>(&text).unwrap()["rules"].clone()
}

/// A ClusterRole for users, aggregated into Kubernetes' view, edit or admin role (value
/// rbac.aggregateClusterRoles), not a grant to the operator.
fn aggregated(role: &Value) -> bool {
    role["metadata"]["labels"]
        .as_object()
        .is_some_and(|labels| labels.keys().any(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-")))
}

/// The ClusterRoles that grant the operator (or the bridge) something.
fn granting_cluster_roles(docs: &[Value]) -> Vec<&Value> {
    of_kind(docs, "ClusterRole").into_iter().filter(|r| !aggregated(r)).collect()
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
    wait_until(&deployments, name, "every replica to be available", TIMEOUT, |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(want)
        })
    })
    .await
    .unwrap()
}

#[test]
fn the_chart_lints_in_both_modes() {
    helm(&["lint", CHART]);
    helm(&["lint", CHART, "--set", "watchNamespaces={a,b}"]);
    helm(&["lint", CHART, "--set", "metrics.serviceMonitor.enabled=true"]);
}

#[test]
fn the_service_monitor_and_single_replica_options_render() {
    let docs = render_with("rel", "ops", &set(&["metrics.serviceMonitor.enabled=true"]));
    let monitors = of_kind(&docs, "ServiceMonitor");
    assert_eq!(monitors.len(), 1);
    assert_eq!(monitors[0]["spec"]["endpoints"][0]["port"], "metrics");
    assert!(selects(
        &monitors[0]["spec"]["selector"]["matchLabels"],
        &of_kind(&docs, "Service")[0]["metadata"]["labels"]
    ));

    let single = render_with("rel", "ops", &set(&["replicas=1", "leaderElection.enabled=false"]));
    let args = &of_kind(&single, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(args.as_array().unwrap().iter().any(|a| a == "--no-leader-election"), "{args}");
    // No election, no Lease permission at all.
    assert!(of_kind(&single, "Role").is_empty(), "{single:#?}");
    // Another Lease name: the Role names that Lease.
    let renamed = render_with("rel", "ops", &set(&["leaderElection.leaseName=other"]));
    let role = of_kind(&renamed, "Role")[0];
    assert_eq!(role["rules"][1]["resourceNames"], serde_json::json!(["other"]));
    let args = &of_kind(&renamed, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(args.as_array().unwrap().iter().any(|a| a == "--lease-name=other"), "{args}");
    // Two replicas without election would both write: refused at render time.
    let stderr = refusal(&set(&["leaderElection.enabled=false"]));
    assert!(stderr.contains("leaderElection.enabled"), "{stderr}");
    // A grace over half the duration, which the operator would refuse at start.
    let stderr = refusal(&set(&["leaderElection.leaseDuration=8", "leaderElection.renewGrace=5"]));
    assert!(stderr.contains("leaderElection.renewGrace"), "{stderr}");
}

/// The users' roles: read with view, write with edit and admin, the status never; the rules
/// and labels of config/rbac/aggregate-to-*.yaml; bound to nobody; optional; cluster-wide
/// installs only (a namespace-scoped one makes nothing cluster-wide).
#[test]
fn the_users_roles_aggregate_into_view_edit_and_admin() {
    let scoped = render("rel", "ops", &["a", "b"]);
    assert!(of_kind(&scoped, "ClusterRole").is_empty(), "a namespace-scoped install makes no ClusterRole");
    {
        let docs = render("rel", "ops", &[]);
        let roles: Vec<&Value> = of_kind(&docs, "ClusterRole").into_iter().filter(|r| aggregated(r)).collect();
        assert_eq!(roles.len(), 2, "{roles:#?}");
        for (suffix, file) in
            [("view", "config/rbac/aggregate-to-view.yaml"), ("edit", "config/rbac/aggregate-to-edit.yaml")]
        {
            let role = named(&docs, "ClusterRole", &format!("rel-mw-operator-{suffix}"));
            assert_eq!(role.len(), 1, "{suffix}");
            let shipped: Value = serde_saphyr::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
            assert_eq!(role[0]["rules"], shipped["rules"], "the chart grants what {file} grants");
            for (key, value) in shipped["metadata"]["labels"].as_object().unwrap() {
                if key.starts_with("rbac.authorization.k8s.io/") {
                    assert_eq!(&role[0]["metadata"]["labels"][key], value, "{suffix}: {key}");
                }
            }
            for rule in role[0]["rules"].as_array().unwrap() {
                assert_eq!(rule["resources"], serde_json::json!(["managedworkloads"]), "never the status: {rule}");
            }
        }
        let labels = |suffix: &str| {
            named(&docs, "ClusterRole", &format!("rel-mw-operator-{suffix}"))[0]["metadata"]["labels"].clone()
        };
        for role in ["view", "edit", "admin"] {
            assert_eq!(labels("view")[format!("rbac.authorization.k8s.io/aggregate-to-{role}")], "true");
        }
        assert!(labels("edit").get("rbac.authorization.k8s.io/aggregate-to-view").is_none(), "view never writes");
        for binding in of_kind(&docs, "ClusterRoleBinding").into_iter().chain(of_kind(&docs, "RoleBinding")) {
            assert!(!binding["roleRef"]["name"].as_str().unwrap().ends_with("-view"), "{binding}");
            assert!(!binding["roleRef"]["name"].as_str().unwrap().ends_with("-edit"), "{binding}");
        }
    }
    let off = render_with("rel", "ops", &set(&["rbac.aggregateClusterRoles=false"]));
    assert!(of_kind(&off, "ClusterRole").iter().all(|r| !aggregated(r)));
}

/// A drain evicts one replica at a time while two run, and the replicas prefer distinct nodes;
/// neither holds a one-node cluster (no budget for one replica, a preference only); both can be
/// turned off, the spread replaced.
#[test]
fn disruption_budgets_and_spread_keep_a_replica_serving() {
    let docs = render_with("rel", "ops", &bridge_values(&[("k8s-lab-1", "team-a")]));
    for name in ["rel-mw-operator", "rel-mw-operator-bridge"] {
        let deployment = &named(&docs, "Deployment", name)[0]["spec"];
        assert_eq!(deployment["replicas"], 2);
        let budget = named(&docs, "PodDisruptionBudget", name);
        assert_eq!(budget.len(), 1, "{name}");
        let spec = &budget[0]["spec"];
        assert_eq!(
            (&spec["maxUnavailable"], &spec["unhealthyPodEvictionPolicy"]),
            (&serde_json::json!(1), &serde_json::json!("AlwaysAllow"))
        );
        assert_eq!(spec["selector"], deployment["selector"], "{name}: the budget covers the Deployment's Pods");
        let spread = &deployment["template"]["spec"]["topologySpreadConstraints"];
        assert_eq!(spread.as_array().map(Vec::len), Some(1), "{name}: {spread}");
        assert_eq!(spread[0]["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(spread[0]["whenUnsatisfiable"], "ScheduleAnyway", "a preference: a one-node cluster runs both");
        assert!(selects(&spread[0]["labelSelector"]["matchLabels"], &deployment["template"]["metadata"]["labels"]));
        assert_eq!(spread[0]["labelSelector"]["matchLabels"], deployment["selector"]["matchLabels"]);
    }

    let single = render_with(
        "rel",
        "ops",
        &[
            bridge_values(&[("k8s-lab-1", "team-a")]),
            set(&[
                "replicas=1",
                "leaderElection.enabled=false",
                "bridge.replicas=1",
                "bridge.leaderElection.enabled=false",
            ]),
        ]
        .concat(),
    );
    assert!(of_kind(&single, "PodDisruptionBudget").is_empty(), "a budget on one replica would block every drain");
    let off = render_with(
        "rel",
        "ops",
        &[
            bridge_values(&[("k8s-lab-1", "team-a")]),
            set(&[
                "podDisruptionBudget.enabled=false",
                "bridge.podDisruptionBudget.enabled=false",
                "spreadOverNodes=false",
                "bridge.spreadOverNodes=false",
            ]),
        ]
        .concat(),
    );
    assert!(of_kind(&off, "PodDisruptionBudget").is_empty());
    for deployment in of_kind(&off, "Deployment") {
        assert!(deployment["spec"]["template"]["spec"].get("topologySpreadConstraints").is_none());
    }
    let zones = render_with(
        "rel",
        "ops",
        &set(&[
            "topologySpreadConstraints[0].maxSkew=1",
            "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
        ]),
    );
    let spread = &of_kind(&zones, "Deployment")[0]["spec"]["template"]["spec"]["topologySpreadConstraints"];
    assert_eq!(spread.as_array().unwrap().len(), 1, "replaces the default: {spread}");
    assert_eq!(spread[0]["topologyKey"], "topology.kubernetes.io/zone");
}

/// The operator's and the bridge's Pods take connections on their metrics port only, from the
/// peers the values name and (default) from none; ingress only, egress left open.
#[test]
fn the_network_policies_admit_only_the_metrics_port() {
    let bridge = bridge_values(&[("k8s-lab-1", "team-a")]);
    let closed = render_with("rel", "ops", &bridge);
    for (name, port) in [("rel-mw-operator", "metrics"), ("rel-mw-operator-bridge", "http-metrics")] {
        let policy = named(&closed, "NetworkPolicy", name);
        assert_eq!(policy.len(), 1, "{name}");
        let spec = &policy[0]["spec"];
        let pod = &named(&closed, "Deployment", name)[0]["spec"]["template"];
        assert!(selects(&spec["podSelector"]["matchLabels"], &pod["metadata"]["labels"]), "{name}");
        assert_eq!(
            spec["policyTypes"],
            serde_json::json!(["Ingress"]),
            "{name}: egress (API server, database) stays open"
        );
        assert!(spec.get("ingress").is_none(), "{name}: no peer by default: {spec}");
        let ports = pod["spec"]["containers"][0]["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 1, "{name}: the metrics port is all that listens");
        assert_eq!(ports[0]["name"], port);
    }
    let open = render_with(
        "rel",
        "ops",
        &[
            bridge,
            set(&["networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring", "metricsPort=9090"]),
        ]
        .concat(),
    );
    for name in ["rel-mw-operator", "rel-mw-operator-bridge"] {
        let spec = &named(&open, "NetworkPolicy", name)[0]["spec"];
        let rules = spec["ingress"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "{name}");
        assert_eq!(
            rules[0]["from"],
            serde_json::json!([{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}])
        );
        let container = &named(&open, "Deployment", name)[0]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            rules[0]["ports"],
            serde_json::json!([{"port": container["ports"][0]["containerPort"], "protocol": "TCP"}]),
            "{name}: the metrics port, by number"
        );
    }
    let off = render_with("rel", "ops", &set(&["networkPolicy.enabled=false"]));
    assert!(of_kind(&off, "NetworkPolicy").is_empty());
}

#[tokio::test]
async fn cluster_wide_install_is_accepted_and_runs() {
    let ns = TestNamespace::new("chart-cluster").await;
    let release = ns.name.clone();
    let docs = render(&release, &ns.name, &[]);
    let roles = granting_cluster_roles(&docs);
    assert_eq!(roles.len(), 1);
    assert_eq!(roles[0]["rules"], shipped_rules(), "the chart grants what config/rbac grants");
    assert!(grants_no_lease(roles[0]), "no Lease permission in every namespace");
    assert_eq!(of_kind(&docs, "ClusterRoleBinding").len(), 1);
    // Leader election: a Role in the release namespace, for the one Lease.
    assert_eq!(of_kind(&docs, "Role").len(), 1);
    assert_lease_role_in(&docs, &ns.name);

    apply_all(&ns.client, &ns.name, &docs).await;
    let deployment = wait_available(&ns, &format!("{release}-mw-operator")).await;
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let container = &pod.containers[0];
    assert_eq!(container.args.as_ref().unwrap()[0], "run");
    assert!(!container.args.as_ref().unwrap().iter().any(|a| a.starts_with("--namespace")));
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    // Two replicas (leader and warm standby), probes on the metrics port, and a metrics Service.
    assert_eq!(deployment.status.unwrap().available_replicas, Some(2));
    let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref().and_then(|p| p.http_get.as_ref()).map(|g| (g.path.clone().unwrap_or_default(), g.port.clone()))
    };
    let metrics_port = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into());
    assert_eq!(probe(&container.readiness_probe), Some(("/readyz".into(), metrics_port.clone())));
    assert_eq!(probe(&container.liveness_probe), Some(("/healthz".into(), metrics_port)));
    let services = of_kind(&docs, "Service");
    assert_eq!(services.len(), 1);
    assert_eq!(services[0]["spec"]["ports"][0]["targetPort"], "metrics");
    assert!(of_kind(&docs, "ServiceMonitor").is_empty(), "the ServiceMonitor is optional, off by default");
    delete_cluster_scoped(&ns.client, &docs).await;
}

#[tokio::test]
async fn namespace_scoped_install_grants_nothing_cluster_wide() {
    let ns = TestNamespace::new("chart-scoped").await;
    let release = ns.name.clone();
    let docs = render(&release, &ns.name, &[&ns.name]);
    assert!(of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty());
    // The release namespace is watched: the operator's Role there, and the leader-election
    // Role beside it (the Role itself grants no Lease).
    let roles = of_kind(&docs, "Role");
    assert_eq!(roles.len(), 2);
    assert!(roles.iter().all(|r| r["metadata"]["namespace"] == ns.name.as_str()));
    assert_eq!(named(&docs, "Role", &format!("{release}-mw-operator"))[0]["rules"], shipped_rules());
    assert_lease_role_in(&docs, &ns.name);
    assert_eq!(of_kind(&docs, "RoleBinding").len(), 2);

    apply_all(&ns.client, &ns.name, &docs).await;
    let deployment = wait_available(&ns, &format!("{release}-mw-operator")).await;
    let args = deployment.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(args.contains(&format!("--namespace={}", ns.name)), "{args:?}");

    // Two namespaces: a Role and RoleBinding in each, one comma-separated flag, and in the
    // unwatched release namespace only what leader election needs.
    let docs = render("two", "ops", &["a", "b"]);
    let in_ns = |kind, namespace: &str| -> Vec<&Value> {
        of_kind(&docs, kind).into_iter().filter(|d| d["metadata"]["namespace"] == namespace).collect()
    };
    for namespace in ["a", "b"] {
        assert_eq!(in_ns("Role", namespace).len(), 1);
        assert_eq!(in_ns("Role", namespace)[0]["rules"], shipped_rules());
        assert_eq!(in_ns("RoleBinding", namespace).len(), 1);
    }
    assert_eq!(in_ns("Role", "ops").len(), 1);
    assert_lease_role_in(&docs, "ops");
    assert_eq!(of_kind(&docs, "Role").len(), 3);
    let deployment = of_kind(&docs, "Deployment")[0];
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap();
    assert!(args.iter().any(|a| a == "--namespace=a,b"), "{args:?}");
    delete_cluster_scoped(&ns.client, &render(&release, &ns.name, &[&ns.name])).await;
}

/// `--set` arguments enabling the bridge for `nodes` (node name, namespace), with the database
/// URL, password and CA in Secrets.
fn bridge_values(nodes: &[(&str, &str)]) -> Vec<String> {
    let mut set = vec![
        "bridge.enabled=true".to_string(),
        "bridge.database.urlSecret.name=manager-db".into(),
        "bridge.database.passwordSecret.name=manager-db-password".into(),
        "bridge.database.caSecret.name=manager-db-ca".into(),
    ];
    for (i, (node, namespace)) in nodes.iter().enumerate() {
        set.push(format!("bridge.nodes[{i}].node={node}"));
        set.push(format!("bridge.nodes[{i}].namespace={namespace}"));
    }
    set.into_iter().flat_map(|s| ["--set".to_string(), s]).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> Vec<&'a Value> {
    of_kind(docs, kind).into_iter().filter(|d| d["metadata"]["name"] == name).collect()
}

fn sorted_by_identity(mut docs: Vec<&Value>) -> Vec<&Value> {
    let key = |d: &Value| {
        let m = &d["metadata"];
        (d["kind"].to_string(), m["namespace"].to_string(), m["name"].to_string())
    };
    docs.sort_by_key(|d| key(d));
    docs
}

/// Is every label of `selector` on `labels`?
fn selects(selector: &Value, labels: &Value) -> bool {
    selector.as_object().unwrap().iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn the_bridge_renders_with_its_own_account_and_only_namespaced_permissions() {
    let values = bridge_values(&[("k8s-lab-1", "team-a"), ("k8s-lab-2", "team-b")]);
    let lint: Vec<String> = ["lint", CHART].map(String::from).into_iter().chain(values.iter().cloned()).collect();
    helm(&lint);
    let plain = render("rel", "ops", &[]);
    let docs = render_with("rel", "ops", &values);
    let name = "rel-mw-operator-bridge";
    let metrics = format!("{name}-metrics");
    let lease = format!("{name}-leader-election");
    let is_bridge = |d: &&Value| {
        d["metadata"]["name"] == name
            || d["metadata"]["name"] == metrics.as_str()
            || d["metadata"]["name"] == lease.as_str()
    };

    // Everything else is exactly what the chart renders without the bridge.
    let others: Vec<&Value> = docs.iter().filter(|d| !is_bridge(d)).collect();
    assert_eq!(sorted_by_identity(others), sorted_by_identity(plain.iter().collect()));
    let mut kinds: Vec<&str> = docs.iter().filter(is_bridge).map(|d| d["kind"].as_str().unwrap()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Role",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );

    // Its own ServiceAccount.
    let account = named(&docs, "ServiceAccount", name);
    assert_eq!(account.len(), 1);
    assert_eq!(account[0]["metadata"]["namespace"], "ops");

    // A Role and RoleBinding in each mapped namespace, granting exactly config/rbac/bridge-role.yaml.
    let bridge_rules = rules_of("config/rbac/bridge-role.yaml");
    for namespace in ["team-a", "team-b"] {
        let in_ns = |kind| -> Vec<&Value> {
            named(&docs, kind, name).into_iter().filter(|d| d["metadata"]["namespace"] == namespace).collect()
        };
        let roles = in_ns("Role");
        assert_eq!(roles.len(), 1, "one Role in {namespace}");
        assert_eq!(roles[0]["rules"], bridge_rules, "the chart grants what config/rbac/bridge-role.yaml grants");
        let bindings = in_ns("RoleBinding");
        assert_eq!(bindings.len(), 1, "one RoleBinding in {namespace}");
        assert_eq!(
            bindings[0]["roleRef"],
            serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name})
        );
        assert_eq!(
            bindings[0]["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": "ops"}])
        );
    }

    // Its leader election: the Lease Role of config/rbac in its own namespace, bound to it.
    let lease_role = named(&docs, "Role", &lease);
    assert_eq!(lease_role.len(), 1);
    assert_eq!(lease_role[0]["metadata"]["namespace"], "ops");
    assert_eq!(lease_role[0]["rules"], rules_of("config/rbac/bridge-leader-election-role.yaml"));
    let lease_binding = named(&docs, "RoleBinding", &lease);
    assert_eq!(lease_binding.len(), 1);
    assert_eq!(lease_binding[0]["metadata"]["namespace"], "ops");
    assert_eq!(lease_binding[0]["roleRef"]["name"], lease.as_str());

    // Nothing cluster-wide: no ClusterRole of its own, and no ClusterRoleBinding names it.
    assert!(named(&docs, "ClusterRole", name).is_empty());
    for binding in of_kind(&docs, "ClusterRoleBinding").into_iter().chain(of_kind(&docs, "RoleBinding")) {
        let is_bridge_binding = binding["metadata"]["name"] == name || binding["metadata"]["name"] == lease.as_str();
        let names_bridge = binding["subjects"].as_array().unwrap().iter().any(|s| s["name"] == name);
        assert_eq!(names_bridge, is_bridge_binding, "{binding}");
        if names_bridge {
            assert_eq!(binding["roleRef"]["kind"], "Role", "{binding}");
        }
    }

    // The Deployment: the operator's image running `bridge`, leader-elected (a warm standby,
    // and a rollout may surge: only the leader writes).
    let deployment = named(&docs, "Deployment", name);
    assert_eq!(deployment.len(), 1);
    let spec = &deployment[0]["spec"];
    assert_eq!(spec["replicas"], 2);
    assert_eq!(spec["strategy"]["type"], "RollingUpdate");
    let operator = &named(&docs, "Deployment", "rel-mw-operator")[0]["spec"];
    let (bridge_pod, operator_pod) = (&spec["template"], &operator["template"]);
    assert!(!selects(&operator["selector"]["matchLabels"], &bridge_pod["metadata"]["labels"]));
    assert!(!selects(&spec["selector"]["matchLabels"], &operator_pod["metadata"]["labels"]));
    assert!(selects(&spec["selector"]["matchLabels"], &bridge_pod["metadata"]["labels"]));
    let pod = &bridge_pod["spec"];
    assert_eq!(pod["serviceAccountName"], name);
    let container = &pod["containers"][0];
    assert_eq!(container["image"], operator_pod["spec"]["containers"][0]["image"]);
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(
        args,
        [
            "bridge",
            "--log-format=json",
            "--node=k8s-lab-1=team-a",
            "--node=k8s-lab-2=team-b",
            "--poll-interval=2s",
            "--resync-interval=5m",
            "--field-manager=mw-bridge",
            "--requests-percent=100",
            "--concurrency=16",
            "--pass-timeout=5m",
            "--max-delete-percent=50",
            "--delete-guard-minimum=2",
            "--rootfs-mount-path=/data",
            "--rootfs-storage-class=",
            "--rootfs-on-delete=retain",
            "--system-container-images=ghcr.io/mieweb/opensource-server/",
            "--ipv4-address=service",
            "--service-type=ClusterIP",
            "--service-load-balancer-class=",
            "--metrics-address=0.0.0.0:8080",
            "--lease-name=mw-bridge",
            "--database-password-file=/etc/mw/password",
        ]
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    // The URL from its Secret; no value of the database's in the pod spec.
    let env = container["env"].as_array().unwrap();
    let url: Vec<&Value> = env.iter().filter(|e| e["name"] == "MW_DATABASE_URL").collect();
    assert_eq!(url.len(), 1);
    assert_eq!(url[0]["valueFrom"], serde_json::json!({"secretKeyRef": {"name": "manager-db", "key": "url"}}));
    assert!(env.iter().all(|e| e["name"] == "RUST_LOG" || e.get("value").is_none()), "{env:?}");
    // Its identity and Lease namespace for the election, from the downward API.
    for (var, field) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
        let from: Vec<&Value> = env.iter().filter(|e| e["name"] == var).collect();
        assert_eq!(from.len(), 1, "{var}");
        assert_eq!(from[0]["valueFrom"]["fieldRef"]["fieldPath"], field);
    }
    // Password and CA as files in /etc/mw, from their Secrets.
    assert_eq!(
        container["volumeMounts"],
        serde_json::json!([{"name": "database", "mountPath": "/etc/mw", "readOnly": true}])
    );
    let sources = &pod["volumes"][0]["projected"]["sources"];
    assert_eq!(
        sources,
        &serde_json::json!([
            {"secret": {"name": "manager-db-password", "items": [{"key": "password", "path": "password"}]}},
            {"secret": {"name": "manager-db-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ])
    );
    // Locked down like the operator.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
}

#[test]
fn the_bridge_metrics_can_be_scraped() {
    let mut values = bridge_values(&[("k8s-lab-1", "team-a")]);
    values.extend(["--set".to_string(), "metrics.serviceMonitor.enabled=true".to_string()]);
    let docs = render_with("rel", "ops", &values);
    let pod_of = |name: &str| named(&docs, "Deployment", name)[0]["spec"]["template"].clone();
    let (bridge, operator) = (pod_of("rel-mw-operator-bridge"), pod_of("rel-mw-operator"));
    let services = of_kind(&docs, "Service");
    assert_eq!(services.len(), 2, "one for the operator, one for the bridge");
    for (pod, other) in [(&bridge, &operator), (&operator, &bridge)] {
        // Exactly one Service selects each Deployment's Pods, on a port its container serves.
        let selecting: Vec<&&Value> =
            services.iter().filter(|s| selects(&s["spec"]["selector"], &pod["metadata"]["labels"])).collect();
        assert_eq!(selecting.len(), 1, "{pod}");
        let service = selecting[0];
        assert!(!selects(&service["spec"]["selector"], &other["metadata"]["labels"]));
        let ports = pod["spec"]["containers"][0]["ports"].as_array().unwrap();
        let target = &service["spec"]["ports"][0]["targetPort"];
        assert!(ports.iter().any(|p| &p["name"] == target), "{target} is not a port of {pod}");
        // And exactly one ServiceMonitor scrapes that Service.
        let monitors: Vec<&Value> = of_kind(&docs, "ServiceMonitor")
            .into_iter()
            .filter(|m| selects(&m["spec"]["selector"]["matchLabels"], &service["metadata"]["labels"]))
            .collect();
        assert_eq!(monitors.len(), 1, "{service}");
        assert_eq!(monitors[0]["spec"]["endpoints"][0]["port"], service["spec"]["ports"][0]["name"]);
    }
    // The ServiceMonitor needs its Service.
    values.extend(set(&["metrics.service.enabled=false"]));
    let stderr = refusal(&values);
    assert!(stderr.contains("metrics.service.enabled"), "{stderr}");
}

#[test]
fn the_bridge_values_are_checked_and_optional_parts_left_out() {
    // Two nodes in one namespace: one Role there; no password or CA: nothing mounted.
    let values = set(&[
        "bridge.enabled=true",
        "bridge.database.urlSecret.name=db",
        "bridge.nodes[0].node=n1",
        "bridge.nodes[0].namespace=shared",
        "bridge.nodes[1].node=n2",
        "bridge.nodes[1].namespace=shared",
        "bridge.pollInterval=500ms",
        "bridge.requestsPercent=50",
        "bridge.ipv4Address=pod",
        "bridge.service.type=LoadBalancer",
        "bridge.service.loadBalancerClass=metallb.io/metallb",
        "bridge.service.annotations.metallb\\.io/address-pool=manager",
    ]);
    let docs = render_with("mw-operator", "mw-system", &values);
    let name = "mw-operator-bridge";
    assert_eq!(named(&docs, "Role", name).len(), 1);
    assert_eq!(named(&docs, "RoleBinding", name).len(), 1);
    let pod = &named(&docs, "Deployment", name)[0]["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].as_array().unwrap();
    for want in [
        "--node=n1=shared",
        "--node=n2=shared",
        "--poll-interval=500ms",
        "--requests-percent=50",
        "--ipv4-address=pod",
        "--service-type=LoadBalancer",
        "--service-load-balancer-class=metallb.io/metallb",
        "--service-annotation=metallb.io/address-pool=manager",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert!(!args.iter().any(|a| a.as_str().unwrap().starts_with("--database-password-file")));
    assert!(pod.get("volumes").is_none() && pod["containers"][0].get("volumeMounts").is_none());

    // Missing required values fail the render with a message naming them.
    let fails = |values: &[&str], needle: &str| {
        let stderr = refusal(&set(values));
        assert!(stderr.contains(needle), "{values:?} should fail naming {needle}: {stderr}");
    };
    fails(&["bridge.enabled=true", "bridge.database.urlSecret.name=db"], "bridge.nodes");
    fails(
        &["bridge.enabled=true", "bridge.nodes[0].node=n1", "bridge.nodes[0].namespace=a"],
        "bridge.database.urlSecret.name",
    );
    fails(&["bridge.enabled=true", "bridge.database.urlSecret.name=db", "bridge.nodes[0].node=n1"], "bridge.nodes");
}

/// May `user` do `verb` on `resource` (`group`, optional subresource) in `namespace` (None:
/// cluster-wide)? Asked of the API server's RBAC authorizer.
async fn allowed(
    client: &Client,
    (user, groups): (&str, &[String]),
    namespace: Option<&str>,
    verb: &str,
    (group, resource, subresource): (&str, &str, Option<&str>),
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups.to_vec()),
            resource_attributes: Some(ResourceAttributes {
                namespace: namespace.map(String::from),
                verb: Some(verb.to_string()),
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                subresource: subresource.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await.expect("a SubjectAccessReview");
    answer.status.expect("the review's status").allowed
}

#[tokio::test]
async fn bridge_install_is_accepted_and_reaches_only_its_namespaces() {
    let ns = TestNamespace::new("chart-bridge").await;
    let (a, b) = (TestNamespace::new("chart-bridge-a").await, TestNamespace::new("chart-bridge-b").await);
    let release = ns.name.clone();
    let mut values = bridge_values(&[("k8s-lab-1", &a.name), ("k8s-lab-2", &b.name)]);
    // The operator namespace-scoped too, and no users' roles, so the test creates nothing
    // cluster-wide.
    values.extend(["--set".to_string(), format!("watchNamespaces={{{}}}", ns.name)]);
    values.extend(set(&["rbac.aggregateClusterRoles=false"]));
    let docs = render_with(&release, &ns.name, &values);
    assert!(of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty());

    apply_all(&ns.client, &ns.name, &docs).await;
    let name = format!("{release}-mw-operator-bridge");
    let deployment = wait_available(&ns, &name).await;
    let args = deployment.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert_eq!(args[0], "bridge");

    // What its identity may do, as the API server's RBAC authorizer answers.
    let user = format!("system:serviceaccount:{}:{name}", ns.name);
    let groups = [
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{}", ns.name),
        "system:authenticated".to_string(),
    ];
    let who = (user.as_str(), &groups[..]);
    const MW: (&str, &str, Option<&str>) = ("opensource-server.mieweb.org", "managedworkloads", None);
    const SECRETS: (&str, &str, Option<&str>) = ("", "secrets", None);
    let client = &ns.client;
    // RBAC reaches the authorizer through an informer: wait for the bindings to be seen.
    eventually("the bridge's RoleBindings to take effect", TIMEOUT, || async {
        for namespace in [&a.name, &b.name] {
            for verb in ["get", "list", "watch", "create", "patch", "delete"] {
                for what in [MW, SECRETS] {
                    if !allowed(client, who, Some(namespace), verb, what).await {
                        return Err(format!("{verb} {} in {namespace} is denied", what.1));
                    }
                }
            }
        }
        Ok(())
    })
    .await;
    let denied = [
        (Some(ns.name.as_str()), "list", SECRETS),
        (Some("default"), "get", SECRETS),
        (None, "list", SECRETS),
        (None, "list", MW),
        (Some(a.name.as_str()), "patch", ("opensource-server.mieweb.org", "managedworkloads", Some("status"))),
        (Some(a.name.as_str()), "list", ("apps", "deployments", None)),
        (Some(b.name.as_str()), "list", ("", "pods", None)),
    ];
    for (namespace, verb, what) in denied {
        assert!(
            !allowed(client, who, namespace, verb, what).await,
            "{verb} {what:?} in {namespace:?} should be denied"
        );
    }
}

/// The schema entry of a value, through `allOf: [{$ref}]` and `$ref` to its definition.
fn resolve<'a>(schema: &'a Value, entry: &'a Value) -> &'a Value {
    let reference = entry["$ref"].as_str().or_else(|| entry["allOf"][0]["$ref"].as_str());
    match reference.and_then(|r| r.strip_prefix("#/definitions/")) {
        Some(name) => resolve(schema, &schema["definitions"][name]),
        None => entry,
    }
}

/// Every key of `values` under `path`, described by `entry`: the paths of those the schema
/// does not list or does not describe.
fn undescribed(schema: &Value, entry: &Value, values: &Value, path: &str) -> Vec<String> {
    let Some(map) = values.as_object() else { return Vec::new() };
    let described = resolve(schema, entry);
    let Some(properties) = described["properties"].as_object() else { return Vec::new() };
    let mut missing = Vec::new();
    for (key, value) in map {
        let path = format!("{path}{key}");
        match properties.get(key) {
            Some(property) if property["description"].is_string() => {
                missing.extend(undescribed(schema, property, value, &format!("{path}.")))
            }
            _ => missing.push(path),
        }
    }
    missing
}

#[test]
fn the_values_schema_describes_every_value() {
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap()).unwrap();
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{CHART}/values.schema.json")).unwrap()).unwrap();
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#", "the draft Helm validates");
    let missing = undescribed(&schema, &schema, &values, "");
    assert!(missing.is_empty(), "values.yaml keys the schema does not list or describe: {missing:?}");
    // Unknown keys are refused wherever the chart owns the structure (not in maps of labels,
    // nor in the Kubernetes types it passes through).
    let open: Vec<&String> = schema["properties"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, p)| {
            let p = resolve(&schema, p);
            p["properties"].is_object() && p["additionalProperties"] != false
        })
        .map(|(k, _)| k)
        .collect();
    assert!(open.is_empty(), "objects accepting unknown keys: {open:?}");
}

#[test]
fn the_values_schema_refuses_typos_and_wrong_types_naming_the_field() {
    // Each: a value the schema refuses, and what the error must name.
    for (value, field) in [
        ("replcas=3", "replcas"),
        ("bridge.pollIntervall=3s", "pollIntervall"),
        ("leaderElection.leaseDuraton=20", "leaseDuraton"),
        ("bridge.nodes[0].namspace=a", "namspace"),
        ("replicas=two", "replicas"),
        ("leaderElection.leaseDuration=15s", "leaseDuration"),
        ("metricsPort=70000", "metricsPort"),
        ("logFormat=xml", "logFormat"),
        ("bridge.service.type=Ingress", "type"),
        ("bridge.requestsPercent=0", "requestsPercent"),
        ("bridge.pollInterval=2 minutes", "pollInterval"),
        ("bridge.rootfs.onDelete=keep", "onDelete"),
        ("watchNamespaces={Team_A}", "watchNamespaces"),
        ("prometheusRule.alertLabels.severity=page", "alertLabels"),
    ] {
        let stderr = refusal(&set(&[value]));
        assert!(stderr.contains("schema"), "{value}: not the schema's refusal: {stderr}");
        assert!(stderr.contains(field), "{value}: the error does not name {field}: {stderr}");
    }
    // And what it accepts besides the defaults: a bridge duration in seconds, as the bridge parses it.
    render_with("r", "ops", &[bridge_values(&[("n", "a")]), set(&["bridge.pollInterval=30"])].concat());
}

/// Fenced code blocks of a Markdown file: (info string, text).
fn code_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (fence, open.take()) {
            (Some(_), Some(block)) => blocks.push(block),
            (Some(info), None) => open = Some((info.trim().to_string(), String::new())),
            (None, Some((info, mut text))) => {
                text.push_str(line);
                text.push('\n');
                open = Some((info, text));
            }
            (None, None) => {}
        }
    }
    blocks
}

/// The shell words of a command line, without its comment (which may hold any quote).
fn words(line: &str) -> Vec<String> {
    let mut quote = None;
    let mut previous = ' ';
    let end = line
        .char_indices()
        .find(|&(_, c)| {
            let comment = quote.is_none() && c == '#' && previous.is_whitespace();
            quote = match (quote, c) {
                (None, '\'' | '"') => Some(c),
                (Some(q), c) if c == q => None,
                (q, _) => q,
            };
            previous = c;
            comment
        })
        .map_or(line.len(), |(i, _)| i);
    shell_words::split(&line[..end]).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

/// The chart's `helm install`/`upgrade --install`/`template` commands in README.md and docs/,
/// as `helm template` arguments (each commented `# --set …` line after one is a documented
/// variant), with the values files the docs show (a YAML block whose first line is
/// `# NAME.yaml`) written to `dir`.
fn documented_helm_commands(dir: &std::path::Path) -> Vec<(String, Vec<String>)> {
    let mut files = vec![std::path::PathBuf::from("README.md")];
    files.extend(
        std::fs::read_dir("docs")
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let blocks: Vec<(String, String, String)> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            code_blocks(&text).into_iter().map(|(info, body)| (f.display().to_string(), info, body)).collect::<Vec<_>>()
        })
        .collect();
    for (_, info, body) in &blocks {
        let name = body.lines().next().and_then(|l| l.strip_prefix("# ")).filter(|n| n.ends_with(".yaml"));
        if let (true, Some(name)) = (info == "yaml", name) {
            std::fs::write(dir.join(name), body).unwrap();
        }
    }
    let mut commands = Vec::new();
    for (file, _, body) in blocks.iter().filter(|(_, info, _)| info == "sh" || info == "bash") {
        let joined = body.replace("\\\n", " ");
        let mut last: Option<Vec<String>> = None;
        for line in joined.lines() {
            let variant = line.trim_start().strip_prefix('#').map(str::trim_start).filter(|l| l.starts_with("--"));
            match (variant, &last) {
                (Some(extra), Some(command)) => {
                    commands.push((format!("{file}: {line}"), [command.clone(), words(extra)].concat()));
                    continue;
                }
                (Some(_), None) => continue,
                _ => last = None,
            }
            if !line.trim_start().starts_with("helm ") {
                continue;
            }
            let w = words(line);
            if !w.iter().any(|a| a == CHART) {
                continue;
            }
            let mut args = vec!["template".to_string()];
            // Flags of an install or upgrade that `helm template` has no use for (with
            // --reuse-values the upgrade adds to the earlier values: the defaults, here).
            let install_only = ["--install", "--create-namespace", "--reuse-values"];
            let mut rest = w[2..].iter().filter(|a| !install_only.contains(&a.as_str()));
            while let Some(arg) = rest.next() {
                args.push(arg.clone());
                if arg == "-f" || arg == "--values" {
                    let name = rest.next().expect("a values file after -f");
                    let path = dir.join(name);
                    assert!(path.exists(), "{file} installs with {name} but shows no `# {name}` YAML block");
                    args.push(path.display().to_string());
                }
            }
            commands.push((format!("{file}: {line}"), args.clone()));
            last = Some(args);
        }
    }
    commands
}

#[test]
fn every_documented_install_renders() {
    let dir = std::env::temp_dir().join(format!("mw-chart-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let commands = documented_helm_commands(&dir);
    let mut bridges = 0;
    for (source, args) in &commands {
        let docs = documents(&helm(args));
        assert!(!of_kind(&docs, "Deployment").is_empty(), "{source} renders no Deployment");
        bridges +=
            usize::from(docs.iter().any(|d| d["spec"]["template"]["spec"]["containers"][0]["args"][0] == "bridge"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(commands.len() >= 3 && bridges >= 1, "the docs show installs with and without the bridge: {commands:#?}");
}

#[path = "chart/promql.rs"]
mod promql;

/// What the operator and the bridge export, from their own registries: every series name
/// (OpenMetrics' suffixes by type: `_total` for counters, `_bucket`/`_sum`/`_count` for
/// histograms), and each one's label values once every recording method ran.
struct Exported {
    series: std::collections::BTreeSet<String>,
    labels: std::collections::BTreeMap<String, std::collections::BTreeSet<(String, String)>>,
}

fn exported() -> Exported {
    use prometheus_client::registry::Registry;
    let (mut operator_registry, mut bridge_registry) = (Registry::default(), Registry::default());
    let operator = mw_operator::metrics::Metrics::register(&mut operator_registry);
    operator.set_max_concurrent(32);
    operator.reconcile_started().finish(false);
    operator.reconcile_failed("write_status");
    operator.set_leader(mw_operator::metrics::DEFAULT_LEASE, true);
    operator.watch_restarted("pods");
    operator.sent("deployments", "apply", &Ok::<(), kube::Error>(()));
    operator.event_dropped();
    operator.set_workloads(&Default::default());
    let bridge = mw_operator::bridge::metrics::Metrics::register(&mut bridge_registry);
    bridge.set_leader(mw_operator::bridge::DEFAULT_LEASE, true);
    bridge.row_error("bad_image");
    bridge.wrote("row_update");
    bridge.pass(true);
    bridge.full_resync_seconds.observe(1.0);
    bridge.rows.set(1);
    bridge.rows_failing.set(0);
    bridge.set_deletions_pending(1, 1);

    let mut text = String::new();
    for registry in [&operator_registry, &bridge_registry] {
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    }
    let mut exported = Exported { series: Default::default(), labels: Default::default() };
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let (name, kind) = declared.split_once(' ').unwrap();
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            exported.series.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let (name, labels) = line
                .split_once('{')
                .map_or((line.split(' ').next().unwrap(), ""), |(n, rest)| (n, rest.rsplit_once('}').unwrap().0));
            let pairs = labels.split(',').filter(|p| !p.is_empty()).map(|p| {
                let (k, v) = p.split_once('=').unwrap();
                (k.to_string(), v.trim_matches('"').to_string())
            });
            exported.labels.entry(name.to_string()).or_default().extend(pairs);
        }
    }
    exported
}

/// The alerts of docs/operations.md's YAML blocks: name and `for`.
fn documented_alerts() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("docs/operations.md").unwrap();
    code_blocks(&text)
        .into_iter()
        .filter(|(info, _)| info == "yaml")
        .filter_map(|(_, body)| serde_saphyr::from_str::<Value>(&body).ok())
        .filter_map(|doc| doc.as_array().cloned())
        .flatten()
        .filter(|rule| rule["alert"].is_string())
        .map(|rule| (rule["alert"].as_str().unwrap().to_string(), rule["for"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn rules_of_prometheus_rule(docs: &[Value]) -> Vec<Value> {
    let rules = of_kind(docs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    rules[0]["spec"]["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap().clone()).collect()
}

/// kube-state-metrics' series, the only ones an alert reads that the operator does not
/// export: whether a Deployment's replicas are available is the kubelet's and the
/// Deployment controller's word, not the operator's own.
const KUBE_STATE_METRICS: &[&str] = &["kube_deployment_status_replicas_available", "kube_deployment_spec_replicas"];

#[test]
fn the_prometheus_rule_holds_the_documented_alerts_over_exported_metrics() {
    assert!(of_kind(&render("rel", "ops", &[]), "PrometheusRule").is_empty(), "off by default");

    let values = set(&[
        "prometheusRule.enabled=true",
        "prometheusRule.namespace=monitoring",
        "prometheusRule.labels.release=kube-prometheus-stack",
        "prometheusRule.alertLabels.team=platform",
    ]);
    helm(&[["lint".to_string(), CHART.to_string()].to_vec(), values.clone()].concat());
    let docs = render_with("rel", "ops", &values);
    let rule = of_kind(&docs, "PrometheusRule")[0];
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let rules = rules_of_prometheus_rule(&docs);

    // Exactly the documented alerts, with the documented `for`.
    let mut rendered: Vec<(String, String)> = rules
        .iter()
        .map(|r| (r["alert"].as_str().unwrap().to_string(), r["for"].as_str().unwrap().to_string()))
        .collect();
    let mut documented = documented_alerts();
    assert!(!documented.is_empty(), "docs/operations.md documents alerts");
    rendered.sort();
    documented.sort();
    assert_eq!(rendered, documented, "the chart's alerts are docs/operations.md's");

    // With the bridge its alerts join them (docs/bridge.md's: tests/docs.rs compares the names
    // with both pages), and every expression below is checked, theirs too.
    let bridge = set(&[
        "bridge.enabled=true",
        "bridge.nodes[0].node=k8s-lab-1",
        "bridge.nodes[0].namespace=workloads",
        "bridge.database.urlSecret.name=db",
    ]);
    let with_bridge = rules_of_prometheus_rule(&render_with("rel", "ops", &[values.clone(), bridge.clone()].concat()));
    assert!(rules.iter().all(|r| with_bridge.contains(r)), "the bridge changes none of the operator's alerts");
    assert!(with_bridge.len() > rules.len(), "the bridge adds its alerts");
    let rules = with_bridge;

    // Every expression parses, reads only series the operator exports (or kube-state-metrics',
    // see above), matches only labels those series carry (or `namespace`, the scrape
    // target's), with values they take; and is narrowed to this release.
    let exported = exported();
    for rule in &rules {
        let (alert, expr) = (rule["alert"].as_str().unwrap(), rule["expr"].as_str().unwrap());
        assert!(["critical", "warning"].contains(&rule["labels"]["severity"].as_str().unwrap()), "{rule}");
        assert_eq!(rule["labels"]["team"], "platform");
        assert!(rule["annotations"]["summary"].is_string() && rule["annotations"]["description"].is_string());
        let selectors = promql::selectors(expr).unwrap_or_else(|e| panic!("{alert}: {e}"));
        assert!(!selectors.is_empty(), "{alert} reads no series");
        for selector in selectors {
            let metric = selector.metric.as_str();
            let release = ("namespace".to_string(), "=".to_string(), "ops".to_string());
            assert!(selector.matchers.contains(&release), "{alert}: {metric} is not narrowed to the release: {expr}");
            if KUBE_STATE_METRICS.contains(&metric) {
                assert_eq!(alert, "MwOperatorNotReady", "{metric} is read by {alert}");
                let deployment = ("deployment".to_string(), "=".to_string(), "rel-mw-operator".to_string());
                assert!(selector.matchers.contains(&deployment), "{alert}: {expr}");
                continue;
            }
            assert!(exported.series.contains(metric), "{alert} reads {metric}, which nothing exports: {expr}");
            let carried = exported.labels.get(metric).unwrap_or_else(|| panic!("{metric}: no sample recorded"));
            for (label, op, value) in selector.matchers.iter().filter(|(l, ..)| l != "namespace") {
                assert!(carried.iter().any(|(l, _)| l == label), "{alert}: {metric} has no label {label}: {expr}");
                if op == "=" {
                    assert!(
                        carried.contains(&(label.clone(), value.clone())),
                        "{alert}: {metric} never has {label}={value:?}: {expr}"
                    );
                }
            }
        }
    }

    // The leader alerts follow the Lease's name, and go without election (no gauge to read).
    let renamed = render_with("rel", "ops", &set(&["prometheusRule.enabled=true", "leaderElection.leaseName=other"]));
    for rule in rules_of_prometheus_rule(&renamed).iter().filter(|r| r["expr"].as_str().unwrap().contains("leader_")) {
        let selectors = promql::selectors(rule["expr"].as_str().unwrap()).unwrap();
        assert!(selectors.iter().all(|s| s.matchers.contains(&("name".into(), "=".into(), "other".into()))), "{rule}");
    }
    let single =
        render_with("rel", "ops", &set(&["prometheusRule.enabled=true", "replicas=1", "leaderElection.enabled=false"]));
    let left: Vec<String> =
        rules_of_prometheus_rule(&single).iter().map(|r| r["alert"].as_str().unwrap().to_string()).collect();
    assert_eq!(left.len(), documented.len() - 2, "{left:?}");
    assert!(left.iter().all(|a| !a.contains("Leader")), "{left:?}");
    // The bridge's leader alert follows its Lease, and goes without its election.
    let bridge_renamed =
        [bridge.clone(), set(&["prometheusRule.enabled=true", "bridge.leaderElection.leaseName=other"])];
    let bridge_leader: Vec<Value> = rules_of_prometheus_rule(&render_with("rel", "ops", &bridge_renamed.concat()))
        .into_iter()
        .filter(|r| r["alert"] == "MwBridgeNoLeader")
        .collect();
    assert_eq!(bridge_leader.len(), 1);
    let selectors = promql::selectors(bridge_leader[0]["expr"].as_str().unwrap()).unwrap();
    assert!(selectors.iter().all(|s| s.matchers.contains(&("name".into(), "=".into(), "other".into()))));
    let unelected =
        [bridge, set(&["prometheusRule.enabled=true", "bridge.replicas=1", "bridge.leaderElection.enabled=false"])];
    let unelected = rules_of_prometheus_rule(&render_with("rel", "ops", &unelected.concat()));
    assert!(unelected.iter().all(|r| r["alert"] != "MwBridgeNoLeader"), "{unelected:?}");
}

#[test]
fn the_promql_check_refuses_malformed_expressions() {
    let ok = promql::selectors(r#"sum by (le) (rate(x_bucket{a="b", c=~"d.*"}[5m])) > 0.5 or absent(y)"#).unwrap();
    assert_eq!(ok.iter().map(|s| s.metric.as_str()).collect::<Vec<_>>(), ["x_bucket", "y"]);
    assert_eq!(ok[0].matchers[1], ("c".into(), "=~".into(), "d.*".into()));
    for bad in [
        "sum(rate(x[5m])",  // unbalanced
        "rate(x) > 0",      // a range function without a range
        "max(x[5m])",       // an aggregation of a range vector
        "x{a=b}",           // an unquoted label value
        "increase(x[10q])", // not a duration
        "frobnicate(x)",    // no such function
        "x and 1",          // and needs vectors
        "x > 0 y",          // trailing input
        "x[5m]",            // not an instant vector
    ] {
        assert!(promql::selectors(bad).is_err(), "{bad} should be refused");
    }
}

/// `mw-operator bridge`'s flags as the binary parses them (`--log-format` is a flag of its
/// top level).
#[derive(clap::Parser, Debug)]
struct BridgeCommand {
    #[arg(long)]
    log_format: String,
    #[command(flatten)]
    args: mw_operator::bridge::BridgeArgs,
}

/// `mw-operator run`'s leader election flags.
#[derive(clap::Parser, Debug)]
struct ElectionCommand {
    #[command(flatten)]
    election: mw_operator::election::ElectionArgs,
}

/// The container args of the Deployment whose first arg is `command`, less that arg.
fn command_args(docs: &[Value], command: &str) -> Vec<String> {
    let deployments = of_kind(docs, "Deployment");
    let args = deployments
        .iter()
        .map(|d| &d["spec"]["template"]["spec"]["containers"][0]["args"])
        .find(|a| a[0] == command)
        .unwrap_or_else(|| panic!("no Deployment runs {command}"));
    args.as_array().unwrap()[1..].iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

#[test]
fn what_the_schema_accepts_the_binary_accepts() {
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{CHART}/values.schema.json")).unwrap()).unwrap();
    let property =
        |path: &str| path.split('.').fold(&schema, |entry, key| &resolve(&schema, entry)["properties"][key]).clone();
    // Each enum value and each integer bound the schema allows for a flag the chart passes.
    let mut cases: Vec<String> = Vec::new();
    for path in ["logFormat", "bridge.ipv4Address", "bridge.service.type", "bridge.rootfs.onDelete"] {
        let values = property(path)["enum"].as_array().unwrap().clone();
        cases.extend(values.iter().map(|v| format!("{path}={}", v.as_str().unwrap())));
    }
    for path in ["bridge.requestsPercent", "bridge.concurrency", "bridge.maxDeletePercent", "bridge.deleteGuardMinimum"]
    {
        let entry = property(path);
        cases.extend(["minimum", "maximum"].iter().filter_map(|b| entry[b].as_u64()).map(|n| format!("{path}={n}")));
    }
    cases.extend(
        ["bridge.pollInterval=500ms", "bridge.resyncInterval=1h", "bridge.passTimeout=30", "bridge.rootfs.mountPath="]
            .map(String::from),
    );
    assert!(cases.len() > 15, "{cases:?}");
    let base = bridge_values(&[("k8s-lab-1", "team-a")]);
    for case in &cases {
        let docs = render_with("rel", "ops", &[base.clone(), set(&[case])].concat());
        let mut argv = vec!["mw-operator".to_string(), "--database-url=postgres://mw_bridge@db/cluster_manager".into()];
        argv.extend(command_args(&docs, "bridge"));
        if let Err(e) = BridgeCommand::try_parse_from(&argv) {
            panic!("{case}: the bridge refuses what the chart renders, {argv:?}: {e}");
        }
    }

    // The smallest Lease the schema allows, which the operator must accept too.
    let lease = property("leaderElection.leaseDuration")["minimum"].as_u64().unwrap();
    let grace = property("leaderElection.renewGrace")["minimum"].as_u64().unwrap();
    let docs = render_with(
        "rel",
        "ops",
        &set(&[&format!("leaderElection.leaseDuration={lease}"), &format!("leaderElection.renewGrace={grace}")]),
    );
    let mut argv = vec!["mw-operator".to_string()];
    argv.extend(command_args(&docs, "run").into_iter().filter(|a| a.starts_with("--lease-")));
    let parsed = ElectionCommand::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let election = parsed.election.election("mw-operator", || "test".into());
    assert!(matches!(election, Ok(Some(_))), "{argv:?}: {election:?}");
}

#[test]
fn kube_version_admits_the_minimum_with_its_distribution_suffixes_and_refuses_the_minor_before() {
    // helm checks the chart's kubeVersion against the cluster's version (or --kube-version).
    let minimum = versions::minimum_kubernetes();
    let (major, minor) = minimum.split_once('.').unwrap();
    let minor: u32 = minor.parse().unwrap();
    let next = format!("{major}.{}", minor + 1);
    for admitted in [
        format!("v{minimum}.0"),
        format!("v{minimum}.14"),
        format!("v{minimum}.4-eks-1234"),
        format!("v{minimum}.2-gke.1076000"),
        format!("v{next}.0-rc.1"),
    ] {
        render_with("r", "default", &["--kube-version".into(), admitted]);
    }
    for refused in [format!("v{major}.{}.14", minor - 1), format!("v{major}.{}.99-eks-1", minor - 1)] {
        let stderr = refusal(&["--kube-version".into(), refused.clone()]);
        assert!(stderr.contains("kubeVersion"), "{refused}: {stderr}");
    }
}
