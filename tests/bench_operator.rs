//! The operator at scale against the control plane's own floor, for `make bench` (ignored by
//! `make test`). For each N in MW_BENCH_SIZES (default "100,1000"):
//! - floor: for N workloads, the objects the operator would make (the Deployment, and its
//!   ClusterIP Service unless MW_BENCH_SERVICE=0), server-side applied at once by a plain
//!   client, as the workloads themselves are; time until every Deployment is Available;
//! - operator: N ManagedWorkloads applied at once, each with a port and a ClusterIP Service
//!   (MW_BENCH_SERVICE=0: without); time until all are Ready; its API writes (from the audit
//!   log, by resource), CPU seconds and memory.
//!
//! Between the two, with the operator stopped, the same N ManagedWorkloads under the ideal
//! controller (`bench_operator/ideal.rs`: the writes the contract needs, made by the bench) and
//! under the controller-runtime peer (`bench_operator/peer.rs`: hack/peer, the contract written
//! as most Go operators are; the binary in MW_BENCH_PEER, no run without it).
//! MW_BENCH_ROUNDS (default 1) runs these three that many times at each size, every other
//! round in the reverse order, and compares their medians.
//!
//! MW_BENCH_VOLUME_EACH=1 gives every workload (and its floor) a volume as well.
//! MW_BENCH_FLOOR=0 skips the floor of each size (no ratio then): with a volume each, the
//! control plane's volume binder takes most of an hour over the floor's claims at N = 5,000,
//! and the operator's memory slope does not need them.
//!
//! Then, on the last N: 60 s of steady state, MW_BENCH_STOPS (default 1,000, at most N / 2)
//! stops against the same flips on the floor's Deployments and on the ideal controller (p50/p99),
//! and an operator restart. Last, MW_BENCH_VOLUMES (default
//! 100) more workloads with a volume each, against their floor (the same Deployments, Services
//! and claims applied directly): their writes and the memory each adds. The operator is the
//! one `make bench` started (its PID file in MW_BENCH_OPERATOR_PIDFILE). Figures go to
//! target/bench/operator-$MW_BENCH_LABEL.json and are printed as Markdown.

#[path = "bench_operator/ideal.rs"]
mod ideal;
#[path = "bench_operator/peer.rs"]
mod peer;
#[path = "bench_operator/profile.rs"]
mod profile;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use mw_operator::names::MANAGED_LABEL;
use mw_operator::operator::{claims, deployment, service};
use mw_operator::resource::{ManagedWorkload, ManagedWorkloadSpec, Phase};
use serde_json::{Value, json};
use support::TestNamespace;
use support::procfs::{cpu_seconds, memory_kib, percentile};
use support::storage::Storage;
use support::workload::condition_current;

const IN_FLIGHT: usize = 32;

