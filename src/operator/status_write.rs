//! The status write: the whole status in one JSON patch whose first operation tests the
//! workload's UID.
//!
//! Why not server-side apply, as for the objects the operator owns: the API server checks no
//! UID on the status subresource. Its strategy takes the stored object's metadata for the
//! written one, so an apply to `/status` that carries another object's UID succeeds (tried
//! on 1.36.3). A reconcile slow enough for its workload to be deleted and re-created under the
//! same name would then write the deleted workload's status (`Ready`, at generation 1) onto a
//! successor that has not started, and `kubectl wait --for=condition=Ready` on the successor
//! would return at once. A JSON patch's `test` is evaluated against the stored object before
//! anything is written, so that write is refused instead. Setting `/status` whole removes what
//! the operator stops reporting (a Pod IP that is gone), as the apply did; no resourceVersion is
//! sent, so spec writers never make it conflict.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, TestOperation};
use kube::api::Patch;
use kube::{Api, Client, ResourceExt};

use super::ownership::FIELD_MANAGER;
use super::slim::StatusWritten;
use crate::resource::{ManagedWorkload, ManagedWorkloadStatus};

/// What a status write came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// Written; the resourceVersion it made.
    Version(Option<String>),
    /// Not written: the workload of that name is not the one the status was derived for (it
    /// was deleted, and maybe re-created). Its successor is reconciled on its own.
    Superseded,
}

/// The patch: test the UID, then set the status whole.
pub fn patch(mw: &ManagedWorkload, status: &ManagedWorkloadStatus) -> Result<json_patch::Patch, serde_json::Error> {
    let mut operations = Vec::with_capacity(2);
    // Every workload read from the API server has a UID; one without has nothing to test.
    if let Some(uid) = &mw.metadata.uid {
        operations.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "uid"]),
            value: uid.as_str().into(),
        }));
    }
    operations.push(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["status"]),
        value: serde_json::to_value(status)?,
    }));
    Ok(json_patch::Patch(operations))
}

/// Writes `status` to `mw`, unless the workload of its name is another one by now.
pub async fn write(
    client: &Client,
    mw: &ManagedWorkload,
    status: &ManagedWorkloadStatus,
) -> Result<Written, kube::Error> {
    let name = mw.name_any();
    let namespace = mw.namespace().unwrap_or_default();
    let api: Api<StatusWritten> = Api::namespaced(client.clone(), &namespace);
    let params = crate::client::patch_params(FIELD_MANAGER);
    let patch = Patch::Json::<()>(patch(mw, status).map_err(kube::Error::SerdeError)?);
    match api.patch_status(&name, &params, &patch).await {
        Ok(written) => Ok(Written::Version(written.resource_version())),
        // A failed `test` is a 422, as a status the schema refuses would be; one GET of the
        // metadata tells them apart without reading the API server's wording.
        Err(kube::Error::Api(refused)) if refused.code == 422 && is_gone(client, mw).await => Ok(Written::Superseded),
        Err(kube::Error::Api(refused)) if refused.code == 404 => Ok(Written::Superseded),
        Err(err) => Err(err),
    }
}

/// Whether the workload of `mw`'s name is absent or has another UID. A failed GET answers no,
/// so the write's own error is what is reported.
async fn is_gone(client: &Client, mw: &ManagedWorkload) -> bool {
    let workloads: Api<ManagedWorkload> = Api::namespaced(client.clone(), &mw.namespace().unwrap_or_default());
    match workloads.get_metadata_opt(&mw.name_any()).await {
        Ok(current) => current.and_then(|c| c.metadata.uid) != mw.metadata.uid,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Phase;

    #[test]
    fn the_patch_tests_the_uid_before_it_sets_the_status() {
        let mut mw = ManagedWorkload::new("web", Default::default());
        mw.metadata.uid = Some("u1".into());
        let status = ManagedWorkloadStatus { phase: Some(Phase::Running), ..Default::default() };
        let patch = serde_json::to_value(patch(&mw, &status).unwrap()).unwrap();
        assert_eq!(
            patch,
            serde_json::json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "add", "path": "/status", "value": serde_json::to_value(&status).unwrap()},
            ])
        );
        assert_eq!(patch[1]["value"]["phase"], "Running");
    }

    #[test]
    fn a_workload_without_a_uid_has_its_status_set_untested() {
        let mw = ManagedWorkload::new("web", Default::default());
        let patch = serde_json::to_value(patch(&mw, &ManagedWorkloadStatus::default()).unwrap()).unwrap();
        assert_eq!(patch.as_array().map(Vec::len), Some(1));
        assert_eq!(patch[0]["op"], "add");
    }
}
