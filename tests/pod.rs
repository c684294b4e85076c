//! Where and as what a workload's Pod runs (issue 16), against the real control plane: pull
//! secrets, ServiceAccount, node selector, tolerations, priority, security context and probes
//! reach the Pod; a GPU workload says at once that no node can host it and runs once a node
//! offers the resource; a namespace enforcing the `restricted` Pod Security Standard runs a
//! compliant workload and fails one that is not, naming the policy.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::{Value, json};
use support::workload::{apply, condition, wait_condition, wait_ready};
use support::{TestNamespace, audit, wait_until};

/// A cluster-scoped object made for one test, deleted when it is dropped.
struct ClusterScoped<K: Cluster> {
    name: String,
    kind: std::marker::PhantomData<K>,
}

trait Cluster:
    kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + serde::Serialize
    + std::fmt::Debug
    + Send
    + 'static
{
}
impl Cluster for Node {}
impl Cluster for PriorityClass {}

impl<K: Cluster> ClusterScoped<K> {
    async fn create(client: &Client, object: Value) -> Self {
        let object: K = serde_json::from_value(object).expect("a valid object");
        let name = object.name_any();
        Api::<K>::all(client.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        ClusterScoped { name, kind: std::marker::PhantomData }
    }
}

impl<K: Cluster> Drop for ClusterScoped<K> {
    fn drop(&mut self) {
        // As TestNamespace's drop: a runtime and client of its own, on a thread of its own.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                let _ = Api::<K>::all(support::client().await).delete(&name, &DeleteParams::background()).await;
            });
        })
        .join();
    }
}

async fn the_pod(pods: &Api<Pod>, name: &str) -> Pod {
    let selector = format!("app.kubernetes.io/instance={name}");
    let list = pods.list(&ListParams::default().labels(&selector)).await.unwrap();
    let live: Vec<Pod> = list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    assert_eq!(live.len(), 1, "one live Pod of {name}: {live:#?}");
    live.into_iter().next().unwrap()
}

