//! The contract's floor: what N ManagedWorkloads cost the control plane with no controller
//! logic at all. The bench plays a controller that knows every answer in advance and makes
//! exactly the writes the contract needs per workload, from bodies built before the clock
//! starts: its Service (when it asks for one), its Deployment with the first status beside it,
//! and the Ready status once the one watch, on Deployments, shows the Deployment Available. No
//! other reads, no caches, no decisions: whatever the operator costs beyond this is its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use tokio::sync::Semaphore;

use mw_operator::operator::ownership::{FIELD_MANAGER, applied_hash};
use mw_operator::operator::status::{self, Observed};
use mw_operator::operator::{deployment, service, status_write};
use mw_operator::resource::{DesiredState, ManagedWorkload, ManagedWorkloadSpec, ManagedWorkloadStatus, Phase};
use mw_operator::write::Write;

use super::{IN_FLIGHT, TestNamespace, deployment_available, each, ready_and_running, until_all, workload_body};

/// Stands in for the UID the API server gives a workload, until it has given it.
const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";
/// Stands in for its Service's cluster IP, likewise.
const PLACEHOLDER_IP: &str = "10.96.0.1";

/// One workload's writes, built before the clock starts.
#[derive(Clone)]
pub struct Bodies {
    workload: Value,
    service: Option<Service>,
    deployment: Deployment,
    /// The status the operator writes beside the Deployment's create: `Creating`.
    creating: ManagedWorkloadStatus,
    /// The status once the Deployment is Available: `Running`, Ready.
    running: ManagedWorkloadStatus,
}

/// The bodies for workload `name` with `spec`, as the operator's own functions build them:
/// the objects it applies, and the statuses it derives for a new Deployment and then for an
/// Available one (its Pod's IP aside: the one watch is on Deployments, not Pods).
pub fn bodies(namespace: &str, name: &str, spec: Value) -> Bodies {
    let workload = workload_body(name, spec.clone());
    let spec: ManagedWorkloadSpec = serde_json::from_value(spec).expect("a valid spec");
    let mut mw = ManagedWorkload::new(name, spec);
    mw.metadata.namespace = Some(namespace.into());
    mw.metadata.uid = Some(PLACEHOLDER_UID.into());
    mw.metadata.generation = Some(1);
    let deployment = deployment::deployment(&mw, &Default::default()).expect("a desired Deployment");
    let service = service::service(&mw);
    let now = now();
    let creating = status::derive(&mw, &observed(&deployment, None, None), &now);
    mw.status = Some(creating.clone());
    let mut available = deployment.clone();
    available.metadata.generation = Some(1);
    available.status = Some(available_status());
    let mut live_service = service.clone();
    if let Some(spec) = live_service.as_mut().and_then(|s| s.spec.as_mut()) {
        spec.cluster_ip = Some(PLACEHOLDER_IP.into());
    }
    let pod = ready_pod(&deployment);
    let mut running = status::derive(&mw, &observed(&available, Some(&pod), live_service.as_ref()), &now);
    // The one watch is on Deployments: the ideal controller never sees the Pod's IP.
    running.pod_ip = None;
    if mw.spec.service.is_none() {
        running.address = None;
    }
    Bodies { workload, service, deployment, creating, running }
}

/// A Ready Pod of `deployment`'s template, as the status rules recognise one.
fn ready_pod(deployment: &Deployment) -> Pod {
    let template = deployment.spec.as_ref().and_then(|s| s.template.metadata.as_ref());
    let mut pod = Pod::default();
    pod.metadata.annotations = template.and_then(|m| m.annotations.clone());
    pod.metadata.labels = template.and_then(|m| m.labels.clone());
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.244.0.1".into()),
        conditions: Some(vec![PodCondition { type_: "Ready".into(), status: "True".into(), ..Default::default() }]),
        ..Default::default()
    });
    pod
}

/// A one-replica Deployment rolled out and Available, as its controller reports it.
fn available_status() -> DeploymentStatus {
    let condition = |type_: &str, reason: &str| DeploymentCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(format!("{type_}: {reason}")),
        ..Default::default()
    };
    DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(1),
        updated_replicas: Some(1),
        ready_replicas: Some(1),
        available_replicas: Some(1),
        conditions: Some(vec![
            condition("Available", "MinimumReplicasAvailable"),
            condition("Progressing", "NewReplicaSetAvailable"),
        ]),
        ..Default::default()
    }
}

