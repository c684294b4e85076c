//! What to do about one owned object, from the desired and the live object, and what the API
//! server's answer to an apply means. Pure, so the decision table is unit-tested, and generic:
//! every owned kind follows the same rules.

use std::time::Duration;

use kube::Resource;
use serde::Serialize;

use super::drift::{self, Live};
use super::ownership::{is_controlled_by, is_departing};
use crate::resource::ManagedWorkload;
use crate::write::{Write, found_another};

/// What to do about one owned object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An object of that name exists and this workload does not control it: never touched,
    /// reported.
    Conflict,
    /// An object of that name is on its way out (`ownership::is_departing`): not touched and
    /// waited for, not reported as a failure (a re-created workload is no conflict).
    Departing,
    /// Applying would change nothing: no write.
    UpToDate,
    Apply(Mode),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Nothing of that name exists: create it, unforced, so it cannot touch an object that
    /// appears meanwhile.
    Create,
    /// Ours and different: apply forced (controllers own their fields). `drift`: applied from
    /// this very desired object, so the difference is someone else's edit (worth an Event).
    Update { drift: bool },
}

impl Mode {
    /// Whether the apply takes fields over from other managers.
    pub fn force(self) -> bool {
        matches!(self, Mode::Update { .. })
    }

    /// The write to send, bound to the UID of the live object the decision was made on.
    pub fn write(self, uid: Option<&str>) -> Write<'_> {
        match self {
            Mode::Create => Write::Create,
            Mode::Update { .. } => Write::Update { uid },
        }
    }
}

pub fn decide<K: Resource + Serialize, L: Live>(mw: &ManagedWorkload, desired: &K, live: Option<&L>) -> Decision {
    decide_by(mw, |live| is_controlled_by(live, mw), desired, live)
}

/// `decide` for a kind whose objects can be the workload's without a controller reference (a
/// retained claim, `claims::is_own`): `own` says whether the live object is ours.
pub fn decide_by<K: Resource + Serialize, L: Live>(
    mw: &ManagedWorkload,
    own: impl Fn(&L) -> bool,
    desired: &K,
    live: Option<&L>,
) -> Decision {
    match live {
        None => Decision::Apply(Mode::Create),
        Some(live) if !own(live) && is_departing(live, mw) => Decision::Departing,
        Some(live) if !own(live) => Decision::Conflict,
        Some(live) if drift::up_to_date(desired, live) => Decision::UpToDate,
        Some(live) => Decision::Apply(Mode::Update { drift: drift::same_desired(desired, live) }),
    }
}

/// What the API server's refusal of an apply means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The write found another object than the one decided on (`write::found_another`): one that
    /// appeared since, or was deleted and re-made since. A fresh look tells whose it is.
    Another,
    /// The API server (400, 422) or admission (a ResourceQuota, a policy, a webhook answering
    /// 403) refused the object: reported with the server's words and rechecked, since a freed
    /// quota or changed policy cures it without a spec change.
    Rejected(String),
    /// Anything else (unreachable, 5xx, 429, an RBAC denial): an error, retried with backoff.
    Retry,
}

/// How soon to look again at a workload whose object appeared while creating it.
pub const APPEARED_RECHECK: Duration = Duration::from_secs(1);

