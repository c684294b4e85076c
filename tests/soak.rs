//! `make soak` (hack/soak.sh): hours of a real install's life in half an hour. N workloads (a
//! third plain, a third with a port and a ClusterIP Service, a third with a disk) under two
//! leader-elected operators (release build); every minute a tenth of them change (image, env,
//! stop, start, or delete and re-create), the API server is restarted twice (SIGKILL, as a
//! crash) and the leader killed once (SIGKILL; a new standby takes its place, as a Deployment
//! would start one). It reports, from the API server's audit log and /proc:
//!
//! - every change reached its phase (Ready at the workload's generation), none stuck;
//! - Deployment writes per change (the goal: exactly one);
//! - the leader's RSS over the last two thirds of the run (the goal: flat within 5%);
//! - writes once everything has settled (the goal: none).
//!
//! A benchmark, `#[ignore]`d: figures are printed and written to target/soak/soak.md, never
//! asserted on wall time. It fails only on a wrong result: a change that never reached its
//! phase, or a write at rest.
//!
//! Its rate is what the control plane itself carries: `floor` (soak/floor.rs), run first by
//! `make soak` on a control plane of its own, finds the highest rate at which the same N
//! workloads as plain objects, with no operator, are all rolled out; the soak runs at that
//! rate (MW_SOAK_FLOOR names the floor's report) and prints the two side by side.
//!
//! MW_SOAK_N (5000) and MW_SOAK_MINUTES (30) set its size; without a floor's report,
//! MW_SOAK_CHANGE_PERCENT (10) sets the rate.

#[path = "soak/floor.rs"]
mod floor;
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use support::audit;
use support::controlplane::Stopped;
use support::operator::{Operator, free_address, service_account_kubeconfig};
use support::procfs::{memory_kib, percentile};
use support::storage::Storage;
use support::workload::condition_current;
use support::{TestNamespace, eventually};

const LEASE: &str = "mw-operator";
const IN_FLIGHT: usize = 32;
/// A change not carried out within this long after the run's end counts as stuck.
const STUCK_AFTER: Duration = Duration::from_secs(300);
/// How often the soak looks at its copy of the workloads (and samples the leader's memory).
const LOOK: Duration = Duration::from_millis(500);

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What a workload is made of: i % 3.
fn kind(i: usize) -> &'static str {
    ["plain", "service", "volume"][i % 3]
}

/// What the soak has asked of workload i so far.
#[derive(Clone, Copy, Default)]
struct Wanted {
    image: bool,
    revision: u32,
    stopped: bool,
}

fn image(w: &Wanted) -> &'static str {
    if w.image { "nginx:1.28" } else { "nginx:1.27" }
}

fn spec(i: usize, w: Wanted, class: &str) -> Value {
    let mut spec = json!({
        "image": image(&w),
        "env": [{"name": "REVISION", "value": w.revision.to_string()}],
        "state": if w.stopped { "Stopped" } else { "Running" },
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
    });
    match kind(i) {
        "service" => {
            spec["ports"] = json!([{"containerPort": 80, "name": "http"}]);
            spec["service"] = json!({"type": "ClusterIP"});
        }
        "volume" => {
            spec["volumes"] = json!([{"name": "data", "mountPath": "/data", "size": "1Gi", "storageClassName": class}]);
        }
        _ => {}
    }
    spec
}

fn body(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "opensource-server.mieweb.org/v1alpha1", "kind": "ManagedWorkload",
           "metadata": {"name": name}, "spec": spec})
}

