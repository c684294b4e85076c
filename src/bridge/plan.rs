//! Pure decisions for one row, one CR, one write-back, so every ownership rule of
//! docs/bridge.md ("Ownership") is unit-tested without a cluster or a database.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use super::cached::{CachedSecret, CachedWorkload, SpecFingerprint};
use super::error::RowError;
use super::mapping::{Desired, SECRET_SUFFIX};
use super::rows::{RowKey, RowState};
use crate::resource::{Phase, ServiceType};

/// A ManagedWorkload as the bridge sees it: whose it is and what it was made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    pub uid: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    /// Made by this bridge (its field manager is on the ownership label).
    pub ours: bool,
    pub key: Option<RowKey>,
    pub created_at: Option<String>,
    pub hash: Option<String>,
    pub deleting: bool,
    /// The live spec's fields, to notice hand edits of fields the bridge sets.
    pub spec: SpecFingerprint,
}

impl Existing {
    pub fn of(mw: &CachedWorkload, field_manager: &str) -> Self {
        Existing {
            uid: mw.uid(),
            namespace: mw.namespace(),
            name: mw.name_any(),
            ours: mw.made_by.bridge(field_manager),
            key: mw.key,
            created_at: mw.created_at.clone(),
            hash: mw.hash.clone(),
            deleting: mw.meta().deletion_timestamp.is_some(),
            spec: mw.spec.clone(),
        }
    }

    /// Every spec field the bridge sets holds what it would set, so a hand edit of one (say the
    /// image) is undone. Fields it does not set (`state`, `args`, `ports`) are never compared.
    fn spec_matches(&self, desired: &Desired) -> bool {
        self.spec.holds(&desired.workload.spec)
    }
}

/// The row and `createdAt` a CR stands for, if this bridge made it. The cheap part of
/// `Existing::of`, for passes over every CR.
pub fn made_for<'a>(mw: &'a CachedWorkload, field_manager: &str) -> Option<(RowKey, Option<&'a str>)> {
    if !mw.made_by.bridge(field_manager) {
        return None;
    }
    Some((mw.key?, mw.created_at.as_deref()))
}

/// The action for one row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The CR and its Secret are what the row says: no write.
    UpToDate,
    /// No CR of that name: its Secret, then the CR, then the Secret's owner.
    Create,
    /// Our CR, out of date, or its Secret does not serve it (gone, an earlier container's, no
    /// owner, or stale env): write the Secret, then the CR.
    Update,
    /// Our CR of that name stands for another container (a re-used SQLite id, or a moved
    /// hostname): delete it by UID and create anew once it is gone.
    Replace { uid: String },
    /// Nothing may be written for this row.
    Blocked(RowError),
}

/// Decide for one mapped row. `secret` is the bridge's env Secret of that name, if any.
/// `row_is_live(key)` says whether the container the CR stands for still has a row: then
/// the hostname is that row's and this row is the collision.
pub fn plan(
    desired: &Desired,
    existing: Option<&Existing>,
    secret: Option<&CachedSecret>,
    row_is_live: impl Fn(RowKey) -> bool,
) -> Plan {
    let Some(cr) = existing else { return Plan::Create };
    let name = || (desired.namespace.clone(), desired.name.clone());
    if !cr.ours {
        let (namespace, name) = name();
        return Plan::Blocked(RowError::NameTaken { namespace, name });
    }
    if cr.deleting {
        let (namespace, name) = name();
        return Plan::Blocked(RowError::Replacing { namespace, name });
    }
    let same_container = cr.key == Some(desired.key) && cr.created_at.as_deref() == Some(desired.created_at.as_str());
    if !same_container {
        if let Some(other) = cr.key.filter(|k| *k != desired.key && row_is_live(*k)) {
            let (namespace, name) = name();
            return Plan::Blocked(RowError::HostnameCollision { namespace, name, other: other.to_string() });
        }
        return match &cr.uid {
            Some(uid) => Plan::Replace { uid: uid.clone() },
            None => Plan::Update,
        };
    }
    let secret_serves = secret.is_some_and(|s| s.serves(cr.uid.as_deref(), desired.env_digest()));
    if cr.hash.as_deref() == Some(desired.hash.as_str()) && secret_serves && cr.spec_matches(desired) {
        Plan::UpToDate
    } else {
        Plan::Update
    }
}

/// A row whose node now maps to another namespace: its `containerId` (`namespace/name`) names
/// the old workload, whose disk is there, and claims cannot move between namespaces. Held
/// until the old workload is gone (`still_there`); in a namespace this bridge does not watch
/// it cannot tell, so only clearing the row's `containerId` releases it.
pub fn moved_from(
    provider_id: Option<&str>,
    desired: &Desired,
    still_there: impl Fn(&str, &str) -> bool,
) -> Option<RowError> {
    let (from, name) = provider_id?.split_once('/')?;
    (from != desired.namespace && still_there(from, name)).then(|| RowError::NodeMoved {
        from: from.to_string(),
        name: name.to_string(),
        to: desired.namespace.clone(),
    })
}

