//! The bridge's view of the cluster and its writes: caches of the ManagedWorkloads and
//! Secrets it made (label-selected, in the namespaces it serves), and the few calls that
//! change them. I/O only; what to write is decided in `plan`.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::InitialListStrategy;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use tokio::sync::Notify;
use tracing::warn;

use super::cached::{CachedSecret, CachedWorkload};
use super::error::BridgeError;
use super::mapping::{SYNCED_BY_LABEL, owner_reference};
use super::metrics::Metrics;
use crate::reflect::{ReflectInPlace, initial_lists, watch_config};
use crate::resource::ManagedWorkload;

pub struct Cluster {
    client: Client,
    field_manager: String,
    workloads: HashMap<String, Store<CachedWorkload>>,
    secrets: HashMap<String, Store<CachedSecret>>,
    metrics: Arc<Metrics>,
}

impl Cluster {
    /// Check access, then start watching `namespaces`. `changed` is notified on every change
    /// of a watched ManagedWorkload (its status is what flows back to Manager).
    pub async fn start(
        clients: &crate::client::Clients,
        namespaces: &[String],
        field_manager: &str,
        changed: Arc<Notify>,
        metrics: Arc<Metrics>,
    ) -> Result<Cluster, BridgeError> {
        // Reads and writes on the request client (every request bounded); the watches on a
        // client of their own, which waits as long as the API server may leave a watch silent.
        let client = clients.requests.clone();
        let watches = clients.watches.clone();
        let selector = format!("{SYNCED_BY_LABEL}={field_manager}");
        let mut workloads = HashMap::new();
        let mut secrets = HashMap::new();
        for ns in namespaces {
            check_access::<ManagedWorkload>(&client, ns, "managedworkloads").await?;
            check_access::<Secret>(&client, ns, "secrets").await?;
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
            // Trimmed as they are read (`cached`): at thousands of rows, what the bridge does
            // not read of its CRs and Secrets would be most of its memory.
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

            // Metadata only (kube asks the API server for metadata only): the bridge needs to
            // know its Secrets exist, never to hold their values.
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

    pub fn workload(&self, namespace: &str, name: &str) -> Option<Arc<CachedWorkload>> {
        self.workloads.get(namespace)?.get(&ObjectRef::new(name).within(namespace))
    }

    /// Every ManagedWorkload this bridge made, in every namespace it serves.
    pub fn workloads(&self) -> Vec<Arc<CachedWorkload>> {
        self.workloads.values().flat_map(Store::state).collect()
    }

    pub fn secret_present(&self, namespace: &str, name: &str) -> bool {
        self.secrets.get(namespace).is_some_and(|s| s.get(&ObjectRef::new(name).within(namespace)).is_some())
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

    /// Server-side apply under the bridge's field manager, as `write` says.
    pub async fn apply_workload(&self, mw: &ManagedWorkload, write: Write) -> Result<ManagedWorkload, kube::Error> {
        let (namespace, name) = names(&mw.metadata);
        let api = Api::<ManagedWorkload>::namespaced(self.client.clone(), namespace);
        let applied = api.patch(name, &self.apply_params(write), &Patch::Apply(write.prepare(mw))).await?;
        self.metrics.wrote("workload_apply");
        Ok(applied)
    }

    pub async fn apply_secret(&self, secret: &Secret, write: Write) -> Result<(), kube::Error> {
        let (namespace, name) = names(&secret.metadata);
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        api.patch(name, &self.apply_params(write), &Patch::Apply(write.prepare(secret))).await?;
        self.metrics.wrote("secret_apply");
        Ok(())
    }

    /// A new row's two writes: create its ManagedWorkload (create-only), then its env Secret
    /// (`write`: created, or updated where the bridge's own is there already), owned by the
    /// CR from that write on. A Secret of that name that is someone else's after all (made
    /// since the bridge looked) must not reach the new workload's Pod: the CR is deleted (by
    /// its UID) before the Secret's 409 is returned.
    pub async fn create_with_secret(
        &self,
        mw: &ManagedWorkload,
        mut secret: Secret,
        write: Write,
    ) -> Result<(), (CreateStep, kube::Error)> {
        let created = self.apply_workload(mw, Write::Create).await.map_err(|e| (CreateStep::Workload, e))?;
        secret.metadata.owner_references = owner_reference(&created).map(|owner| vec![owner]);
        match self.apply_secret(&secret, write).await {
            Err(taken) if found_another(&taken) => {
                let (namespace, name) = names(&created.metadata);
                if let Some(uid) = &created.metadata.uid {
                    self.delete_workload(namespace, name, uid).await.map_err(|e| (CreateStep::Undo, e))?;
                }
                Err((CreateStep::Secret, taken))
            }
            written => written.map_err(|e| (CreateStep::Secret, e)),
        }
    }

    /// Give the Secret `uid` names its owner, in a patch of its owner references alone (it
    /// carries no data): if it is no longer that Secret (deleted, or deleted and made
    /// again), nothing is written.
    pub async fn set_secret_owner(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        owner: &OwnerReference,
    ) -> Result<(), kube::Error> {
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        // The UID in a patch is a precondition: the API server refuses to change it.
        let patch = serde_json::json!({"metadata": {"uid": uid, "ownerReferences": [owner]}});
        let params = crate::client::patch_params(&self.field_manager);
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                self.metrics.wrote("secret_owner");
                Ok(())
            }
            Err(err) if found_another(&err) || matches!(&err, kube::Error::Api(s) if s.code == 404) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// The API server's clock now, from the `Date` header of its answer to `GET /version`
    /// (which every authenticated user may read), to the second.
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

    /// Delete a ManagedWorkload if it is still the object `uid` names (never one someone
    /// re-created under the same name since). Its Deployment, Pods and Secret follow through
    /// garbage collection.
    pub async fn delete_workload(&self, namespace: &str, name: &str, uid: &str) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let api = Api::<ManagedWorkload>::namespaced(self.client.clone(), namespace);
        ignore_gone(api.delete(name, &params).await.map(|_| self.metrics.wrote("workload_delete")))
    }

    pub async fn delete_secret(&self, namespace: &str, name: &str, uid: &str) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
            ..Default::default()
        };
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        ignore_gone(api.delete(name, &params).await.map(|_| self.metrics.wrote("secret_delete")))
    }

