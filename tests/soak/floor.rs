//! The soak's floor: how much churn this control plane carries at N workloads with no operator
//! at all. The same N workloads, as the objects the operator would make (built by its own
//! functions: the Deployment, the Service of a third, the claim of a third), applied directly
//! by the soak, then changed the way the soak changes workloads at one rate after another.
//! A rate is carried when each minute's writes are accepted within the minute, the backlog
//! (changes not yet rolled out) does not grow from its first minute to its last, and it is
//! gone within a minute of the churn stopping. The highest rate carried is the rate the
//! operator's soak then runs at.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use mw_operator::operator::{claims, deployment, service};
use mw_operator::resource::{ManagedWorkload, ManagedWorkloadSpec};
use serde::Serialize;
use serde_json::{Value, json};

use super::support::storage::Storage;
use super::support::{TestNamespace, eventually};
use super::{
    Change, IN_FLIGHT, LOOK, Lcg, Pending, Wanted, Written, apply, choose, delete, image, knob, mirror, percentile,
    retire, spec,
};

/// How long each rate is tried, in minutes.
const TRIAL_MINUTES: usize = 3;
/// How long after its last minute a carried rate's backlog may take to clear.
const DRAIN: Duration = Duration::from_secs(60);
/// How long a rate that was not carried may take to clear before the next is tried.
const RECOVER: Duration = Duration::from_secs(600);
/// At most this many rates are tried.
const TRIALS: usize = 6;

/// One rate tried.
#[derive(Serialize, Clone)]
pub struct Trial {
    pub per_minute: usize,
    /// How long each minute's writes took the API server to accept: a minute's must fit in
    /// the minute.
    pub writes_s: Vec<f64>,
    /// Changes not yet rolled out at the end of each minute.
    pub backlog: Vec<usize>,
    /// Seconds from the last minute's end until every change was rolled out; None: not within
    /// `DRAIN` (then not within `RECOVER` either, if `recovered` is false).
    pub drained_s: Option<f64>,
    pub recovered: bool,
    /// From a change's last write accepted until its rollout was seen (checked every 0.5 s):
    /// p50, p99, max.
    pub latency_s: [f64; 3],
    pub carried: bool,
}

/// What `make soak` keeps of the floor (target/soak/floor.json), read by the operator's soak.
#[derive(Serialize, serde::Deserialize)]
pub struct Capacity {
    pub n: usize,
    /// The highest rate carried, in changes a minute (0: none was).
    pub per_minute: usize,
    /// The trial at that rate, as `Trial` (kept as JSON: the operator's soak prints it).
    pub at_capacity: Option<Value>,
    pub trials: Vec<Value>,
}

/// The objects the operator would make for workload `i` as `w` asks, with no owner (there is
/// no ManagedWorkload to own them).
fn objects(namespace: &str, i: usize, w: Wanted, class: &str) -> (Value, Option<Value>, Option<Value>) {
    let spec: ManagedWorkloadSpec = serde_json::from_value(spec(i, w, class)).expect("a valid spec");
    let mut mw = ManagedWorkload::new(&format!("w{i}"), spec);
    mw.metadata.namespace = Some(namespace.into());
    mw.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    mw.metadata.generation = Some(1);
    fn ownerless<K: Serialize>(object: K) -> Value {
        let mut value = serde_json::to_value(object).expect("an object");
        if let Some(meta) = value["metadata"].as_object_mut() {
            meta.remove("ownerReferences");
        }
        value
    }
    let deployment = deployment::deployment(&mw, &Default::default()).expect("a desired Deployment");
    let service = service::service(&mw).map(ownerless);
    let claim = mw.spec.volumes.first().and_then(|v| claims::claim(&mw, v, None, false)).map(ownerless);
    (ownerless(deployment), service, claim)
}

/// Whether `d` is rolled out as `w` asks: its controller has seen this spec, and one Pod of
/// the new template is available (or none runs, when stopped).
fn rolled_out(d: &Deployment, w: &Wanted) -> bool {
    let (Some(spec), Some(status)) = (&d.spec, &d.status) else { return false };
    let container = spec.template.spec.as_ref().and_then(|p| p.containers.first());
    let revision = container
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|e| e.name == "REVISION"))
        .and_then(|e| e.value.as_deref());
    let asked = container.and_then(|c| c.image.as_deref()) == Some(image(w))
        && revision == Some(&*w.revision.to_string())
        && spec.replicas == Some(if w.stopped { 0 } else { 1 });
    let observed = status.observed_generation >= d.metadata.generation;
    let pods = if w.stopped {
        status.replicas.unwrap_or(0) == 0
    } else {
        status.replicas == Some(1) && status.updated_replicas == Some(1) && status.available_replicas == Some(1)
    };
    asked && observed && pods
}