/// Which address of a workload is written back as `ipv4Address` (bridge flag
/// `--ipv4-address`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressSource {
    /// `status.address`: the load balancer's, else the Service's cluster IP, else the Pod IP.
    /// Stable with a Service.
    #[default]
    Service,
    /// `status.podIP`: the serving Pod's IP (moves with every new Pod).
    Pod,
}

/// What the row's written-back columns should hold for this CR (docs/bridge.md, "What is
/// written back"): the provider id, the address as `source` says, no MAC. `current` is the
/// address the row holds now.
///
/// The address is written once the workload is `Running` and during a rollout (`Updating`:
/// the old Pod serves until the new one is Ready). A replaced Pod (`Creating`) or a restart
/// (`Failed` in the crash-loop window) keeps it only if unchanged (always, with a Service).
/// Stopped: no address. For a `LoadBalancer` Service only the load balancer's address counts:
/// an nginx outside the cluster cannot reach the cluster IP.
pub fn row_state(mw: &CachedWorkload, source: AddressSource, current: Option<&str>) -> RowState {
    let status = mw.status.as_ref();
    let provider_id =
        status.and_then(|s| s.provider_id.clone()).or_else(|| Some(format!("{}/{}", mw.namespace()?, mw.name_any())));
    let candidate = status.and_then(|s| match source {
        AddressSource::Pod => s.pod_ip.clone(),
        AddressSource::Service => {
            let load_balancer = s.service.as_ref().filter(|svc| svc.type_ == ServiceType::LoadBalancer.as_str());
            match load_balancer {
                Some(svc) => svc.load_balancer_ingress.first().cloned(),
                None => s.address.clone(),
            }
        }
    });
    let phase = status.and_then(|s| s.phase).filter(|_| mw.running);
    let address = match phase {
        Some(Phase::Running | Phase::Updating) => candidate,
        Some(Phase::Creating | Phase::Failed) => candidate.filter(|a| Some(a.as_str()) == current),
        Some(Phase::Stopping | Phase::Stopped) | None => None,
    };
    RowState { container_id: provider_id, ipv4_address: address, mac_address: None }
}

/// The written-back columns for a row, given our CR for it (`None`: none). With no workload,
/// no address: Pod IPs are reused quickly and a stale one would send traffic to another Pod.
/// The provider id stays: it is the name the workload has or will have again.
pub fn write_back_target(cr: Option<&CachedWorkload>, written: &RowState, source: AddressSource) -> RowState {
    match cr {
        Some(cr) => row_state(cr, source, written.ipv4_address.as_deref()),
        None => RowState { container_id: written.container_id.clone(), ipv4_address: None, mac_address: None },
    }
}

/// The deletion guard (docs/bridge.md, "Deletion guard"). CRs whose rows are gone are deleted
/// only when two full reads, at least `confirm_after` apart, found the same set: a database in
/// flux (a restore, a lagging replica) will not show the same set twice. A confirmed set is
/// deleted if it is under `minimum`, within `max_percent` of the bridge's workloads, or every
/// CR in it carries the approval token; otherwise all of it is held. All or nothing, so
/// approving some CRs never shrinks the rest into the allowed share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeleteGuard {
    pub max_percent: u32,
    pub minimum: usize,
    /// The least time between the full read that finds a set and the one that confirms it.
    pub confirm_after: Duration,
}

/// The CRs one full read found to delete (by UID), and when that set was first found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub uids: BTreeSet<String>,
    pub at: Instant,
}

/// What the guard says about the CRs one full read found to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// Nothing to delete.
    Nothing,
    /// Found, not confirmed: new, different from the last read's set, or read again too soon.
    /// Delete nothing; read everything again at `recheck_at`.
    Unconfirmed { sighting: Sighting, recheck_at: Instant },
    /// Two reads agree, and the set is within the share or approved: delete all of it.
    Delete { sighting: Sighting },
    /// Two reads agree, but the set is beyond the share: delete none until every CR carries
    /// `token` (`approved` do now).
    Held { sighting: Sighting, token: String, approved: usize },
}

impl Judgement {
    /// The sighting the next full read is compared with; none once the set is deleted.
    pub fn sighting(&self) -> Option<&Sighting> {
        match self {
            Judgement::Nothing | Judgement::Delete { .. } => None,
            Judgement::Unconfirmed { sighting, .. } | Judgement::Held { sighting, .. } => Some(sighting),
        }
    }
}

