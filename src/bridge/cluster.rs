//! The bridge's view of the cluster and its writes: caches of the ManagedWorkloads and
//! Secrets it made (label-selected, in the namespaces it serves), and the few calls that
//! change them. I/O only; what to write is decided in `plan`.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::InitialListStrategy;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use tokio::sync::Notify;
use tracing::warn;

use super::cached::{CachedSecret, CachedWorkload};
use super::error::BridgeError;
use super::mapping::owner_reference;
use super::metrics::Metrics;
use crate::names::SYNCED_BY_LABEL;
use crate::reflect::{ReflectInPlace, initial_lists, watch_config};
use crate::resource::ManagedWorkload;
use crate::write::{Write, delete_by_uid, found_another};

pub struct Cluster {
    client: Client,
    field_manager: String,
    workloads: HashMap<String, Store<CachedWorkload>>,
    secrets: HashMap<String, Store<CachedSecret>>,
    metrics: Arc<Metrics>,
}

impl Cluster {
    /// Check access, then watch `namespaces`. `changed` is notified on every change of a watched
    /// ManagedWorkload (its status flows back to Manager).
    pub async fn start(
        clients: &crate::client::Clients,
        namespaces: &[String],
        field_manager: &str,
        changed: Arc<Notify>,
        metrics: Arc<Metrics>,
    ) -> Result<Cluster, BridgeError> {
        // Reads and writes on the request client (bounded); the watches on their own client, which
        // waits as long as the API server may leave a watch silent.
        let client = clients.requests.clone();
        let watches = clients.watches.clone();
        let selector = format!("{SYNCED_BY_LABEL}={field_manager}");
        let mut workloads = HashMap::new();
        let mut secrets = HashMap::new();
        for ns in namespaces {
            // At start-up, naming what is missing, instead of a forbidden watch retried forever.
            let denied = |resource: &str| {
                let operation = format!(
                    "listing {resource} in namespace {ns} (check the bridge's RBAC: config/rbac/bridge-role.yaml)"
                );
                move |source| BridgeError::Kube { operation, source }
            };
            crate::client::may_list::<ManagedWorkload>(&client, Some(ns)).await.map_err(denied("managedworkloads"))?;
            crate::client::may_list::<Secret>(&client, Some(ns)).await.map_err(denied("secrets"))?;
        }
        // One API server answers for every namespace.
        let lists = match namespaces.first() {
            Some(ns) => initial_lists(&Api::<ManagedWorkload>::namespaced(client.clone(), ns)).await,
            None => InitialListStrategy::default(),
        };
        for ns in namespaces {
            let config = watch_config(Some(&selector), lists.clone());

            let (store, writer) = reflector::store();
            let notify = changed.clone();
            // Trimmed as they are read (`cached`); the rest would be most of the bridge's memory.
            let stream = watcher(Api::<CachedWorkload>::namespaced(watches.clone(), ns), config.clone())
                .default_backoff()
                .reflect_in_place(writer)
                .for_each(move |event| {
                    if let Err(err) = &event {
                        warn!(error = %err, "ManagedWorkload watch failed; retrying with backoff");
                    }
                    notify.notify_one();
                    async {}
                });
            tokio::spawn(stream);
            workloads.insert(ns.clone(), store);

            // Metadata only: the bridge needs to know its Secrets exist, never their values.
            let (store, writer) = reflector::store();
            let stream = watcher(Api::<PartialObjectMeta<Secret>>::namespaced(watches.clone(), ns), config)
                .default_backoff()
                .map_ok(|event| trimmed(event, CachedSecret::from))
                .reflect_in_place(writer)
                .for_each(|event| {
                    if let Err(err) = &event {
                        warn!(error = %err, "Secret watch failed; retrying with backoff");
                    }
                    async {}
                });
            tokio::spawn(stream);
            secrets.insert(ns.clone(), store);
        }
        Ok(Cluster { client, field_manager: field_manager.to_string(), workloads, secrets, metrics })
    }

    /// Wait until every cache holds a first complete list.
    pub async fn ready(&self) {
        for store in self.workloads.values() {
            let _ = store.wait_until_ready().await;
        }
        for store in self.secrets.values() {
            let _ = store.wait_until_ready().await;
        }
    }

    /// Whether this bridge watches `namespace` (its caches hold all of its own CRs there).
    pub fn watches(&self, namespace: &str) -> bool {
        self.workloads.contains_key(namespace)
    }

    pub fn workload(&self, namespace: &str, name: &str) -> Option<Arc<CachedWorkload>> {
        self.workloads.get(namespace)?.get(&ObjectRef::new(name).within(namespace))
    }

    /// Every ManagedWorkload this bridge made, in every namespace it serves.
    pub fn workloads(&self) -> Vec<Arc<CachedWorkload>> {
        self.workloads.values().flat_map(Store::state).collect()
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<CachedSecret>> {
        self.secrets.get(namespace)?.get(&ObjectRef::new(name).within(namespace))
    }

    pub fn secrets(&self) -> Vec<Arc<CachedSecret>> {
        self.secrets.values().flat_map(Store::state).collect()
    }

    pub async fn get_workload(&self, namespace: &str, name: &str) -> Result<Option<ManagedWorkload>, kube::Error> {
        Api::<ManagedWorkload>::namespaced(self.client.clone(), namespace).get_opt(name).await
    }

    pub async fn get_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PartialObjectMeta<Secret>>, kube::Error> {
        Api::<Secret>::namespaced(self.client.clone(), namespace).get_metadata_opt(name).await
    }

    /// Server-side apply under the bridge's field manager, as `write` says; counted by
    /// `metric` ("workload_apply", "secret_apply").
    pub async fn apply<K>(&self, object: &K, write: Write<'_>, metric: &'static str) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let (namespace, name) = names(object.meta());
        let api = Api::<K>::namespaced(self.client.clone(), namespace);
        let applied = write.apply(&api, name, object, &self.field_manager).await?;
        self.metrics.wrote(metric);
        Ok(applied)
    }

