//! Helpers for tests that drive ManagedWorkloads through the operator `make test` runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::{Value, json};

use super::wait_until;

pub const TIMEOUT: Duration = Duration::from_secs(90);
/// Field manager the tests apply CRs with, like `kubectl apply --server-side` would.
const TEST_MANAGER: &str = "integration-test";

/// Server-side apply of a ManagedWorkload with this spec, with strict field validation (as
/// `kubectl apply` does).
pub async fn apply(api: &Api<ManagedWorkload>, name: &str, spec: Value) -> Result<ManagedWorkload, kube::Error> {
    apply_with_labels(api, name, json!({}), spec).await
}

pub async fn apply_with_labels(
    api: &Api<ManagedWorkload>,
    name: &str,
    labels: Value,
    spec: Value,
) -> Result<ManagedWorkload, kube::Error> {
    let body = json!({
        "apiVersion": "opensource-server.mieweb.org/v1alpha1",
        "kind": "ManagedWorkload",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    });
    api.patch(name, &PatchParams::apply(TEST_MANAGER).force().validation_strict(), &Patch::Apply(&body)).await
}

/// Create a ManagedWorkload the way `kubectl create`/`kubectl apply` (client-side) do: a
/// POST with `fieldValidation=Strict`, so unknown and duplicate fields are errors.
pub async fn create_strict(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    spec: Value,
) -> Result<ManagedWorkload, kube::Error> {
    let body = json!({
        "apiVersion": "opensource-server.mieweb.org/v1alpha1",
        "kind": "ManagedWorkload",
        "metadata": {"name": name},
        "spec": spec,
    });
    let uri = format!(
        "/apis/opensource-server.mieweb.org/v1alpha1/namespaces/{namespace}/managedworkloads?fieldValidation=Strict"
    );
    let request = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("JSON body"))
        .expect("a valid request");
    client.request(request).await
}

/// Wait as `kubectl wait --for=condition=Ready` does: Ready=True with an observedGeneration
/// equal to the CR's current generation, so a stale Ready never counts. Then check the phase.
pub async fn wait_ready(api: &Api<ManagedWorkload>, name: &str, phase: Phase) -> ManagedWorkload {
    wait_condition(api, name, "Ready", "True").await;
    let mw = api.get(name).await.unwrap();
    assert_eq!(phase_of(&mw), Some(phase), "Ready=True but the phase is not {phase:?}: {:#?}", mw.status);
    mw
}

/// Wait until the CR is Ready at its current generation *and* in `phase`. Unlike
/// `wait_ready`, a Ready=True written before a change the generation does not count (a hand
/// edit of the Deployment, a foreign rollout) is not taken as the final answer.
pub async fn wait_phase(api: &Api<ManagedWorkload>, name: &str, phase: Phase) -> ManagedWorkload {
    let what = format!("Ready=True and phase {phase:?}");
    wait_until(api, name, &what, TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| condition_current(mw, "Ready", "True") && phase_of(mw) == Some(phase))
    })
    .await
    .unwrap()
}

/// Wait until the workload's Deployment `name` has its one Pod available (what a wait that
/// starts after the Pod, the load balancer's, is judged from).
pub async fn wait_pod_available(client: &kube::Client, namespace: &str, name: &str) {
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), namespace);
    wait_until(
        &deployments,
        name,
        "the Pod available",
        TIMEOUT,
        |d: Option<&k8s_openapi::api::apps::v1::Deployment>| {
            d.and_then(|d| d.status.as_ref()).is_some_and(|s| s.available_replicas == Some(1))
        },
    )
    .await
    .unwrap();
}

/// Wait until condition `type_` has `status` for the CR's current generation.
pub async fn wait_condition(api: &Api<ManagedWorkload>, name: &str, type_: &str, status: &str) -> ManagedWorkload {
    let what = format!("{type_}={status} at the current generation");
    wait_until(api, name, &what, TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| condition_current(mw, type_, status))
    })
    .await
    .unwrap()
}

pub fn condition_current(mw: &ManagedWorkload, type_: &str, status: &str) -> bool {
    let generation = mw.metadata.generation;
    mw.status.as_ref().is_some_and(|s| {
        s.observed_generation == generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == status && c.observed_generation == generation)
    })
}

pub fn condition<'a>(
    mw: &'a ManagedWorkload,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    mw.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition: {:#?}", mw.status))
}

pub fn phase_of(mw: &ManagedWorkload) -> Option<Phase> {
    mw.status.as_ref().and_then(|s| s.phase)
}