#[test]
fn the_floor_makes_the_operators_objects_without_an_owner_and_sees_them_rolled_out() {
    let w = Wanted::default();
    let (deployment, service, claim) = objects("ns", 1, w, "sc");
    assert!(deployment["metadata"].get("ownerReferences").is_none(), "{deployment}");
    assert_eq!(deployment["metadata"]["name"], "w1");
    assert!(service.is_some_and(|s| s["metadata"].get("ownerReferences").is_none()), "w1 has a Service");
    assert!(claim.is_none());
    let (_, service, claim) = objects("ns", 2, w, "sc");
    assert!(service.is_none());
    assert_eq!(claim.expect("w2 has a claim")["spec"]["storageClassName"], "sc");

    let mut d: Deployment = serde_json::from_value(deployment).unwrap();
    d.metadata.generation = Some(2);
    d.status = Some(
        serde_json::from_value(
            json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}),
        )
        .unwrap(),
    );
    assert!(rolled_out(&d, &w));
    let newer = Wanted { revision: 1, ..w };
    assert!(!rolled_out(&d, &newer), "another env is not rolled out yet");
    d.status.as_mut().unwrap().observed_generation = Some(1);
    assert!(!rolled_out(&d, &w), "a generation its controller has not seen");
    let stopped = Wanted { stopped: true, ..w };
    assert!(!rolled_out(&d, &stopped), "replicas still 1");
}

struct Floor {
    ns: TestNamespace,
    class: String,
    deployments: Api<Deployment>,
    services: Api<Service>,
    seen: Store<Deployment>,
    wanted: Vec<Wanted>,
    rng: Lcg,
}

impl Floor {
    /// Whether workload i is rolled out as wanted; after a change, only by the Deployment its
    /// write made (`written`).
    fn done(&self, i: usize, written: Option<&Written>) -> bool {
        self.seen
            .get(&ObjectRef::new(&format!("w{i}")).within(&self.ns.name))
            .is_some_and(|d| written.is_none_or(|w| w.shows(&*d)) && rolled_out(&d, &self.wanted[i]))
    }

