//! Server-side apply of an owned object, as the apply decision (`plan::decide`) says: the one
//! write every owned kind (the Deployment, the claims, the Service) is made with.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ownership::FIELD_MANAGER;
use super::plan::Mode;
use crate::metrics::Metrics;

/// Apply `desired` as `name` under the operator's field manager, counted as a write of
/// `resource`. Updating, forced (controllers own their fields). Creating, neither forced nor
/// able to touch an existing object: the resourceVersion precondition "1" matches no stored
/// object (etcd's first write is revision 2) and is ignored when the object is created, so an
/// object that appeared since it was looked for answers 409 instead of being merged into.
pub async fn apply<K>(
    metrics: &Metrics,
    resource: &'static str,
    api: &Api<K>,
    name: &str,
    desired: &K,
    mode: Mode,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    metrics.wrote(resource, "apply");
    let mut params = PatchParams::apply(FIELD_MANAGER);
    params.force = mode.force();
    if mode.force() {
        return api.patch(name, &params, &Patch::Apply(desired)).await;
    }
    let mut create_only = desired.clone();
    create_only.meta_mut().resource_version = Some("1".into());
    api.patch(name, &params, &Patch::Apply(&create_only)).await
}
