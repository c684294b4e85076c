//! The API server rejects bad ManagedWorkloads with a message naming the field, from the
//! CRD's schema and CEL rules alone (no webhook). Table-driven: one bad manifest per row.

mod support;

use mw_operator::resource::ManagedWorkload;
use serde_json::{Value, json};
use support::TestNamespace;
use support::workload::{apply, create_strict};

/// (case, spec, substrings the rejection message must contain: the field, then the why)
fn cases() -> Vec<(&'static str, Value, Vec<&'static str>)> {
    let with = |extra: Value| {
        let mut spec = json!({"image": "nginx:latest"});
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        spec
    };
    vec![
        ("missing image", json!({"state": "Running"}), vec!["spec.image", "Required value"]),
        ("blank image", json!({"image": ""}), vec!["spec.image", "at least 1 chars long"]),
        ("image with whitespace", json!({"image": "nginx latest"}), vec!["spec.image", "must not contain whitespace"]),
        ("image of spaces", json!({"image": "   "}), vec!["spec.image", "must not contain whitespace"]),
        (
            "env name starting with a digit",
            with(json!({"env": [{"name": "1BAD", "value": "x"}]})),
            vec!["spec.env[0].name", "should match"],
        ),
        (
            "env name with '='",
            with(json!({"env": [{"name": "A=B", "value": "x"}]})),
            vec!["spec.env[0].name", "should match"],
        ),
        (
            "duplicate env names",
            with(json!({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]})),
            vec!["spec.env[1]", "Duplicate value"],
        ),
        (
            "env with value and valueFrom",
            with(
                json!({"env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
            ),
            vec!["spec.env[0]", "exactly one of value or valueFrom"],
        ),
        (
            "env valueFrom naming no source",
            with(json!({"env": [{"name": "A", "valueFrom": {}}]})),
            vec!["spec.env[0].valueFrom", "exactly one of secretKeyRef or configMapKeyRef"],
        ),
        (
            "malformed cpu",
            with(json!({"resources": {"requests": {"cpu": "lots"}}})),
            vec!["spec.resources.requests.cpu", "must be a quantity"],
        ),
        (
            "malformed memory",
            with(json!({"resources": {"limits": {"memory": "1GB"}}})),
            vec!["spec.resources.limits.memory", "must be a quantity"],
        ),
        (
            "negative cpu",
            with(json!({"resources": {"requests": {"cpu": "-1"}}})),
            vec!["spec.resources.requests.cpu", "must not be negative"],
        ),
        (
            "negative memory as a number",
            with(json!({"resources": {"limits": {"memory": -5}}})),
            vec!["spec.resources.limits.memory", "must not be negative"],
        ),
        (
            "cpu request above limit",
            with(json!({"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}})),
            vec!["spec.resources.requests.cpu", "less than or equal to limits.cpu"],
        ),
        (
            "memory request above limit",
            with(json!({"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}})),
            vec!["spec.resources.requests.memory", "less than or equal to limits.memory"],
        ),
        ("unknown state", with(json!({"state": "Paused"})), vec!["spec.state", "Unsupported value: \"Paused\""]),
        ("unknown spec field", with(json!({"replicas": 3})), vec!["unknown field \"spec.replicas\""]),
        (
            "unknown nested field",
            with(json!({"resources": {"requests": {"gpu": "1"}}})),
            vec!["unknown field \"spec.resources.requests.gpu\""],
        ),
        (
            "port zero",
            with(json!({"ports": [{"containerPort": 0}]})),
            vec!["spec.ports[0].containerPort", "greater than or equal to 1"],
        ),
        (
            "port too high",
            with(json!({"ports": [{"containerPort": 70000}]})),
            vec!["spec.ports[0].containerPort", "less than or equal to 65535"],
        ),
        (
            "port with unknown protocol",
            with(json!({"ports": [{"containerPort": 80, "protocol": "HTTP"}]})),
            vec!["spec.ports[0].protocol", "Unsupported value"],
        ),
        (
            "duplicate ports",
            with(json!({"ports": [{"containerPort": 80}, {"containerPort": 80, "protocol": "TCP"}]})),
            vec!["spec.ports", "containerPort/protocol pair must be unique"],
        ),
        (
            "duplicate port names",
            with(json!({"ports": [{"containerPort": 80, "name": "web"}, {"containerPort": 81, "name": "web"}]})),
            vec!["spec.ports", "port names must be unique"],
        ),
        (
            "bad port name",
            with(json!({"ports": [{"containerPort": 80, "name": "Web_Port"}]})),
            vec!["spec.ports[0].name", "should match"],
        ),
        ("bad hostname", with(json!({"hostname": "My_Host"})), vec!["spec.hostname", "should match"]),
        (
            "zero progress deadline",
            with(json!({"progressDeadlineSeconds": 0})),
            vec!["spec.progressDeadlineSeconds", "greater than or equal to 1"],
        ),
        (
            "unknown update strategy",
            with(json!({"updateStrategy": "BlueGreen"})),
            vec!["spec.updateStrategy", "Unsupported value"],
        ),
    ]
}

#[tokio::test]
async fn bad_manifests_are_rejected_with_the_field_named() {
    let ns = TestNamespace::new("validation").await;
    let mut failures = Vec::new();
    for (i, (case, spec, expected)) in cases().into_iter().enumerate() {
        match create_strict(&ns.client, &ns.name, &format!("bad-{i}"), spec.clone()).await {
            Ok(_) => failures.push(format!("{case}: accepted {spec}")),
            Err(kube::Error::Api(status)) => {
                let missing: Vec<_> = expected.iter().filter(|s| !status.message.contains(*s)).collect();
                if status.code != 422 && status.code != 400 || !missing.is_empty() {
                    failures.push(format!("{case}: HTTP {} {:?}, missing {missing:?}", status.code, status.message));
                }
            }
            Err(e) => failures.push(format!("{case}: unexpected error {e}")),
        }
    }
    assert!(failures.is_empty(), "{} case(s) wrong:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test]
async fn a_name_longer_than_a_label_value_is_rejected_naming_metadata_name() {
    let ns = TestNamespace::new("validation-name").await;
    let long = "w".repeat(64);
    match create_strict(&ns.client, &ns.name, &long, json!({"image": "nginx"})).await {
        Ok(_) => panic!("a 64-character name was accepted"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(status.message.contains("metadata.name must be at most 63 characters"), "{}", status.message);
        }
        Err(e) => panic!("unexpected error {e}"),
    }
    let longest = "w".repeat(63);
    create_strict(&ns.client, &ns.name, &longest, json!({"image": "nginx"})).await.expect("63 characters is fine");
}

#[tokio::test]
async fn good_manifests_are_accepted() {
    let ns = TestNamespace::new("validation-ok").await;
    let workloads = ns.api::<ManagedWorkload>();
    let full = json!({
        "image": "registry.example.com/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "command": ["/bin/sh", "-c"],
        "args": ["exec nginx -g 'daemon off;'"],
        "env": [
            {"name": "PLAIN", "value": ""},
            {"name": "from.secret", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
            {"name": "_FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": true}}}
        ],
        "resources": {"requests": {"cpu": 1, "memory": "512Mi"}, "limits": {"cpu": "1000m", "memory": "0.5Gi"}},
        "state": "Stopped",
        "hostname": "box-1",
        "ports": [{"containerPort": 53, "protocol": "UDP", "name": "dns"}, {"containerPort": 53, "name": "dns-tcp"}],
        "updateStrategy": "Recreate",
        "progressDeadlineSeconds": 120,
        "automountServiceAccountToken": true,
        "enableServiceLinks": false
    });
    let minimal = json!({"image": "nginx"});
    for (i, spec) in [full, minimal].into_iter().enumerate() {
        let stored = apply(&workloads, &format!("good-{i}"), spec.clone())
            .await
            .unwrap_or_else(|e| panic!("{spec} rejected: {e}"));
        // Nothing is defaulted into the stored spec: GitOps tools would see a diff.
        let stored_spec = serde_json::to_value(&stored.spec).unwrap();
        assert_eq!(stored_spec.as_object().unwrap().len(), spec.as_object().unwrap().len(), "{stored_spec}");
    }
}