    /// A new row's writes: its env Secret first, so it exists before anything uses it; the
    /// ManagedWorkload, create-only; then the Secret again, by UID, owned by the CR. A Secret of
    /// ours left by an earlier container (`earlier`) is deleted first, by UID: rewriting it would
    /// keep keys another writer owns. Every write is create-only or bound to a UID: someone else's
    /// Secret of that name refuses the create, so no CR uses it; a CR made meanwhile refuses ours,
    /// and the Secret just written is deleted again.
    pub async fn create_with_secret(
        &self,
        mw: &ManagedWorkload,
        mut secret: Secret,
        earlier: Option<&str>,
    ) -> Result<(), (CreateStep, kube::Error)> {
        let (namespace, name) = names(&secret.metadata);
        if let Some(uid) = earlier {
            self.delete_secret(namespace, name, uid).await.map_err(|e| (CreateStep::Earlier, e))?;
        }
        let written = self.apply(&secret, Write::Create, "secret_apply").await.map_err(|e| (CreateStep::Secret, e))?;
        let uid = written.metadata.uid.unwrap_or_default();
        let created = match self.apply(mw, Write::Create, "workload_apply").await {
            Ok(created) => created,
            Err(taken) => {
                if found_another(&taken) {
                    self.delete_secret(namespace, name, &uid).await.map_err(|e| (CreateStep::Undo, e))?;
                }
                return Err((CreateStep::Workload, taken));
            }
        };
        secret.metadata.owner_references = owner_reference(&created).map(|owner| vec![owner]);
        self.apply(&secret, Write::Update { uid: Some(&uid) }, "secret_apply")
            .await
            .map_err(|e| (CreateStep::Owner, e))?;
        Ok(())
    }

    /// The API server's clock, to the second, from the `Date` header of `GET /version` (which
    /// every authenticated user may read).
    pub async fn server_time(&self) -> Result<Timestamp, BridgeError> {
        let failed = |why: String| BridgeError::Config(format!("reading the API server's clock: {why}"));
        let request =
            hyper::Request::get("/version").body(kube::client::Body::empty()).map_err(|e| failed(e.to_string()))?;
        let response = self.client.send(request).await.map_err(|source| BridgeError::Kube {
            operation: "reading the API server's clock (GET /version)".into(),
            source,
        })?;
        let date = response.headers().get(hyper::header::DATE).ok_or_else(|| failed("no Date header".into()))?;
        let date = date.to_str().map_err(|e| failed(e.to_string()))?;
        parse_http_date(date).ok_or_else(|| failed(format!("the Date header {date:?} is not an HTTP date")))
    }

    /// Delete a ManagedWorkload only if it is still the object of `uid`. Its Deployment, Pods and
    /// Secret follow through garbage collection.
    pub async fn delete_workload(&self, namespace: &str, name: &str, uid: &str) -> Result<(), kube::Error> {
        let api = Api::<ManagedWorkload>::namespaced(self.client.clone(), namespace);
        if delete_by_uid(&api, name, uid).await? {
            self.metrics.wrote("workload_delete");
        }
        Ok(())
    }

    pub async fn delete_secret(&self, namespace: &str, name: &str, uid: &str) -> Result<(), kube::Error> {
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        if delete_by_uid(&api, name, uid).await? {
            self.metrics.wrote("secret_delete");
        }
        Ok(())
    }
}

/// A watch event with its object trimmed to what a cache keeps.
fn trimmed<K, C>(event: watcher::Event<K>, trim: impl Fn(K) -> C) -> watcher::Event<C> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(trim(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(trim(object)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(trim(object)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Which write of `Cluster::create_with_secret` failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateStep {
    /// Deleting the bridge's Secret of that name left by an earlier container.
    Earlier,
    /// Writing the env Secret (nothing else was written).
    Secret,
    /// Creating the ManagedWorkload (the Secret just written is deleted when someone else has
    /// a CR of that name).
    Workload,
    /// Deleting the Secret just written, the CR's name being taken.
    Undo,
    /// Giving the Secret its CR as owner.
    Owner,
}

/// An HTTP `Date` header (RFC 9110's IMF-fixdate, `Tue, 15 Nov 1994 08:12:31 GMT`).
pub fn parse_http_date(text: &str) -> Option<Timestamp> {
    k8s_openapi::jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(text.trim()).ok()
}

fn names(meta: &kube::api::ObjectMeta) -> (&str, &str) {
    (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates() {
        assert_eq!(parse_http_date("Tue, 15 Nov 1994 08:12:31 GMT"), Some("1994-11-15T08:12:31Z".parse().unwrap()));
        assert_eq!(parse_http_date("Tue, 21 Jul 2026 09:12:40 GMT "), Some("2026-07-21T09:12:40Z".parse().unwrap()));
        assert_eq!(parse_http_date("yesterday"), None);
    }
}