    /// Carry out `changes`: apply each workload's objects as now wanted; a re-create deletes
    /// its Deployment and Service first (its claim stays, as a retained volume does). Each
    /// change with the moment the API server accepted its last write, and what that made.
    async fn act(&self, changes: &[(usize, Change)]) -> Vec<Pending> {
        futures::stream::iter(changes)
            .map(|&(i, change)| async move {
                let name = format!("w{i}");
                let (deployment, service, _) = objects(&self.ns.name, i, self.wanted[i], &self.class);
                if change == Change::Recreate {
                    delete(&self.deployments, &name).await;
                    if service.is_some() {
                        delete(&self.services, &name).await;
                    }
                }
                if let Some(service) = service {
                    apply(&self.services, &name, &service).await;
                }
                let written = apply(&self.deployments, &name, &deployment).await;
                Pending { i, since: Instant::now(), written }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await
    }

    /// Drop the changes rolled out from `pending`, keeping how long each took.
    fn retire(&self, pending: &mut Vec<Pending>, took: &mut Vec<f64>) {
        retire(pending, took, |p| self.done(p.i, Some(&p.written)));
    }

    /// Wait up to `limit` for `pending` to clear; how long it took, if it did.
    async fn drain(&self, pending: &mut Vec<Pending>, took: &mut Vec<f64>, limit: Duration) -> Option<f64> {
        let start = Instant::now();
        loop {
            self.retire(pending, took);
            if pending.is_empty() {
                return Some(start.elapsed().as_secs_f64());
            }
            if start.elapsed() > limit {
                return None;
            }
            tokio::time::sleep(LOOK).await;
        }
    }

    async fn trial(&mut self, per_minute: usize) -> Trial {
        let mut pending: Vec<Pending> = Vec::new();
        let mut took = Vec::new();
        let mut backlog = Vec::new();
        let mut writes_s = Vec::new();
        let start = Instant::now();
        for minute in 0..TRIAL_MINUTES {
            let minute_end = start + Duration::from_secs(60 * (minute as u64 + 1));
            let busy: HashSet<usize> = pending.iter().map(|p| p.i).collect();
            let changes = choose(&mut self.rng, &mut self.wanted, &busy, per_minute);
            let writing = Instant::now();
            pending.extend(self.act(&changes).await);
            writes_s.push(writing.elapsed().as_secs_f64());
            while Instant::now() < minute_end {
                self.retire(&mut pending, &mut took);
                tokio::time::sleep(LOOK.min(minute_end.saturating_duration_since(Instant::now()))).await;
            }
            self.retire(&mut pending, &mut took);
            backlog.push(pending.len());
        }
        let drained_s = self.drain(&mut pending, &mut took, DRAIN).await;
        let recovered = drained_s.is_some() || self.drain(&mut pending, &mut took, RECOVER).await.is_some();
        took.sort_by(f64::total_cmp);
        let carried = drained_s.is_some() && backlog.last() <= backlog.first() && writes_s.iter().all(|s| *s < 60.0);
        Trial {
            per_minute,
            writes_s,
            latency_s: [percentile(&took, 50.0), percentile(&took, 99.0), took.last().copied().unwrap_or(0.0)],
            backlog,
            drained_s,
            recovered,
            carried,
        }
    }
}

/// The next rate to try after `trials`: double while carried (up to a fifth of N a minute),
/// halve while not, then halfway between the highest carried and the lowest
/// not carried, until they are within a tenth of each other.
fn next_rate(n: usize, start: usize, trials: &[Trial]) -> Option<usize> {
    let Some(last) = trials.last() else { return Some(start) };
    let ceiling = (n / 5).max(1);
    let carried = trials.iter().filter(|t| t.carried).map(|t| t.per_minute).max();
    let failed = trials.iter().filter(|t| !t.carried).map(|t| t.per_minute).min();
    let next = match (carried, failed) {
        (Some(ok), None) if ok >= ceiling => return None,
        (Some(ok), None) => (ok * 2).min(ceiling),
        (None, Some(bad)) if bad <= 1 => return None,
        (None, Some(bad)) => bad / 2,
        (Some(ok), Some(bad)) if bad <= ok + (ok / 10).max(1) => return None,
        (Some(ok), Some(bad)) => (ok + bad) / 2,
        (None, None) => last.per_minute,
    };
    Some(next)
}

#[test]
fn the_rate_doubles_while_carried_then_bisects() {
    let trial = |per_minute, carried| Trial {
        per_minute,
        writes_s: vec![],
        backlog: vec![],
        drained_s: None,
        recovered: true,
        latency_s: [0.0; 3],
        carried,
    };
    assert_eq!(next_rate(5000, 50, &[]), Some(50));
    assert_eq!(next_rate(5000, 50, &[trial(50, true)]), Some(100));
    assert_eq!(next_rate(5000, 50, &[trial(50, true), trial(100, false)]), Some(75));
    assert_eq!(next_rate(5000, 50, &[trial(50, false)]), Some(25));
    assert_eq!(next_rate(5000, 50, &[trial(800, true)]), Some(1000));
    assert_eq!(next_rate(5000, 50, &[trial(1000, true)]), None);
    assert_eq!(next_rate(5000, 50, &[trial(100, true), trial(105, false)]), None);
}

#[tokio::test]
#[ignore = "the soak's floor: `make soak` runs it"]
async fn floor() {
    let n = knob("MW_SOAK_N", 5000);
    let start_rate = knob("MW_SOAK_FLOOR_START", (n / 50).max(1));
    let ns = TestNamespace::new("soak-floor").await;
    let storage = Storage::new(&ns, n / 3 + 1, "1Gi").await;
    let (deployments, services, claims) =
        (ns.api::<Deployment>(), ns.api::<Service>(), ns.api::<PersistentVolumeClaim>());
    let seen = mirror(deployments.clone());
    let mut floor = Floor {
        class: storage.class.clone(),
        deployments,
        services,
        seen,
        wanted: vec![Wanted::default(); n],
        rng: Lcg(0xf1008),
        ns,
    };

    let t0 = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let floor = &floor;
            let claims = &claims;
            async move {
                let name = format!("w{i}");
                let (deployment, service, claim) = objects(&floor.ns.name, i, floor.wanted[i], &floor.class);
                if let Some(claim) = claim {
                    apply(claims, claim["metadata"]["name"].as_str().unwrap_or(&name), &claim).await;
                }
                if let Some(service) = service {
                    apply(&floor.services, &name, &service).await;
                }
                apply(&floor.deployments, &name, &deployment).await;
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
    eventually(&format!("{n} Deployments rolled out"), Duration::from_secs(1800), || {
        let waiting = (0..n).filter(|i| !floor.done(*i, None)).count();
        async move { if waiting == 0 { Ok(()) } else { Err(format!("{waiting} of {n} not rolled out")) } }
    })
    .await;
    eprintln!("floor: {n} Deployments rolled out after {:.0} s", t0.elapsed().as_secs_f64());

    let mut trials: Vec<Trial> = Vec::new();
    while trials.len() < TRIALS
        && let Some(rate) = next_rate(n, start_rate, &trials)
    {
        let trial = floor.trial(rate).await;
        eprintln!(
            "floor: {rate} changes a minute: backlog {:?}, drained {:?} s, p50/p99/max {:.1?} s: {}",
            trial.backlog,
            trial.drained_s,
            trial.latency_s,
            if trial.carried { "carried" } else { "not carried" }
        );
        let recovered = trial.recovered;
        trials.push(trial);
        if !recovered {
            eprintln!("floor: the backlog did not clear within {} s; no further rate tried", RECOVER.as_secs());
            break;
        }
    }
    let best = trials.iter().filter(|t| t.carried).max_by_key(|t| t.per_minute);
    let capacity = Capacity {
        n,
        per_minute: best.map_or(0, |t| t.per_minute),
        at_capacity: best.map(|t| json!(t)),
        trials: trials.iter().map(|t| json!(t)).collect(),
    };
    let out = std::env::var("MW_SOAK_FLOOR_OUT").unwrap_or_else(|_| "target/soak/floor.json".into());
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&out, serde_json::to_string_pretty(&capacity).expect("JSON")).expect("writing the floor's capacity");
    println!(
        "floor: {n} workloads carry {} changes a minute ({:.1}% of them) on this control plane",
        capacity.per_minute,
        capacity.per_minute as f64 * 100.0 / n as f64
    );
}
