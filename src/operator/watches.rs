//! The watches of one scope (a namespace, or all), the caches they fill, and the fan-out of
//! "this workload may need a reconcile" to whichever controller runs now. They run leader or
//! not, so a standby is warm when it takes over.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::InitialListStrategy;
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{broadcast, mpsc};
use tracing::warn;

use super::by_uid::ByUid;
use super::memory::PerObject;
use super::ownership::FIELD_MANAGER;
use super::pod_index::PodIndex;
use super::replica_sets::ReplicaSets;
use super::slim::{CachedClaim, CachedDeployment, CachedPod, CachedService};
use crate::client::api_in as api;
use crate::metrics::Metrics;
use crate::names::{MANAGED_LABEL, OWNER_ANNOTATION};
use crate::reflect::{ReflectInPlace, watch_config};
use crate::resource::{ManagedWorkload, Workload};

/// The watches and caches of one scope (see the module comment).
pub struct Caches {
    pub namespace: Option<String>,
    pub deployments: Store<CachedDeployment>,
    pub replica_sets: Arc<ReplicaSets>,
    pub pods: Store<CachedPod>,
    /// The workloads' claims, retained ones included (they carry the managed label too).
    pub claims: Store<CachedClaim>,
    /// The workloads' Services (label-selected, trimmed).
    pub services: Store<CachedService>,
    /// The isolated workloads' NetworkPolicies (label-selected, whole: small and few).
    pub network_policies: Store<NetworkPolicy>,
    pub workloads: Store<Workload>,
    /// How far the workloads' cache can be trusted now (`Freshness`).
    pub workloads_watch: Arc<WorkloadsWatch>,
    pub pod_index: Arc<PodIndex>,
    pub objects: Arc<PerObject>,
    /// Workloads to reconcile, from every watch. Only a leader subscribes.
    pub triggers: broadcast::Sender<Trigger>,
}

/// What a watch event asks of the controller.
#[derive(Clone, Debug, PartialEq)]
pub enum Trigger {
    One(ObjectRef<Workload>),
    /// A watch re-listed (after an API server restart or an expired resourceVersion): what
    /// changed meanwhile came as no event (a deletion never does), so reconcile every workload
    /// from the caches as they now are.
    All,
}

/// Queued triggers per subscriber. A leader this far behind reconciles everything once (see
/// `subscribe`) instead of losing a trigger.
const TRIGGER_BUFFER: usize = 4096;