/// Apply `body`, retrying through an API server outage; what the write made.
async fn apply<K: Resource + Clone + DeserializeOwned + Debug>(api: &Api<K>, name: &str, body: &Value) -> Written {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match api.patch(name, &PatchParams::apply("soak"), &Patch::Apply(body)).await {
            Ok(object) => return Written::of(&object),
            Err(e) => assert!(Instant::now() < deadline, "applying {name}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The object a change's write made: its UID and generation. The copy the soak looks at can
/// still hold the object from before (a re-created workload's predecessor, done, with the
/// same spec): only this object, at this generation or a later one, can show the change done.
#[derive(Clone, Debug)]
struct Written {
    uid: Option<String>,
    generation: Option<i64>,
}

impl Written {
    fn of<K: Resource>(object: &K) -> Written {
        Written { uid: object.meta().uid.clone(), generation: object.meta().generation }
    }

    fn shows<K: Resource>(&self, object: &K) -> bool {
        object.meta().uid == self.uid && object.meta().generation >= self.generation
    }
}

#[test]
fn a_change_shows_only_on_the_object_its_write_made() {
    let object = |uid: &str, generation| {
        let mut d = k8s_openapi::api::apps::v1::Deployment::default();
        d.metadata.uid = Some(uid.into());
        d.metadata.generation = Some(generation);
        d
    };
    let written = Written::of(&object("new", 2));
    assert!(written.shows(&object("new", 2)));
    assert!(written.shows(&object("new", 3)), "a later generation carries it too");
    assert!(!written.shows(&object("new", 1)), "the copy from before the write");
    assert!(!written.shows(&object("old", 5)), "a re-created workload's predecessor");
}

/// Delete `name` (gone already counts), retrying through an API server outage.
async fn delete<K: Clone + DeserializeOwned + Debug>(api: &Api<K>, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 404 => return,
            Err(e) => assert!(Instant::now() < deadline, "deleting {name}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A copy of every object of `api`'s kind, kept current by one watch (which rides out API
/// server restarts), so seeing what is done costs the API server nothing per look. The watch
/// runs until the test ends.
fn mirror<K>(api: Api<K>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let watch = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
    tokio::spawn(watch.for_each(|_| async {}));
    store
}

/// Ready at its generation and in the phase asked for.
fn settled(mw: &ManagedWorkload, w: &Wanted) -> bool {
    let phase = if w.stopped { Phase::Stopped } else { Phase::Running };
    condition_current(mw, "Ready", "True") && mw.status.as_ref().and_then(|s| s.phase) == Some(phase)
}

/// Where a change not carried out waits: on the operator (no status, or one behind the
/// workload's generation), or past it, on the rollout (the Deployment controller, the
/// scheduler, the node), with the phase and Ready reason the operator reports.
fn waiting_on(mw: Option<&ManagedWorkload>) -> String {
    let Some(mw) = mw else { return "gone".into() };
    let Some(status) = &mw.status else { return "operator: no status".into() };
    if status.observed_generation < mw.metadata.generation {
        return "operator: status behind".into();
    }
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").map_or("-", |c| c.reason.as_str());
    format!("rollout: {:?}, {ready}", status.phase.unwrap_or(Phase::Creating))
}

/// The resident level of `samples` (seconds, KiB): the median of each whole minute's samples,
/// and the least-squares slope of every sample in KiB per 10 minutes. Each minute's changes
/// land at once, and the reconciles they start hold a MiB or two for some seconds: the
/// spread of every sample shows those bursts, the medians and the slope show whether what
/// stays grows.
fn resident_level(samples: &[(f64, f64)]) -> (Vec<f64>, f64) {
    let mut minutes: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for (t, kib) in samples {
        minutes.entry((*t / 60.0) as u64).or_default().push(*kib);
    }
    let medians = minutes
        .into_values()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            let mid = v.len() / 2;
            if v.len() % 2 == 0 { (v[mid - 1] + v[mid]) / 2.0 } else { v[mid] }
        })
        .collect();
    let n = samples.len().max(1) as f64;
    let (mt, mk) = samples.iter().fold((0.0, 0.0), |(a, b), (t, k)| (a + t / n, b + k / n));
    let (cov, var) =
        samples.iter().fold((0.0, 0.0), |(c, v), (t, k)| (c + (t - mt) * (k - mk), v + (t - mt) * (t - mt)));
    let slope = if var > 0.0 { cov / var * 600.0 } else { 0.0 };
    (medians, slope)
}

#[test]
fn the_resident_level_is_each_minutes_median_and_the_trend_per_ten_minutes() {
    // Two minutes at 100 KiB with a burst to 200 in each: the medians ignore the bursts.
    let flat = [(0.0, 100.0), (20.0, 200.0), (40.0, 100.0), (60.0, 100.0), (80.0, 200.0), (100.0, 100.0)];
    let (medians, _) = resident_level(&flat);
    assert_eq!(medians, [100.0, 100.0]);
    // 1 KiB more every minute: 10 KiB per 10 minutes.
    let growing: Vec<(f64, f64)> = (0..30).map(|m| (m as f64 * 60.0, 1000.0 + m as f64)).collect();
    let (_, slope) = resident_level(&growing);
    assert!((slope - 10.0).abs() < 1e-9, "{slope}");
}

/// How many stuck changes wait where (see `waiting_on`), most first.
fn stuck_by_place(stuck: &[(usize, String)]) -> Vec<(String, usize)> {
    let mut by: HashMap<String, usize> = HashMap::new();
    for (_, place) in stuck {
        *by.entry(place.clone()).or_default() += 1;
    }
    let mut by: Vec<(String, usize)> = by.into_iter().collect();
    by.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    by
}

/// A small deterministic generator (a run is repeatable; no dependency for it).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    Image,
    Env,
    Stop,
    Start,
    Recreate,
}

/// A change not yet seen done.
struct Pending {
    /// Its workload.
    i: usize,
    /// When the API server accepted the change's (last) write.
    since: Instant,
    written: Written,
}

/// Drop the changes `done` says are done from `pending`, keeping how long each took.
fn retire(pending: &mut Vec<Pending>, took: &mut Vec<f64>, done: impl Fn(&Pending) -> bool) {
    pending.retain(|p| {
        let done = done(p);
        if done {
            took.push(p.since.elapsed().as_secs_f64());
        }
        !done
    });
}

/// This minute's changes: `per_minute` distinct workloads, none in `busy` (a change still
/// pending), each changed in `wanted` (a stopped one is started, the others get a new image,
/// a new env, a stop or a re-create).
fn choose(rng: &mut Lcg, wanted: &mut [Wanted], busy: &HashSet<usize>, per_minute: usize) -> Vec<(usize, Change)> {
    let n = wanted.len();
    let mut chosen = BTreeSet::new();
    while chosen.len() < per_minute.min(n - busy.len()) {
        let i = rng.below(n);
        if !busy.contains(&i) {
            chosen.insert(i);
        }
    }
    chosen
        .into_iter()
        .map(|i| {
            let w = &mut wanted[i];
            let change = if w.stopped {
                Change::Start
            } else {
                [Change::Image, Change::Env, Change::Stop, Change::Recreate][rng.below(4)]
            };
            match change {
                Change::Image => w.image = !w.image,
                Change::Env => w.revision += 1,
                Change::Stop => w.stopped = true,
                Change::Start => w.stopped = false,
                Change::Recreate => {}
            }
            (i, change)
        })
        .collect()
}

/// The two (then three) operators: each one's process and audit user.
struct Replica {
    op: Operator,
    user: String,
}

async fn replica(ns: &TestNamespace, name: &str) -> Replica {
    let (config, _, user) = service_account_kubeconfig(ns, name).await;
    let metrics = free_address();
    let args: Vec<String> = vec![
        "run".into(),
        "--log-format=json".into(),
        format!("--kubeconfig={}", config.display()),
        format!("--metrics-address={metrics}"),
        format!("--namespace={}", ns.name),
        format!("--lease-namespace={}", ns.name),
        format!("--identity={name}"),
    ];
    // Debug logs at this size would be most of the CPU and disk the soak measures.
    let op = Operator::spawn(&format!("{}-{name}", ns.name), &args, &[("RUST_LOG", "info")], metrics);
    op.wait_ready(Duration::from_secs(120)).await;
    Replica { op, user }
}

async fn leads(r: &Replica) -> bool {
    r.op.metric(&format!("leader_election_master_status{{name=\"{LEASE}\"}}")).await == Some(1.0)
}

#[tokio::test]
#[ignore = "a soak: `make soak` runs it"]
async fn soak() {
    let n = knob("MW_SOAK_N", 5000);
    let minutes = knob("MW_SOAK_MINUTES", 30).max(3);
    // The floor's capacity, when `make soak` measured it; else a share of N.
    let floor: Option<floor::Capacity> = std::env::var("MW_SOAK_FLOOR").ok().map(|path| {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    });
    let per_minute = match &floor {
        Some(floor) if floor.n == n && floor.per_minute > 0 => floor.per_minute,
        Some(floor) => panic!(
            "the floor measured {} workloads carrying {} changes a minute: no rate for {n}",
            floor.n, floor.per_minute
        ),
        None => (n * knob("MW_SOAK_CHANGE_PERCENT", 10) / 100).max(1),
    };
    // The faults, at fixed fractions of the run: the leader killed at 1/6, the API server
    // restarted at 2/5 and 7/10; memory judged over the last two thirds.
    let kill_at = minutes / 6;
    let restarts = [minutes * 2 / 5, minutes * 7 / 10];
    let window_from = Duration::from_secs((minutes as u64 * 60) / 3);

    let ns = TestNamespace::new("soak").await;
    let storage = Storage::new(&ns, n / 3 + 1, "1Gi").await;
    let workloads = ns.api::<ManagedWorkload>();
    let seen = mirror(workloads.clone());
    let workload = |i: usize| seen.get(&ObjectRef::new(&format!("w{i}")).within(&ns.name));
    // A change is carried out once the object its write made is settled as now wanted.
    let carried_out = |p: &Pending, wanted: &[Wanted]| {
        workload(p.i).is_some_and(|m| p.written.shows(&*m) && settled(&m, &wanted[p.i]))
    };
    let mut replicas = vec![replica(&ns, "soak-a").await];
    replicas[0].op.wait_leader(LEASE, Duration::from_secs(120)).await;
    replicas.push(replica(&ns, "soak-b").await);

    let mut wanted = vec![Wanted::default(); n];
    let t0 = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let (api, name) = (workloads.clone(), format!("w{i}"));
            let body = body(&name, spec(i, wanted[i], &storage.class));
            async move { apply(&api, &name, &body).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<Written>>()
        .await;
    eventually(&format!("{n} workloads Ready"), Duration::from_secs(1800), || {
        let waiting = (0..n).filter(|&i| !workload(i).is_some_and(|m| settled(&m, &wanted[i]))).count();
        async move { if waiting == 0 { Ok(()) } else { Err(format!("{waiting} of {n} not settled")) } }
    })
    .await;
    eprintln!("soak: {n} workloads Ready after {:.0} s", t0.elapsed().as_secs_f64());

    let since = Timestamp::now();
    let started = Instant::now();
    let mut rng = Lcg(0x5eed);
    let mut changes: BTreeMap<Change, usize> = BTreeMap::new();
    let mut per_name: BTreeMap<String, usize> = BTreeMap::new();
    let mut pending: Vec<Pending> = Vec::new();
    // Each change not carried out by STUCK_AFTER past the run's end: its workload's number and
    // where it waits.
    let mut stuck: Vec<(usize, String)> = Vec::new();
    let mut took: Vec<f64> = Vec::new();
    let mut rss: Vec<(Duration, f64)> = Vec::new();
    let mut events: Vec<String> = Vec::new();
    let mut leader = 0;

    for minute in 0..minutes {
        let minute_end = started + Duration::from_secs(60 * (minute as u64 + 1));
        if minute == kill_at {
            leader = {
                let mut found = None;
                for (k, r) in replicas.iter().enumerate() {
                    if leads(r).await {
                        found = Some(k);
                    }
                }
                found.expect("a leader")
            };
            replicas[leader].op.signal("KILL");
            let took = Instant::now();
            let mut next = None;
            while next.is_none() {
                for (k, r) in replicas.iter().enumerate() {
                    if k != leader && leads(r).await {
                        next = Some(k);
                    }
                }
                assert!(took.elapsed() < Duration::from_secs(120), "no standby took over");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            events.push(format!(
                "minute {minute}: leader {} killed; {} led after {:.1} s",
                replicas[leader].user,
                replicas[next.unwrap()].user,
                took.elapsed().as_secs_f64()
            ));
            leader = next.unwrap();
            replicas.push(replica(&ns, "soak-c").await);
        }
        if restarts.contains(&minute) {
            let down = Instant::now();
            let stopped = Stopped::stop("kube-apiserver");
            tokio::time::sleep(Duration::from_secs(5)).await;
            stopped.start();
            // kube-controller-manager v1.36.3's garbage collector stops collecting once its
            // API server has been killed under it (found by this soak: a deleted workload's
            // Deployment stayed until kube-controller-manager restarted, and its re-created
            // successor waited on it, WaitingForDeletion, for good). Kubernetes' problem, not
            // the operator's, which waits as it should: restart it, as a control plane's
            // supervisor would restart a wedged component.
            Stopped::stop("kube-controller-manager").start();
            events.push(format!(
                "minute {minute}: kube-apiserver killed and restarted, then kube-controller-manager ({:.1} s)",
                down.elapsed().as_secs_f64()
            ));
        }

        // The leader may have changed hands (an API server outage longer than its renewal
        // deadline): memory is the current leader's.
        for (k, r) in replicas.iter().enumerate() {
            if k != leader && leads(r).await {
                events.push(format!("minute {minute}: {} leads now", r.user));
                leader = k;
            }
        }

        // This minute's changes: distinct workloads, none with a change still pending.
        let busy: HashSet<usize> = pending.iter().map(|p| p.i).collect();
        let chosen = choose(&mut rng, &mut wanted, &busy, per_minute);
        for (i, change) in &chosen {
            *changes.entry(*change).or_default() += 1;
            *per_name.entry(format!("w{i}")).or_default() += 1;
        }
        let accepted: Vec<Pending> = futures::stream::iter(&chosen)
            .map(|&(i, change)| {
                let (api, name) = (workloads.clone(), format!("w{i}"));
                let body = body(&name, spec(i, wanted[i], &storage.class));
                async move {
                    if change == Change::Recreate {
                        delete(&api, &name).await;
                    }
                    let written = apply(&api, &name, &body).await;
                    Pending { i, since: Instant::now(), written }
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        pending.extend(accepted);

        // Until the minute ends: sample the leader's memory, and see which changes are done.
        while Instant::now() < minute_end {
            rss.push((started.elapsed(), memory_kib(replicas[leader].op.pid).0));
            retire(&mut pending, &mut took, |p| carried_out(p, &wanted));
            tokio::time::sleep(LOOK.min(minute_end.saturating_duration_since(Instant::now()))).await;
        }
        eprintln!(
            "soak: minute {minute}: {} changes so far, {} pending, leader RSS {:.0} KiB",
            changes.values().sum::<usize>(),
            pending.len(),
            rss.last().map_or(0.0, |(_, kib)| *kib)
        );
    }
    // The last changes: carried out within STUCK_AFTER, or stuck (reported with their reason).
    let last = Instant::now();
    loop {
        retire(&mut pending, &mut took, |p| carried_out(p, &wanted));
        let waiting: Vec<(usize, String)> = (0..n)
            .filter_map(|i| {
                let current = workload(i);
                let done =
                    current.as_ref().is_some_and(|m| settled(m, &wanted[i])) && !pending.iter().any(|p| p.i == i);
                (!done).then(|| (i, waiting_on(current.as_deref())))
            })
            .collect();
        if waiting.is_empty() {
            break;
        }
        if last.elapsed() > STUCK_AFTER {
            stuck.extend(waiting);
            break;
        }
        tokio::time::sleep(LOOK).await;
    }
    took.sort_by(f64::total_cmp);
    let total_changes: usize = changes.values().sum();

    // At rest: once nothing moves, no write for a minute, by any replica, to anything but the
    // leader's Lease (renewed every 2 s).
    let users: Vec<String> = replicas.iter().map(|r| r.user.clone()).collect();
    let workload_writes = || -> usize {
        users.iter().map(|u| audit::writes_by(u, &ns.name).iter().filter(|w| w.resource != "leases").count()).sum()
    };
    let mut before = workload_writes();
    let settle = Instant::now();
    loop {
        tokio::time::sleep(audit::QUIET).await;
        let now = workload_writes();
        if now == before || settle.elapsed() > Duration::from_secs(120) {
            break;
        }
        before = now;
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let at_rest = workload_writes() - before;

    let user_refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let writes = audit::deployment_writes_since(&user_refs, &ns.name, since);
    let deployment_total: usize = writes.values().sum();
    let off: Vec<String> = per_name
        .iter()
        .filter(|(name, want)| writes.get(*name) != Some(want))
        .map(|(name, want)| format!("{name}: {want} changes, {} writes", writes.get(name).copied().unwrap_or(0)))
        .collect();
    let timed: Vec<(f64, f64)> =
        rss.iter().filter(|(t, _)| *t >= window_from).map(|(t, kib)| (t.as_secs_f64(), *kib)).collect();
    let window: Vec<f64> = timed.iter().map(|(_, kib)| *kib).collect();
    let (lo, hi) = window.iter().fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let mean = window.iter().sum::<f64>() / window.len().max(1) as f64;
    let (medians, slope) = resident_level(&timed);
    let (med_lo, med_hi) = medians.iter().fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));

    let none = "—".to_string();
    // The floor at the rate the soak ran at (its highest carried), for the column beside.
    let at = floor.as_ref().and_then(|f| f.at_capacity.clone());
    let field = |key: &str| at.as_ref().map(|t| t[key].clone());
    let floor_rate = floor.as_ref().map_or(none.clone(), |f| {
        let tried: Vec<String> = f
            .trials
            .iter()
            .map(|t| format!("{} {}", t["per_minute"], if t["carried"] == true { "carried" } else { "not" }))
            .collect();
        format!(
            "{} ({:.1}% of N); tried, 3 minutes each: {}",
            f.per_minute,
            f.per_minute as f64 * 100.0 / n as f64,
            tried.join(", ")
        )
    });
    let floor_latency = field("latency_s").map_or(none.clone(), |l| {
        format!(
            "{:.1} / {:.1} / {:.1} s",
            l[0].as_f64().unwrap_or(0.0),
            l[1].as_f64().unwrap_or(0.0),
            l[2].as_f64().unwrap_or(0.0)
        )
    });
    let floor_backlog = field("backlog").map_or(none.clone(), |b| format!("{b} at each minute's end"));
    let report = format!(
        "## Soak ({date})\n\n\
         | | floor: the same objects, no operator | operator |\n|---|---|---|\n\
         | workloads | {n} (a third plain, a third with a Service, a third with a disk) | the same |\n\
         | changes a minute | {floor_rate} | {per_minute}, for {minutes} minutes: {total_changes} ({changes:?}) |\n\
         | faults | none | {events} |\n\
         | changes carried out | every one (that is what carried means); backlog {floor_backlog} | {done} of {total_changes}; slower than {after} s: {slow}; not carried out {after} s after the run: {stuck_n}, waiting on {by_place:?}; the first: {stuck_head:?} |\n\
         | change accepted → seen done, p50 / p99 / max (checked every 0.5 s) | {floor_latency} | {p50:.1} / {p99:.1} / {max:.1} s |\n\
         | Deployment writes per change | 1 (the soak's own apply) | {ratio:.3} ({deployment_total} for {total_changes}); workloads off one-per-change: {off_n} {off_head:?} |\n\
         | leader RSS, last {window_min} minutes | — | {lo:.0}–{hi:.0} KiB (mean {mean:.0}): spread {spread:.1}% |\n\
         | leader RSS, median of each minute, last {window_min} minutes | — | {med_lo:.0}–{med_hi:.0} KiB: spread {med_spread:.1}%; trend {slope:+.0} KiB per 10 minutes |\n\
         | writes at rest (60 s) | — | {at_rest} |\n",
        date = Timestamp::now().strftime("%Y-%m-%d"),
        events = events.join("; "),
        done = total_changes - stuck.len(),
        stuck_n = stuck.len(),
        after = STUCK_AFTER.as_secs(),
        slow = took.iter().filter(|t| **t > STUCK_AFTER.as_secs_f64()).count(),
        by_place = stuck_by_place(&stuck),
        stuck_head =
            stuck.iter().take(10).map(|(i, place)| format!("w{i} ({}, {place})", kind(*i))).collect::<Vec<_>>(),
        p50 = percentile(&took, 50.0),
        p99 = percentile(&took, 99.0),
        max = took.last().copied().unwrap_or(0.0),
        ratio = deployment_total as f64 / total_changes.max(1) as f64,
        off_n = off.len(),
        off_head = off.iter().take(10).collect::<Vec<_>>(),
        window_min = minutes - (minutes / 3),
        spread = if mean > 0.0 { (hi - lo) / mean * 100.0 } else { 0.0 },
        med_spread = {
            let mean = medians.iter().sum::<f64>() / medians.len().max(1) as f64;
            if mean > 0.0 { (med_hi - med_lo) / mean * 100.0 } else { 0.0 }
        },
    );
    println!("{report}");
    let out = std::env::var("MW_SOAK_OUT").unwrap_or_else(|_| "target/soak/soak.md".into());
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&out, &report).expect("writing the soak report");
    // Every sample of the leader's RSS beside it, for a look at its shape around the faults.
    let samples: String = rss.iter().map(|(t, kib)| format!("{:.1}\t{kib:.0}\n", t.as_secs_f64())).collect();
    std::fs::write(std::path::Path::new(&out).with_extension("rss.tsv"), samples).expect("writing the RSS samples");
    assert!(stuck.is_empty(), "changes never carried out: {} waiting on {:?}", stuck.len(), stuck_by_place(&stuck));
    assert_eq!(at_rest, 0, "writes at rest");
}
