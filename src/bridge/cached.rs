//! What the bridge's caches keep of each ManagedWorkload and Secret it made: only the values
//! its decisions read. It caches one CR and one Secret per Manager row, so at 10,000 rows the
//! rest (label and annotation maps, the whole spec, the conditions) would be most of its
//! memory. The spec is kept as a fingerprint per top-level field (`SpecFingerprint`): enough
//! to tell whether the fields the bridge sets still hold its values.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use serde::Serialize;

use super::mapping::key_of;
use super::rows::RowKey;
use crate::cached::stands_for;
use crate::names::{
    APPROVE_DELETION_ANNOTATION, BRIDGE_HASH_ANNOTATION, ENV_DIGEST_ANNOTATION, PROVIDER_LABEL, ROW_CREATED_ANNOTATION,
    SYNCED_BY_LABEL,
};
use crate::resource::{DesiredState, ManagedWorkload, ManagedWorkloadStatus};

/// Which bridge made an object, from its labels (`SYNCED_BY_LABEL`), and whether Manager's
/// provider has taken it over (`PROVIDER_LABEL`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MadeBy {
    synced_by: Option<String>,
    provider: bool,
}

impl MadeBy {
    pub fn of(labels: &BTreeMap<String, String>) -> Self {
        MadeBy { synced_by: labels.get(SYNCED_BY_LABEL).cloned(), provider: labels.contains_key(PROVIDER_LABEL) }
    }

    /// Made by the bridge of this field manager, and not taken over by Manager's provider:
    /// the one ownership test for CRs and Secrets alike.
    pub fn bridge(&self, field_manager: &str) -> bool {
        self.synced_by.as_deref() == Some(field_manager) && !self.provider
    }
}

/// The top-level fields of a spec, each as a fingerprint of its name and JSON value, sorted.
/// Compared within one process only (std's hasher is not stable across Rust releases).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecFingerprint(Box<[(u64, u64)]>);

fn fingerprint(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The spec's fields as JSON (a spec always serializes to an object).
fn fields(spec: &impl Serialize) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(spec) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    }
}

impl SpecFingerprint {
    pub fn of(spec: &impl Serialize) -> Self {
        let mut prints: Vec<(u64, u64)> =
            fields(spec).iter().map(|(name, value)| (fingerprint(name), fingerprint(&value.to_string()))).collect();
        prints.sort_unstable();
        SpecFingerprint(prints.into_boxed_slice())
    }

    /// Every field set in `spec` holds the same value here (unset fields are not compared).
    pub fn holds(&self, spec: &impl Serialize) -> bool {
        let (fields, prints) = (fields(spec), &self.0);
        !fields.is_empty()
            && fields.iter().all(|(name, value)| {
                let name = fingerprint(name);
                prints
                    .binary_search_by_key(&name, |(n, _)| *n)
                    .is_ok_and(|at| prints[at].1 == fingerprint(&value.to_string()))
            })
    }
}

/// What the workload cache holds of each ManagedWorkload the bridge made.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(from = "ManagedWorkload")]
pub struct CachedWorkload {
    /// Name, namespace, UID, resourceVersion and deletionTimestamp only.
    metadata: ObjectMeta,
    pub made_by: MadeBy,
    /// The row it stands for (its id labels).
    pub key: Option<RowKey>,
    /// `ROW_CREATED_ANNOTATION`: with the key, which container of that id.
    pub created_at: Option<String>,
    /// `BRIDGE_HASH_ANNOTATION`: what the bridge last applied.
    pub hash: Option<String>,
    /// `APPROVE_DELETION_ANNOTATION`, if set.
    pub approval: Option<String>,
    pub spec: SpecFingerprint,
    /// The spec asks for it to run (`spec.state`).
    pub running: bool,
    /// Without conditions and volumes: what is written back to the row is read from the rest.
    pub status: Option<ManagedWorkloadStatus>,
}