impl Caches {
    pub fn start(
        client: &Client,
        namespace: Option<String>,
        lists: InitialListStrategy,
        metrics: Arc<Metrics>,
    ) -> Caches {
        let ns = namespace.as_deref();
        let managed = watch_config(Some(&format!("{MANAGED_LABEL}=true")), lists.clone());
        let (triggers, _) = broadcast::channel(TRIGGER_BUFFER);

        // Each cache keeps only what the operator reads of its objects (see slim.rs).
        let (deployments, writer) = reflector::store();
        let deployment_events =
            watcher(api::<CachedDeployment>(client, ns), managed.clone()).default_backoff().reflect_in_place(writer);
        let deployment_targets = targets(deployment_events, "deployments", owner_of);

        // ReplicaSets: only which Deployment controls each (replica_sets.rs). One may arrive after
        // its first Pod, which then starts to count: reconcile the workload (same name as the
        // Deployment).
        let replica_sets = Arc::new(ReplicaSets::default());
        let indexer = replica_sets.clone();
        let replica_set_events = watcher(api::<PartialObjectMeta<ReplicaSet>>(client, ns), managed.clone())
            .default_backoff()
            .inspect(move |event| {
                if let Ok(event) = event {
                    indexer.observe(event);
                }
            });
        let replica_set_targets = targets(replica_set_events, "replicasets", |rs: &PartialObjectMeta<ReplicaSet>| {
            let deployment =
                rs.owner_references().iter().find(|o| o.controller == Some(true) && o.kind == "Deployment")?;
            Some(ObjectRef::new(&deployment.name).within(&rs.namespace()?))
        });

        let (pods, writer) = reflector::store();
        let pod_index = Arc::new(PodIndex::default());
        let indexer = pod_index.clone();
        // The index is updated after the cache, both before the event's trigger is sent.
        let pod_events = watcher(api::<CachedPod>(client, ns), managed.clone())
            .default_backoff()
            .reflect_in_place(writer)
            .inspect(move |event| {
                if let Ok(event) = event {
                    indexer.observe(event);
                }
            });
        let pod_targets = targets(pod_events, "pods", |pod: &CachedPod| {
            let name = pod.instance()?;
            Some(ObjectRef::new(name).within(&pod.namespace()?))
        });

        // Claims: by the instance label, since a retained claim has no owner reference.
        let (claims, writer) = reflector::store();
        let claim_events =
            watcher(api::<CachedClaim>(client, ns), managed.clone()).default_backoff().reflect_in_place(writer);
        let claim_targets = targets(claim_events, "persistentvolumeclaims", |claim: &CachedClaim| {
            let name = claim.instance()?;
            Some(ObjectRef::new(name).within(&claim.namespace()?))
        });

        // Services: by their controller. A load balancer address arriving, a deletion or an edit
        // reconciles the workload. Endpoint updates go to EndpointSlices, so a serving workload's
        // Service stays quiet.
        let (services, writer) = reflector::store();
        let service_events =
            watcher(api::<CachedService>(client, ns), managed.clone()).default_backoff().reflect_in_place(writer);
        let service_targets = targets(service_events, "services", owner_of);

        // NetworkPolicies: by their controller.
        let (network_policies, writer) = reflector::store();
        let policy_events = watcher(api::<NetworkPolicy>(client, ns), managed.clone())
            .default_backoff()
            // Only the operator's own apply record is read (drift.rs); drop the others.
            .modify(|p: &mut NetworkPolicy| {
                if let Some(fields) = p.metadata.managed_fields.as_mut() {
                    fields.retain(|f| f.manager.as_deref() == Some(FIELD_MANAGER));
                }
            })
            .reflect_in_place(writer);
        let policy_targets = targets(policy_events, "networkpolicies", owner_of);

        // DeserializeGuard: one object the operator cannot parse (say, stored under an older
        // schema) is reported on its own instead of failing the whole watch.
        let (workloads, writer) = reflector::store();
        let objects = Arc::new(PerObject::default());
        let pruner = objects.clone();
        let mut changes = SpecChanges::default();
        let workloads_watch = Arc::new(WorkloadsWatch::default());
        let freshness = workloads_watch.clone();
        let workload_events = watcher(api::<Workload>(client, ns), watch_config(None, lists))
            .default_backoff()
            .modify(super::slim::workload)
            .reflect_in_place(writer)
            // After the cache has the event, before its trigger is sent: update freshness and what
            // is remembered per workload (PerObject::observe).
            .inspect(move |event| {
                freshness.observe(event);
                if let Ok(event) = event {
                    pruner.observe(event);
                }
            })
            .filter(move |event| std::future::ready(event.as_ref().map_or(true, |e| changes.asks_for_reconcile(e))));
        let workload_targets =
            targets(workload_events, "managedworkloads", |mw: &Workload| Some(ObjectRef::from_obj(mw)));
        // One task drives all seven watches, so events and cache updates are handled one at a time
        // in arrival order.
        let all = futures::stream::select_all([
            deployment_targets,
            replica_set_targets,
            pod_targets,
            claim_targets,
            service_targets,
            policy_targets,
            workload_targets,
        ]);
        tokio::spawn(fan_out(all, triggers.clone(), metrics));

        Caches {
            namespace,
            deployments,
            replica_sets,
            pods,
            claims,
            services,
            network_policies,
            workloads,
            workloads_watch,
            pod_index,
            objects,
            triggers,
        }
    }