impl DeleteGuard {
    /// Would deleting `deleting` of `owned` workloads be allowed without approval?
    pub fn within_share(&self, deleting: usize, owned: usize) -> bool {
        deleting < self.minimum || deleting.saturating_mul(100) <= owned.saturating_mul(self.max_percent as usize)
    }

    /// Judge the CRs a full read found to delete: `found` maps each UID to its approval annotation,
    /// `earlier` is the last read's sighting, `owned` how many workloads the bridge has.
    pub fn judge(
        &self,
        earlier: Option<&Sighting>,
        found: &BTreeMap<String, Option<String>>,
        owned: usize,
        now: Instant,
    ) -> Judgement {
        if found.is_empty() {
            return Judgement::Nothing;
        }
        let uids: BTreeSet<String> = found.keys().cloned().collect();
        // A set is confirmed by a later read only, never by the read that found it.
        let sighting = match earlier {
            Some(earlier) if earlier.uids == uids => earlier.clone(),
            _ => {
                let sighting = Sighting { uids, at: now };
                return Judgement::Unconfirmed { recheck_at: now + self.confirm_after, sighting };
            }
        };
        let recheck_at = sighting.at + self.confirm_after;
        if now < recheck_at {
            return Judgement::Unconfirmed { sighting, recheck_at };
        }
        let token = approval_token(&sighting.uids);
        let approved = found.values().filter(|v| v.as_deref() == Some(token.as_str())).count();
        if self.within_share(found.len(), owned) || approved == found.len() {
            Judgement::Delete { sighting }
        } else {
            Judgement::Held { sighting, token, approved }
        }
    }
}

/// The token approving exactly this set: 16 hex digits of the SHA-256 of the sorted UIDs.
/// Bound to the set, so a leftover approval never approves a later deletion.
pub fn approval_token(uids: &BTreeSet<String>) -> String {
    let mut hasher = Sha256::new();
    for uid in uids {
        hasher.update(uid.as_bytes());
        hasher.update(b"\n");
    }
    hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Age after which an env Secret with no CR and no owner is deleted: older than any Secret +
/// CR write still in flight.
pub const ORPHAN_SECRET_GRACE: SignedDuration = SignedDuration::from_mins(5);

/// This bridge's env Secrets with no owner, no CR of the matching name, and created more than
/// `ORPHAN_SECRET_GRACE` before `server_now` (a crash or lost leadership between writing the
/// Secret and its CR, or a CR deleted while its Secret had no owner). `server_now` is the API
/// server's clock, which stamped the creationTimestamps; ours may differ. `workloads` are the
/// (namespace, name) of existing CRs.
pub fn orphan_secrets<'a>(
    secrets: impl IntoIterator<Item = &'a CachedSecret>,
    workloads: impl IntoIterator<Item = (String, String)>,
    field_manager: &str,
    server_now: Timestamp,
) -> Vec<&'a CachedSecret> {
    let created_before = server_now.saturating_sub(ORPHAN_SECRET_GRACE).unwrap_or(Timestamp::UNIX_EPOCH);
    let expected: HashSet<(String, String)> =
        workloads.into_iter().map(|(ns, name)| (ns, format!("{name}{SECRET_SUFFIX}"))).collect();
    secrets
        .into_iter()
        .filter(|secret| {
            !secret.owned()
                && secret.made_by.bridge(field_manager)
                && secret.meta().creation_timestamp.as_ref().is_some_and(|t| t.0 < created_before)
        })
        .filter(|secret| match (&secret.meta().namespace, &secret.meta().name) {
            (Some(ns), Some(name)) => !expected.contains(&(ns.clone(), name.clone())),
            _ => false,
        })
        .collect()
}

/// Where a row's CR belongs now: the row's `createdAt`, namespace and hostname.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowTarget {
    pub created_at: String,
    pub namespace: String,
    pub name: String,
}

