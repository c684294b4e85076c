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
            "min ready not below the progress deadline",
            with(json!({"progressDeadlineSeconds": 30, "minReadySeconds": 30})),
            vec!["spec.minReadySeconds", "less than progressDeadlineSeconds"],
        ),
        (
            "min ready not below the default progress deadline",
            with(json!({"minReadySeconds": 600})),
            vec!["spec.minReadySeconds", "less than progressDeadlineSeconds"],
        ),
        (
            "negative min ready",
            with(json!({"minReadySeconds": -1})),
            vec!["spec.minReadySeconds", "greater than or equal to 0"],
        ),
        (
            "unknown update strategy",
            with(json!({"updateStrategy": "BlueGreen"})),
            vec!["spec.updateStrategy", "Unsupported value"],
        ),
        // Pod options: registry, identity, placement, security, health.
        (
            "bad image pull secret name",
            with(json!({"imagePullSecrets": [{"name": "Reg_Cred"}]})),
            vec!["spec.imagePullSecrets[0].name", "should match"],
        ),
        (
            "duplicate image pull secrets",
            with(json!({"imagePullSecrets": [{"name": "regcred"}, {"name": "regcred"}]})),
            vec!["spec.imagePullSecrets[1]", "Duplicate value"],
        ),
        (
            "unknown image pull policy",
            with(json!({"imagePullPolicy": "Sometimes"})),
            vec!["spec.imagePullPolicy", "Unsupported value"],
        ),
        (
            "bad service account name",
            with(json!({"serviceAccountName": "My SA"})),
            vec!["spec.serviceAccountName", "should match"],
        ),
        (
            "bad node selector key",
            with(json!({"nodeSelector": {"bad key!": "x"}})),
            vec!["spec.nodeSelector", "keys must be label keys"],
        ),
        (
            "bad node selector value",
            with(json!({"nodeSelector": {"disk": "fast ssd"}})),
            vec!["spec.nodeSelector", "values label values"],
        ),
        (
            "node selector value too long",
            with(json!({"nodeSelector": {"disk": "x".repeat(64)}})),
            // The API server's own wording: "may not be longer than 63" on 1.31, "may not be
            // more than 63 bytes" on 1.36; "Too long" is the error's type on both.
            vec!["spec.nodeSelector.disk", "Too long", "63"],
        ),
        (
            "toleration with unknown operator",
            with(json!({"tolerations": [{"key": "gpu", "operator": "In"}]})),
            vec!["spec.tolerations[0].operator", "Unsupported value"],
        ),
        (
            "toleration with unknown effect",
            with(json!({"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoRun"}]})),
            vec!["spec.tolerations[0].effect", "Unsupported value"],
        ),
        (
            "toleration with neither key nor Exists",
            with(json!({"tolerations": [{"value": "x"}]})),
            vec!["spec.tolerations[0]", "a toleration without a key must have operator Exists"],
        ),
        (
            "toleration Exists with a value",
            with(json!({"tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]})),
            vec!["spec.tolerations[0]", "value must be empty when operator is Exists"],
        ),
        (
            "tolerationSeconds without NoExecute",
            with(json!({"tolerations": [{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30}]})),
            vec!["spec.tolerations[0]", "tolerationSeconds is only allowed with effect NoExecute"],
        ),
        (
            "bad toleration key",
            with(json!({"tolerations": [{"key": "-gpu", "operator": "Exists"}]})),
            vec!["spec.tolerations[0].key", "should match"],
        ),
        (
            "bad priority class name",
            with(json!({"priorityClassName": "High_Priority"})),
            vec!["spec.priorityClassName", "should match"],
        ),
        (
            "negative GPU count",
            with(json!({"resources": {"gpus": -1}})),
            vec!["spec.resources.gpus", "greater than or equal to 0"],
        ),
        (
            "GPU count as text",
            with(json!({"resources": {"gpus": "one"}})),
            vec!["spec.resources.gpus", "must be of type integer"],
        ),
        (
            "negative runAsUser",
            with(json!({"securityContext": {"runAsUser": -1}})),
            vec!["spec.securityContext.runAsUser", "greater than or equal to 0"],
        ),
        (
            "negative runAsGroup",
            with(json!({"securityContext": {"runAsGroup": -5}})),
            vec!["spec.securityContext.runAsGroup", "greater than or equal to 0"],
        ),
        (
            "negative fsGroup",
            with(json!({"securityContext": {"fsGroup": -5}})),
            vec!["spec.securityContext.fsGroup", "greater than or equal to 0"],
        ),
        (
            "runAsNonRoot with user 0",
            with(json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 0}})),
            vec!["spec.securityContext", "runAsNonRoot: true contradicts runAsUser: 0"],
        ),
        (
            "readOnlyRootFilesystem as text",
            with(json!({"securityContext": {"readOnlyRootFilesystem": "yes"}})),
            vec!["spec.securityContext.readOnlyRootFilesystem", "must be of type boolean"],
        ),
        (
            "allowPrivilegeEscalation as text",
            with(json!({"securityContext": {"allowPrivilegeEscalation": "no"}})),
            vec!["spec.securityContext.allowPrivilegeEscalation", "must be of type boolean"],
        ),
        (
            "lowercase capability",
            with(json!({"securityContext": {"capabilities": {"add": ["net_admin"]}}})),
            vec!["spec.securityContext.capabilities.add[0]", "should match"],
        ),
        (
            "duplicate dropped capability",
            with(json!({"securityContext": {"capabilities": {"drop": ["ALL", "ALL"]}}})),
            vec!["spec.securityContext.capabilities.drop[1]", "Duplicate value"],
        ),
        (
            "unknown seccomp profile type",
            with(json!({"securityContext": {"seccompProfile": {"type": "Strict"}}})),
            vec!["spec.securityContext.seccompProfile.type", "Unsupported value"],
        ),
        (
            "Localhost seccomp profile without a path",
            with(json!({"securityContext": {"seccompProfile": {"type": "Localhost"}}})),
            vec!["spec.securityContext.seccompProfile", "localhostProfile is required with type Localhost"],
        ),
        (
            "absolute seccomp localhost profile",
            with(
                json!({"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "/etc/p.json"}}}),
            ),
            vec!["spec.securityContext.seccompProfile.localhostProfile", "relative to the kubelet's seccomp directory"],
        ),
        (
            "seccomp localhost profile climbing out",
            with(
                json!({"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "a/../../p.json"}}}),
            ),
            vec!["spec.securityContext.seccompProfile.localhostProfile", "without '..'"],
        ),
        (
            "toleration key prefix too long",
            with(json!({"tolerations": [{"key": format!("{}.io/gpu", "a".repeat(260)), "operator": "Exists"}]})),
            vec!["spec.tolerations[0].key", "prefix (before '/') must be at most 253"],
        ),
        (
            "node selector key prefix too long",
            with(json!({"nodeSelector": {format!("{}.io/gpu", "a".repeat(260)): "x"}})),
            vec!["spec.nodeSelector", "keys must be label keys"],
        ),
        (
            "probe with no handler",
            with(json!({"readinessProbe": {"periodSeconds": 5}})),
            vec!["spec.readinessProbe", "exactly one of httpGet, tcpSocket or exec"],
        ),
        (
            "probe with two handlers",
            with(json!({"livenessProbe": {"tcpSocket": {"port": 80}, "exec": {"command": ["true"]}}})),
            vec!["spec.livenessProbe", "exactly one of httpGet, tcpSocket or exec"],
        ),
        (
            "probe port zero",
            with(json!({"readinessProbe": {"httpGet": {"port": 0}}})),
            vec!["spec.readinessProbe.httpGet.port", "must be a port number (1 to 65535) or a port name"],
        ),
        (
            "probe port name not a port name",
            with(json!({"livenessProbe": {"tcpSocket": {"port": "Web_Port"}}})),
            vec!["spec.livenessProbe.tcpSocket.port", "must be a port number (1 to 65535) or a port name"],
        ),
        (
            "probe port name not among the ports",
            with(
                json!({"ports": [{"containerPort": 80, "name": "web"}], "readinessProbe": {"httpGet": {"port": "http"}}}),
            ),
            vec!["spec.readinessProbe", "a named port must be the name of one of spec.ports"],
        ),
        (
            "probe port name with no ports at all",
            with(json!({"startupProbe": {"tcpSocket": {"port": "http"}}})),
            vec!["spec.startupProbe", "a named port must be the name of one of spec.ports"],
        ),
        (
            "probe path not starting with /",
            with(json!({"readinessProbe": {"httpGet": {"path": "healthz", "port": 80}}})),
            vec!["spec.readinessProbe.httpGet.path", "should match"],
        ),
        (
            "unknown probe scheme",
            with(json!({"readinessProbe": {"httpGet": {"port": 80, "scheme": "FTP"}}})),
            vec!["spec.readinessProbe.httpGet.scheme", "Unsupported value"],
        ),
        (
            "exec probe without a command",
            with(json!({"startupProbe": {"exec": {"command": []}}})),
            vec!["spec.startupProbe.exec.command", "should have at least 1 items"],
        ),
        (
            "probe period zero",
            with(json!({"readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 0}})),
            vec!["spec.readinessProbe.periodSeconds", "greater than or equal to 1"],
        ),
        (
            "negative probe initial delay",
            with(json!({"startupProbe": {"tcpSocket": {"port": 80}, "initialDelaySeconds": -1}})),
            vec!["spec.startupProbe.initialDelaySeconds", "greater than or equal to 0"],
        ),
        (
            "probe failure threshold zero",
            with(json!({"readinessProbe": {"tcpSocket": {"port": 80}, "failureThreshold": 0}})),
            vec!["spec.readinessProbe.failureThreshold", "greater than or equal to 1"],
        ),
        (
            "probe timeout zero",
            with(json!({"readinessProbe": {"tcpSocket": {"port": 80}, "timeoutSeconds": 0}})),
            vec!["spec.readinessProbe.timeoutSeconds", "greater than or equal to 1"],
        ),
        (
            "liveness probe successThreshold above 1",
            with(json!({"livenessProbe": {"tcpSocket": {"port": 80}, "successThreshold": 2}})),
            vec!["spec.livenessProbe", "successThreshold must be 1 for a liveness probe"],
        ),
        (
            "startup probe successThreshold above 1",
            with(json!({"startupProbe": {"tcpSocket": {"port": 80}, "successThreshold": 3}})),
            vec!["spec.startupProbe", "successThreshold must be 1 for a startup probe"],
        ),
        (
            "a Service without ports",
            with(json!({"service": {"type": "ClusterIP"}})),
            vec!["spec.service", "needs at least one port in spec.ports"],
        ),
        (
            "an unknown Service type",
            with(json!({"ports": [{"containerPort": 80}], "service": {"type": "External"}})),
            vec!["spec.service.type", "Unsupported value"],
        ),
        (
            "a load-balancer class without a load balancer",
            with(json!({"ports": [{"containerPort": 80}], "service": {"loadBalancerClass": "metallb.io/metallb"}})),
            vec!["spec.service.loadBalancerClass", "only allowed with type LoadBalancer"],
        ),
        (
            "source ranges on a NodePort Service",
            with(
                json!({"ports": [{"containerPort": 80}], "service": {"type": "NodePort", "loadBalancerSourceRanges": ["10.0.0.0/8"]}}),
            ),
            vec!["spec.service.loadBalancerSourceRanges", "only allowed with type LoadBalancer"],
        ),
        (
            "a source range that is no CIDR",
            with(
                json!({"ports": [{"containerPort": 80}], "service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["somewhere"]}}),
            ),
            vec!["spec.service.loadBalancerSourceRanges", "must be a CIDR"],
        ),
        (
            "an external traffic policy on a ClusterIP Service",
            with(json!({"ports": [{"containerPort": 80}], "service": {"externalTrafficPolicy": "Local"}})),
            vec!["spec.service.externalTrafficPolicy", "only allowed with type NodePort or LoadBalancer"],
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
        "resources": {"requests": {"cpu": 1, "memory": "512Mi"}, "limits": {"cpu": "1000m", "memory": "0.5Gi"}, "gpus": 2},
        "state": "Stopped",
        "hostname": "box-1",
        "ports": [{"containerPort": 53, "protocol": "UDP", "name": "dns"}, {"containerPort": 53, "name": "dns-tcp"}],
        "updateStrategy": "Recreate",
        "progressDeadlineSeconds": 120,
        "minReadySeconds": 119,
        "automountServiceAccountToken": true,
        "enableServiceLinks": false,
        "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror.example"}],
        "imagePullPolicy": "IfNotPresent",
        "serviceAccountName": "runner",
        "nodeSelector": {"kubernetes.io/os": "linux", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "empty": ""},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "manager", "effect": "NoExecute", "tolerationSeconds": 300},
            {"operator": "Exists"}
        ],
        "priorityClassName": "manager-high",
        "securityContext": {
            "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true, "fsGroup": 2000,
            "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
            "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/app.json"}
        },
        "readinessProbe": {"httpGet": {"path": "/healthz?full=1", "port": 8080, "scheme": "HTTPS"}, "periodSeconds": 5,
                           "timeoutSeconds": 2, "successThreshold": 2, "failureThreshold": 3, "initialDelaySeconds": 0},
        "livenessProbe": {"tcpSocket": {"port": "dns-tcp"}, "successThreshold": 1},
        "startupProbe": {"exec": {"command": ["pg_isready", "-q"]}, "failureThreshold": 60},
        "service": {
            "type": "LoadBalancer", "loadBalancerClass": "metallb.io/metallb",
            "loadBalancerSourceRanges": ["203.0.113.0/24", "2001:db8::/32"], "externalTrafficPolicy": "Local",
            "annotations": {"metallb.io/address-pool": "public"}
        }
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