    /// The status `mw` has as far as the operator knows (`PerObject::previous_status`).
    pub fn previous_status(&self, mw: &ManagedWorkload) -> Option<crate::resource::ManagedWorkloadStatus> {
        let latest = mw.namespace().and_then(|ns| self.workloads.get(&ObjectRef::new(&mw.name_any()).within(&ns)));
        self.objects.previous_status(mw, latest.as_ref().and_then(|l| l.0.as_ref().ok()))
    }

    pub async fn ready(&self) -> bool {
        self.deployments.wait_until_ready().await.is_ok()
            && self.replica_sets.ready().await
            && self.pods.wait_until_ready().await.is_ok()
            && self.claims.wait_until_ready().await.is_ok()
            && self.services.wait_until_ready().await.is_ok()
            && self.network_policies.wait_until_ready().await.is_ok()
            && self.workloads.wait_until_ready().await.is_ok()
    }
}

/// How far the workloads' cache can be trusted. Each watch is its own stream: after an API
/// server restart another watch may re-list and trigger reconciles while this one still
/// lists, holding a workload re-created during the gap as it was. Reconciling from that
/// creates objects for the deleted workload, which garbage collection then deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Freshness {
    /// Listed, and following every change since.
    Current,
    /// Listing, the first time or again (the cache mixes new and pre-gap objects). Its end
    /// reconciles every workload.
    Listing,
    /// Failed, and not yet listing again or back with an event: a resumed watch is silent until
    /// something changes, so the cache may be current or may miss changes.
    Interrupted,
}

impl Freshness {
    fn after<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> Freshness {
        match event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Freshness::Listing,
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => Freshness::Current,
            Err(_) => Freshness::Interrupted,
        }
    }
}

/// The workloads' watch's `Freshness`, shared with the reconciles.
pub struct WorkloadsWatch(AtomicU8);

impl Default for WorkloadsWatch {
    fn default() -> Self {
        WorkloadsWatch(AtomicU8::new(Freshness::Listing as u8))
    }
}

impl WorkloadsWatch {
    fn observe<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) {
        self.0.store(Freshness::after(event) as u8, Ordering::Relaxed);
    }

    pub fn freshness(&self) -> Freshness {
        match self.0.load(Ordering::Relaxed) {
            x if x == Freshness::Current as u8 => Freshness::Current,
            x if x == Freshness::Listing as u8 => Freshness::Listing,
            _ => Freshness::Interrupted,
        }
    }
}

/// The workload an owned object belongs to, from its controller ownerReference.
fn owner_of(deployment: &impl Resource) -> Option<ObjectRef<Workload>> {
    let owner = deployment.owner_references().iter().find(|o| {
        o.controller == Some(true)
            && o.kind == ManagedWorkload::kind(&())
            && o.api_version == ManagedWorkload::api_version(&())
    })?;
    Some(ObjectRef::new(&owner.name).within(&deployment.namespace()?))
}

/// What one watch event means for the controller: a trigger, if any, or the watch's failure.
type Target = Result<Option<Trigger>, (&'static str, watcher::Error)>;

/// The triggers of one watch's events. A changed or deleted object triggers the workload `map`
/// names. A re-list triggers nothing until done, then everything: until its end the cache
/// still holds pre-gap objects (`reflect`), and a reconcile from those would not be redone.
fn targets<K: Send + 'static>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    resource: &'static str,
    map: impl Fn(&K) -> Option<ObjectRef<Workload>> + Send + 'static,
) -> futures::stream::BoxStream<'static, Target> {
    events
        .filter_map(move |event| {
            std::future::ready(match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                    Some(Ok(map(&object).map(Trigger::One)))
                }
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                Ok(watcher::Event::InitDone) => Some(Ok(Some(Trigger::All))),
                Err(err) => Some(Err((resource, err))),
            })
        })
        .boxed()
}

/// Which ManagedWorkload events ask for a reconcile: a new generation, new labels, a new owner
/// (an annotation, so no new generation; a handed-over container's claims must move at once),
/// and the end of a re-list. The operator's status writes change none of these, so they do
/// not echo back. Keeps one hash per workload UID.
#[derive(Default)]
struct SpecChanges {
    seen: ByUid<u64>,
}

