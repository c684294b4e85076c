//! Is a live owned object already what we would apply? Answering this without a write keeps
//! an idle operator from touching the API server. Two pure checks:
//! - the live object carries the fingerprint of the desired object (catches every change of
//!   ours, including removed fields);
//! - the operator still owns every field it sets, by the object's server-side apply record
//!   (`metadata.managedFields`). A writer who changes one of our fields (`kubectl scale`, an
//!   edited label) takes it over, so a lost field is exactly "someone changed what we set".
//!   Values the API server normalises and list entries others add (`kubectl set env`, a
//!   webhook) leave our ownership alone: not drift, and re-applying could not undo them.

use std::hash::{Hash, Hasher};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Serialize;
use serde_json::{Map, Value};

use super::ownership::{FIELD_MANAGER, applied_hash};

/// A live object as drift judges it: its identity (`Resource`), the fingerprint it was
/// applied from, and the field set the operator's server-side apply owns on it.
pub trait Live: Resource {
    /// The operator's own field set; None when it has none (never applied, or record removed).
    fn owned(&self) -> Option<std::borrow::Cow<'_, OwnedFields>>;

    /// The fingerprint of the desired object it was last applied from.
    fn applied_hash(&self) -> Option<&str>;
}

/// Objects as the API server sends them: the apply record is read from `metadata.managedFields`.
macro_rules! live_from_managed_fields {
    ($($kind:ty),*) => {$(
        impl Live for $kind {
            fn owned(&self) -> Option<std::borrow::Cow<'_, OwnedFields>> {
                owned_fields(self.meta()).and_then(OwnedFields::of).map(std::borrow::Cow::Owned)
            }

            fn applied_hash(&self) -> Option<&str> {
                applied_hash(self)
            }
        }
    )*};
}
live_from_managed_fields!(
    k8s_openapi::api::apps::v1::Deployment,
    k8s_openapi::api::core::v1::Service,
    k8s_openapi::api::core::v1::PersistentVolumeClaim,
    k8s_openapi::api::networking::v1::NetworkPolicy
);

/// True when applying `desired` would change nothing on `live`.
pub fn up_to_date<K: Resource + Serialize, L: Live>(desired: &K, live: &L) -> bool {
    same_desired(desired, live) && owns_everything(desired, live)
}

/// `live` was last applied from exactly this desired object, so any difference is someone
/// else's edit, not a spec change.
pub fn same_desired<K: Resource, L: Live>(desired: &K, live: &L) -> bool {
    applied_hash(desired).is_some() && applied_hash(desired) == live.applied_hash()
}

/// The operator's `Apply` entry still covers every field `desired` sets.
fn owns_everything<K: Resource + Serialize, L: Live>(desired: &K, live: &L) -> bool {
    let Some(owned) = live.owned() else { return false };
    let Ok(mut want) = serde_json::to_value(desired) else { return false };
    if let Value::Object(map) = &mut want {
        // Never part of a field set: the type, the identity, and status.
        for key in ["apiVersion", "kind", "status"] {
            map.remove(key);
        }
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            for key in ["name", "namespace"] {
                meta.remove(key);
            }
        }
    }
    owned.covers(&want)
}

/// The fields the operator owns through server-side apply on the main resource (not a
/// subresource), as sent: a parsed FieldsV1 tree or its JSON text.
pub fn owned_fields(live: &ObjectMeta) -> Option<&Value> {
    let entries = live.managed_fields.as_ref()?;
    let entry = entries.iter().find(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.operation.as_deref() == Some("Apply")
            && m.subresource.as_deref().is_none_or(str::is_empty)
    })?;
    entry.fields_v1.as_ref().map(|f| &f.0)
}

/// A field set (FieldsV1: `f:<name>` fields, `k:<json>` keyed list entries, `v:<json>` set
/// entries, `.` the entry itself) kept as a fingerprint: the hash of every path, plus each
/// keyed list's key names. It answers "does it cover every desired field?" as the set would,
/// in about a third of the memory of its text (a Deployment's is about 1 KiB).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedFields {
    /// The hash of every path, sorted; low bit set when the path is owned whole (a leaf, or an
    /// atomic struct or list).
    paths: Box<[u64]>,
    /// For each keyed list (by the hash of its path), the names of its key fields, sorted.
    keys: Box<[(u64, KeyNames)]>,
}

/// The names of a keyed list's key fields, sorted.
type KeyNames = Box<[Box<str>]>;

const ROOT: u64 = 0;