impl From<ManagedWorkload> for CachedWorkload {
    fn from(mw: ManagedWorkload) -> Self {
        let meta = mw.metadata;
        let labels = meta.labels.unwrap_or_default();
        let mut annotations = meta.annotations.unwrap_or_default();
        let mut status = mw.status;
        if let Some(status) = status.as_mut() {
            status.conditions = Vec::new();
            status.volumes = Vec::new();
        }
        CachedWorkload {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                deletion_timestamp: meta.deletion_timestamp,
                ..Default::default()
            },
            made_by: MadeBy::of(&labels),
            key: key_of(&labels),
            created_at: annotations.remove(ROW_CREATED_ANNOTATION),
            hash: annotations.remove(BRIDGE_HASH_ANNOTATION),
            approval: annotations.remove(APPROVE_DELETION_ANNOTATION),
            spec: SpecFingerprint::of(&mw.spec),
            running: mw.spec.desired_state() == DesiredState::Running,
            status,
        }
    }
}

/// What the Secret cache holds of each env Secret the bridge made (watched as metadata only,
/// so the bridge never holds a Secret's values).
#[derive(Clone, Debug, PartialEq)]
pub struct CachedSecret {
    /// Name, namespace, UID, resourceVersion and creationTimestamp only.
    metadata: ObjectMeta,
    pub made_by: MadeBy,
    /// Its owners' UIDs: its CR once written, or an earlier CR's until garbage collection drops
    /// that reference.
    pub owners: Box<[String]>,
    /// `ENV_DIGEST_ANNOTATION`: the digest of the env it holds, as the bridge wrote it.
    pub env_digest: Option<String>,
}

impl CachedSecret {
    pub fn owned(&self) -> bool {
        !self.owners.is_empty()
    }

    /// It is the env of the CR of UID `workload` and holds `env_digest`, so a Pod of that
    /// workload may start with it. Not so for a Secret left by an earlier container of the same
    /// name, one that lost its owner, or one whose rewrite did not happen.
    pub fn serves(&self, workload: Option<&str>, env_digest: &str) -> bool {
        workload.is_some_and(|uid| self.owners.iter().any(|o| o == uid))
            && self.env_digest.as_deref() == Some(env_digest)
    }
}

impl From<PartialObjectMeta<Secret>> for CachedSecret {
    fn from(secret: PartialObjectMeta<Secret>) -> Self {
        let meta = secret.metadata;
        CachedSecret {
            made_by: MadeBy::of(meta.labels.as_ref().unwrap_or(&BTreeMap::new())),
            owners: meta.owner_references.iter().flatten().map(|o| o.uid.clone()).collect(),
            env_digest: meta.annotations.as_ref().and_then(|a| a.get(ENV_DIGEST_ANNOTATION)).cloned(),
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                creation_timestamp: meta.creation_timestamp,
                ..Default::default()
            },
        }
    }
}