/// Records one value of a CR (its phase, its address, …) at every change its own watch
/// delivers, from the CR's state at `start` on, consecutive duplicates folded: transient
/// values (an `Updating` that lasts moments) are seen too.
///
/// A log that stopped recording would make every "it never moved" assertion pass without
/// evidence: a watch error stops it loudly (`seen` panics, naming the error), and `alive`
/// proves it still records by making a write and waiting for the watch to deliver it.
pub struct WatchLog<T> {
    seen: Arc<Mutex<Vec<T>>>,
    /// Events the watch delivered (every one, recorded or not), for `alive`.
    events: Arc<Mutex<usize>>,
    /// Why the watch stopped, if it did.
    stopped: Arc<Mutex<Option<String>>>,
    api: Api<ManagedWorkload>,
    name: String,
    task: tokio::task::JoinHandle<()>,
}

impl<T: PartialEq + Clone + Send + 'static> WatchLog<T> {
    /// Starts watching and returns once the watch has delivered the CR's current state, so
    /// every value after this call is recorded. `read` gives the value, or None to skip.
    pub async fn start(api: &Api<ManagedWorkload>, name: &str, read: fn(&ManagedWorkload) -> Option<T>) -> Self {
        let (seen, events, stopped) =
            (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(0)), Arc::new(Mutex::new(None)));
        let (sink, counter, failure) = (seen.clone(), events.clone(), stopped.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(api.clone(), config);
        let (synced, is_synced) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut synced = Some(synced);
            loop {
                let event = match stream.next().await {
                    Some(Ok(event)) => event,
                    Some(Err(e)) => {
                        *failure.lock().unwrap() = Some(format!("the watch failed: {e}"));
                        return;
                    }
                    None => {
                        *failure.lock().unwrap() = Some("the watch ended".into());
                        return;
                    }
                };
                *counter.lock().unwrap() += 1;
                match event {
                    watcher::Event::Apply(mw) | watcher::Event::InitApply(mw) => {
                        if let Some(value) = read(&mw) {
                            let mut log = sink.lock().unwrap();
                            if log.last() != Some(&value) {
                                log.push(value);
                            }
                        }
                    }
                    watcher::Event::InitDone => {
                        if let Some(tx) = synced.take() {
                            let _ = tx.send(());
                        }
                    }
                    _ => {}
                }
            }
        });
        tokio::time::timeout(TIMEOUT, is_synced).await.expect("the watch to list the CR").expect("the watch task");
        WatchLog { seen, events, stopped, api: api.clone(), name: name.to_string(), task }
    }

    /// Values seen since `start`, consecutive duplicates folded. Panics if the watch stopped:
    /// what it did not see cannot be asserted on.
    pub fn seen(&self) -> Vec<T> {
        if let Some(why) = self.stopped.lock().unwrap().as_ref() {
            panic!("the watch log of {} stopped recording: {why}", self.name);
        }
        self.seen.lock().unwrap().clone()
    }

    /// The positive control for "never moved": annotate the CR and wait for this very watch
    /// to deliver the change. A log that passes this was recording when it was called.
    pub async fn alive(&self) {
        let before = *self.events.lock().unwrap();
        let probe = json!({"metadata": {"annotations": {"mw-operator.test/watch-probe": before.to_string()}}});
        self.api.patch(&self.name, &PatchParams::default(), &Patch::Merge(&probe)).await.expect("the probe write");
        super::eventually(&format!("the watch log of {} to see its probe", self.name), TIMEOUT, || async {
            let _ = self.seen();
            let now = *self.events.lock().unwrap();
            if now > before { Ok(()) } else { Err(format!("{now} events, as before the probe")) }
        })
        .await;
    }
}

impl<T> Drop for WatchLog<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every phase one CR passes through.
pub struct PhaseLog(WatchLog<Phase>);

impl PhaseLog {
    pub async fn start(api: &Api<ManagedWorkload>, name: &str) -> Self {
        PhaseLog(WatchLog::start(api, name, phase_of).await)
    }

    /// Phases seen since `start`, consecutive duplicates folded.
    pub fn seen(&self) -> Vec<Phase> {
        self.0.seen()
    }

    /// See `WatchLog::alive`.
    pub async fn alive(&self) {
        self.0.alive().await
    }

    /// Phases seen once this log's own watch has delivered a change ending in `last` (the
    /// first entry is the phase at `start`). Another watch may have seen `last` first: watches
    /// are not delivered in lockstep.
    pub async fn until(&self, last: Phase) -> Vec<Phase> {
        super::eventually(&format!("the phase log to see {last:?}"), TIMEOUT, || async {
            let seen = self.seen();
            if seen.len() > 1 && seen.last() == Some(&last) { Ok(()) } else { Err(format!("saw {seen:?}")) }
        })
        .await;
        self.seen()
    }
}

/// Name used in assertion messages.
pub fn describe(mw: &ManagedWorkload) -> String {
    format!("{}/{}", mw.namespace().unwrap_or_default(), mw.name_any())
}