/// The hash of `segment` under the path hashed `parent`, low bit clear. SipHash with fixed
/// keys, so the same in every process.
fn step(parent: u64, segment: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    (parent, segment).hash(&mut h);
    h.finish() & !1
}

/// A keyed list entry's segment: its key fields, by sorted name, with their JSON values.
fn key_segment<'a>(names: impl IntoIterator<Item = &'a str>, entry: &Map<String, Value>) -> Option<String> {
    let mut segment = String::from("k:");
    for name in names {
        segment.push_str(&format!("{name}={},", entry.get(name)?));
    }
    Some(segment)
}

impl OwnedFields {
    /// The fingerprint of a field set in either form `owned_fields` gives; None if it does not
    /// parse.
    pub fn of(fields: &Value) -> Option<OwnedFields> {
        let parsed: std::borrow::Cow<'_, Value> = match fields {
            Value::String(text) => std::borrow::Cow::Owned(serde_json::from_str(text).ok()?),
            other => std::borrow::Cow::Borrowed(other),
        };
        let Value::Object(root) = parsed.as_ref() else { return None };
        let mut paths = Vec::new();
        let mut keys: Vec<(u64, KeyNames)> = Vec::new();
        let mut pending = vec![(ROOT, root)];
        while let Some((path, node)) = pending.pop() {
            for (segment, child) in node {
                let segment = match segment.as_str() {
                    "." => continue,
                    s => match s.strip_prefix("k:") {
                        Some(key) => {
                            let key: Map<String, Value> = serde_json::from_str(key).ok()?;
                            let mut names: Vec<&str> = key.keys().map(String::as_str).collect();
                            names.sort_unstable();
                            if !keys.iter().any(|(p, n)| *p == path && n.iter().map(|n| &**n).eq(names.iter().copied()))
                            {
                                keys.push((path, names.iter().map(|n| Box::from(*n)).collect()));
                            }
                            key_segment(names, &key)?
                        }
                        None => s.to_owned(),
                    },
                };
                let child_path = step(path, &segment);
                match child {
                    Value::Object(children) if !children.is_empty() => {
                        paths.push(child_path);
                        pending.push((child_path, children));
                    }
                    _ => paths.push(child_path | 1),
                }
            }
        }
        paths.sort_unstable();
        paths.dedup();
        Some(OwnedFields { paths: paths.into_boxed_slice(), keys: keys.into_boxed_slice() })
    }

    /// The set contains every field of `want` (JSON, less what no field set holds).
    pub fn covers(&self, want: &Value) -> bool {
        self.covers_at(ROOT, want)
    }

    /// Whether the path is in the set, and if so whether it is owned whole.
    fn find(&self, path: u64) -> Option<bool> {
        self.paths.binary_search_by(|p| (p & !1).cmp(&path)).ok().map(|i| self.paths[i] & 1 == 1)
    }

    /// `want`, found under `path` (in the set, with members), is covered.
    fn covers_at(&self, path: u64, want: &Value) -> bool {
        let child = |segment: &str, value: &Value| {
            let child = step(path, segment);
            // A member with no children is owned whole: a leaf, or an atomic struct or list (a
            // LabelSelector, an ownerReference, `command`).
            match self.find(child) {
                None => false,
                Some(true) => true,
                Some(false) => self.covers_at(child, value),
            }
        };
        match want {
            Value::Object(map) => map.iter().all(|(name, value)| child(&format!("f:{name}"), value)),
            Value::Array(items) => items.iter().all(|item| match item {
                Value::Object(entry) => self
                    .keys
                    .iter()
                    .filter(|(p, _)| *p == path)
                    .filter_map(|(_, names)| key_segment(names.iter().map(|n| &**n), entry))
                    .any(|segment| child(&segment, item)),
                scalar => self.find(step(path, &format!("v:{scalar}"))).is_some(),
            }),
            // A scalar field: owning its path is owning it.
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::deployment as desired;
    use crate::resource::{EnvVar, ManagedWorkload, ManagedWorkloadSpec, Quantity, ResourceList, Resources};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Container;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    fn workload() -> ManagedWorkload {
        let mut mw = ManagedWorkload::new(
            "web",
            ManagedWorkloadSpec {
                image: "nginx:latest".into(),
                command: vec!["/bin/sh".into()],
                env: vec![
                    EnvVar { name: "A".into(), value: Some("1".into()), value_from: None },
                    EnvVar { name: "EMPTY".into(), value: Some(String::new()), value_from: None },
                ],
                resources: Some(Resources {
                    requests: Some(ResourceList {
                        cpu: Some(Quantity("1000m".into())),
                        memory: Some(Quantity("1024Mi".into())),
                    }),
                    limits: None,
                    gpus: None,
                }),
                ports: vec![crate::resource::ContainerPort { container_port: 80, name: None, protocol: None }],
                ..Default::default()
            },
        );
        mw.metadata.namespace = Some("apps".into());
        mw.metadata.uid = Some("uid-1".into());
        mw
    }

    /// The FieldsV1 set server-side apply records for an applied object, as the API server
    /// wrote it for a real Deployment: `f:` per field, `k:` per keyed list entry, atomic
    /// lists and structs (the selector, each ownerReference) as a leaf.
    fn field_set(value: &Value, field: &str) -> Value {
        match value {
            _ if field == "selector" => Value::Object(Map::new()),
            Value::Object(map) => {
                let mut set = Map::new();
                for (k, v) in map {
                    set.insert(format!("f:{k}"), field_set(v, k));
                }
                Value::Object(set)
            }
            Value::Array(items) => {
                let keys: &[&str] = match field {
                    "containers" | "env" => &["name"],
                    "ports" => &["containerPort", "protocol"],
                    "ownerReferences" => &["uid"],
                    _ => return Value::Object(Map::new()),
                };
                let mut set = Map::new();
                for item in items {
                    let key: Map<String, Value> = keys.iter().map(|k| (k.to_string(), item[*k].clone())).collect();
                    let mut entry = Map::new();
                    if field != "ownerReferences" {
                        entry = field_set(item, "").as_object().cloned().unwrap_or_default();
                        entry.insert(".".into(), Value::Object(Map::new()));
                    }
                    set.insert(format!("k:{}", Value::Object(key)), Value::Object(entry));
                }
                Value::Object(set)
            }
            _ => Value::Object(Map::new()),
        }
    }

    fn entry(manager: &str, operation: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    /// What the API server returns for an applied Deployment: defaults filled in, quantities
    /// canonicalized, system metadata added, and the operator's ownership recorded.
    fn as_stored(d: &Deployment) -> Deployment {
        let mut applied = serde_json::to_value(d).unwrap();
        let map = applied.as_object_mut().unwrap();
        map.remove("apiVersion");
        map.remove("kind");
        let meta = map.get_mut("metadata").unwrap().as_object_mut().unwrap();
        meta.remove("name");
        meta.remove("namespace");
        let ours = entry(FIELD_MANAGER, "Apply", field_set(&applied, ""));

        let mut live = d.clone();
        live.metadata.uid = Some("dep-uid".into());
        live.metadata.resource_version = Some("42".into());
        live.metadata.generation = Some(1);
        live.metadata.managed_fields = Some(vec![
            ours,
            entry("kube-controller-manager", "Update", serde_json::json!({"f:status": {"f:replicas": {}}})),
        ]);
        let spec = live.spec.as_mut().unwrap();
        let pod = spec.template.spec.as_mut().unwrap();
        pod.restart_policy = Some("Always".into());
        pod.dns_policy = Some("ClusterFirst".into());
        let c: &mut Container = &mut pod.containers[0];
        c.image_pull_policy = Some("Always".into());
        c.termination_message_path = Some("/dev/termination-log".into());
        let requests = c.resources.as_mut().unwrap().requests.as_mut().unwrap();
        requests.insert("cpu".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()));
        requests.insert("memory".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()));
        live.status = Some(Default::default());
        live
    }

    /// Another writer changed `path` (as field names): server-side apply moves the field from
    /// the operator's set to theirs.
    fn taken_over(mut live: Deployment, path: &[&str]) -> Deployment {
        let entries = live.metadata.managed_fields.as_mut().unwrap();
        let mut node = &mut entries[0].fields_v1.as_mut().unwrap().0;
        for (i, name) in path.iter().enumerate() {
            let map = node.as_object_mut().unwrap();
            if i + 1 == path.len() {
                assert!(map.remove(*name).is_some(), "{name} not in the set");
                break;
            }
            node = map.get_mut(*name).unwrap();
        }
        live
    }

    const CONTAINER: &str = r#"k:{"name":"workload"}"#;

    /// The fingerprint answers as the field set itself: every path of the set is found, keyed
    /// entries by their key fields whatever their order, and a path taken over is missing.
    #[test]
    fn the_fingerprint_covers_what_the_field_set_does() {
        let desired = desired::deployment(&workload(), &Default::default()).unwrap();
        let live = as_stored(&desired);
        let fields = owned_fields(&live.metadata).unwrap().clone();
        let owned = OwnedFields::of(&fields).unwrap();
        assert_eq!(OwnedFields::of(&Value::String(fields.to_string())), Some(owned.clone()), "text or tree");
        assert!(up_to_date(&desired, &live));
        let mut want = serde_json::to_value(&desired).unwrap();
        want.as_object_mut().unwrap().retain(|k, _| k == "metadata" || k == "spec");
        want["metadata"].as_object_mut().unwrap().retain(|k, _| k != "name" && k != "namespace");
        assert!(owned.covers(&want));
        // A port keyed by two fields, given in the other order: the same entry.
        let port: Map<String, Value> = serde_json::from_str(r#"{"protocol":"TCP","containerPort":80}"#).unwrap();
        let ports = step(
            step(step(step(step(step(ROOT, "f:spec"), "f:template"), "f:spec"), "f:containers"), CONTAINER_KEY),
            "f:ports",
        );
        let names = owned.keys.iter().find(|(p, _)| *p == ports).map(|(_, n)| n.clone()).unwrap();
        assert_eq!(&*names, [Box::from("containerPort"), Box::from("protocol")]);
        assert!(owned.find(step(ports, &key_segment(names.iter().map(|n| &**n), &port).unwrap())).is_some());
        // The paths it was built from, and no other.
        let mut extra = want.clone();
        extra["spec"]["paused"] = Value::Bool(true);
        assert!(!owned.covers(&extra), "a field the operator does not own");
        assert_eq!(OwnedFields::of(&Value::String("not json".into())), None);
    }

    const CONTAINER_KEY: &str = "k:name=\"workload\",";

    #[test]
    fn normalised_values_and_defaults_are_up_to_date() {
        let desired = desired::deployment(&workload(), &Default::default()).unwrap();
        assert!(up_to_date(&desired, &as_stored(&desired)));
    }

    #[test]
    fn entries_other_managers_add_are_not_drift() {
        let desired = desired::deployment(&workload(), &Default::default()).unwrap();
        let mut live = as_stored(&desired);
        // kubectl set env deployment/web EXTRA=1
        live.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers[0].env.as_mut().unwrap().push(
            k8s_openapi::api::core::v1::EnvVar { name: "EXTRA".into(), value: Some("1".into()), value_from: None },
        );
        let theirs = serde_json::json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {CONTAINER: {
            "f:env": {r#"k:{"name":"EXTRA"}"#: {".": {}, "f:name": {}, "f:value": {}}}
        }}}}}});
        live.metadata.managed_fields.as_mut().unwrap().push(entry("kubectl-set", "Update", theirs));
        assert!(up_to_date(&desired, &live));
    }

    #[test]
    fn hand_edits_of_our_fields_are_drift() {
        let desired = desired::deployment(&workload(), &Default::default()).unwrap();
        let stored = as_stored(&desired);
        for path in [
            &["f:spec", "f:replicas"][..],
            &["f:spec", "f:template", "f:spec", "f:containers", CONTAINER, "f:image"],
            &["f:spec", "f:template", "f:spec", "f:containers", CONTAINER, "f:env", r#"k:{"name":"A"}"#],
            &["f:spec", "f:template", "f:spec", "f:containers", CONTAINER, "f:command"],
            &["f:metadata", "f:labels", &format!("f:{}", crate::names::MANAGED_LABEL)],
        ] {
            let edited = taken_over(stored.clone(), path);
            assert!(!up_to_date(&desired, &edited), "{path:?}");
            assert!(same_desired(&desired, &edited), "a hand edit leaves our fingerprint in place");
        }
    }

    #[test]
    fn without_the_operators_ownership_record_it_reapplies() {
        let desired = desired::deployment(&workload(), &Default::default()).unwrap();
        let mut live = as_stored(&desired);
        live.metadata.managed_fields = None;
        assert!(!up_to_date(&desired, &live));
        let mut live = as_stored(&desired);
        live.metadata.managed_fields.as_mut().unwrap()[0].operation = Some("Update".into());
        assert!(!up_to_date(&desired, &live), "only the Apply entry counts");
    }

    #[test]
    fn a_changed_spec_is_not_up_to_date_even_when_it_only_removes_fields() {
        let mut mw = workload();
        mw.spec.hostname = Some("box".into());
        let before = desired::deployment(&mw, &Default::default()).unwrap();
        mw.spec.hostname = None;
        let after = desired::deployment(&mw, &Default::default()).unwrap();
        assert!(!up_to_date(&after, &as_stored(&before)));
        assert!(!same_desired(&after, &as_stored(&before)));
    }
}