impl SpecChanges {
    fn asks_for_reconcile(&mut self, event: &watcher::Event<Workload>) -> bool {
        let hash = |mw: &Workload| predicates::generation.combine(predicates::labels).combine(owner).hash_property(mw);
        let changed = self.seen.observe(event, hash);
        match event {
            // One that cannot be told apart from its last sighting is reconciled.
            watcher::Event::Apply(mw) => changed || mw.uid().is_none() || hash(mw).is_none(),
            watcher::Event::InitDone => true,
            _ => false,
        }
    }
}

/// The workload's owner (`OWNER_ANNOTATION`), as a predicate's hash.
fn owner(mw: &Workload) -> Option<u64> {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let owner = mw.annotations().get(OWNER_ANNOTATION)?;
    Some(BuildHasherDefault::<DefaultHasher>::default().hash_one(owner))
}

/// Drive the watches (which fill the caches) and send each event's workload to the
/// subscribed controller, if any.
async fn fan_out(
    events: impl futures::Stream<Item = Target>,
    triggers: broadcast::Sender<Trigger>,
    metrics: Arc<Metrics>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(Some(target)) => {
                // No receiver (a standby, or between terms) is fine: a new leader reconciles all.
                let _ = triggers.send(target);
            }
            Ok(None) => {}
            Err((resource, err)) => {
                metrics.watch_restarted(resource);
                warn!(resource, error = %err, "watch failed; retrying with backoff");
            }
        }
    }
}

