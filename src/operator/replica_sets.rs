//! Which ReplicaSets belong to which Deployment, so a Pod counts as a workload's only if one
//! of its Deployment's ReplicaSets owns it. With labels alone, anyone who can create a Pod with
//! the workload's labels could hold it out of `Running` or put their Pod's IP in its status
//! (and so in Manager's routing). Kept as an index (ReplicaSet UID → controller UID), not a
//! cache of ReplicaSets: that is all the operator reads of them.

use std::sync::Mutex;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use tokio::sync::watch;

use super::by_uid::{ByUid, Uid};

#[derive(Debug)]
pub struct ReplicaSets {
    /// ReplicaSet UID → its controlling Deployment's UID.
    owners: Mutex<ByUid<Uid>>,
    /// Turns true once the first list has been indexed.
    synced: watch::Sender<bool>,
}

impl Default for ReplicaSets {
    fn default() -> Self {
        ReplicaSets { owners: Mutex::default(), synced: watch::channel(false).0 }
    }
}

/// The UID of `object`'s controller, from its controller ownerReference of kind `kind`.
fn controller_uid<'a>(
    refs: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    kind: &str,
) -> Option<&'a str> {
    refs.iter().find(|o| o.controller == Some(true) && o.kind == kind).map(|o| o.uid.as_str())
}

impl ReplicaSets {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByUid<Uid>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn observe(&self, event: &watcher::Event<PartialObjectMeta<ReplicaSet>>) {
        let owner =
            |rs: &PartialObjectMeta<ReplicaSet>| controller_uid(rs.owner_references(), "Deployment").map(Uid::of);
        self.lock().observe(event, owner);
        if matches!(event, watcher::Event::InitDone) {
            self.synced.send_replace(true);
        }
    }

    /// Resolves once the first list has been indexed (false if that can no longer happen).
    pub async fn ready(&self) -> bool {
        self.synced.subscribe().wait_for(|s| *s).await.is_ok()
    }

    /// `pod`'s controller is a ReplicaSet that the Deployment with UID `deployment` controls.
    pub fn owns(&self, deployment: &str, pod: &Pod) -> bool {
        let Some(rs) = controller_uid(pod.owner_references(), "ReplicaSet") else { return false };
        self.lock().get(rs).is_some_and(|owner| *owner == Uid::of(deployment))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owner(kind: &str, uid: &str) -> OwnerReference {
        OwnerReference { kind: kind.into(), uid: uid.into(), controller: Some(true), ..Default::default() }
    }

    fn rs(uid: &str, deployment: &str) -> PartialObjectMeta<ReplicaSet> {
        let mut rs = PartialObjectMeta::<ReplicaSet>::default();
        rs.metadata.uid = Some(uid.into());
        rs.metadata.owner_references = Some(vec![owner("Deployment", deployment)]);
        rs
    }

    fn pod(owners: Vec<OwnerReference>) -> Pod {
        let mut p = Pod::default();
        p.metadata.owner_references = Some(owners);
        p
    }

    #[test]
    fn a_pod_counts_only_through_its_deployment_s_replica_sets() {
        let index = ReplicaSets::default();
        for e in [watcher::Event::Init, watcher::Event::InitApply(rs("rs-1", "d-1")), watcher::Event::InitDone] {
            index.observe(&e);
        }
        assert!(index.owns("d-1", &pod(vec![owner("ReplicaSet", "rs-1")])));
        assert!(!index.owns("d-2", &pod(vec![owner("ReplicaSet", "rs-1")])), "another Deployment's");
        assert!(!index.owns("d-1", &pod(vec![])), "a bare Pod with the right labels");
        assert!(!index.owns("d-1", &pod(vec![owner("ReplicaSet", "forged")])), "a ReplicaSet nobody knows");
        let not_controller = OwnerReference { controller: None, ..owner("ReplicaSet", "rs-1") };
        assert!(!index.owns("d-1", &pod(vec![not_controller])), "an owner that is not the controller");

        index.observe(&watcher::Event::Apply(rs("rs-2", "d-1")));
        assert!(index.owns("d-1", &pod(vec![owner("ReplicaSet", "rs-2")])), "a new revision");
        index.observe(&watcher::Event::Delete(rs("rs-1", "d-1")));
        assert!(!index.owns("d-1", &pod(vec![owner("ReplicaSet", "rs-1")])));
        // A re-list after a watch gap that hid a deletion.
        for e in [watcher::Event::Init, watcher::Event::InitApply(rs("rs-3", "d-3")), watcher::Event::InitDone] {
            index.observe(&e);
        }
        assert_eq!(index.len(), 1);
        assert!(index.owns("d-3", &pod(vec![owner("ReplicaSet", "rs-3")])));
    }

    #[tokio::test]
    async fn ready_once_listed() {
        let index = ReplicaSets::default();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), index.ready()).await;
        assert!(waiting.is_err(), "not before the first list");
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitDone);
        assert!(index.ready().await);
    }
}