    fn apply_params(&self, write: Write) -> PatchParams {
        let params = crate::client::apply_params(&self.field_manager);
        if write == Write::Update { params.force() } else { params }
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
    /// Creating the ManagedWorkload.
    Workload,
    /// Writing its Secret (the CR, if created, is deleted when the Secret is someone else's).
    Secret,
    /// Deleting the CR just created, its Secret being someone else's.
    Undo,
}

/// How an apply may touch what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Create, and only create: not forced, and with the resourceVersion precondition "1",
    /// which no stored object has (etcd's first write is revision 2) and which is ignored
    /// when the object is created. An object of that name made since the bridge looked
    /// (someone's own ManagedWorkload or Secret) answers 409 instead of being merged into and
    /// taken over, as a plain apply would where its fields agree. (The operator creates its
    /// objects the same way: `operator::apply`.)
    Create,
    /// Update the bridge's own object, forced: the fields it sets are its own. The object's
    /// `metadata.uid`, when set, must be the stored one's (else 409).
    Update,
}

impl Write {
    fn prepare<K: Resource + Clone>(self, object: &K) -> std::borrow::Cow<'_, K> {
        match self {
            Write::Create => {
                let mut create_only = object.clone();
                create_only.meta_mut().resource_version = Some("1".into());
                std::borrow::Cow::Owned(create_only)
            }
            Write::Update => std::borrow::Cow::Borrowed(object),
        }
    }
}

/// Did a write find another object than the one it was for? A create-only apply, one that
/// exists (409); an update naming the UID it read, one deleted and made again since (the API
/// server refuses to change `metadata.uid`: 409, or 422 on that field).
pub fn found_another(err: &kube::Error) -> bool {
    let kube::Error::Api(status) = err else { return false };
    let on_uid = || status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"));
    status.code == 409 || (status.code == 422 && on_uid())
}

/// An HTTP `Date` header (RFC 9110's IMF-fixdate, `Tue, 15 Nov 1994 08:12:31 GMT`).
pub fn parse_http_date(text: &str) -> Option<Timestamp> {
    k8s_openapi::jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(text.trim()).ok()
}

fn names(meta: &kube::api::ObjectMeta) -> (&str, &str) {
    (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

/// Already gone (404) or already replaced (409 on the UID precondition): nothing to delete.
fn ignore_gone(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        other => other,
    }
}

/// Fail at start-up, naming the namespace and resource, when RBAC does not let the bridge
/// list what it must watch, instead of retrying a forbidden watch forever.
async fn check_access<K>(client: &Client, namespace: &str, resource: &str) -> Result<(), BridgeError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map(|_| ())
        .map_err(|source| BridgeError::Kube {
            operation: format!(
                "listing {resource} in namespace {namespace} (check the bridge's RBAC: config/rbac/bridge-role.yaml)"
            ),
            source,
        })
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

    #[test]
    fn another_object_is_a_conflict_or_a_refused_uid() {
        // As the API server answers (the 422 of a changed UID names the field).
        let status = |code: u16, field: &str| {
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                "details": {"causes": [{"reason": "FieldValueInvalid", "field": field}]}});
            kube::Error::Api(Box::new(serde_json::from_value(status).unwrap()))
        };
        assert!(found_another(&status(409, "")));
        assert!(found_another(&status(422, "metadata.uid")));
        assert!(!found_another(&status(422, "spec.image")), "a refused spec is the row's error");
        assert!(!found_another(&status(500, "")));
    }

    #[test]
    fn create_only_never_matches_a_stored_object() {
        let mut mw = ManagedWorkload::new("x", Default::default());
        mw.metadata.resource_version = Some("4711".into());
        assert_eq!(Write::Create.prepare(&mw).metadata.resource_version.as_deref(), Some("1"));
        assert_eq!(Write::Update.prepare(&mw).metadata.resource_version.as_deref(), Some("4711"));
    }
}
