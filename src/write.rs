//! The rule every server-side apply of the operator and the bridge follows: change the object
//! decided on, or nothing. A name is not enough: between the look (cache or GET) and the
//! write, the object may be deleted and someone else's made under that name.

use std::borrow::Cow;

use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Which stored object an apply may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write<'a> {
    /// Create only. Not forced, and with the resourceVersion precondition "1", which no stored
    /// object has (etcd's first write is revision 2) and which is ignored on create: an object
    /// made under that name since the look answers 409 instead of being taken over.
    Create,
    /// The stored object of this UID and no other, forced (the writer owns its fields). The UID
    /// in the body acts as a precondition: the API server refuses to change a stored object's UID
    /// (422 on `metadata.uid`) and answers 409 when none is stored. `None` only where the UID is
    /// unknown, and then any object of the name.
    Update { uid: Option<&'a str> },
}

impl Write<'_> {
    /// Server-side applies `object` as `name` under field manager `manager`, as this write says:
    /// the one apply of the operator's owned objects and of the bridge's CRs and Secrets.
    pub async fn apply<K>(self, api: &Api<K>, name: &str, object: &K, manager: &str) -> Result<K, kube::Error>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    {
        api.patch(name, &self.params(manager), &Patch::Apply(self.prepare(object))).await
    }

    /// Whether the apply takes fields over from other managers.
    pub fn force(self) -> bool {
        matches!(self, Write::Update { .. })
    }

    /// `object` as sent for this write.
    fn prepare<K: Resource + Clone>(self, object: &K) -> Cow<'_, K> {
        match self {
            Write::Create => {
                let mut create_only = object.clone();
                create_only.meta_mut().resource_version = Some("1".into());
                Cow::Owned(create_only)
            }
            Write::Update { uid: Some(uid) } if object.meta().uid.as_deref() != Some(uid) => {
                let mut bound = object.clone();
                bound.meta_mut().uid = Some(uid.to_string());
                Cow::Owned(bound)
            }
            Write::Update { .. } => Cow::Borrowed(object),
        }
    }

    /// The apply's parameters under `manager` (`client::apply_params`), forced for an update.
    fn params(self, manager: &str) -> PatchParams {
        let params = crate::client::apply_params(manager);
        if self.force() { params.force() } else { params }
    }
}

/// Did a write find another object than the one it was for? Create-only: one exists (409).
/// Bound to a UID: the object was re-made since (422 on `metadata.uid`) or is gone (409).
pub fn found_another(err: &kube::Error) -> bool {
    let kube::Error::Api(status) = err else { return false };
    let on_uid = || status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"));
    status.code == 409 || (status.code == 422 && on_uid())
}

/// Delete `name` only if it is still the object of UID `uid`. Returns whether it deleted; an
/// object already gone (404) or replaced (409 on the UID precondition) is no error.
/// Dependents are removed in the background by garbage collection.
pub async fn delete_by_uid<K>(api: &Api<K>, name: &str, uid: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::ManagedWorkload;

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
        assert!(!found_another(&status(422, "spec.image")), "a refused spec is the object's own error");
        assert!(!found_another(&status(500, "")));
    }

    #[test]
    fn create_only_never_matches_a_stored_object_and_an_update_names_its_uid() {
        let mut mw = ManagedWorkload::new("x", Default::default());
        mw.metadata.resource_version = Some("4711".into());
        assert_eq!(Write::Create.prepare(&mw).metadata.resource_version.as_deref(), Some("1"));
        assert!(!Write::Create.force());
        let update = Write::Update { uid: Some("u1") };
        assert!(update.force());
        assert_eq!(update.prepare(&mw).metadata.resource_version.as_deref(), Some("4711"));
        assert_eq!(update.prepare(&mw).metadata.uid.as_deref(), Some("u1"), "bound to the object decided on");
        mw.metadata.uid = Some("u1".into());
        assert!(matches!(update.prepare(&mw), Cow::Borrowed(_)), "already bound: not copied");
        assert_eq!(Write::Update { uid: None }.prepare(&mw).metadata.uid.as_deref(), Some("u1"));
    }
}
