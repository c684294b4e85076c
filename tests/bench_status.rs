//! What one status write costs the API server, by what is written and how, for `make bench`
//! (ignored by `make test`): the operator's ManagedWorkload status write beside
//! kube-controller-manager's Deployment status update, and variants that each change one thing
//! (the write's method, the status's shape, the CRD's schema, the managed fields), so the
//! difference can be pinned on its cause.
//!
//! For each variant, MW_BENCH_STATUS_K (default 300) objects of its own are created and given a
//! first status; then, MW_BENCH_STATUS_ROUNDS times (default 5), each variant in turn writes
//! every one of its objects once, alternating between two statuses as the operator's Creating
//! → Running writes do, IN_FLIGHT at once, each round starting one variant later. The API
//! server's and etcd's CPU over each batch, and the API server's allocations (its Go runtime's
//! count, from its metrics), less what they spend idle meanwhile, are per write that round; the
//! table gives each variant's mean over the rounds and their range (garbage collection cycles
//! and a shared machine make rounds differ; the allocations much less). kube-controller-manager is
//! stopped while writes are timed, so nothing else writes; no operator may run.
//! MW_BENCH_STATUS_ONLY (comma-separated variant names) runs some variants only. The table goes
//! to target/bench/status.md and is printed.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus, ServiceSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use mw_operator::client::patch_params;
use mw_operator::names::{MANAGED_LABEL, TEMPLATE_HASH_ANNOTATION};
use mw_operator::operator::ownership::{FIELD_MANAGER, applied_hash};
use mw_operator::operator::status::{self, Observed};
use mw_operator::operator::{deployment, status_write};
use mw_operator::resource::{ManagedWorkload, ManagedWorkloadSpec, ManagedWorkloadStatus};
use support::TestNamespace;
use support::controlplane::{Stopped, components_cpu};

/// Writes in flight at once, for every variant alike.
const IN_FLIGHT: usize = 4;
const GROUP: &str = "opensource-server.mieweb.org";
const VERSION: &str = "v1alpha1";
const KCM: &str = "kube-controller-manager";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The objects a variant writes to: Deployments, or ManagedWorkloads of the operator's CRD or
/// of a copy of it under another group.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Deployment,
    Workload(Crd),
}

/// The operator's CRD, or a copy of it whose schema is trimmed, under a group of its own.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Crd {
    Shipped,
    /// Every description removed.
    NoDescriptions,
    /// `status` kept as it comes (x-kubernetes-preserve-unknown-fields): no status schema.
    LooseStatus,
    /// `spec` and `status` both kept as they come: no schema, no CEL.
    Bare,
    /// The schema without its CEL rules (x-kubernetes-validations).
    NoCel,
    /// `status` tracked field by field (no x-kubernetes-map-type: atomic): its writer's
    /// managed-fields entry lists every field of every condition.
    GranularStatus,
}

impl Crd {
    fn group(self) -> String {
        match self {
            Crd::Shipped => GROUP.into(),
            Crd::NoDescriptions => "nodesc.statusbench.test".into(),
            Crd::LooseStatus => "loose.statusbench.test".into(),
            Crd::Bare => "bare.statusbench.test".into(),
            Crd::NoCel => "nocel.statusbench.test".into(),
            Crd::GranularStatus => "granular.statusbench.test".into(),
        }
    }

    fn resource(self) -> ApiResource {
        let gvk = kube::api::GroupVersionKind::gvk(&self.group(), VERSION, "ManagedWorkload");
        ApiResource::from_gvk_with_plural(&gvk, "managedworkloads")
    }