/// Where each workload is between its first writes (a create, or a stop) and the status that
/// ends them (Running, or Stopped): whichever of the two (its first writes answered, its
/// Deployment seen where that status says) comes second writes it.
enum Slot {
    /// Its first writes were answered: the workload (its UID, for the write's test) and the
    /// status to write once its Deployment is seen there.
    Written(Box<(ManagedWorkload, ManagedWorkloadStatus)>),
    /// Its Deployment was seen there before its first writes were answered.
    Seen,
}

type Slots = Arc<Mutex<HashMap<String, Slot>>>;

/// Applies `bodies` as N new workloads and plays their ideal controller until every one is
/// Ready and Running (the same watch the operator's run is timed with); the seconds from the
/// first apply until the last was.
pub async fn run(ns: &TestNamespace, bodies: Vec<Bodies>) -> f64 {
    let n = bodies.len();
    let workloads = ns.api::<ManagedWorkload>();
    let ready = tokio::spawn(until_all(workloads.clone(), n, ready_and_running));
    let slots: Slots = Arc::default();
    let controller =
        tokio::spawn(write_on_sight(ns.client.clone(), ns.api::<Deployment>(), slots.clone(), deployment_available));
    let (deployments, services) = (ns.api::<Deployment>(), ns.api::<Service>());
    let bodies = Arc::new(bodies);
    let t = Instant::now();
    each(n, |i| {
        let (client, workloads, deployments, services) =
            (ns.client.clone(), workloads.clone(), deployments.clone(), services.clone());
        let (bodies, slots) = (bodies.clone(), slots.clone());
        async move {
            let Bodies { workload, mut service, mut deployment, creating, mut running } = bodies[i].clone();
            let name = deployment.name_any();
            // The user's apply, as in the operator's run; its answer carries the UID.
            let mw = workloads
                .patch(&name, &PatchParams::apply("bench"), &Patch::Apply(&workload))
                .await
                .expect("applying a CR");
            owned_by(&mut deployment, &mut service, mw.metadata.uid.as_deref().expect("a UID"));
            let service = create(&services, service);
            let deployment = create(&deployments, Some(deployment));
            let status = status_write::write(&client, &mw, &creating);
            let (service, _, creating) = tokio::join!(service, deployment, status);
            creating.expect("the first status");
            if let Some(ip) = service.and_then(|s| s.spec.and_then(|s| s.cluster_ip)) {
                running.address = Some(ip.clone());
                if let Some(status) = running.service.as_mut() {
                    status.cluster_ip = Some(ip);
                }
            }
            if answered(&slots, name, &mw, &running) {
                status_write::write(&client, &mw, &running).await.expect("the Running status");
            }
        }
    })
    .await;
    let last = ready.await.expect("the timing watch").into_values().max();
    controller.abort();
    last.map(|last| last.duration_since(t).as_secs_f64()).unwrap_or(0.0)
}

/// Gives `deployment`'s and `service`'s owner references the UID the workload was created
/// with. With the placeholder the garbage collector takes them for orphans and deletes them,
/// and a floor whose Services vanish mid-run is cheaper than the contract.
fn owned_by(deployment: &mut Deployment, service: &mut Option<Service>, uid: &str) {
    let owners = deployment.metadata.owner_references.iter_mut().flatten();
    let service_owners = service.iter_mut().flat_map(|s| s.metadata.owner_references.iter_mut().flatten());
    for owner in owners.chain(service_owners) {
        owner.uid = uid.into();
    }
}

/// The operator's create-only apply of `object`, if any; its answer.
async fn create<K>(api: &Api<K>, object: Option<K>) -> Option<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let object = object?;
    Some(Write::Create.apply(api, &object.name_any(), &object, FIELD_MANAGER).await.expect("a create-only apply"))
}

/// `mw`'s first writes were answered: whether its Deployment was already seen where `next`
/// says (then the caller writes `next`), or else `next` is left for the watch to write.
fn answered(slots: &Slots, name: String, mw: &ManagedWorkload, next: &ManagedWorkloadStatus) -> bool {
    let mut slots = slots.lock().unwrap();
    let seen = matches!(slots.remove(&name), Some(Slot::Seen));
    if !seen {
        slots.insert(name, Slot::Written(Box::new((mw.clone(), next.clone()))));
    }
    seen
}