#[tokio::test]
async fn registry_identity_placement_security_and_probes_reach_the_pod() {
    let ns = TestNamespace::new("pod-options").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    let accounts = ns.api::<ServiceAccount>();
    accounts
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "runner"}})).unwrap())
        .await
        .unwrap();
    // Pod admission refuses a Pod naming a PriorityClass that does not exist.
    let class = format!("mw-test-{}", ns.name);
    let _priority = ClusterScoped::<PriorityClass>::create(
        &ns.client,
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": class}, "value": 1000}),
    )
    .await;

    let spec = |toleration_key: &str| {
        json!({
            "image": "nginx:latest",
            "imagePullSecrets": [{"name": "regcred"}],
            "imagePullPolicy": "IfNotPresent",
            "serviceAccountName": "runner",
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": toleration_key, "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": class,
            "securityContext": {"runAsUser": 1000, "runAsNonRoot": true, "allowPrivilegeEscalation": false,
                                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 80}, "periodSeconds": 5},
            "ports": [{"containerPort": 80, "name": "http"}],
            "livenessProbe": {"tcpSocket": {"port": "http"}, "failureThreshold": 5},
            "startupProbe": {"exec": {"command": ["cat", "/tmp/started"]}, "failureThreshold": 30},
        })
    };
    apply(&workloads, "web", spec("dedicated")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;

    let pod = the_pod(&pods, "web").await;
    let s = pod.spec.as_ref().unwrap();
    let secrets: Vec<_> = s.image_pull_secrets.iter().flatten().map(|r| r.name.as_str()).collect();
    assert_eq!(secrets, ["regcred"]);
    assert_eq!(s.service_account_name.as_deref(), Some("runner"));
    assert_eq!(s.node_selector.as_ref().unwrap()["type"], "kwok");
    let ours = s.tolerations.iter().flatten().find(|t| t.key.as_deref() == Some("dedicated"));
    assert_eq!(ours.and_then(|t| t.effect.as_deref()), Some("NoSchedule"), "{:?}", s.tolerations);
    assert_eq!(s.priority_class_name.as_deref(), Some(class.as_str()));
    assert_eq!(s.priority, Some(1000), "the PriorityClass applied");
    let psc = s.security_context.as_ref().unwrap();
    assert_eq!((psc.run_as_user, psc.run_as_non_root), (Some(1000), Some(true)));
    assert_eq!(psc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    let c = &s.containers[0];
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let csc = c.security_context.as_ref().unwrap();
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert_eq!(csc.capabilities.as_ref().unwrap().drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(c.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap().path.as_deref(), Some("/ready"));
    let liveness = c.liveness_probe.as_ref().unwrap();
    assert_eq!(liveness.failure_threshold, Some(5));
    assert_eq!(liveness.tcp_socket.as_ref().unwrap().port, IntOrString::String("http".into()), "a named port");
    assert_eq!(c.startup_probe.as_ref().unwrap().exec.as_ref().unwrap().command.as_ref().unwrap()[0], "cat");

    // Steady state: the API server's defaults in the probes, tolerations and security context
    // are no drift; a reconcile that finds nothing to change writes nothing.
    let before = audit::settled_writes(&ns.name).await;
    let poke = json!({"metadata": {"labels": {"team": "blue"}}});
    workloads.patch("web", &PatchParams::default(), &Patch::Merge(&poke)).await.unwrap();
    tokio::time::sleep(audit::QUIET).await;
    let after = audit::operator_writes(&ns.name);
    assert_eq!(after[before.len()..], [], "writes by the operator while nothing changed");

    // A changed option rolls out a new Pod (and is the positive control of the quiet window:
    // the same reading of the audit log sees the operator's write).
    let first = pod.uid();
    apply(&workloads, "web", spec("other")).await.unwrap();
    audit::wait_for_operator_write(&ns.name, after.len()).await;
    let updated = wait_until(&workloads, "web", "the new generation Running", support::workload::TIMEOUT, |w| {
        w.and_then(|w| w.status.as_ref())
            .is_some_and(|s| s.phase == Some(Phase::Running) && s.observed_generation > mw.metadata.generation)
    })
    .await
    .unwrap();
    assert_eq!(condition(&updated, "Ready").status, "True");
    let pod = the_pod(&pods, "web").await;
    assert_ne!(pod.uid(), first, "a new Pod");
    assert!(pod.spec.unwrap().tolerations.iter().flatten().any(|t| t.key.as_deref() == Some("other")));
}

#[tokio::test]
async fn a_gpu_workload_waits_unschedulable_and_runs_once_a_node_offers_gpus() {
    let ns = TestNamespace::new("gpu").await;
    let workloads = ns.api::<ManagedWorkload>();
    // The GPU node is tainted for this test alone, so no other test's Pods land on it.
    let suffix = &ns.name[ns.name.len() - 6..];
    let taint = format!("mw-operator.test/gpu-{suffix}");
    let node_name = format!("kwok-gpu-{suffix}");
    let started = Instant::now();
    apply(
        &workloads,
        "trainer",
        json!({
            "image": "nginx:latest",
            "resources": {"gpus": 1},
            "tolerations": [{"key": taint, "operator": "Exists", "effect": "NoSchedule"}],
            "progressDeadlineSeconds": 3600,
        }),
    )
    .await
    .unwrap();
    let mw = wait_until(&workloads, "trainer", "Reconciling reason Unschedulable", Duration::from_secs(30), |w| {
        w.is_some_and(|w| support::workload::condition_current(w, "Reconciling", "True"))
            && w.is_some_and(|w| condition(w, "Reconciling").reason == "Unschedulable")
    })
    .await
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "reported within seconds: {:?}", started.elapsed());
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Creating), "a wait, not a failure");
    let reconciling = condition(&mw, "Reconciling");
    assert!(reconciling.message.contains("Insufficient nvidia.com/gpu"), "{}", reconciling.message);
    assert!(!reconciling.message.contains("preemption"), "{}", reconciling.message);
    assert_eq!(condition(&mw, "Ready").reason, "Unschedulable");
    assert_eq!(condition(&mw, "Stalled").status, "False");
    let deployment = ns.api::<Deployment>().get("trainer").await.unwrap();
    let resources = deployment.spec.unwrap().template.spec.unwrap().containers[0].resources.clone().unwrap();
    assert_eq!(resources.limits.unwrap()["nvidia.com/gpu"].0, "1");
    assert_eq!(resources.requests.unwrap()["nvidia.com/gpu"].0, "1");

    // A node with a GPU appears (as a cluster autoscaler would add one): the Pod is placed and
    // the workload runs, with no change of its spec.
    let _node = ClusterScoped::<Node>::create(
        &ns.client,
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": node_name,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux", "type": "kwok"},
            },
            "spec": {"taints": [{"key": taint, "value": "true", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "1"},
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "1"},
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake",
                             "kubeProxyVersion": "fake"},
            },
        }),
    )
    .await;
    let mw = wait_ready(&workloads, "trainer", Phase::Running).await;
    assert_eq!(condition(&mw, "Reconciling").reason, "Idle");
    let pod = the_pod(&ns.api::<Pod>(), "trainer").await;
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(node_name.as_str()));
}