/// How many stops the flips measure: MW_BENCH_STOPS (default 1,000), at most half the last N
/// (the other half is the ideal controller's stops). A p99 of 1,000 is the tenth slowest, so
/// one slow stop does not decide it.
fn stop_count(n: usize) -> usize {
    let wanted = std::env::var("MW_BENCH_STOPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    wanted.min(n / 2).max(1)
}

fn operator_pid() -> u32 {
    let file = std::env::var("MW_BENCH_OPERATOR_PIDFILE").expect("MW_BENCH_OPERATOR_PIDFILE");
    std::fs::read_to_string(&file).expect("the operator's PID file").trim().parse().expect("a PID")
}

/// The operator's API user.
fn operator_user() -> String {
    std::env::var("MW_TEST_OPERATOR_USER").unwrap_or_else(|_| "mw-operator".into())
}

/// The operator's writes in `namespace`, by "verb resource[/subresource]".
fn writes(namespace: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for w in support::audit::writes_by(&operator_user(), namespace) {
        *counts.entry(format!("{} {}", w.verb, w.path())).or_insert(0) += 1;
    }
    counts
}

fn total(counts: &BTreeMap<String, usize>) -> usize {
    counts.values().sum()
}

/// Workload `i`: a port and a ClusterIP Service, as a Manager container with an http service
/// has (unless MW_BENCH_SERVICE=0), so the figures include what a Service costs (the goal: its
/// one apply per workload, nothing more, and still under 16 KiB per additional workload).
fn spec(i: usize) -> Value {
    let mut spec = json!({"image": "nginx:latest", "env": [{"name": "ID", "value": i.to_string()}],
           "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}});
    if with_service() {
        spec["ports"] = json!([{"containerPort": 80, "name": "http"}]);
        spec["service"] = json!({"type": "ClusterIP"});
    }
    spec
}

fn with_service() -> bool {
    std::env::var("MW_BENCH_SERVICE").map(|v| v != "0").unwrap_or(true)
}

/// The objects the operator would make for workload `name` with `spec` (its Deployment, its
/// Service and its claims), as a plain client would apply them: no owner, no operator
/// annotations on the objects themselves.
fn floor_objects(
    namespace: &str,
    name: &str,
    spec: Value,
) -> (Deployment, Option<Service>, Vec<PersistentVolumeClaim>) {
    let spec: ManagedWorkloadSpec = serde_json::from_value(spec).expect("a valid spec");
    let mut mw = ManagedWorkload::new(name, spec);
    mw.metadata.namespace = Some(namespace.into());
    mw.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    let mut d = deployment::deployment(&mw, &Default::default()).expect("a desired Deployment");
    let spec = d.spec.as_mut().expect("a Deployment spec");
    unmanaged(&mut spec.selector.match_labels);
    unmanaged(&mut spec.template.metadata.get_or_insert_default().labels);
    let mut service = service::service(&mw);
    if let Some(spec) = service.as_mut().and_then(|s| s.spec.as_mut()) {
        unmanaged(&mut spec.selector);
    }
    let mut claims: Vec<_> = mw.spec.volumes.iter().filter_map(|v| claims::claim(&mw, v, None, false)).collect();
    plain(&mut d.metadata);
    service.iter_mut().for_each(|s| plain(&mut s.metadata));
    claims.iter_mut().for_each(|c| plain(&mut c.metadata));
    (d, service, claims)
}

/// No owner and no operator annotations; and not the operator's label either: the operator's
/// label-selected caches would hold the floor's objects, and its memory and CPU would count
/// them.
fn plain(meta: &mut ObjectMeta) {
    meta.owner_references = None;
    meta.annotations = None;
    unmanaged(&mut meta.labels);
}

fn unmanaged(labels: &mut Option<BTreeMap<String, String>>) {
    if let Some(labels) = labels.as_mut()
        && labels.remove(MANAGED_LABEL).is_some()
    {
        labels.insert(FLOOR_LABEL.into(), "true".into());
    }
}

/// Takes the place of the operator's managed label on the floor's objects (about as long, so
/// the objects are about the same size).
const FLOOR_LABEL: &str = "opensource-server.mieweb.org/benchmark";

/// Run `f` over 0..n with IN_FLIGHT at once.
async fn each<F, Fut>(n: usize, f: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::stream::iter(0..n).map(f).buffer_unordered(IN_FLIGHT).collect::<Vec<()>>().await;
}

/// The floor: for each of `n` workloads `{prefix}{i}` with `spec(i)`, the objects the operator
/// would make, server-side applied by a plain client (IN_FLIGHT workloads at once; claims,
/// Service, Deployment in the operator's order), as the workloads themselves are applied; the
/// seconds from the first apply until every Deployment was Available.
async fn floor(ns: &TestNamespace, n: usize, prefix: &str, spec: impl Fn(usize) -> Value) -> f64 {
    let deployments = ns.api::<Deployment>();
    let watch = tokio::spawn(until_all(deployments.clone(), n, deployment_available));
    let (services, claims) = (ns.api::<Service>(), ns.api::<PersistentVolumeClaim>());
    let t = Instant::now();
    each(n, |i| {
        let (deployments, services, claims) = (deployments.clone(), services.clone(), claims.clone());
        let name = format!("{prefix}{i}");
        let (d, service, owned_claims) = floor_objects(&ns.name, &name, spec(i));
        async move {
            let params = PatchParams::apply("bench");
            for c in owned_claims {
                claims.patch(&c.name_any(), &params, &Patch::Apply(&c)).await.expect("applying a claim");
            }
            if let Some(s) = service {
                services.patch(&s.name_any(), &params, &Patch::Apply(&s)).await.expect("applying a Service");
            }
            deployments.patch(&name, &params, &Patch::Apply(&d)).await.expect("applying a Deployment");
        }
    })
    .await;
    let ready = watch.await.expect("the floor watch");
    ready.values().max().map(|last| last.duration_since(t).as_secs_f64()).unwrap_or(0.0)
}

/// Watch `api` until `done(obj)` holds for `n` distinct objects; the instant each first did.
async fn until_all<K>(api: Api<K>, n: usize, done: impl Fn(&K) -> bool) -> HashMap<String, Instant>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let mut seen = HashMap::new();
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
    while seen.len() < n {
        let event = tokio::time::timeout_at(deadline, stream.try_next()).await.expect("convergence within an hour");
        if let Ok(Some(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) = event
            && done(&obj)
        {
            seen.entry(obj.name_any()).or_insert_with(Instant::now);
        }
    }
    seen
}

fn deployment_available(d: &Deployment) -> bool {
    let (Some(spec), Some(status)) = (&d.spec, &d.status) else { return false };
    let want = spec.replicas.unwrap_or(1);
    status.observed_generation >= d.metadata.generation
        && status.available_replicas.unwrap_or(0) == want
        && status.updated_replicas.unwrap_or(0) == want
        && status.replicas.unwrap_or(0) == want
}

/// Delete a namespace and wait until it is gone, so its Pods and garbage collection do not
/// overlap the next measurement.
async fn gone(ns: TestNamespace) {
    let (client, name) = (ns.client.clone(), ns.name.clone());
    drop(ns);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let deadline = Instant::now() + Duration::from_secs(900);
    while namespaces.get_opt(&name).await.ok().flatten().is_some() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

struct Run {
    floor_s: f64,
    /// The ideal controller's runs (`ideal.rs`), one a round, when there were any.
    ideal: Vec<IdealRun>,
    /// The controller-runtime peer's runs (`peer.rs`), one a round, when there were any
    /// (MW_BENCH_PEER).
    peer: Vec<peer::PeerRun>,
    /// The operator's runs, one a round; the last one's namespace is kept.
    operator: Vec<OperatorRun>,
    /// CPU seconds each control-plane component spent on the floor's run.
    floor_cpu: BTreeMap<String, f64>,
}

struct IdealRun {
    seconds: f64,
    /// Its writes beside the user's applies, by "verb resource[/subresource]".
    writes: BTreeMap<String, usize>,
    cpu: BTreeMap<String, f64>,
    /// What kube-controller-manager, kube-scheduler and kwok wrote meanwhile in its namespace.
    control_plane_writes: usize,
}

struct OperatorRun {
    seconds: f64,
    /// Its writes, by "verb resource[/subresource]".
    writes: BTreeMap<String, usize>,
    /// CPU seconds each process spent (the operator's as `operator`).
    cpu: BTreeMap<String, f64>,
    control_plane_writes: usize,
    /// The operator's own CPU seconds and its RSS afterwards.
    cpu_s: f64,
    rss_kib: f64,
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// MW_BENCH_ROUNDS (default 1): how many times the ideal controller, the peer and the
/// operator each run at every size. At N = 5,000 two runs of the operator have differed by
/// 6.5%, so one run each cannot settle a goal of 10%; the figures compared are the medians.
fn rounds() -> usize {
    std::env::var("MW_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1)
}

/// The API user the bench's own requests are made as (the admin kubeconfig's).
const BENCH_USER: &str = "mw-admin";

/// MW_BENCH_IDEAL=0 skips the ideal controller's run. It makes no claims, so a volume each
/// (MW_BENCH_VOLUME_EACH) skips it too.
fn with_ideal() -> bool {
    std::env::var("MW_BENCH_IDEAL").map(|v| v != "0").unwrap_or(true) && !volume_each()
}

/// Runs the shell command in environment variable `var` (set by hack/bench.sh), if set.
fn operator_command(var: &str) {
    let Ok(cmd) = std::env::var(var) else { return };
    let status = std::process::Command::new("bash").arg("-c").arg(&cmd).status().expect("running a command");
    assert!(status.success(), "{var} ({cmd}) failed");
}

/// Waits until the control plane has finished with what came before (a namespace deleted,
/// its garbage collected, caches catching up): its processes together under a quarter of a
/// core over 5 s, at most 3 minutes. A run that starts in another's aftermath pays for it.
async fn settle(before_what: &str) {
    const WINDOW: Duration = Duration::from_secs(5);
    let start = Instant::now();
    let busy = || support::controlplane::components_cpu().values().sum::<f64>();
    let mut before = busy();
    let mut rate = 0.0;
    while start.elapsed() < Duration::from_secs(180) {
        tokio::time::sleep(WINDOW).await;
        let now = busy();
        rate = (now - before) / WINDOW.as_secs_f64();
        if rate < 0.25 {
            break;
        }
        before = now;
    }
    println!(
        "settled for {:.0} s before {before_what} (control plane at {rate:.2} cores)",
        start.elapsed().as_secs_f64()
    );
}

/// Waits until the operator has done what a start makes it do (list, look at every workload
/// once): its CPU idle for a second, at most a minute.
async fn operator_idle() {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut before = cpu_seconds(operator_pid());
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cpu_seconds(operator_pid());
        if now - before < 0.02 {
            return;
        }
        before = now;
    }
}

/// The contract's floor for `n` workloads: the same workloads applied the same way, and their
/// writes made by the bench's ideal controller. The operator is stopped meanwhile (it watches
/// every namespace) and started again, ready, once the namespace is gone.
async fn ideal_run(n: usize, spec: impl Fn(usize) -> Value) -> IdealRun {
    operator_command("MW_BENCH_STOP_CMD");
    settle(&format!("the ideal controller's run of {n}")).await;
    let ns = TestNamespace::new(&format!("ideal-{n}")).await;
    let bodies = (0..n).map(|i| ideal::bodies(&ns.name, &format!("w{i}"), spec(i))).collect();
    let (seconds, cpu) = components_cpu_of("ideal", n, ideal::run(&ns, bodies)).await;
    let mut writes = BTreeMap::new();
    for w in support::audit::writes_by(BENCH_USER, &ns.name) {
        if w.path() != "managedworkloads" {
            *writes.entry(format!("{} {}", w.verb, w.path())).or_insert(0) += 1;
        }
    }
    let control_plane_writes = support::audit::control_plane_writes(&ns.name);
    gone(ns).await;
    operator_command("MW_BENCH_RESTART_CMD");
    operator_idle().await;
    IdealRun { seconds, writes, cpu, control_plane_writes }
}

/// "kube-apiserver 20.1 → 24.0 → 27.4 s, ..., total 41.0 → 47.2 → 55.2 s": each process's
/// CPU seconds in each run, in order (a process absent from a run shows "—" there).
fn cpu_by_component(runs: &[&BTreeMap<String, f64>]) -> String {
    let names: std::collections::BTreeSet<&String> = runs.iter().flat_map(|r| r.keys()).collect();
    let cell = |m: &BTreeMap<String, f64>, name: &str| m.get(name).map_or("—".to_string(), |s| format!("{s:.1}"));
    let row = |label: &str, cells: Vec<String>| format!("{label} {} s", cells.join(" → "));
    let mut parts: Vec<String> =
        names.iter().map(|name| row(name, runs.iter().map(|r| cell(r, name)).collect())).collect();
    parts.push(row("total", runs.iter().map(|r| format!("{:.1}", r.values().sum::<f64>())).collect()));
    parts.join(", ")
}

/// What `during`, `contender`'s run of `n` workloads, cost each control-plane component, in
/// CPU seconds. The bench's own process counts too: it is the ideal controller in that run,
/// and runs the timing watch in every run. With MW_BENCH_PROFILE, the API server's profile of
/// the run too (`profile.rs`).
async fn components_cpu_of<T>(
    contender: &str,
    n: usize,
    during: impl std::future::Future<Output = T>,
) -> (T, BTreeMap<String, f64>) {
    let profiling = profile::start(contender, n).await;
    let cpu = || {
        let mut cpu = support::controlplane::components_cpu();
        cpu.insert("bench".into(), cpu_seconds(std::process::id()));
        cpu
    };
    let before = cpu();
    let out = during.await;
    let spent = cpu()
        .into_iter()
        .filter_map(|(name, s)| Some((name.clone(), s - before.get(&name)?)))
        .filter(|(_, s)| *s > 0.0)
        .collect();
    if let Some(profiling) = profiling {
        profiling.finish().await;
    }
    (out, spent)
}

/// Workload `i`'s spec, with a volume of `storage`'s class when there is one.
fn spec_with(storage: Option<&Storage>) -> impl Fn(usize) -> Value {
    move |i| match storage {
        Some(storage) => with_volume(i, &storage.class),
        None => spec(i),
    }
}

/// MW_BENCH_VOLUME_EACH=1: every workload of every size has a volume too (a claim bound at
/// once), as every bridged Manager container has, and its floor the same claims.
fn volume_each() -> bool {
    std::env::var("MW_BENCH_VOLUME_EACH").is_ok_and(|v| v == "1")
}

/// MW_BENCH_FLOOR=0: the operator alone at each size, no floor to compare with.
fn with_floor() -> bool {
    std::env::var("MW_BENCH_FLOOR").map(|v| v != "0").unwrap_or(true)
}

/// `n` workloads against their floor; the storage their claims are bound to, if they have
/// volumes (MW_BENCH_VOLUME_EACH), lives as long as their namespace is kept.
///
/// With more than one round (MW_BENCH_ROUNDS), every other round runs its contenders in the
/// reverse order, ending with the operator's last round (its namespace is kept for what
/// follows): over two rounds, operator, peer, ideal, ideal, peer, operator, so a control plane
/// that slows or speeds up as the runs go on favours none of them.
async fn converge(n: usize) -> (Run, TestNamespace, Option<Storage>) {
    // Floor: the same objects, applied directly.
    let mut floor_s = 0.0;
    let mut floor_cpu = BTreeMap::new();
    if with_floor() {
        let floor_ns = TestNamespace::new(&format!("floor-{n}")).await;
        let floor_storage = if volume_each() { Some(Storage::new(&floor_ns, n, "1Gi").await) } else { None };
        (floor_s, floor_cpu) =
            components_cpu_of("plain", n, floor(&floor_ns, n, "w", spec_with(floor_storage.as_ref()))).await;
        gone(floor_ns).await;
        drop(floor_storage);
    }
    let mut run = Run { floor_s, ideal: Vec::new(), peer: Vec::new(), operator: Vec::new(), floor_cpu };
    let rounds = rounds();
    for round in 0..rounds - 1 {
        let reversed = (rounds - 1 - round) % 2 == 1;
        if reversed {
            operator_round(n, &mut run).await;
        }
        others(n, reversed, &mut run).await;
        if !reversed {
            operator_round(n, &mut run).await;
        }
    }
    others(n, false, &mut run).await;
    let (operator, ns, storage) = operator_run(n).await;
    run.operator.push(operator);
    (run, ns, storage)
}

/// The ideal controller's run and the peer's, in this order or `reversed`.
async fn others(n: usize, reversed: bool, run: &mut Run) {
    // The peer makes no claims either.
    let binary = peer::binary().filter(|_| !volume_each());
    if reversed && let Some(binary) = &binary {
        run.peer.push(peer::run(n, binary, spec).await);
    }
    if with_ideal() {
        run.ideal.push(ideal_run(n, spec).await);
    }
    if !reversed && let Some(binary) = &binary {
        run.peer.push(peer::run(n, binary, spec).await);
    }
}

/// An operator's run of a round before the last: its namespace is deleted afterwards.
async fn operator_round(n: usize, run: &mut Run) {
    let (operator, ns, storage) = operator_run(n).await;
    run.operator.push(operator);
    gone(ns).await;
    drop(storage);
}

/// The operator's run of `n` workloads, in a namespace of its own, which it returns.
async fn operator_run(n: usize) -> (OperatorRun, TestNamespace, Option<Storage>) {
    let pid = operator_pid();
    settle(&format!("the operator's run of {n}")).await;
    let ns = TestNamespace::new(&format!("operator-{n}")).await;
    let storage = if volume_each() { Some(Storage::new(&ns, n, "1Gi").await) } else { None };
    let cpu0 = cpu_seconds(pid);
    let (seconds, cpu) =
        components_cpu_of("operator", n, apply_until_ready(&ns.api(), n, "w", spec_with(storage.as_ref()))).await;
    // Let trailing writes (the last status, Events) land before counting.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let run = OperatorRun {
        seconds,
        writes: writes(&ns.name),
        cpu,
        control_plane_writes: support::audit::control_plane_writes(&ns.name),
        cpu_s: cpu_seconds(pid) - cpu0,
        rss_kib: memory_kib(pid).0,
    };
    (run, ns, storage)
}

struct VolumeRun {
    floor_s: f64,
    operator_s: f64,
    writes: BTreeMap<String, usize>,
    rss_before_kib: f64,
    rss_kib: f64,
}

/// Workload `i` with one ReadWriteOnce volume of `class`.
fn with_volume(i: usize, class: &str) -> Value {
    let mut spec = spec(i);
    spec["volumes"] = json!([{"name": "data", "mountPath": "/data", "size": "1Gi", "storageClassName": class}]);
    spec
}

/// `n` workloads with one ReadWriteOnce volume each, applied at once beside those already
/// there, until all are Ready (their claims bound to the volumes `Storage` provides); and the
/// floor: the same Deployments, Services and claims applied directly, on volumes of their own.
async fn converge_with_volumes(n: usize, pid: u32) -> (VolumeRun, Storage, TestNamespace) {
    let floor_ns = TestNamespace::new(&format!("floor-volumes-{n}")).await;
    let floor_storage = Storage::new(&floor_ns, n, "1Gi").await;
    let floor_s = floor(&floor_ns, n, "v", |i| with_volume(i, &floor_storage.class)).await;
    gone(floor_ns).await;
    drop(floor_storage);

    let ns = TestNamespace::new(&format!("operator-volumes-{n}")).await;
    let storage = Storage::new(&ns, n, "1Gi").await;
    let rss_before_kib = memory_kib(pid).0;
    let operator_s = apply_until_ready(&ns.api(), n, "v", |i| with_volume(i, &storage.class)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let run = VolumeRun { floor_s, operator_s, writes: writes(&ns.name), rss_before_kib, rss_kib: memory_kib(pid).0 };
    (run, storage, ns)
}

/// Apply `n` ManagedWorkloads `{prefix}{i}` with `spec(i)`, IN_FLIGHT at once, and wait until
/// each is Ready and Running; the seconds from the first apply until the last was.
async fn apply_until_ready(
    workloads: &Api<ManagedWorkload>,
    n: usize,
    prefix: &str,
    spec: impl Fn(usize) -> Value,
) -> f64 {
    let watch = tokio::spawn(until_all(workloads.clone(), n, ready_and_running));
    let t = Instant::now();
    each(n, |i| {
        let api = workloads.clone();
        let name = format!("{prefix}{i}");
        let body = workload_body(&name, spec(i));
        async move {
            api.patch(&name, &PatchParams::apply("bench"), &Patch::Apply(&body)).await.expect("applying a CR");
        }
    })
    .await;
    let ready = watch.await.expect("the operator watch");
    ready.values().max().map(|last| last.duration_since(t).as_secs_f64()).unwrap_or(0.0)
}

/// Workload `name` with `spec` as the user applies it.
fn workload_body(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "opensource-server.mieweb.org/v1alpha1", "kind": "ManagedWorkload",
           "metadata": {"name": name}, "spec": spec})
}

fn ready_and_running(mw: &ManagedWorkload) -> bool {
    condition_current(mw, "Ready", "True") && mw.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running)
}

/// A user's stop: `spec.state` patched to Stopped.
fn stop_patch() -> Value {
    json!({"spec": {"state": "Stopped"}})
}

/// A stop is seen once the workload's status shows `Stopping` or `Stopped` at the generation
/// the stop made, its target in `targets`.
fn stopped_at(targets: HashMap<String, i64>) -> impl Fn(&ManagedWorkload, usize) -> bool + Send + Sync + 'static {
    move |mw, _| {
        let Some(&target) = targets.get(&mw.name_any()) else { return false };
        mw.metadata.generation >= Some(target)
            && mw.status.as_ref().is_some_and(|s| {
                s.observed_generation >= Some(target) && matches!(s.phase, Some(Phase::Stopping | Phase::Stopped))
            })
    }
}

/// Each flip in the order they were made: when it was made (seconds after the first) and how
/// long it took to be seen done. Kept in order so that a stall shared by neighbouring flips
/// shows in the figures; `took` gives the times sorted, for percentiles.
struct Flips(Vec<(f64, f64)>);

impl Flips {
    fn took(&self) -> Vec<f64> {
        let mut took: Vec<f64> = self.0.iter().map(|(_, took)| *took).collect();
        took.sort_by(f64::total_cmp);
        took
    }

    fn json(&self) -> Value {
        json!(self.0.iter().map(|(at, took)| json!({"at_s": at, "took_s": took})).collect::<Vec<_>>())
    }
}

/// Flip each of `names` one by one, 50 ms apart; latency from each flip to `done`.
async fn flips<K, P, D>(api: Api<K>, names: Vec<String>, patch: P, done: D) -> Flips
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
    P: Fn(usize) -> Value,
    D: Fn(&K, usize) -> bool + Send + Sync + 'static,
{
    let flipped: Arc<Mutex<HashMap<String, (usize, Instant)>>> = Arc::default();
    let done_in: Arc<Mutex<Vec<Option<f64>>>> = Arc::new(Mutex::new(vec![None; names.len()]));
    let (f2, d2) = (flipped.clone(), done_in.clone());
    let watch_api = api.clone();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(watch_api, watcher::Config::default()));
        while let Some(Ok(event)) = stream.next().await {
            if let watcher::Event::Apply(obj) = event {
                let mut f = f2.lock().unwrap();
                if let Some((k, at)) = f.get(&obj.name_any()).copied()
                    && done(&obj, k)
                {
                    d2.lock().unwrap()[k] = Some(at.elapsed().as_secs_f64());
                    f.remove(&obj.name_any());
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await; // the watch has listed
    let first = Instant::now();
    let mut made = Vec::with_capacity(names.len());
    for (k, name) in names.iter().enumerate() {
        made.push(first.elapsed().as_secs_f64());
        flipped.lock().unwrap().insert(name.clone(), (k, Instant::now()));
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch(k))).await.expect("a flip");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while !flipped.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    task.abort();
    let done_in = done_in.lock().unwrap().clone();
    // A flip never seen done (past the deadline) is left out.
    Flips(made.into_iter().zip(done_in).filter_map(|(at, took)| Some((at, took?))).collect())
}

#[tokio::test]
#[ignore = "a benchmark: `make bench` runs it"]
async fn operator_against_the_floor() {
    let label = std::env::var("MW_BENCH_LABEL").unwrap_or_else(|_| "bench".into());
    let sizes: Vec<usize> = std::env::var("MW_BENCH_SIZES")
        .unwrap_or_else(|_| "100,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let with_flips = std::env::var("MW_BENCH_FLIPS").map(|v| v != "0").unwrap_or(true);
    let mut report = json!({"label": label, "sizes": {}});
    let mut table = format!(
        "\n## Operator ({label}{})\n\n| N | plain Deployments: all Available | ideal controller: all Ready | controller-runtime peer: all Ready | operator: all Ready | operator ÷ ideal | operator ÷ peer | operator ÷ plain | writes per workload | of which Deployment / Service / status / Events | operator CPU per 1000 | RSS after |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        match (with_service(), volume_each()) {
            (true, true) => ", each workload with a ClusterIP Service and a volume",
            (true, false) => ", each workload with a ClusterIP Service",
            (false, true) => ", each workload with a volume",
            (false, false) => "",
        }
    );
    let mut kept = Vec::new();
    let mut last_rss = None;
    let (mut cpu_lines, mut ideal_lines, mut peer_lines) = (String::new(), String::new(), String::new());
    let mut round_lines = String::new();
    for &n in &sizes {
        let (run, ns, storage) = converge(n).await;
        let last = run.operator.last().expect("the operator's run");
        let per = |pred: &dyn Fn(&str) -> bool| {
            last.writes.iter().filter(|(k, _)| pred(k)).map(|(_, v)| *v).sum::<usize>() as f64 / n as f64
        };
        let deploy = per(&|k| k.ends_with(" deployments"));
        let service = per(&|k| k.ends_with(" services"));
        let status = per(&|k| k.ends_with("managedworkloads/status"));
        let events = per(&|k| k.ends_with(" events"));
        let ideal_s = median(run.ideal.iter().map(|i| i.seconds));
        let peer_s = median(run.peer.iter().map(|p| p.seconds));
        let operator_s = median(run.operator.iter().map(|o| o.seconds));
        let seconds = |s: f64| if s > 0.0 { format!("{s:.1} s") } else { "—".into() };
        let ratio = |to: f64| if to > 0.0 { operator_s / to } else { 0.0 };
        let shown = |r: f64| if r > 0.0 { format!("{r:.2}") } else { "—".into() };
        table.push_str(&format!(
            "| {n} | {} | {} | {} | {operator_s:.1} s | **{}** | {} | {} | {:.2} | {deploy:.2} / {service:.2} / {status:.2} / {events:.2} | {:.1} s | {:.1} MiB |\n",
            seconds(run.floor_s),
            seconds(ideal_s),
            seconds(peer_s),
            shown(ratio(ideal_s)),
            shown(ratio(peer_s)),
            shown(ratio(run.floor_s)),
            total(&last.writes) as f64 / n as f64,
            last.cpu_s * 1000.0 / n as f64,
            last.rss_kib / 1024.0
        ));
        // Each run of each round: its time, the CPU it cost every process, and what the
        // control plane wrote for it.
        let cell = |seconds: f64, cpu: &BTreeMap<String, f64>, writes: usize| {
            format!("{seconds:.1} s, {:.0} CPU s, {:.2}", cpu.values().sum::<f64>(), writes as f64 / n as f64)
        };
        for round in 0..run.operator.len() {
            let ideal = run.ideal.get(round).map_or("—".into(), |i| cell(i.seconds, &i.cpu, i.control_plane_writes));
            let peer = run.peer.get(round).map_or("—".into(), |p| cell(p.seconds, &p.cpu, p.control_plane_writes));
            let o = &run.operator[round];
            let operator = cell(o.seconds, &o.cpu, o.control_plane_writes);
            // The round's own ratio: its two runs were close in time, so a machine that slows
            // or speeds up over the session moves both.
            let own = run.ideal.get(round).map_or("—".into(), |i| shown(o.seconds / i.seconds));
            round_lines.push_str(&format!("| {n} | {} | {ideal} | {peer} | {operator} | {own} |\n", round + 1));
        }
        // The earlier sizes' workloads are kept, so the RSS growth is n more workloads' worth.
        let per_workload_kib = last_rss.map(|rss: f64| (last.rss_kib - rss) / n as f64);
        let no_cpu = BTreeMap::new();
        let ideal_cpu = run.ideal.last().map_or(&no_cpu, |i| &i.cpu);
        let peer_cpu = run.peer.last().map_or(&no_cpu, |p| &p.cpu);
        report["sizes"][n.to_string()] = json!({
            "floor_s": run.floor_s, "ideal_s": ideal_s, "peer_s": peer_s, "operator_s": operator_s,
            "rounds": {
                "ideal_s": run.ideal.iter().map(|i| i.seconds).collect::<Vec<_>>(),
                "peer_s": run.peer.iter().map(|p| p.seconds).collect::<Vec<_>>(),
                "operator_s": run.operator.iter().map(|o| o.seconds).collect::<Vec<_>>(),
                "operator_to_ideal": run.operator.iter().zip(&run.ideal).map(|(o, i)| o.seconds / i.seconds).collect::<Vec<_>>(),
                "ideal_control_plane_writes": run.ideal.iter().map(|i| i.control_plane_writes).collect::<Vec<_>>(),
                "peer_control_plane_writes": run.peer.iter().map(|p| p.control_plane_writes).collect::<Vec<_>>(),
                "operator_control_plane_writes": run.operator.iter().map(|o| o.control_plane_writes).collect::<Vec<_>>(),
            },
            "ratio_to_ideal": ratio(ideal_s), "ratio_to_peer": ratio(peer_s), "ratio": ratio(run.floor_s),
            "writes": last.writes, "writes_per_workload": total(&last.writes) as f64 / n as f64,
            "ideal_writes": run.ideal.last().map(|i| &i.writes),
            "peer_writes": run.peer.last().map(|p| &p.writes),
            "peer_refused_writes": run.peer.last().map(|p| p.refused),
            "cpu_s": last.cpu_s, "rss_kib_after": last.rss_kib, "kib_per_additional_workload": per_workload_kib,
            "cpu_by_component": {"floor": run.floor_cpu, "ideal": ideal_cpu, "peer": peer_cpu, "operator": last.cpu},
        });
        let runs = [&run.floor_cpu, ideal_cpu, peer_cpu, &last.cpu];
        cpu_lines.push_str(&format!("| {n} | {} |\n", cpu_by_component(&runs)));
        let per_workload = |writes: &BTreeMap<String, usize>| {
            let writes: Vec<String> = writes.iter().map(|(k, v)| format!("{k} {:.2}", *v as f64 / n as f64)).collect();
            writes.join(", ")
        };
        if let Some(ideal) = run.ideal.last() {
            ideal_lines.push_str(&format!("| {n} | {} |\n", per_workload(&ideal.writes)));
        }
        if let Some(peer) = run.peer.last() {
            peer_lines.push_str(&format!(
                "| {n} | {} | {:.2} | {:.2} |\n",
                per_workload(&peer.writes),
                total(&peer.writes) as f64 / n as f64,
                peer.refused as f64 / n as f64
            ));
        }
        last_rss = Some(last.rss_kib);
        kept.push((ns, storage));
    }
    table.push_str(&format!(
        "\nEach run, round by round ({} round(s); the times above are each contender's median; every other round, counting back from the last, runs in the reverse order, so the last ends with the operator): seconds until all Ready, every process's CPU seconds, and the writes kube-controller-manager, kube-scheduler and kwok made per workload in its namespace (the same objects for every contender; how many status updates they take varies with timing):\n\n| N | round | ideal controller | controller-runtime peer | operator | operator ÷ ideal |\n|---|---|---|---|---|---|\n{round_lines}",
        rounds()
    ));
    table.push_str(&format!(
        "\nCPU seconds each process spent, plain Deployments → ideal controller → controller-runtime peer → operator, in the last round (bench: this benchmark's own process, the ideal controller in its run; peer: the peer's process):\n\n| N | CPU |\n|---|---|\n{cpu_lines}"
    ));
    if !ideal_lines.is_empty() {
        table.push_str(&format!(
            "\nThe ideal controller's writes per workload, beside the user's apply:\n\n| N | writes |\n|---|---|\n{ideal_lines}"
        ));
    }
    if !peer_lines.is_empty() {
        table.push_str(&format!(
            "\nThe controller-runtime peer's writes per workload (hack/peer), beside the user's apply; refused: those the API server answered with an error (a stale copy's conflict, a create of what exists):\n\n| N | writes | total | of which refused |\n|---|---|---|---|\n{peer_lines}"
        ));
    }
    let pid = operator_pid();
    let (_, hwm) = memory_kib(pid);
    report["peak_rss_kib"] = json!(hwm);
    table.push_str(&format!("\nOperator peak RSS: {:.1} MiB.\n", hwm / 1024.0));

    let (ns, _) = kept.last().expect("at least one size");
    let n = *sizes.last().unwrap();
    // The API server's own time over the operator's writes, beside kube-controller-manager's
    // of the same kinds: a gap is the operator's connection, not the API server.
    let median = |user: &str, verb: &str, resource: &str| {
        support::audit::median_write_seconds(user, &ns.name, verb, resource)
            .map_or_else(|| "—".to_string(), |s| format!("{:.0} ms", s * 1000.0))
    };
    let (operator, kcm) = (operator_user(), "system:kube-controller-manager");
    table.push_str(&format!(
        "API server time per write with {n} (median): the operator's status writes {}, its Events {}; kube-controller-manager's Deployment status writes {}, its Events {}.\n",
        median(&operator, "patch", "managedworkloads/status"),
        median(&operator, "create", "events"),
        median(kcm, "update", "deployments/status"),
        median(kcm, "create", "events"),
    ));
    // Steady state: 60 s with every workload Ready.
    let before = total(&writes(&ns.name));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let steady = total(&writes(&ns.name)) - before;
    report["steady_60s_writes"] = json!(steady);
    table.push_str(&format!("Steady state, 60 s with {n} Ready: {steady} writes.\n"));

    let stops = stop_count(n);
    if with_flips {
        // Flips: stop some workloads one by one; the floor scales as many plain Deployments to 0.
        let names: Vec<String> = (0..stops).map(|i| format!("w{i}")).collect();
        let writes_before = writes(&ns.name);
        let workloads = ns.api::<ManagedWorkload>();
        let targets: HashMap<String, i64> = {
            let list = workloads.list(&Default::default()).await.unwrap();
            list.items.iter().map(|mw| (mw.name_any(), mw.metadata.generation.unwrap_or(0) + 1)).collect()
        };
        let op = flips(workloads, names.clone(), |_| stop_patch(), stopped_at(targets)).await;
        let flip_writes = total(&writes(&ns.name)) - total(&writes_before);
        let floor_ns = TestNamespace::new("floor-flips").await;
        let deployments = floor_ns.api::<Deployment>();
        floor(&floor_ns, stops, "w", spec).await;
        let floor = flips(
            deployments,
            names,
            |_| json!({"spec": {"replicas": 0}}),
            |d: &Deployment, _| {
                let (Some(spec), Some(status)) = (&d.spec, &d.status) else { return false };
                spec.replicas == Some(0) && status.observed_generation >= d.metadata.generation
            },
        )
        .await;
        let (op_took, floor_took) = (op.took(), floor.took());
        let (p50, p99, f50, f99) = (
            percentile(&op_took, 50.0),
            percentile(&op_took, 99.0),
            percentile(&floor_took, 50.0),
            percentile(&floor_took, 99.0),
        );
        let seen = op_took.len();
        report["flips"] = json!({"count": seen, "p50_s": p50, "p99_s": p99, "floor_p50_s": f50, "floor_p99_s": f99,
                                  "writes_per_flip": flip_writes as f64 / seen.max(1) as f64,
                                  // Every stop, in the order made, so what the slowest waited on
                                  // can be read from them.
                                  "stops": op.json(), "floor_stops": floor.json()});
        table.push_str(&format!(
            "Flips ({seen} stops, 50 ms apart): flip → new phase at the new generation p50 {:.3} s, p99 {:.3} s; floor (plain Deployment scaled to 0, status observed) p50 {:.3} s, p99 {:.3} s; ratios {:.2} / {:.2}; {:.2} operator writes per flip.\n",
            p50, p99, f50, f99,
            if f50 > 0.0 { p50 / f50 } else { 0.0 },
            if f99 > 0.0 { p99 / f99 } else { 0.0 },
            flip_writes as f64 / seen.max(1) as f64
        ));
    }

    // Restart: the operator resyncs every workload and should write nothing.
    if std::env::var("MW_BENCH_RESTART_CMD").is_ok() {
        let before = total(&writes(&ns.name));
        operator_command("MW_BENCH_RESTART_CMD");
        tokio::time::sleep(Duration::from_secs(30)).await;
        let after = total(&writes(&ns.name)) - before;
        report["restart_30s_writes"] = json!(after);
        table.push_str(&format!("Operator restart, 30 s to resync {n}: {after} writes.\n"));
    }

    // The stops' own floor: the same stops of as many other workloads, with the writes a stop
    // needs made by the ideal controller (ideal.rs) while the operator is stopped. It counts
    // the user's patch of the workload too, which the plain Deployments' scale leaves out.
    // The operator, started again, then finishes those stops (their `Stopped`).
    let others: Vec<String> = (stops..2 * stops).filter(|i| *i < n).map(|i| format!("w{i}")).collect();
    if with_flips && with_ideal() && !others.is_empty() {
        operator_command("MW_BENCH_STOP_CMD");
        let stopped = ideal::stops(ns, others).await;
        operator_command("MW_BENCH_RESTART_CMD");
        operator_idle().await;
        let took = stopped.took();
        let (i50, i99) = (percentile(&took, 50.0), percentile(&took, 99.0));
        let op99 = report["flips"]["p99_s"].as_f64().unwrap_or(0.0);
        report["flips"]["ideal_p50_s"] = json!(i50);
        report["flips"]["ideal_p99_s"] = json!(i99);
        report["flips"]["ideal_stops"] = stopped.json();
        table.push_str(&format!(
            "Stops' contract floor ({} other workloads stopped by the ideal controller: the user's patch, then the Deployment's scale-down and the `Stopping` status from one watch, the `Stopped` status from another): p50 {i50:.3} s, p99 {i99:.3} s; the operator's p99 minus it: {:+.3} s (goal: at most +0.100 s).\n",
            took.len(),
            op99 - i99
        ));
    }

    // Volumes: more workloads, each with a claim the control plane binds to a volume of its
    // own; what each adds to memory and costs in writes. MW_BENCH_VOLUMES (default 100; 0 skips).
    let with_volumes: usize = std::env::var("MW_BENCH_VOLUMES").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    if with_volumes > 0 {
        let (run, storage, vns) = converge_with_volumes(with_volumes, pid).await;
        let claims =
            run.writes.iter().filter(|(k, _)| k.ends_with(" persistentvolumeclaims")).map(|(_, v)| v).sum::<usize>();
        let per_workload_kib = (run.rss_kib - run.rss_before_kib) / with_volumes as f64;
        report["volumes"] = json!({
            "n": with_volumes, "floor_s": run.floor_s, "operator_s": run.operator_s,
            "ratio": if run.floor_s > 0.0 { run.operator_s / run.floor_s } else { 0.0 }, "writes": run.writes,
            "writes_per_workload": total(&run.writes) as f64 / with_volumes as f64,
            "claim_writes_per_workload": claims as f64 / with_volumes as f64,
            "kib_per_additional_workload": per_workload_kib,
        });
        table.push_str(&format!(
            "With a volume each, {with_volumes} more workloads: all Ready (claims bound) in {:.1} s against {:.1} s for the floor (the same Deployments, Services and claims applied directly), ratio {:.2}; {:.2} writes per workload, of which {:.2} claim applies; {:.1} KiB more memory per workload.\n",
            run.operator_s,
            run.floor_s,
            if run.floor_s > 0.0 { run.operator_s / run.floor_s } else { 0.0 },
            total(&run.writes) as f64 / with_volumes as f64,
            claims as f64 / with_volumes as f64,
            per_workload_kib
        ));
        drop(vns);
        drop(storage);
    }

    let dir = std::path::Path::new("target/bench");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(format!("operator-{label}.json")), serde_json::to_string_pretty(&report).unwrap()).unwrap();
    std::fs::write(dir.join(format!("operator-{label}.md")), &table).unwrap();
    println!("{table}");
}