/// Should this CR of ours be deleted? Only if its node is one this bridge serves (a node
/// dropped from the configuration leaves its workloads alone) and its row is gone or now
/// belongs elsewhere (another namespace, a changed hostname), where it gets its own CR.
pub fn is_orphan(
    existing: &Existing,
    serves_node: impl Fn(i64) -> bool,
    row: impl Fn(RowKey) -> Option<RowTarget>,
) -> bool {
    if !existing.ours || existing.deleting {
        return false;
    }
    let Some(key) = existing.key else { return false };
    if !serves_node(key.node_id) {
        return false;
    }
    match row(key) {
        None => true,
        Some(target) => {
            // The id was re-used: the CR's container is gone; the new row gets its own CR.
            existing.created_at.as_deref().is_some_and(|c| c != target.created_at)
                || existing.namespace.as_deref() != Some(target.namespace.as_str())
                || existing.name != target.name
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bridge::env::DefaultEnv;
    use crate::bridge::mapping::{self, Context};
    use crate::bridge::rows::{ContainerRow, Grants};
    use crate::names::{ENV_DIGEST_ANNOTATION, PROVIDER_LABEL, SYNCED_BY_LABEL};
    use crate::resource::{DesiredState, ManagedWorkload, ManagedWorkloadSpec, ManagedWorkloadStatus, ServiceStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// A row of the sample's shape (the other modules' tests start from it too).
    pub(crate) fn row() -> ContainerRow {
        ContainerRow {
            id: 3,
            node_id: 1,
            site_id: 1,
            hostname: "app".into(),
            username: "u".into(),
            template: Some("docker.io/library/nginx:1.27".into()),
            environment_vars: None,
            entrypoint: None,
            nvidia_requested: 0,
            container_id: None,
            ipv4_address: None,
            mac_address: None,
            created_at: "2026-01-01 00:00:00.000 +00:00".into(),
            updated_at: "2026-01-01 00:00:00.000 +00:00".into(),
            services: vec![],
        }
    }

    fn desired() -> Desired {
        let defaults = DefaultEnv::default();
        let grants = Grants::default();
        let cx = Context {
            namespace: "ns",
            field_manager: "mw-bridge",
            defaults: &defaults,
            grants: &grants,
            requests_percent: 100,
            rootfs: &Default::default(),
            service: &Default::default(),
            system_images: &Default::default(),
            isolation: &None,
        };
        mapping::desired(&row(), &cx).unwrap()
    }

    fn existing(d: &Desired) -> Existing {
        Existing {
            uid: Some("uid-1".into()),
            namespace: Some("ns".into()),
            name: "app".into(),
            ours: true,
            key: Some(d.key),
            created_at: Some(d.created_at.clone()),
            hash: Some(d.hash.clone()),
            deleting: false,
            spec: SpecFingerprint::of(&d.workload.spec),
        }
    }

    /// `mw` as the bridge's cache holds it.
    fn cached(mw: &ManagedWorkload) -> CachedWorkload {
        CachedWorkload::from(mw.clone())
    }

    /// A Secret with this metadata as the bridge's cache holds it.
    fn cached_secret(metadata: ObjectMeta) -> CachedSecret {
        CachedSecret::from(kube::core::PartialObjectMeta { metadata, ..Default::default() })
    }

    /// The row's env Secret, owned by the CR of UID `owner`, holding the env of `digest`.
    fn env_secret(d: &Desired, owner: Option<&str>, digest: &str) -> CachedSecret {
        let secret = mapping::secret(d, "mw-bridge", None);
        let mut metadata = secret.metadata;
        metadata.annotations = Some(BTreeMap::from([(ENV_DIGEST_ANNOTATION.to_string(), digest.to_string())]));
        metadata.owner_references = owner.map(|uid| {
            vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                uid: uid.into(),
                ..Default::default()
            }]
        });
        cached_secret(metadata)
    }

    #[test]
    fn create_update_or_nothing() {
        let d = desired();
        let env = env_secret(&d, Some("uid-1"), d.env_digest());
        assert_eq!(plan(&d, None, None, |_| false), Plan::Create);
        assert_eq!(plan(&d, Some(&existing(&d)), Some(&env), |_| false), Plan::UpToDate);
        assert_eq!(plan(&d, Some(&existing(&d)), None, |_| false), Plan::Update, "a lost Secret is rewritten");
        let stale = Existing { hash: Some("old".into()), ..existing(&d) };
        assert_eq!(plan(&d, Some(&stale), Some(&env), |_| false), Plan::Update);
        // A Secret that does not serve this CR is rewritten before anything else.
        let earlier = env_secret(&d, Some("uid-0"), d.env_digest());
        assert_eq!(plan(&d, Some(&existing(&d)), Some(&earlier), |_| false), Plan::Update, "an earlier container's");
        let unowned = env_secret(&d, None, d.env_digest());
        assert_eq!(plan(&d, Some(&existing(&d)), Some(&unowned), |_| false), Plan::Update, "without its owner");
        let old_env = env_secret(&d, Some("uid-1"), "another digest");
        assert_eq!(plan(&d, Some(&existing(&d)), Some(&old_env), |_| false), Plan::Update, "its rewrite lost");
        // What the bridge applies reads back the same.
        assert_eq!(Existing::of(&cached(&d.workload), "mw-bridge"), Existing { uid: None, ..existing(&d) });
        // A hand edit of the image is undone; a hand stop is not the bridge's business.
        let spec = |edit: fn(&mut ManagedWorkloadSpec)| {
            let mut spec = d.workload.spec.clone();
            edit(&mut spec);
            SpecFingerprint::of(&spec)
        };
        let edited = Existing { spec: spec(|s| s.image = "nginx:hacked".into()), ..existing(&d) };
        assert_eq!(plan(&d, Some(&edited), Some(&env), |_| false), Plan::Update);
        let stopped = Existing {
            spec: spec(|s| {
                s.state = Some(DesiredState::Stopped);
                s.args = vec!["-v".into()];
            }),
            ..existing(&d)
        };
        assert_eq!(plan(&d, Some(&stopped), Some(&env), |_| false), Plan::UpToDate);
    }

    #[test]
    fn never_touches_what_is_not_ours() {
        let d = desired();
        let env = env_secret(&d, Some("uid-1"), d.env_digest());
        let foreign = Existing { ours: false, ..existing(&d) };
        assert_eq!(plan(&d, Some(&foreign), Some(&env), |_| false).reason(), Some("name_taken"));
        let mine = cached(&d.workload);
        assert!(!Existing::of(&mine, "another-bridge").ours);
        assert_eq!(made_for(&mine, "mw-bridge"), Some((d.key, Some(d.created_at.as_str()))));
        assert_eq!(made_for(&mine, "another-bridge"), None);
        // Taken over by Manager's provider (a node moved to it): the bridge's label is still
        // there, the provider's refuses it.
        let mut taken = d.workload.clone();
        taken.labels_mut().insert(PROVIDER_LABEL.into(), "manager".into());
        let taken = cached(&taken);
        assert!(!Existing::of(&taken, "mw-bridge").ours);
        assert_eq!(
            plan(&d, Some(&Existing::of(&taken, "mw-bridge")), Some(&env), |_| false).reason(),
            Some("name_taken")
        );
        assert_eq!(made_for(&taken, "mw-bridge"), None);
        assert!(!is_orphan(&Existing::of(&taken, "mw-bridge"), |_| true, |_| None), "never deleted as an orphan");
    }

    #[test]
    fn reused_ids_and_moved_hostnames() {
        let d = desired();
        let env = env_secret(&d, Some("uid-1"), d.env_digest());
        let reused = Existing { created_at: Some("2025-01-01 00:00:00.000 +00:00".into()), ..existing(&d) };
        assert_eq!(plan(&d, Some(&reused), Some(&env), |_| false), Plan::Replace { uid: "uid-1".into() });
        let other = RowKey { node_id: 1, id: 99 };
        let taken = Existing { key: Some(other), ..existing(&d) };
        assert_eq!(plan(&d, Some(&taken), Some(&env), |k| k == other).reason(), Some("hostname_collision"));
        assert_eq!(plan(&d, Some(&taken), Some(&env), |_| false), Plan::Replace { uid: "uid-1".into() });
        let deleting = Existing { deleting: true, ..existing(&d) };
        assert_eq!(plan(&d, Some(&deleting), Some(&env), |_| false).reason(), Some("replacing"));
    }

    #[test]
    fn a_container_whose_node_moved_is_held_while_its_old_workload_may_exist() {
        let d = desired();
        let anywhere = |_: &str, _: &str| true;
        assert_eq!(moved_from(None, &d, anywhere), None, "never written back: a new container");
        assert_eq!(moved_from(Some("ns/app"), &d, anywhere), None, "in the namespace it is mapped to");
        assert_eq!(moved_from(Some("4711"), &d, anywhere), None, "a provider id of another kind (a VMID)");
        let held = moved_from(Some("old/app"), &d, anywhere).expect("held");
        assert_eq!(held.reason(), "node_moved");
        assert!(held.to_string().contains("old/app") && held.to_string().contains("namespace ns"), "{held}");
        assert_eq!(moved_from(Some("old/app"), &d, |_, _| false), None, "the old workload is gone: created anew");
    }

    #[test]
    fn orphans_are_ours_on_served_nodes_without_a_row() {
        let d = desired();
        let e = existing(&d);
        let target = RowTarget { created_at: d.created_at.clone(), namespace: "ns".into(), name: "app".into() };
        let at = |t: RowTarget| move |_| Some(t.clone());
        assert!(!is_orphan(&e, |_| true, at(target.clone())));
        assert!(is_orphan(&e, |_| true, |_| None));
        let reused = RowTarget { created_at: "2027-01-01 00:00:00.000 +00:00".into(), ..target.clone() };
        assert!(is_orphan(&e, |_| true, at(reused)), "id re-used");
        assert!(
            is_orphan(&e, |_| true, at(RowTarget { namespace: "elsewhere".into(), ..target.clone() })),
            "node remapped"
        );
        assert!(
            is_orphan(&e, |_| true, at(RowTarget { name: "renamed".into(), ..target.clone() })),
            "hostname changed"
        );
        assert!(!is_orphan(&e, |_| false, |_| None), "node no longer served: left alone");
        assert!(!is_orphan(&Existing { ours: false, ..e.clone() }, |_| true, |_| None));
    }

    fn status(phase: Phase, pod_ip: Option<&str>) -> ManagedWorkloadStatus {
        ManagedWorkloadStatus {
            phase: Some(phase),
            provider_id: Some("ns/app".into()),
            pod_ip: pod_ip.map(Into::into),
            address: pod_ip.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn row_state_follows_status() {
        let mut mw = desired().workload;
        let pod = AddressSource::Pod;
        assert_eq!(row_state(&cached(&mw), pod, None).container_id.as_deref(), Some("ns/app"));
        mw.status = Some(status(Phase::Creating, Some("10.244.0.9")));
        assert_eq!(row_state(&cached(&mw), pod, None).ipv4_address, None, "not before the workload serves");
        mw.status.as_mut().unwrap().phase = Some(Phase::Running);
        assert_eq!(
            row_state(&cached(&mw), pod, None),
            RowState {
                container_id: Some("ns/app".into()),
                ipv4_address: Some("10.244.0.9".into()),
                mac_address: None
            }
        );
        mw.status.as_mut().unwrap().phase = Some(Phase::Stopped);
        assert_eq!(row_state(&cached(&mw), pod, Some("10.244.0.9")).ipv4_address, None);
    }

    #[test]
    fn the_address_is_kept_through_a_rollout_a_restart_and_a_new_pod() {
        let mut mw = desired().workload;
        for source in [AddressSource::Pod, AddressSource::Service] {
            // Updating: the old Pod's IP, then the new one's once it serves.
            mw.status = Some(status(Phase::Updating, Some("10.244.0.9")));
            assert_eq!(row_state(&cached(&mw), source, Some("10.244.0.9")).ipv4_address.as_deref(), Some("10.244.0.9"));
            mw.status = Some(status(Phase::Updating, Some("10.244.0.10")));
            assert_eq!(
                row_state(&cached(&mw), source, Some("10.244.0.9")).ipv4_address.as_deref(),
                Some("10.244.0.10")
            );
            // A one-off restart reads Failed for a while; the Pod, and its IP, stay.
            mw.status = Some(status(Phase::Failed, Some("10.244.0.10")));
            assert_eq!(
                row_state(&cached(&mw), source, Some("10.244.0.10")).ipv4_address.as_deref(),
                Some("10.244.0.10")
            );
            // A new Pod (Creating again) with a new IP: not before it serves.
            mw.status = Some(status(Phase::Creating, Some("10.244.0.11")));
            assert_eq!(row_state(&cached(&mw), source, Some("10.244.0.10")).ipv4_address, None, "{source:?}");
        }
        // With a Service the address does not move: a new Pod keeps it.
        let mut with_service = status(Phase::Creating, Some("10.244.0.11"));
        with_service.address = Some("10.96.0.20".into());
        with_service.service = Some(ServiceStatus { type_: "ClusterIP".into(), ..Default::default() });
        mw.status = Some(with_service.clone());
        let kept = row_state(&cached(&mw), AddressSource::Service, Some("10.96.0.20"));
        assert_eq!(kept.ipv4_address.as_deref(), Some("10.96.0.20"));
        assert_eq!(
            row_state(&cached(&mw), AddressSource::Pod, Some("10.96.0.20")).ipv4_address,
            None,
            "pod: not the Service's"
        );
        mw.status = Some(ManagedWorkloadStatus { phase: Some(Phase::Running), ..with_service });
        assert_eq!(row_state(&cached(&mw), AddressSource::Service, None).ipv4_address.as_deref(), Some("10.96.0.20"));
        assert_eq!(row_state(&cached(&mw), AddressSource::Pod, None).ipv4_address.as_deref(), Some("10.244.0.11"));
        // Stopped on purpose: nothing serves, whatever the row holds.
        mw.spec.state = Some(DesiredState::Stopped);
        assert_eq!(row_state(&cached(&mw), AddressSource::Service, Some("10.96.0.20")).ipv4_address, None);
    }

    #[test]
    fn a_load_balancers_address_only_once_it_has_one() {
        let mut mw = desired().workload;
        let mut pending = status(Phase::Creating, Some("10.244.0.9"));
        pending.address = Some("10.96.0.20".into());
        pending.service = Some(ServiceStatus { type_: "LoadBalancer".into(), ..Default::default() });
        mw.status = Some(pending.clone());
        assert_eq!(row_state(&cached(&mw), AddressSource::Service, None).ipv4_address, None, "not its cluster IP");
        let mut served = ManagedWorkloadStatus { phase: Some(Phase::Running), ..pending };
        served.address = Some("192.0.2.10".into());
        served.service.as_mut().unwrap().load_balancer_ingress = vec!["192.0.2.10".into()];
        mw.status = Some(served);
        assert_eq!(row_state(&cached(&mw), AddressSource::Service, None).ipv4_address.as_deref(), Some("192.0.2.10"));
    }

    #[test]
    fn rows_without_a_live_workload_get_no_address() {
        let written = RowState {
            container_id: Some("ns/app".into()),
            ipv4_address: Some("10.244.0.9".into()),
            mac_address: Some("aa:bb:cc:dd:ee:ff".into()),
        };
        assert_eq!(
            write_back_target(None, &written, AddressSource::Service),
            RowState { container_id: Some("ns/app".into()), ipv4_address: None, mac_address: None },
            "no workload: the dead address goes, the provider id stays"
        );
        let mut mw = desired().workload;
        mw.status = Some(status(Phase::Running, Some("10.244.0.10")));
        assert_eq!(
            write_back_target(Some(&cached(&mw)), &written, AddressSource::Service).ipv4_address.as_deref(),
            Some("10.244.0.10")
        );
    }

    #[test]
    fn the_share() {
        let guard = DeleteGuard { max_percent: 50, minimum: 2, confirm_after: Duration::from_secs(30) };
        assert!(guard.within_share(0, 0));
        assert!(guard.within_share(1, 1), "one deletion goes at any share (once confirmed)");
        assert!(!guard.within_share(2, 2), "a small install's every workload at once: held");
        assert!(guard.within_share(5, 10), "half is allowed");
        assert!(!guard.within_share(6, 10));
        assert!(!guard.within_share(2, 0), "more than it owns (a stale count): held");
        let open = DeleteGuard { max_percent: 100, ..guard };
        assert!(open.within_share(1000, 1000), "100 lets everything through");
        assert!(!DeleteGuard { max_percent: 0, minimum: 1, ..guard }.within_share(1, 1000));
    }

    /// UID → approval annotation value, as a full read finds them.
    fn found(uids: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        uids.iter().map(|(u, a)| (u.to_string(), a.map(str::to_string))).collect()
    }

    #[test]
    fn deletions_wait_for_a_second_read_that_agrees() {
        let guard = DeleteGuard { max_percent: 50, minimum: 2, confirm_after: Duration::from_secs(30) };
        let t0 = Instant::now();
        let later = |s: u64| t0 + Duration::from_secs(s);
        let one = found(&[("a", None)]);
        // Even one of one waits: the read that finds it never confirms it.
        let first = guard.judge(None, &one, 1, t0);
        let Judgement::Unconfirmed { sighting, recheck_at } = first.clone() else { panic!("{first:?}") };
        assert_eq!(recheck_at, later(30));
        // Read again too soon: still waiting, the first sighting's time kept.
        let soon = guard.judge(Some(&sighting), &one, 1, later(10));
        assert_eq!(soon, Judgement::Unconfirmed { sighting: sighting.clone(), recheck_at: later(30) });
        // A later read that agrees: a real deletion of one container goes through.
        let deleted = guard.judge(soon.sighting(), &one, 1, later(31));
        assert_eq!(deleted, Judgement::Delete { sighting: sighting.clone() });
        assert_eq!(deleted.sighting(), None, "what a later read finds is a new set");
        // A later read that found another set starts over (a database in flux).
        let two = found(&[("a", None), ("b", None)]);
        let moved = guard.judge(Some(&sighting), &two, 4, later(31));
        let Judgement::Unconfirmed { sighting: second, recheck_at } = moved else { panic!("{moved:?}") };
        assert_eq!((second.uids.len(), second.at, recheck_at), (2, later(31), later(61)));
        assert_eq!(guard.judge(Some(&second), &two, 4, later(61)), Judgement::Delete { sighting: second.clone() });
        // Nothing to delete forgets the sighting.
        assert_eq!(guard.judge(Some(&second), &found(&[]), 4, later(62)), Judgement::Nothing);
        assert_eq!(Judgement::Nothing.sighting(), None);
    }

    #[test]
    fn a_mass_deletion_waits_for_the_approval_of_all_of_it() {
        let guard = DeleteGuard { max_percent: 50, minimum: 2, confirm_after: Duration::from_secs(30) };
        let t0 = Instant::now();
        let all = found(&[("a", None), ("b", None), ("c", None)]);
        let Judgement::Unconfirmed { sighting, .. } = guard.judge(None, &all, 3, t0) else { panic!() };
        let confirmed = t0 + Duration::from_secs(30);
        let held = guard.judge(Some(&sighting), &all, 3, confirmed);
        let token = approval_token(&sighting.uids);
        assert_eq!(held, Judgement::Held { sighting: sighting.clone(), token: token.clone(), approved: 0 });
        // Approving part of it deletes none of it (approving some never shrinks the rest into
        // the share), nor does another set's token, an old approval left on a CR.
        let part = found(&[("a", Some(&token)), ("b", Some(&token)), ("c", Some("0123456789abcdef"))]);
        assert_eq!(
            guard.judge(Some(&sighting), &part, 3, confirmed),
            Judgement::Held { sighting: sighting.clone(), token: token.clone(), approved: 2 }
        );
        let approved = found(&[("a", Some(&token)), ("b", Some(&token)), ("c", Some(&token))]);
        assert_eq!(
            guard.judge(Some(&sighting), &approved, 3, confirmed),
            Judgement::Delete { sighting: sighting.clone() }
        );
        // The flag's way: 100 % lets the confirmed set through.
        let open = DeleteGuard { max_percent: 100, ..guard };
        assert_eq!(open.judge(Some(&sighting), &all, 3, confirmed), Judgement::Delete { sighting: sighting.clone() });
        // The token is the set's: stable, and another set's differs.
        assert_eq!(token.len(), 16);
        assert_eq!(approval_token(&sighting.uids), token);
        assert_ne!(approval_token(&["a".to_string(), "b".to_string()].into()), token);
    }

    #[test]
    fn orphan_secrets_linear_and_exact() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
        let old = Timestamp::UNIX_EPOCH;
        // The API server's clock; the grace before it is the cutoff.
        let server_now = Timestamp::from_second(1_000_000).unwrap();
        let cutoff = server_now - ORPHAN_SECRET_GRACE;
        let meta = |ns: &str, name: &str, fm: &str, at: Timestamp, owned: bool| ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            labels: Some([(SYNCED_BY_LABEL.to_string(), fm.to_string())].into()),
            creation_timestamp: Some(Time(at)),
            owner_references: owned.then(|| vec![OwnerReference::default()]),
            ..Default::default()
        };
        let secrets = [
            meta("a", "x-manager-env", "mw-bridge", old, false), // its CR exists
            meta("b", "x-manager-env", "mw-bridge", old, false), // CR x is in another namespace
            meta("a", "y-manager-env", "mw-bridge", old, true),  // owned: goes by garbage collection
            meta("a", "z-manager-env", "other", old, false),     // another bridge's
            meta("a", "w-manager-env", "mw-bridge", cutoff, false), // too young
            ObjectMeta {
                // Manager's provider took it over
                labels: Some(
                    [
                        (SYNCED_BY_LABEL.to_string(), "mw-bridge".to_string()),
                        (PROVIDER_LABEL.to_string(), "manager".into()),
                    ]
                    .into(),
                ),
                ..meta("c", "v-manager-env", "mw-bridge", old, false)
            },
        ];
        let secrets = secrets.map(cached_secret);
        let orphans = orphan_secrets(&secrets, [("a".to_string(), "x".to_string())], "mw-bridge", server_now);
        assert_eq!(orphans.len(), 1);
        let (namespace, name) = (orphans[0].namespace(), orphans[0].name_any());
        assert_eq!((namespace.as_deref(), name.as_str()), (Some("b"), "x-manager-env"));

        // 40,000 workloads and Secrets: linear is milliseconds, workloads × Secrets would be
        // 1.6 billion name comparisons.
        let n = 40_000;
        let many: Vec<CachedSecret> = (0..n)
            .map(|i| cached_secret(meta("a", &format!("w{i}{SECRET_SUFFIX}"), "mw-bridge", old, false)))
            .collect();
        let started = std::time::Instant::now();
        let orphans =
            orphan_secrets(&many, (1..n).map(|i| ("a".to_string(), format!("w{i}"))), "mw-bridge", server_now);
        assert_eq!(orphans.iter().map(|s| s.name_any()).collect::<Vec<_>>(), ["w0-manager-env"]);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn a_secrets_age_is_judged_by_the_api_servers_clock() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        // A Secret the API server created a minute ago, its CR not (yet) there, judged on a
        // machine whose clock runs an hour ahead of the API server's: not old enough.
        let server_now = Timestamp::now() - SignedDuration::from_hours(1);
        let meta = |age: SignedDuration| ObjectMeta {
            namespace: Some("a".into()),
            name: Some("x-manager-env".into()),
            labels: Some([(SYNCED_BY_LABEL.to_string(), "mw-bridge".to_string())].into()),
            creation_timestamp: Some(Time(server_now - age)),
            ..Default::default()
        };
        let young = [cached_secret(meta(SignedDuration::from_mins(1)))];
        assert!(orphan_secrets(&young, [], "mw-bridge", server_now).is_empty());
        let old = [cached_secret(meta(SignedDuration::from_mins(6)))];
        assert_eq!(orphan_secrets(&old, [], "mw-bridge", server_now).len(), 1);
    }

    impl Plan {
        fn reason(&self) -> Option<&'static str> {
            match self {
                Plan::Blocked(e) => Some(e.reason()),
                _ => None,
            }
        }
    }
}