    /// The shipped CRD (crds/), changed as this variant says.
    fn definition(self) -> CustomResourceDefinition {
        let text = std::fs::read_to_string(format!("crds/managedworkloads.{GROUP}.yaml")).expect("the shipped CRD");
        let mut crd = support::documents(&text).into_iter().next().expect("a CRD document");
        crd["metadata"] = json!({"name": format!("managedworkloads.{}", self.group())});
        crd["spec"]["group"] = json!(self.group());
        for version in crd["spec"]["versions"].as_array_mut().expect("versions") {
            let schema = &mut version["schema"]["openAPIV3Schema"];
            match self {
                Crd::Shipped => {}
                Crd::NoDescriptions => strip_descriptions(schema),
                Crd::LooseStatus => {
                    schema["properties"]["status"] =
                        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
                }
                Crd::Bare => {
                    let loose = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
                    *schema = json!({"type": "object", "properties": {"spec": loose, "status": loose}});
                }
                Crd::NoCel => strip_key(schema, "x-kubernetes-validations"),
                Crd::GranularStatus => {
                    if let Some(status) = schema["properties"]["status"].as_object_mut() {
                        status.remove("x-kubernetes-map-type");
                    }
                }
            }
        }
        serde_json::from_value(crd).expect("a CustomResourceDefinition")
    }
}

/// A schema without its descriptions (a string-valued `description`, never a property of
/// that name).
fn strip_descriptions(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.get("description").is_some_and(Value::is_string) {
                map.remove("description");
            }
            map.values_mut().for_each(strip_descriptions);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// A schema without `key` anywhere (an extension: no property has such a name).
fn strip_key(schema: &mut Value, key: &str) {
    match schema {
        Value::Object(map) => {
            map.remove(key);
            map.values_mut().for_each(|v| strip_key(v, key));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| strip_key(v, key)),
        _ => {}
    }
}

/// How a status is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    /// The operator's own: `status_write::write` (shipped CRD) or the same patch
    /// (`status_write::patch`) to another group.
    Operator,
    /// A merge patch `{"status": ...}`.
    Merge,
    /// PUT of the object last written with its status replaced (its resourceVersion, no
    /// managedFields), as kube-controller-manager updates a Deployment's status.
    Put,
    /// Server-side apply of the status (no UID check: see status_write.rs).
    Apply,
}

/// The statuses a variant alternates between, as functions of the object's name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// kube-controller-manager's: a Deployment rolling out, then available.
    Kcm,
    /// What the operator derives: `Creating`, then `Running` (with a ClusterIP Service).
    Operator,
    /// The same without the mirrored Deployment conditions.
    NoMirrored,
    /// Only what kstatus and `kubectl wait` read: observedGeneration, phase, the three summary
    /// conditions.
    Summary,
}

struct Variant {
    name: &'static str,
    /// What it writes, for the table.
    what: &'static str,
    kind: Kind,
    method: Method,
    shape: Shape,
    /// Managed fields cleared after the first status write. The API server tracks no fields
    /// of an object that has none on an update, so this is the write without field tracking
    /// (which no object a client applies gets).
    no_managed_fields: bool,
}

fn variants() -> Vec<Variant> {
    let v = |name, what, kind, method, shape| Variant { name, what, kind, method, shape, no_managed_fields: false };
    let (shipped, op, status) = (Kind::Workload(Crd::Shipped), Method::Operator, Shape::Operator);
    let copy = |crd| Kind::Workload(crd);
    vec![
        v(
            "deployment-put",
            "a Deployment's status, PUT with its resourceVersion as kube-controller-manager does",
            Kind::Deployment,
            Method::Put,
            Shape::Kcm,
        ),
        v(
            "mw-operator",
            "the operator's write: a JSON patch that tests the UID, then adds the status",
            shipped,
            op,
            status,
        ),
        v("mw-merge", "the same status by merge patch", shipped, Method::Merge, status),
        v("mw-put", "the same status, PUT with the resourceVersion", shipped, Method::Put, status),
        v("mw-apply", "the same status by server-side apply", shipped, Method::Apply, status),
        v(
            "mw-no-mirrored",
            "the operator's write without the mirrored Deployment conditions",
            shipped,
            op,
            Shape::NoMirrored,
        ),
        v(
            "mw-summary",
            "the operator's write of observedGeneration, phase and the three kstatus conditions only",
            shipped,
            op,
            Shape::Summary,
        ),
        Variant {
            no_managed_fields: true,
            ..v(
                "mw-no-managed-fields",
                "the operator's write to an object without managedFields (then none are tracked)",
                shipped,
                op,
                status,
            )
        },
        v(
            "crd-no-descriptions",
            "the operator's write; the CRD without descriptions",
            copy(Crd::NoDescriptions),
            op,
            status,
        ),
        v(
            "crd-loose-status",
            "the operator's write; the CRD without a status schema",
            copy(Crd::LooseStatus),
            op,
            status,
        ),
        v("crd-bare", "the operator's write; the CRD without any schema or CEL rule", copy(Crd::Bare), op, status),
        v("crd-no-cel", "the operator's write; the CRD without its CEL rules", copy(Crd::NoCel), op, status),
        v(
            "crd-granular-status",
            "the operator's write; the status tracked field by field (not atomic)",
            copy(Crd::GranularStatus),
            op,
            status,
        ),
    ]
}