stands_for!(CachedWorkload, ManagedWorkload);
stands_for!(CachedSecret, Secret);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{ManagedWorkloadSpec, Phase};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::{Resource, ResourceExt};

    fn workload() -> ManagedWorkload {
        let spec = ManagedWorkloadSpec { image: "nginx:1.27".into(), ..Default::default() };
        let mut mw = ManagedWorkload::new("app", spec);
        mw.metadata.namespace = Some("ns".into());
        mw.metadata.uid = Some("uid-1".into());
        mw.metadata.labels = Some(BTreeMap::from([
            (SYNCED_BY_LABEL.to_string(), "mw-bridge".to_string()),
            ("team".to_string(), "x".to_string()),
        ]));
        mw.metadata.annotations = Some(BTreeMap::from([
            (BRIDGE_HASH_ANNOTATION.to_string(), "h1".to_string()),
            ("kubectl.kubernetes.io/last-applied-configuration".to_string(), "{...}".to_string()),
        ]));
        mw
    }

    #[test]
    fn a_workload_keeps_what_the_bridge_reads() {
        let mut mw = workload();
        mw.status = Some(ManagedWorkloadStatus {
            phase: Some(Phase::Running),
            pod_ip: Some("10.244.0.9".into()),
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Running".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
                observed_generation: Some(1),
            }],
            ..Default::default()
        });
        let cached = CachedWorkload::from(mw.clone());
        assert_eq!(
            (cached.name_any(), cached.namespace(), cached.uid()),
            ("app".into(), Some("ns".into()), Some("uid-1".into()))
        );
        assert!(cached.made_by.bridge("mw-bridge"));
        assert!(!cached.made_by.bridge("another-bridge"));
        assert_eq!(cached.hash.as_deref(), Some("h1"));
        assert!(cached.running);
        let status = cached.status.as_ref().unwrap();
        assert_eq!((status.phase, status.pod_ip.as_deref()), (Some(Phase::Running), Some("10.244.0.9")));
        assert!(status.conditions.is_empty());
        assert!(cached.labels().is_empty() && cached.annotations().is_empty(), "no maps kept");
        // Read from the wire as the watch reads it.
        let wire: CachedWorkload = serde_json::from_value(serde_json::to_value(&mw).unwrap()).unwrap();
        assert_eq!(wire, cached);
    }

    #[test]
    fn taken_over_by_the_provider_is_no_longer_the_bridges() {
        let mut mw = workload();
        mw.labels_mut().insert(PROVIDER_LABEL.into(), "kubernetes".into());
        assert!(!CachedWorkload::from(mw).made_by.bridge("mw-bridge"));
    }

    #[test]
    fn the_spec_fingerprint_compares_the_fields_set_only() {
        let spec = workload().spec;
        let live = SpecFingerprint::of(&spec);
        assert!(live.holds(&spec));
        let edited = ManagedWorkloadSpec { image: "nginx:hacked".into(), ..spec.clone() };
        assert!(!live.holds(&edited), "a field set to another value");
        // Someone else's field on the live object (a stop) is not the bridge's business...
        let stopped = SpecFingerprint::of(&ManagedWorkloadSpec { state: Some(DesiredState::Stopped), ..spec.clone() });
        assert!(stopped.holds(&spec));
        // ...but a field the bridge sets and the live object lacks is a difference.
        assert!(!SpecFingerprint::default().holds(&spec));
    }

    #[test]
    fn a_secret_keeps_its_maker_owner_digest_and_age_only() {
        let mut secret = PartialObjectMeta::<Secret>::default();
        secret.metadata.name = Some("app-manager-env".into());
        secret.metadata.labels = Some(BTreeMap::from([(SYNCED_BY_LABEL.to_string(), "mw-bridge".to_string())]));
        secret.metadata.owner_references = Some(vec![OwnerReference { uid: "cr-1".into(), ..Default::default() }]);
        secret.metadata.annotations = Some(BTreeMap::from([(ENV_DIGEST_ANNOTATION.to_string(), "d1".to_string())]));
        let cached = CachedSecret::from(secret);
        assert!(cached.made_by.bridge("mw-bridge") && cached.owned());
        assert!(cached.meta().labels.is_none() && cached.meta().owner_references.is_none());
        assert!(cached.serves(Some("cr-1"), "d1"), "its CR's, with the env wanted");
        assert!(!cached.serves(Some("cr-2"), "d1"), "an earlier container's of the same name");
        assert!(!cached.serves(Some("cr-1"), "d2"), "its rewrite with the new env did not happen");
        assert!(!cached.serves(None, "d1"), "no CR yet");
        let unowned = CachedSecret { owners: Box::default(), ..cached.clone() };
        assert!(!unowned.serves(Some("cr-1"), "d1"), "no owner: nobody's yet");
        // An earlier CR's reference still there beside the new one's, whichever comes first.
        let both = CachedSecret { owners: ["cr-0".to_string(), "cr-1".to_string()].into(), ..cached };
        assert!(both.serves(Some("cr-1"), "d1"));
    }
}