/// The one watch on Deployments: each workload whose Deployment is seen `there` (Available,
/// or scaled down) gets its next status written once, IN_FLIGHT at a time, as the operator's
/// concurrency allows.
async fn write_on_sight(client: Client, deployments: Api<Deployment>, slots: Slots, there: fn(&Deployment) -> bool) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut stream = std::pin::pin!(watcher(deployments, watcher::Config::default()));
    loop {
        let Ok(Some(watcher::Event::Apply(d) | watcher::Event::InitApply(d))) = stream.try_next().await else {
            continue;
        };
        if !there(&d) {
            continue;
        }
        let written = {
            let mut slots = slots.lock().unwrap();
            match slots.remove(&d.name_any()) {
                Some(Slot::Written(written)) => Some(*written),
                _ => {
                    slots.insert(d.name_any(), Slot::Seen);
                    None
                }
            }
        };
        let Some((mw, next)) = written else { continue };
        let (client, slot) = (client.clone(), in_flight.clone().acquire_owned().await.expect("open"));
        tokio::spawn(async move {
            status_write::write(&client, &mw, &next).await.expect("the status a Deployment's progress ends with");
            drop(slot);
        });
    }
}

/// One stop's writes, built before the clock starts: the Deployment scaled to 0 (the
/// operator's own apply of the stopped workload's Deployment, to the stored one's UID), the
/// `Stopping` status at the new generation, derived from the Deployment as it was, and the
/// `Stopped` status once the Deployment has scaled down.
struct Stop {
    workload: ManagedWorkload,
    deployment: Deployment,
    stopping: ManagedWorkloadStatus,
    stopped: ManagedWorkloadStatus,
}

/// The writes that stop `mw`, whose Deployment is `live`, and the generation the stop makes.
fn stop(mut mw: ManagedWorkload, live: &Deployment) -> (i64, Stop) {
    mw.spec.state = Some(DesiredState::Stopped);
    let generation = mw.metadata.generation.unwrap_or(0) + 1;
    mw.metadata.generation = Some(generation);
    let mut deployment = deployment::deployment(&mw, &Default::default()).expect("a desired Deployment");
    deployment.metadata.uid = live.metadata.uid.clone();
    let mut before = observed(&deployment, None, None);
    before.deployment = Some(live);
    let stopping = status::derive(&mw, &before, &now());
    let mut scaled = deployment.clone();
    scaled.metadata.generation = Some(live.metadata.generation.unwrap_or(0) + 1);
    scaled.status = Some(DeploymentStatus { observed_generation: scaled.metadata.generation, ..Default::default() });
    let mut after = observed(&deployment, None, None);
    after.deployment = Some(&scaled);
    let stopped = status::derive(&mw, &after, &now());
    (generation, Stop { workload: mw, deployment, stopping, stopped })
}

/// A Deployment its controller has scaled down to no Pods.
fn scaled_down(d: &Deployment) -> bool {
    let (Some(spec), Some(status)) = (&d.spec, &d.status) else { return false };
    spec.replicas == Some(0) && status.observed_generation >= d.metadata.generation && status.replicas.unwrap_or(0) == 0
}

/// The contract's floor for stops: `names`' workloads (Running) each stopped by the user's
/// patch of `spec.state`, and exactly the writes a stop needs: from one watch, on
/// ManagedWorkloads, the Deployment's scale-down beside the `Stopping` status, at once; from
/// another, on Deployments, the `Stopped` status once it has scaled down. Timed as the
/// operator's stops are (`super::flips`): the seconds from each patch until the status shows
/// the new phase at the new generation. The `Stopped` writes go on meanwhile, as the
/// operator's do during its stops.
pub async fn stops(ns: &TestNamespace, names: Vec<String>) -> super::Flips {
    let (workloads, deployments) = (ns.api::<ManagedWorkload>(), ns.api::<Deployment>());
    let (mut bodies, mut targets) = (HashMap::new(), HashMap::new());
    for name in &names {
        let mw = workloads.get(name).await.expect("the workload");
        let live = deployments.get(name).await.expect("its Deployment");
        let (generation, stop) = stop(mw, &live);
        bodies.insert(name.clone(), (generation, stop));
        targets.insert(name.clone(), generation);
    }
    let slots: Slots = Arc::default();
    let finish = tokio::spawn(write_on_sight(ns.client.clone(), deployments.clone(), slots.clone(), scaled_down));
    let start = tokio::spawn(stop_on_sight(ns.client.clone(), workloads.clone(), deployments, bodies, slots));
    let took = super::flips(workloads, names, |_| super::stop_patch(), super::stopped_at(targets)).await;
    start.abort();
    finish.abort();
    took
}