/// Workload `name`'s spec, as bench_operator's: a port and a ClusterIP Service.
fn spec() -> Value {
    json!({"image": "nginx:latest", "env": [{"name": "ID", "value": "1"}],
           "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
           "ports": [{"containerPort": 80, "name": "http"}], "service": {"type": "ClusterIP"}})
}

fn workload(namespace: &str, name: &str) -> ManagedWorkload {
    let spec: ManagedWorkloadSpec = serde_json::from_value(spec()).expect("a valid spec");
    let mut mw = ManagedWorkload::new(name, spec);
    mw.metadata.namespace = Some(namespace.into());
    mw.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    mw.metadata.generation = Some(1);
    mw
}

/// The Deployment the operator would apply for `mw`, as a plain client would (no owner, no
/// operator label: kube-controller-manager's garbage collector would take it for an orphan).
fn plain_deployment(mw: &ManagedWorkload) -> Deployment {
    let mut d = deployment::deployment(mw, &Default::default()).expect("a desired Deployment");
    d.metadata.owner_references = None;
    d.metadata.annotations = None;
    let plain = |labels: &mut Option<BTreeMap<String, String>>| {
        if let Some(labels) = labels.as_mut() {
            labels.remove(MANAGED_LABEL);
        }
    };
    plain(&mut d.metadata.labels);
    if let Some(spec) = d.spec.as_mut() {
        plain(&mut spec.selector.match_labels);
        plain(&mut spec.template.metadata.get_or_insert_default().labels);
    }
    d
}

/// kube-controller-manager's two statuses of a one-replica Deployment: rolling out (its Pod
/// not available yet), then available; from one it really wrote (`available`).
fn kcm_statuses(available: &DeploymentStatus) -> [DeploymentStatus; 2] {
    let mut rolling = available.clone();
    rolling.ready_replicas = None;
    rolling.available_replicas = None;
    rolling.unavailable_replicas = Some(1);
    for c in rolling.conditions.iter_mut().flatten() {
        match c.type_.as_str() {
            "Available" => {
                c.status = "False".into();
                c.reason = Some("MinimumReplicasUnavailable".into());
                c.message = Some("Deployment does not have minimum availability.".into());
            }
            "Progressing" => {
                c.reason = Some("ReplicaSetUpdated".into());
                c.message = c.message.as_ref().map(|m| m.replace("has successfully progressed", "is progressing"));
            }
            _ => {}
        }
    }
    [rolling, available.clone()]
}

/// The statuses the operator derives for workload `mw`: `Creating` (its Pod not ready yet),
/// then `Running`, with its Deployment in kube-controller-manager's two states and its
/// ClusterIP Service.
fn operator_statuses(mw: &ManagedWorkload, kcm: &[DeploymentStatus; 2]) -> [ManagedWorkloadStatus; 2] {
    let mut d = deployment::deployment(mw, &Default::default()).expect("a desired Deployment");
    d.metadata.generation = Some(1);
    let hash = applied_hash(&d).expect("a fingerprint").to_owned();
    let template = deployment::current_template_hash(&d).expect("a template hash").to_owned();
    let mut service = mw_operator::operator::service::service(mw).expect("a Service");
    service.spec = Some(ServiceSpec { cluster_ip: Some("10.96.14.3".into()), ..service.spec.unwrap_or_default() });
    let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).expect("a time"));
    let mut previous = mw.clone();
    let mut out = Vec::new();
    for (i, ready) in [false, true].into_iter().enumerate() {
        d.status = Some(kcm[i].clone());
        let mut pod = Pod::default();
        pod.metadata.name = Some(format!("{}-{template}", mw.name_any()));
        pod.metadata.annotations = Some([(TEMPLATE_HASH_ANNOTATION.to_string(), template.clone())].into());
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.244.0.7".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let observed = Observed {
            desired_hash: &hash,
            deployment: Some(&d),
            pods: vec![&pod],
            blocked: None,
            claims: vec![],
            refused: &[],
            service: Some(&service),
            sandbox: None,
        };
        let s = status::derive(&previous, &observed, &at(10 * i as i64));
        previous.status = Some(s.clone());
        out.push(s);
    }
    let running = out.pop().expect("Running");
    [out.pop().expect("Creating"), running]
}