#[tokio::test]
async fn restricted_pod_security_runs_a_compliant_workload_and_fails_one_that_is_not() {
    let ns = TestNamespace::new("restricted").await;
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    let label = json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}});
    namespaces.patch(&ns.name, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let workloads = ns.api::<ManagedWorkload>();
    let restricted = json!({"runAsNonRoot": true, "runAsUser": 101, "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}});

    apply(&workloads, "compliant", json!({"image": "nginx:latest", "securityContext": restricted})).await.unwrap();
    let started = Instant::now();
    apply(&workloads, "plain", json!({"image": "nginx:latest"})).await.unwrap();

    let failed = wait_condition(&workloads, "plain", "Stalled", "True").await;
    assert!(started.elapsed() < Duration::from_secs(30), "failed within seconds: {:?}", started.elapsed());
    assert_eq!(failed.status.as_ref().unwrap().phase, Some(Phase::Failed));
    let stalled = condition(&failed, "Stalled");
    assert_eq!(stalled.reason, "FailedCreate");
    assert!(stalled.message.contains("violates PodSecurity \"restricted"), "names the policy: {}", stalled.message);
    assert!(stalled.message.contains("allowPrivilegeEscalation"), "and what is missing: {}", stalled.message);
    wait_ready(&workloads, "compliant", Phase::Running).await;

    // Made compliant, it recovers.
    apply(&workloads, "plain", json!({"image": "nginx:latest", "securityContext": restricted})).await.unwrap();
    wait_ready(&workloads, "plain", Phase::Running).await;
}

/// kwok runs no probes; it models one (hack/kwok/stages.yaml): a readiness probe of path
/// `/kwok.example/unready` keeps failing, so the container runs but is never Ready, as a
/// kubelet reports it. Any other probe passes.
#[tokio::test]
async fn a_failing_readiness_probe_keeps_the_workload_from_running_and_ready() {
    let ns = TestNamespace::new("probes").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    let spec = |path: &str| {
        json!({
            "image": "nginx:latest",
            "ports": [{"containerPort": 80}],
            "readinessProbe": {"httpGet": {"path": path, "port": 80}, "periodSeconds": 1},
            "progressDeadlineSeconds": 3600,
        })
    };
    apply(&workloads, "web", spec("/kwok.example/unready")).await.unwrap();
    support::eventually("the Pod running, not Ready", Duration::from_secs(30), || async {
        let list = pods.list(&ListParams::default().labels("app.kubernetes.io/instance=web")).await;
        let pod = list.map_err(|e| e.to_string())?.items.into_iter().next().ok_or("no Pod yet")?;
        let status = pod.status.unwrap_or_default();
        let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
        if status.phase.as_deref() == Some("Running") && !ready {
            Ok(())
        } else {
            Err(format!("phase {:?}, ready {ready}", status.phase))
        }
    })
    .await;
    // Longer than anything that would re-ready it (pod-ready-again waits 5 s): the process runs,
    // but it does not serve, so the workload is not Running and not Ready.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let mw = workloads.get("web").await.unwrap();
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Creating), "{:#?}", mw.status);
    assert_eq!(condition(&mw, "Ready").status, "False");
    // (Messages and counts are details, written with the next phase change or within a minute.)
    assert_eq!(condition(&mw, "Reconciling").reason, "Creating");
    assert_eq!(condition(&mw, "Stalled").status, "False");

    // A probe that passes: the new Pod becomes Ready, and with it the workload.
    apply(&workloads, "web", spec("/healthz")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(mw.status.as_ref().unwrap().available_replicas, 1);
}