/// The stop floor's watch on workloads: each one seen at its stop's generation gets its two
/// writes, together, IN_FLIGHT stops at a time; then its `Stopped` status, once its Deployment
/// has been seen scaled down (`slots`).
async fn stop_on_sight(
    client: Client,
    workloads: Api<ManagedWorkload>,
    deployments: Api<Deployment>,
    mut bodies: HashMap<String, (i64, Stop)>,
    slots: Slots,
) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut stream = std::pin::pin!(watcher(workloads, watcher::Config::default()));
    loop {
        let Ok(Some(watcher::Event::Apply(mw) | watcher::Event::InitApply(mw))) = stream.try_next().await else {
            continue;
        };
        let name = mw.name_any();
        let Some((generation, _)) = bodies.get(&name) else { continue };
        if mw.metadata.generation < Some(*generation) {
            continue; // not stopped yet
        }
        let Some((_, stop)) = bodies.remove(&name) else { continue };
        let (client, deployments, slots) = (client.clone(), deployments.clone(), slots.clone());
        let slot = in_flight.clone().acquire_owned().await.expect("open");
        tokio::spawn(async move {
            let uid = stop.deployment.metadata.uid.clone();
            let scale =
                Write::Update { uid: uid.as_deref() }.apply(&deployments, &name, &stop.deployment, FIELD_MANAGER);
            let status = status_write::write(&client, &stop.workload, &stop.stopping);
            let (scaled, stopping) = tokio::join!(scale, status);
            scaled.expect("the scale-down");
            stopping.expect("the Stopping status");
            drop(slot);
            if answered(&slots, name, &stop.workload, &stop.stopped) {
                status_write::write(&client, &stop.workload, &stop.stopped).await.expect("the Stopped status");
            }
        });
    }
}

/// A time as the operator writes them: whole seconds.
fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).expect("a time"))
}

/// What the status rules see: `deployment` as the desired one and as the stored one, `pod` and
/// `service` if any.
fn observed<'a>(deployment: &'a Deployment, pod: Option<&'a Pod>, service: Option<&'a Service>) -> Observed<'a> {
    Observed {
        desired_hash: applied_hash(deployment).unwrap_or_default(),
        deployment: Some(deployment),
        pods: pod.into_iter().collect(),
        blocked: None,
        claims: Vec::new(),
        refused: &[],
        service,
        sandbox: None,
    }
}

/// The bodies must describe what they stand for, or the floor measures something else.
#[test]
fn the_statuses_are_the_operators_creating_then_running() {
    let b = bodies("ns", "w0", super::spec(0));
    assert_eq!(b.creating.phase, Some(Phase::Creating));
    assert_eq!(b.running.phase, Some(Phase::Running));
    let ready = b.running.conditions.iter().find(|c| c.type_ == "Ready").expect("a Ready condition");
    assert_eq!(ready.status, "True");
}

/// Once the workload is created, every object it owns names its real UID.
#[test]
fn the_objects_are_owned_by_the_workload_as_created() {
    let Bodies { mut deployment, mut service, .. } = bodies("ns", "w0", super::spec(0));
    owned_by(&mut deployment, &mut service, "real-uid");
    let service = service.expect("a Service");
    let owners = deployment.metadata.owner_references.iter().chain(service.metadata.owner_references.iter());
    let uids: Vec<&str> = owners.flatten().map(|o| o.uid.as_str()).collect();
    assert_eq!(uids, ["real-uid", "real-uid"]);
}

/// A stop's bodies: the Deployment at 0 replicas, the status `Stopping` at the new generation,
/// then `Stopped`.
#[test]
fn a_stop_scales_to_zero_beside_stopping_then_is_stopped() {
    let b = bodies("ns", "w0", super::spec(0));
    let mut mw = ManagedWorkload::new("w0", serde_json::from_value(super::spec(0)).expect("a valid spec"));
    mw.metadata.namespace = Some("ns".into());
    mw.metadata.uid = Some(PLACEHOLDER_UID.into());
    mw.metadata.generation = Some(1);
    mw.status = Some(b.running);
    let mut live = b.deployment;
    live.metadata.generation = Some(1);
    live.status = Some(available_status());
    let (generation, stop) = stop(mw, &live);
    assert_eq!(generation, 2);
    assert_eq!(stop.deployment.spec.and_then(|s| s.replicas), Some(0));
    assert_eq!(stop.stopping.phase, Some(Phase::Stopping));
    assert_eq!(stop.stopping.observed_generation, Some(2));
    assert_eq!(stop.stopped.phase, Some(Phase::Stopped));
    assert_eq!(stop.stopped.observed_generation, Some(2));
}