/// `status` cut to `shape`.
fn shaped(shape: Shape, status: &ManagedWorkloadStatus) -> ManagedWorkloadStatus {
    let summary = |s: &mut ManagedWorkloadStatus| {
        s.conditions.retain(|c| [status::READY, status::RECONCILING, status::STALLED].contains(&c.type_.as_str()))
    };
    let mut s = status.clone();
    match shape {
        Shape::Operator | Shape::Kcm => {}
        Shape::NoMirrored => summary(&mut s),
        Shape::Summary => {
            summary(&mut s);
            s = ManagedWorkloadStatus {
                observed_generation: s.observed_generation,
                phase: s.phase,
                conditions: s.conditions,
                ..Default::default()
            };
        }
    }
    s
}

/// One object a variant writes to: its name, the two statuses it alternates between, the
/// object as last written (for a PUT), and, for the operator's own write, the workload.
struct Target {
    name: String,
    statuses: [Value; 2],
    last: Value,
    workload: ManagedWorkload,
}

struct Run {
    variant: Variant,
    api: Api<DynamicObject>,
    targets: Vec<Target>,
    /// Per round: what one write cost.
    rounds: Vec<Cost>,
    /// Its place in the table.
    order: usize,
}

impl Run {
    /// Write status `which` (0 or 1) to every target, IN_FLIGHT at once.
    async fn write_all(&mut self, client: &Client, which: usize) {
        let (api, method, name) = (&self.api, self.variant.method, self.variant.name);
        let shipped = self.variant.kind == Kind::Workload(Crd::Shipped);
        let answers: Vec<(usize, Value)> = futures::stream::iter(self.targets.iter().enumerate())
            .map(|(i, t)| async move {
                let status = &t.statuses[which];
                let answer = write(client, api, method, shipped, t, status)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: writing {}'s status: {e}", t.name));
                (i, answer)
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        for (i, answer) in answers {
            if !answer.is_null() {
                self.targets[i].last = answer;
            }
        }
    }
}

/// Write `status` to `t` by `method`; the object the answer carries, when it is read (a PUT's
/// next body), else null.
async fn write(
    client: &Client,
    api: &Api<DynamicObject>,
    method: Method,
    shipped: bool,
    t: &Target,
    status: &Value,
) -> Result<Value, kube::Error> {
    let manager = if api.resource_url().contains("/deployments") { KCM } else { FIELD_MANAGER };
    match method {
        Method::Operator if shipped => {
            let s: ManagedWorkloadStatus = serde_json::from_value(status.clone()).map_err(kube::Error::SerdeError)?;
            status_write::write(client, &t.workload, &s).await?;
            Ok(Value::Null)
        }
        Method::Operator => {
            let s: ManagedWorkloadStatus = serde_json::from_value(status.clone()).map_err(kube::Error::SerdeError)?;
            let patch = status_write::patch(&t.workload, &s).map_err(kube::Error::SerdeError)?;
            api.patch_status(&t.name, &patch_params(manager), &Patch::Json::<()>(patch)).await?;
            Ok(Value::Null)
        }
        Method::Merge => {
            api.patch_status(&t.name, &patch_params(manager), &Patch::Merge(json!({"status": status}))).await?;
            Ok(Value::Null)
        }
        Method::Apply => {
            let body = json!({"apiVersion": t.last["apiVersion"], "kind": t.last["kind"], "status": status});
            api.patch_status(&t.name, &PatchParams::apply(manager).force(), &Patch::Apply(body)).await?;
            Ok(Value::Null)
        }
        Method::Put => {
            let mut body = t.last.clone();
            body["status"] = status.clone();
            if let Some(meta) = body["metadata"].as_object_mut() {
                meta.remove("managedFields");
            }
            let body: DynamicObject = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
            let params = PostParams { field_manager: Some(manager.into()), ..Default::default() };
            let written = api.replace_status(&t.name, &params, &body).await?;
            serde_json::to_value(written).map_err(kube::Error::SerdeError)
        }
    }
}

/// A fresh copy of `crd` under its own group, established; deleted when dropped.
struct TrimmedCrd(String);

impl TrimmedCrd {
    async fn create(client: &Client, crd: Crd) -> TrimmedCrd {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let definition = crd.definition();
        let name = definition.name_any();
        let _ = crds.delete(&name, &DeleteParams::default()).await;
        support::eventually(&format!("{name} gone"), Duration::from_secs(60), || async {
            match crds.get_opt(&name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        crds.create(&PostParams::default(), &definition).await.expect("creating a trimmed CRD");
        support::eventually(&format!("{name} established"), Duration::from_secs(60), || async {
            let crd = crds.get(&name).await.map_err(|e| e.to_string())?;
            let established = crd.status.and_then(|s| s.conditions).into_iter().flatten();
            if established.into_iter().any(|c| c.type_ == "Established" && c.status == "True") {
                Ok(())
            } else {
                Err("not established".into())
            }
        })
        .await;
        TrimmedCrd(name)
    }
}

impl Drop for TrimmedCrd {
    fn drop(&mut self) {
        // As TestNamespace's drop: a runtime of its own, on a thread of its own.
        let name = self.0.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                let crds: Api<CustomResourceDefinition> = Api::all(support::client().await);
                let _ = crds.delete(&name, &DeleteParams::default()).await;
            });
        })
        .join();
    }
}

/// Object `name` as the API server serves it: its length in bytes as JSON, without its
/// managedFields, and of its status alone.
async fn sizes(client: &Client, url: &str, name: &str) -> (usize, usize, usize) {
    let request = Request::new(url).get(name, &Default::default()).expect("a GET");
    let text = client.request_text(request).await.expect("reading an object");
    let mut object: Value = serde_json::from_str(&text).expect("JSON");
    let status = serde_json::to_vec(&object["status"]).map_or(0, |v| v.len());
    if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    (text.len(), serde_json::to_vec(&object).map_or(0, |v| v.len()), status)
}

/// What the API server and etcd spent: CPU milliseconds each, and the API server's allocations
/// in KiB (steadier than its CPU: the garbage collector's cycles land in one batch or another,
/// and what they cost follows what was allocated; the API server's own background work still
/// adds some).
#[derive(Clone, Copy, Default)]
struct Cost {
    apiserver_ms: f64,
    etcd_ms: f64,
    allocated_kib: f64,
}

impl Cost {
    fn scaled(self, by: f64) -> Cost {
        Cost {
            apiserver_ms: self.apiserver_ms * by,
            etcd_ms: self.etcd_ms * by,
            allocated_kib: self.allocated_kib * by,
        }
    }
}

/// What the API server and etcd do unasked, per second, and what reading the API server's
/// allocations allocates (its answer is encoded after the figure is read).
#[derive(Clone, Copy, Default)]
struct Idle {
    per_second: Cost,
    scrape_kib: f64,
}

/// KiB the API server has allocated since it started (Go's count, from its metrics).
async fn allocated_kib(client: &Client) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("a GET");
    let text = client.request_text(request).await.expect("the API server's metrics");
    let bytes: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("go_memstats_alloc_bytes_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("go_memstats_alloc_bytes_total");
    bytes / 1024.0
}

/// What `during` cost, less what would have been spent idle in that time.
async fn cost_of<T>(client: &Client, idle: Idle, during: impl std::future::Future<Output = T>) -> (T, Cost) {
    let allocated = allocated_kib(client).await;
    let before = components_cpu();
    let t = Instant::now();
    let out = during.await;
    // The last writes' watch events are dispatched just after their answers.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let elapsed = t.elapsed().as_secs_f64();
    let after = components_cpu();
    let allocated = allocated_kib(client).await - allocated - idle.scrape_kib;
    let spent = |c: &str| (after.get(c).copied().unwrap_or(0.0) - before.get(c).copied().unwrap_or(0.0)) * 1000.0;
    let idle = idle.per_second.scaled(elapsed);
    let cost = Cost {
        apiserver_ms: spent("kube-apiserver") - idle.apiserver_ms,
        etcd_ms: spent("etcd") - idle.etcd_ms,
        allocated_kib: allocated - idle.allocated_kib,
    };
    (out, cost)
}

/// Wait until no namespace is being deleted (an earlier run's thousands of objects being
/// collected would be timed with this run's writes).
async fn quiet() {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(support::client().await);
    support::eventually("no namespace being deleted", Duration::from_secs(600), || async {
        let list = namespaces.list(&Default::default()).await.map_err(|e| e.to_string())?;
        let terminating: Vec<String> = list
            .items
            .iter()
            .filter(|n| n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating"))
            .map(|n| n.name_any())
            .collect();
        if terminating.is_empty() { Ok(()) } else { Err(format!("still being deleted: {terminating:?}")) }
    })
    .await;
}

/// What the API server and etcd spend while nothing is written.
async fn idle(client: &Client) -> Idle {
    let first = allocated_kib(client).await;
    let scrape_kib = allocated_kib(client).await - first;
    let t = Instant::now();
    let ((), cost) =
        cost_of(client, Idle { scrape_kib, ..Idle::default() }, tokio::time::sleep(Duration::from_secs(10))).await;
    Idle { per_second: cost.scaled(1.0 / t.elapsed().as_secs_f64()), scrape_kib }
}

#[tokio::test]
#[ignore = "a benchmark: `make bench` runs it"]
async fn status_write_cost() {
    let k = env_usize("MW_BENCH_STATUS_K", 300);
    let rounds = env_usize("MW_BENCH_STATUS_ROUNDS", 5);
    let only: Option<Vec<String>> =
        std::env::var("MW_BENCH_STATUS_ONLY").ok().map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let chosen: Vec<Variant> =
        variants().into_iter().filter(|v| only.as_ref().is_none_or(|o| o.iter().any(|n| n == v.name))).collect();
    quiet().await;
    let ns = TestNamespace::new("status").await;
    let client = ns.client.clone();

    // kube-controller-manager's own status of a one-replica Deployment, once it is available.
    let deployments: Api<Deployment> = ns.api();
    let reference = plain_deployment(&workload(&ns.name, "reference"));
    deployments.create(&PostParams::default(), &reference).await.expect("creating the reference Deployment");
    let available = support::wait_until(
        &deployments,
        "reference",
        "the reference Deployment available",
        Duration::from_secs(120),
        |d| {
            d.and_then(|d| d.status.as_ref())
                .is_some_and(|s| s.available_replicas == Some(1) && s.conditions.iter().flatten().count() >= 2)
        },
    )
    .await
    .and_then(|d| d.status)
    .expect("the reference Deployment's status");
    let kcm = kcm_statuses(&available);
    // From here on nothing but this benchmark writes: no controller reacts to the objects.
    let stopped = Stopped::stop(KCM);

    let mut trimmed = Vec::new();
    for crd in [Crd::NoDescriptions, Crd::LooseStatus, Crd::Bare, Crd::NoCel, Crd::GranularStatus] {
        if chosen.iter().any(|v| v.kind == Kind::Workload(crd)) {
            trimmed.push(TrimmedCrd::create(&client, crd).await);
        }
    }

    let mut runs = Vec::new();
    for variant in chosen {
        eprintln!("{}: creating {k} objects", variant.name);
        let resource = match variant.kind {
            Kind::Deployment => ApiResource::erase::<Deployment>(&()),
            Kind::Workload(crd) => crd.resource(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &resource);
        let names: Vec<String> = (0..k).map(|i| format!("{}-{i}", variant.name)).collect();
        let targets: Vec<Target> = futures::stream::iter(names)
            .map(|name| {
                let (api, resource, ns, kcm) = (api.clone(), resource.clone(), ns.name.clone(), &kcm);
                let variant = &variant;
                async move {
                    let mut mw = workload(&ns, &name);
                    let (body, statuses) = match variant.kind {
                        Kind::Deployment => {
                            let mut d = serde_json::to_value(plain_deployment(&mw)).expect("JSON");
                            d["apiVersion"] = json!("apps/v1");
                            d["kind"] = json!("Deployment");
                            (d, kcm.clone().map(|s| json!(s)))
                        }
                        Kind::Workload(_) => {
                            let body = json!({"apiVersion": resource.api_version, "kind": "ManagedWorkload",
                                              "metadata": {"name": name}, "spec": spec()});
                            let statuses = operator_statuses(&mw, kcm).map(|s| json!(shaped(variant.shape, &s)));
                            (body, statuses)
                        }
                    };
                    let created = api
                        .patch(&name, &PatchParams::apply("bench"), &Patch::Apply(&body))
                        .await
                        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
                    mw.metadata.uid = created.uid();
                    let last = serde_json::to_value(created).expect("JSON");
                    Target { name, statuses, last, workload: mw }
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        let mut run = Run { variant, api, targets, rounds: Vec::new(), order: runs.len() };
        // The first status, as the operator's `Creating`; not timed.
        run.write_all(&client, 0).await;
        if run.variant.no_managed_fields {
            for t in &run.targets {
                let clear = json!({"metadata": {"managedFields": [{}]}});
                run.api
                    .patch(&t.name, &PatchParams::default(), &Patch::Merge(clear))
                    .await
                    .expect("clearing managedFields");
            }
        }
        runs.push(run);
    }

    let idle_before = idle(&client).await;
    eprintln!("timing {rounds} rounds of writes");
    for round in 0..rounds {
        // Each round starts one variant later, so none is always timed right after another.
        let n = runs.len();
        runs.rotate_left(usize::from(n > 0));
        for run in &mut runs {
            let which = (round + 1) % 2;
            let ((), cost) = cost_of(&client, idle_before, run.write_all(&client, which)).await;
            run.rounds.push(cost.scaled(1.0 / run.targets.len().max(1) as f64));
        }
    }
    let idle_after = idle(&client).await;
    runs.sort_by_key(|r| r.order);

    let mut table = format!(
        "\n## Status writes ({k} objects per variant, {rounds} rounds, {IN_FLIGHT} in flight)\n\n\
         | variant | what is written | object bytes (without managedFields) | status bytes | kube-apiserver CPU per write, mean (rounds' range) | its allocations per write | etcd CPU per write |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for run in &runs {
        let url = match run.variant.kind {
            Kind::Deployment => Deployment::url_path(&(), Some(&ns.name)),
            Kind::Workload(crd) => DynamicObject::url_path(&crd.resource(), Some(&ns.name)),
        };
        let (whole, bare, status) = sizes(&client, &url, &run.targets[0].name).await;
        // The mean, not the median: the API server's garbage collection comes in cycles a round
        // may or may not catch, and it is part of what the writes cost.
        let mean = |f: fn(&Cost) -> f64| run.rounds.iter().map(f).sum::<f64>() / run.rounds.len().max(1) as f64;
        let (lo, hi) = run
            .rounds
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(r.apiserver_ms), hi.max(r.apiserver_ms)));
        table.push_str(&format!(
            "| {} | {} | {whole} ({bare}) | {status} | {:.2} ms ({lo:.2}–{hi:.2}) | {:.0} KiB | {:.2} ms |\n",
            run.variant.name,
            run.variant.what,
            mean(|r| r.apiserver_ms),
            mean(|r| r.allocated_kib),
            mean(|r| r.etcd_ms),
        ));
    }
    table.push_str(&format!(
        "\nIdle, subtracted: kube-apiserver {:.1} and {:.1} ms/s, {:.0} and {:.0} KiB/s; etcd {:.1} and {:.1} ms/s (before and after).\n",
        idle_before.per_second.apiserver_ms,
        idle_after.per_second.apiserver_ms,
        idle_before.per_second.allocated_kib,
        idle_after.per_second.allocated_kib,
        idle_before.per_second.etcd_ms,
        idle_after.per_second.etcd_ms,
    ));
    stopped.start();
    drop(trimmed);

    let dir = std::path::Path::new("target/bench");
    std::fs::create_dir_all(dir).expect("target/bench");
    std::fs::write(dir.join("status.md"), &table).expect("writing status.md");
    println!("{table}");
}