pub fn judge(err: &kube::Error) -> Refusal {
    if found_another(err) {
        return Refusal::Another;
    }
    let kube::Error::Api(status) = err else { return Refusal::Retry };
    match status.code {
        400 | 422 => Refusal::Rejected(status.message.clone()),
        // A namespace being deleted refuses every create, and no edit cures that: an error,
        // which `error_policy` recognises and ends the workload's reconciles with.
        403 if crate::error::is_namespace_terminating(status) => Refusal::Retry,
        403 if !crate::error::is_authorization_denial(status) => Refusal::Rejected(status.message.clone()),
        _ => Refusal::Retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, Operation};
    use crate::operator::deployment;
    use crate::resource::ManagedWorkloadSpec;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    fn workload(uid: &str, image: &str) -> ManagedWorkload {
        let mut mw = ManagedWorkload::new("web", ManagedWorkloadSpec { image: image.into(), ..Default::default() });
        mw.metadata.namespace = Some("apps".into());
        mw.metadata.uid = Some(uid.into());
        mw
    }

    /// `desired` as the API server would store it after the operator applied it: the
    /// operator's Apply entry owns every field it set.
    fn stored(desired: &Deployment) -> Deployment {
        fn fields(value: &serde_json::Value) -> serde_json::Value {
            match value {
                serde_json::Value::Object(map) => {
                    serde_json::Value::Object(map.iter().map(|(k, v)| (format!("f:{k}"), fields(v))).collect())
                }
                // Lists owned whole: enough for these tests, which never edit inside one.
                _ => serde_json::json!({}),
            }
        }
        let mut live = desired.clone();
        let mut want = serde_json::to_value(desired).unwrap();
        want.as_object_mut().unwrap().retain(|k, _| k == "metadata" || k == "spec");
        want["metadata"].as_object_mut().unwrap().retain(|k, _| k != "name" && k != "namespace");
        live.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(super::super::ownership::FIELD_MANAGER.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(fields(&want))),
            ..Default::default()
        }]);
        live
    }

    #[test]
    fn the_decision_table() {
        let mw = workload("u1", "nginx:1");
        let desired = deployment::deployment(&mw, &Default::default()).unwrap();
        let live = stored(&desired);
        assert_eq!(
            decide(&mw, &desired, None::<&Deployment>),
            Decision::Apply(Mode::Create),
            "absent: create, not forced"
        );
        assert!(!Mode::Create.force());
        assert_eq!(decide(&mw, &desired, Some(&live)), Decision::UpToDate, "applied from this spec, untouched");

        let changed = workload("u1", "nginx:2");
        let newer = deployment::deployment(&changed, &Default::default()).unwrap();
        assert_eq!(
            decide(&changed, &newer, Some(&live)),
            Decision::Apply(Mode::Update { drift: false }),
            "a spec change: forced, no drift Event"
        );
        assert!(Mode::Update { drift: false }.force());
        assert_eq!(Mode::Update { drift: false }.write(Some("u1")), Write::Update { uid: Some("u1") }, "bound");
        assert_eq!(Mode::Create.write(Some("u1")), Write::Create);

        let mut edited = live.clone();
        edited.metadata.managed_fields = None;
        assert_eq!(
            decide(&mw, &desired, Some(&edited)),
            Decision::Apply(Mode::Update { drift: true }),
            "a field taken over behind the operator's back: restored, and said so"
        );

        let successor = workload("u2", "nginx:1");
        let successors = deployment::deployment(&successor, &Default::default()).unwrap();
        assert_eq!(
            decide(&successor, &successors, Some(&live)),
            Decision::Departing,
            "a re-created workload of the same name waits for its predecessor's Deployment to be collected"
        );
        let mut foreign = live.clone();
        foreign.metadata.owner_references = None;
        assert_eq!(decide(&mw, &desired, Some(&foreign)), Decision::Conflict, "someone else's: never touched");
        let mut orphaned = foreign.clone();
        orphaned.metadata.owner_references = live.metadata.owner_references.clone();
        orphaned.metadata.owner_references.as_mut().unwrap()[0].name = "other".into();
        assert_eq!(decide(&successor, &successors, Some(&orphaned)), Decision::Conflict, "another workload's");
        orphaned.metadata.owner_references.as_mut().unwrap()[0].kind = "ReplicaSet".into();
        orphaned.metadata.owner_references.as_mut().unwrap()[0].name = "web".into();
        assert_eq!(decide(&successor, &successors, Some(&orphaned)), Decision::Conflict, "not a workload's");
        let mut leaving = foreign.clone();
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(decide(&mw, &desired, Some(&leaving)), Decision::Departing, "being deleted: waited for");
    }

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure(message, "Reason").with_code(code).boxed())
    }

    /// The API server's answer to a create in a namespace being deleted, word for word.
    fn namespace_terminating() -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "reason": "Forbidden", "code": 403,
                "message": "deployments.apps \"web\" is forbidden: unable to create new content in namespace a because it is being terminated",
                "details": {"name": "web", "group": "apps", "kind": "deployments", "causes": [
                    {"reason": "NamespaceTerminating", "message": "namespace a is being terminated", "field": "metadata.namespace"}]}}))
            .unwrap(),
        ))
    }

    #[test]
    fn a_namespace_being_deleted_ends_the_workloads_reconciles_and_nothing_else_does() {
        let err = |source| Error::owned(Operation::Apply, "Deployment", "a", "web", source);
        assert!(err(namespace_terminating()).namespace_terminating());
        assert!(!err(namespace_terminating()).is_permanent(), "not a judgement of the object");
        let quota = r#"deployments.apps "web" is forbidden: exceeded quota: q, requested: count/deployments.apps=1"#;
        for other in [api(403, quota), api(403, "unable to create new content in namespace a"), api(500, "busy")] {
            assert!(!err(other).namespace_terminating());
        }
    }

    #[test]
    fn what_a_refusal_means() {
        assert_eq!(judge(&api(409, "exists")), Refusal::Another, "a create-only apply found one");
        let replaced = kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "code": 422, "message": "metadata.uid: Invalid value: field is immutable",
                "details": {"causes": [{"reason": "FieldValueInvalid", "field": "metadata.uid"}]}}))
            .unwrap(),
        ));
        assert_eq!(judge(&replaced), Refusal::Another, "an update found another object than the one decided on");
        for code in [400, 422] {
            assert_eq!(judge(&api(code, "spec.x: Invalid")), Refusal::Rejected("spec.x: Invalid".into()));
        }
        let quota = r#"deployments.apps "web" is forbidden: exceeded quota: q, requested: count/deployments.apps=1"#;
        assert_eq!(judge(&api(403, quota)), Refusal::Rejected(quota.into()), "quota: rejected, named");
        let rbac = r#"deployments.apps "web" is forbidden: User "u" cannot patch resource "deployments" in API group "apps" in the namespace "a""#;
        assert_eq!(judge(&api(403, rbac)), Refusal::Retry, "RBAC: retried until granted");
        assert_eq!(
            judge(&namespace_terminating()),
            Refusal::Retry,
            "a namespace being deleted: an error, not the object's fault"
        );
        for code in [429, 500, 503, 504] {
            assert_eq!(judge(&api(code, "busy")), Refusal::Retry, "{code}");
        }
        assert_eq!(judge(&kube::Error::Service("connection reset".into())), Refusal::Retry);
    }
}