/// The triggers from now on; a gap (buffer overflow) asks for a reconcile of everything
/// through `resync`.
pub fn subscribe(
    triggers: &broadcast::Sender<Trigger>,
    resync: mpsc::UnboundedSender<()>,
) -> impl futures::Stream<Item = ObjectRef<Workload>> + Send + 'static {
    futures::stream::unfold((triggers.subscribe(), resync), |(mut rx, resync)| async move {
        loop {
            match rx.recv().await {
                Ok(Trigger::One(target)) => return Some((target, (rx, resync))),
                Ok(Trigger::All) => {
                    let _ = resync.send(());
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    warn!(missed, "the controller fell behind its watches; reconciling every workload");
                    let _ = resync.send(());
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;

    #[test]
    fn owned_deployments_map_to_their_controller_only() {
        let mut d = Deployment::default();
        d.metadata.namespace = Some("a".into());
        let owner = |kind: &str, controller| k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: ManagedWorkload::api_version(&()).into(),
            kind: kind.into(),
            name: format!("{kind}-owner"),
            uid: "u".into(),
            controller: Some(controller),
            ..Default::default()
        };
        d.metadata.owner_references = Some(vec![owner("ManagedWorkload", false), owner("Other", true)]);
        assert_eq!(owner_of(&d), None);
        d.metadata.owner_references.as_mut().unwrap().push(owner("ManagedWorkload", true));
        assert_eq!(owner_of(&d), Some(ObjectRef::new("ManagedWorkload-owner").within("a")));
    }

    fn workload(uid: &str, generation: i64, team: &str) -> Workload {
        let mut mw = ManagedWorkload::new("web", Default::default());
        mw.metadata.namespace = Some("a".into());
        mw.metadata.uid = Some(uid.into());
        mw.metadata.generation = Some(generation);
        mw.metadata.labels = Some([("team".to_string(), team.to_string())].into());
        kube::core::DeserializeGuard(Ok(mw))
    }

    #[test]
    fn the_workloads_cache_is_current_once_listed_or_followed_again() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let failed = || Err(watcher::Error::NoResourceVersion);
        let watch = WorkloadsWatch::default();
        let mut seen = vec![watch.freshness()];
        let events = [Ok(Init), Ok(InitApply(workload("a", 1, "x"))), Ok(InitDone), failed(), Ok(Init), failed()];
        for event in
            events.into_iter().chain([Ok(Apply(workload("a", 2, "x"))), failed(), Ok(Delete(workload("a", 2, "x")))])
        {
            watch.observe(&event);
            seen.push(watch.freshness());
        }
        use Freshness::{Current, Interrupted, Listing};
        assert_eq!(
            seen,
            [Listing, Listing, Listing, Current, Interrupted, Listing, Interrupted, Current, Interrupted, Current]
        );
    }

    #[test]
    fn a_workload_asks_for_a_reconcile_when_its_spec_labels_or_owner_change_not_its_status() {
        use watcher::Event::{Apply, Delete};
        let mut changes = SpecChanges::default();
        assert!(changes.asks_for_reconcile(&Apply(workload("u1", 1, "x"))), "first seen");
        assert!(!changes.asks_for_reconcile(&Apply(workload("u1", 1, "x"))), "a status write");
        assert!(changes.asks_for_reconcile(&Apply(workload("u1", 2, "x"))), "a new generation");
        assert!(changes.asks_for_reconcile(&Apply(workload("u1", 2, "y"))), "new labels");
        let handed_over = |user: &str| {
            let mut mw = workload("u1", 2, "y");
            if let Ok(mw) = &mut mw.0 {
                mw.annotations_mut().insert(OWNER_ANNOTATION.into(), user.into());
            }
            mw
        };
        assert!(changes.asks_for_reconcile(&Apply(handed_over("alice"))), "an owner set");
        assert!(!changes.asks_for_reconcile(&Apply(handed_over("alice"))), "the same owner");
        assert!(changes.asks_for_reconcile(&Apply(handed_over("carol"))), "handed over to another user");
        assert!(changes.asks_for_reconcile(&Apply(workload("u1", 2, "y"))), "the owner removed");
        assert!(!changes.asks_for_reconcile(&Delete(workload("u1", 2, "y"))), "deleted: garbage collection's");
        assert!(changes.asks_for_reconcile(&Apply(workload("u2", 1, "x"))), "a successor under the same name");
    }

    #[test]
    fn a_relist_asks_for_everything_once_done_and_remembers_only_what_it_listed() {
        use watcher::Event::{Apply, Init, InitApply, InitDone};
        let mut changes = SpecChanges::default();
        changes.asks_for_reconcile(&Apply(workload("kept", 1, "x")));
        changes.asks_for_reconcile(&Apply(workload("gone", 1, "x")));
        assert!(!changes.asks_for_reconcile(&Init));
        assert!(!changes.asks_for_reconcile(&InitApply(workload("kept", 1, "x"))));
        assert!(!changes.asks_for_reconcile(&InitApply(workload("new", 1, "x"))));
        assert!(changes.asks_for_reconcile(&InitDone));
        assert!(!changes.asks_for_reconcile(&Apply(workload("kept", 1, "x"))), "listed unchanged");
        assert!(!changes.asks_for_reconcile(&Apply(workload("new", 1, "x"))), "listed, reconciled with everything");
        assert_eq!(changes.seen.len(), 2, "the workload deleted during the gap is forgotten");
    }

    #[tokio::test]
    async fn a_relist_triggers_nothing_until_done_then_everything() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let deployment = |name: &str| {
            let mut d = k8s_openapi::api::apps::v1::Deployment::default();
            d.metadata.name = Some(name.into());
            d
        };
        let events = futures::stream::iter([
            Ok(Init),
            Ok(InitApply(deployment("a"))),
            Ok(InitDone),
            Ok(Apply(deployment("b"))),
            Ok(Delete(deployment("c"))),
        ]);
        let by_name = |d: &k8s_openapi::api::apps::v1::Deployment| Some(ObjectRef::new(&d.name_any()).within("ns"));
        let triggers: Vec<Option<Trigger>> =
            targets(events, "deployments", by_name).map(|t| t.map_err(|_| ()).unwrap()).collect().await;
        let one = |name: &str| Some(Trigger::One(ObjectRef::new(name).within("ns")));
        assert_eq!(triggers, vec![Some(Trigger::All), one("b"), one("c")]);
    }
}
