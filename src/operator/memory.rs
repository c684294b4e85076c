//! What the operator remembers per workload between reconciles (failure counts, the status
//! and Deployment it last wrote until its caches show them, when it last wrote). Forgotten
//! with the workload, or after a re-list that no longer holds it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::slim::CachedDeployment;
use kube::Resource;
use kube::runtime::watcher;

use super::by_uid::Uid;
use super::status;
use crate::reflect::Relist;
use crate::resource::Workload;
use crate::resource::{ManagedWorkload, ManagedWorkloadStatus};

/// What the operator remembers per ManagedWorkload UID between reconciles.
#[derive(Default)]
pub struct PerObject {
    inner: Mutex<PerObjectInner>,
}

#[derive(Default)]
struct PerObjectInner {
    /// Consecutive failures, for exponential backoff; cleared on success.
    failures: HashMap<Uid, u32>,
    /// The status last written, until the cache has caught up with it.
    written: HashMap<Uid, Written>,
    /// The Deployment as the last apply returned it, until the cache catches up: while a watch
    /// is down the cache keeps the old one, and every retry would apply the same change again.
    applied: HashMap<Uid, CachedDeployment>,
    /// When each workload's status was last written, so details can wait (`status::urgency`).
    last_write: HashMap<Uid, Instant>,
    /// Refused claim applies (say, an expansion the StorageClass does not allow), per workload
    /// and claim, so the same apply is not sent again before its backoff has passed.
    refusals: HashMap<Uid, HashMap<String, Refused>>,
    /// Objects (kind, name) whose last apply lost its answer (the connection broke after the
    /// request went out), so it may have been carried out and the cache cannot tell. The next
    /// look at them is a GET.
    unanswered: HashMap<Uid, Vec<(&'static str, String)>>,
    /// Workloads whose namespace is being deleted (it refused a create for them): nothing more
    /// is done for them, since the deletion takes them too and every create would be refused.
    closing: HashSet<Uid>,
    relist: Relist<Uid>,
}

/// A refused apply of one desired object, and when it may be tried again.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused {
    /// Fingerprint of the refused desired object: a different one is tried at once.
    pub desired: String,
    /// The API server's words.
    pub message: String,
    attempts: u32,
    retry_at: Instant,
}

/// The first retry of a refused claim apply, doubling per refusal up to `REFUSAL_MAX`.
const REFUSAL_BASE: Duration = Duration::from_secs(10);
const REFUSAL_MAX: Duration = Duration::from_secs(600);

/// A status write the cache may not show yet.
struct Written {
    /// resourceVersion the write produced: a cached CR older than that predates the write.
    version: Option<String>,
    status: ManagedWorkloadStatus,
}

/// `cached` is older than `written`. resourceVersions are compared as numbers only to order
/// the operator's own write against its cache; if either does not parse, only an exact
/// match counts as caught up.
fn older(cached: Option<&str>, written: Option<&str>) -> bool {
    match (cached.and_then(|c| c.parse::<u64>().ok()), written.and_then(|w| w.parse::<u64>().ok())) {
        (Some(c), Some(w)) => c < w,
        _ => cached != written,
    }
}

fn uid(object: &impl Resource) -> Option<Uid> {
    object.meta().uid.as_deref().map(Uid::of)
}

fn version(object: &impl Resource) -> Option<&str> {
    object.meta().resource_version.as_deref()
}

impl PerObject {
    fn lock(&self) -> std::sync::MutexGuard<'_, PerObjectInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep the maps in step with the CR watch, after its cache has taken the event: forget a
    /// status write once the cache shows it (the status is a workload's largest part, and most
    /// workloads see no reconcile for minutes), forget deleted workloads, and after a re-list every
    /// workload no longer listed. A re-listed object is cached as soon as it is listed (`reflect`),
    /// so it too shows the write.
    pub fn observe(&self, event: &watcher::Event<Workload>) {
        let mut inner = self.lock();
        if let Some(listed) = inner.relist.observe(event, uid) {
            inner.failures.retain(|uid, _| listed.contains(uid));
            inner.written.retain(|uid, _| listed.contains(uid));
            inner.applied.retain(|uid, _| listed.contains(uid));
            inner.last_write.retain(|uid, _| listed.contains(uid));
            inner.refusals.retain(|uid, _| listed.contains(uid));
            inner.unanswered.retain(|uid, _| listed.contains(uid));
            inner.closing.retain(|uid| listed.contains(uid));
        }
        match event {
            watcher::Event::Apply(mw) | watcher::Event::InitApply(mw) => inner.echoed(mw),
            watcher::Event::Delete(mw) => inner.forget(uid(mw)),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// The status the CR has as far as the operator knows: the one last written while the cached
    /// CR predates that write, else the cached one. `latest` is the cache's copy now, which may
    /// be newer than the `mw` the reconcile began with.
    pub fn previous_status(
        &self,
        mw: &ManagedWorkload,
        latest: Option<&ManagedWorkload>,
    ) -> Option<ManagedWorkloadStatus> {
        let uid = uid(mw)?;
        let current =
            latest.filter(|l| l.metadata.uid == mw.metadata.uid && older(version(mw), version(*l))).unwrap_or(mw);
        let mut inner = self.lock();
        match inner.written.get(&uid) {
            Some(w) if older(version(current), w.version.as_deref()) => Some(w.status.clone()),
            Some(_) => {
                inner.written.remove(&uid);
                current.status.clone()
            }
            None => current.status.clone(),
        }
    }

    pub fn wrote(&self, mw: &ManagedWorkload, version: Option<String>, status: ManagedWorkloadStatus) {
        if let Some(uid) = uid(mw) {
            let mut inner = self.lock();
            inner.last_write.insert(uid, Instant::now());
            inner.written.insert(uid, Written { version, status });
        }
    }

    /// How long to hold back a status change of this urgency: zero if urgent or if the last
    /// write (since this process started) is long enough ago.
    pub fn hold_back(&self, mw: &ManagedWorkload, urgency: status::Urgency) -> Duration {
        let status::Urgency::Within(delay) = urgency else { return Duration::ZERO };
        let last = uid(mw).and_then(|uid| self.lock().last_write.get(&uid).copied());
        last.map_or(Duration::ZERO, |at| delay.saturating_sub(at.elapsed()))
    }

    /// The live Deployment as far as the operator knows: the one the last apply returned while the
    /// cached one predates it, else the cached one. Nothing cached: the caller asks the API server
    /// (it may have been deleted), and the remembered one is dropped.
    pub fn newest_deployment(
        &self,
        mw: &ManagedWorkload,
        cached: Option<CachedDeployment>,
    ) -> Option<CachedDeployment> {
        let Some(uid) = uid(mw) else { return cached };
        let mut inner = self.lock();
        let newer = match (&cached, inner.applied.get(&uid)) {
            (Some(c), Some(a)) if older(version(c), version(a)) => Some(a.clone()),
            _ => None,
        };
        if newer.is_none() {
            inner.applied.remove(&uid);
        }
        newer.or(cached)
    }

    pub fn applied(&self, mw: &ManagedWorkload, deployment: CachedDeployment) {
        if let Some(uid) = uid(mw) {
            self.lock().applied.insert(uid, deployment);
        }
    }

    /// A new term of leadership: forget the statuses written and when, since another leader may
    /// have overwritten them. Applied Deployments stay: a term often begins as the API server
    /// returns, before the Deployment watch re-lists, and applying again would write one change
    /// twice. A remembered Deployment is used only while the cache is older, so another leader's
    /// newer write wins once cached. Failure counts stay too: they pace retries.
    pub fn new_term(&self) {
        let mut inner = self.lock();
        inner.written.clear();
        inner.last_write.clear();
    }

    pub fn failed(&self, uid: Option<&str>) -> u32 {
        let mut inner = self.lock();
        let n = inner.failures.entry(Uid::of(uid.unwrap_or_default())).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub fn succeeded(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.lock().failures.remove(&Uid::of(uid));
        }
    }

    /// The refusal of `claim`'s apply, if still in force for this desired object (by fingerprint),
    /// and how long until it may be sent again.
    pub fn refusal(&self, mw: &ManagedWorkload, claim: &str, desired: &str) -> Option<(Refused, Duration)> {
        let uid = uid(mw)?;
        let mut inner = self.lock();
        let by_claim = inner.refusals.get_mut(&uid)?;
        match by_claim.get(claim) {
            Some(r) if r.desired == desired => Some((r.clone(), r.retry_at.saturating_duration_since(Instant::now()))),
            // Another desired object (the spec changed): the old refusal says nothing of it.
            Some(_) => {
                by_claim.remove(claim);
                None
            }
            None => None,
        }
    }

    /// `claim`'s apply of `desired` was refused: how long until it may be tried again.
    pub fn refused(&self, mw: &ManagedWorkload, claim: &str, desired: &str, message: &str) -> Duration {
        let Some(uid) = uid(mw) else { return REFUSAL_BASE };
        let mut inner = self.lock();
        let by_claim = inner.refusals.entry(uid).or_default();
        let attempts = by_claim.get(claim).filter(|r| r.desired == desired).map_or(0, |r| r.attempts) + 1;
        let delay = REFUSAL_BASE.saturating_mul(1 << (attempts - 1).min(16)).min(REFUSAL_MAX);
        let refused =
            Refused { desired: desired.into(), message: message.into(), attempts, retry_at: Instant::now() + delay };
        by_claim.insert(claim.into(), refused);
        delay
    }

    /// The apply of `kind` `name` went out and its answer was lost.
    pub fn unanswered(&self, mw: &ManagedWorkload, kind: &'static str, name: &str) {
        let Some(uid) = uid(mw) else { return };
        let mut inner = self.lock();
        let objects = inner.unanswered.entry(uid).or_default();
        if !objects.iter().any(|(k, n)| *k == kind && n == name) {
            objects.push((kind, name.to_string()));
        }
    }

    /// Whether the last apply of `kind` `name` lost its answer and nobody has looked since.
    /// Called on every step, so no allocation, and the map is almost always empty.
    pub fn is_unanswered(&self, mw: &ManagedWorkload, kind: &str, name: &str) -> bool {
        let inner = self.lock();
        !inner.unanswered.is_empty()
            && uid(mw)
                .and_then(|uid| inner.unanswered.get(&uid))
                .is_some_and(|objects| objects.iter().any(|(k, n)| *k == kind && n == name))
    }

    /// `kind` `name` was looked up: what the API server holds is known again.
    pub fn looked_up(&self, mw: &ManagedWorkload, kind: &str, name: &str) {
        let Some(uid) = uid(mw) else { return };
        let mut inner = self.lock();
        let Some(objects) = inner.unanswered.get_mut(&uid) else { return };
        objects.retain(|(k, n)| !(*k == kind && n == name));
        if objects.is_empty() {
            inner.unanswered.remove(&uid);
        }
    }

    /// `uid`'s namespace refused a create because it is being deleted.
    pub fn closing(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.lock().closing.insert(Uid::of(uid));
        }
    }

    /// Whether `mw`'s namespace is being deleted, as a refused create said.
    pub fn is_closing(&self, mw: &ManagedWorkload) -> bool {
        uid(mw).is_some_and(|uid| self.lock().closing.contains(&uid))
    }

    /// `claim` was applied (or needs no apply): any refusal is over.
    pub fn accepted(&self, mw: &ManagedWorkload, claim: &str) {
        let Some(uid) = uid(mw) else { return };
        let mut inner = self.lock();
        if let Some(by_claim) = inner.refusals.get_mut(&uid) {
            by_claim.remove(claim);
            if by_claim.is_empty() {
                inner.refusals.remove(&uid);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> (usize, usize, usize) {
        let inner = self.lock();
        (inner.failures.len(), inner.written.len(), inner.last_write.len())
    }
}

impl PerObjectInner {
    /// The cache now holds `mw`: forget the status write it shows (or an older one).
    fn echoed(&mut self, mw: &Workload) {
        if let Some(uid) = uid(mw)
            && self.written.get(&uid).is_some_and(|w| !older(version(mw), w.version.as_deref()))
        {
            self.written.remove(&uid);
        }
    }

    fn forget(&mut self, uid: Option<Uid>) {
        if let Some(uid) = uid {
            self.failures.remove(&uid);
            self.written.remove(&uid);
            self.applied.remove(&uid);
            self.last_write.remove(&uid);
            self.refusals.remove(&uid);
            self.unanswered.remove(&uid);
            self.closing.remove(&uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Phase;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::core::DeserializeGuard;

    fn workload(uid: &str, rv: &str) -> Workload {
        let mut mw = ManagedWorkload::new("web", Default::default());
        mw.metadata.uid = Some(uid.into());
        mw.metadata.resource_version = Some(rv.into());
        DeserializeGuard(Ok(mw))
    }

    #[test]
    fn an_unanswered_apply_counts_until_it_is_looked_up_or_its_workload_goes() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "10").0 else { unreachable!() };
        objects.unanswered(&mw, "Deployment", "web");
        assert!(!objects.is_unanswered(&mw, "Service", "web"), "another object");
        assert!(objects.is_unanswered(&mw, "Deployment", "web"));
        assert!(
            objects.is_unanswered(&mw, "Deployment", "web"),
            "until a look succeeds (the API server may still be away)"
        );
        objects.looked_up(&mw, "Deployment", "web");
        assert!(!objects.is_unanswered(&mw, "Deployment", "web"));
        objects.unanswered(&mw, "Deployment", "web");
        objects.observe(&watcher::Event::Delete(workload("u1", "11")));
        assert!(!objects.is_unanswered(&mw, "Deployment", "web"), "forgotten with its workload");
    }

    #[test]
    fn a_closing_namespace_is_remembered_until_its_workload_goes() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "10").0 else { unreachable!() };
        let Ok(other) = workload("u2", "10").0 else { unreachable!() };
        objects.closing(Some("u1"));
        assert!(objects.is_closing(&mw));
        assert!(!objects.is_closing(&other), "only the workload a create was refused for");
        objects.observe(&watcher::Event::Delete(workload("u1", "11")));
        assert!(!objects.is_closing(&mw), "forgotten with its workload");
    }

    #[test]
    fn the_last_written_status_counts_until_the_cache_moves_past_it() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "10").0 else { unreachable!() };
        let written = ManagedWorkloadStatus { phase: Some(Phase::Running), ..Default::default() };
        objects.wrote(&mw, Some("12".into()), written.clone());
        assert_eq!(objects.previous_status(&mw, None), Some(written.clone()), "the cache still holds version 10");
        let mut between = mw.clone();
        between.metadata.resource_version = Some("11".into());
        assert_eq!(
            objects.previous_status(&between, None),
            Some(written),
            "version 11 (a spec change) predates it too"
        );
        let mut caught_up = mw.clone();
        caught_up.metadata.resource_version = Some("12".into());
        assert_eq!(objects.previous_status(&caught_up, None), None, "the cache's own status once it has the write");
        assert_eq!(objects.len(), (0, 0, 1), "the write time stays: it spaces the next detail write");
        assert!(older(Some("9"), Some("10")) && !older(Some("10"), Some("10")) && !older(Some("11"), Some("10")));
        assert!(older(Some("x"), Some("y")) && !older(Some("y"), Some("y")), "opaque versions: only equality");
    }

    #[test]
    fn a_write_is_forgotten_once_its_echo_is_cached_and_a_reconcile_of_an_older_copy_reads_the_cache() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "10").0 else { unreachable!() };
        let written = ManagedWorkloadStatus { phase: Some(Phase::Running), ..Default::default() };
        objects.wrote(&mw, Some("12".into()), written.clone());
        objects.observe(&watcher::Event::Apply(workload("u1", "11")));
        assert_eq!(objects.len(), (0, 1, 1), "an older version: the write is kept");
        let echo = {
            let Ok(mut echo) = workload("u1", "12").0 else { unreachable!() };
            echo.status = Some(written.clone());
            echo
        };
        objects.observe(&watcher::Event::Apply(DeserializeGuard(Ok(echo.clone()))));
        assert_eq!(objects.len(), (0, 0, 1), "its echo: the status is the cache's now");
        assert_eq!(objects.previous_status(&mw, Some(&echo)), Some(written), "a reconcile begun before the echo");
        let Ok(other) = workload("u2", "13").0 else { unreachable!() };
        assert_eq!(objects.previous_status(&mw, Some(&other)), None, "a successor's copy says nothing of it");
    }

    #[test]
    fn the_last_applied_deployment_counts_until_the_cache_moves_past_it() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "1").0 else { unreachable!() };
        let at = |rv: &str| {
            let mut d = Deployment::default();
            d.metadata.resource_version = Some(rv.into());
            CachedDeployment::from(d)
        };
        objects.applied(&mw, at("20"));
        let seen = |cached: Option<CachedDeployment>| {
            objects.newest_deployment(&mw, cached).and_then(|d| d.meta().resource_version.clone())
        };
        assert_eq!(seen(Some(at("10"))).as_deref(), Some("20"), "a stale cache: the applied one");
        assert_eq!(seen(Some(at("10"))).as_deref(), Some("20"), "still, on a retry");
        assert_eq!(seen(Some(at("20"))).as_deref(), Some("20"), "caught up");
        assert_eq!(seen(Some(at("10"))).as_deref(), Some("10"), "the memo went once the cache caught up");
        objects.applied(&mw, at("30"));
        assert_eq!(seen(None), None, "not cached: asked of the API server (it may be gone)");
        assert_eq!(seen(Some(at("10"))).as_deref(), Some("10"));
    }

    #[test]
    fn a_refused_apply_backs_off_until_the_desired_object_changes() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "1").0 else { unreachable!() };
        assert_eq!(objects.refusal(&mw, "web-data", "h1"), None);
        assert_eq!(objects.refused(&mw, "web-data", "h1", "no expansion"), REFUSAL_BASE);
        let (refused, left) = objects.refusal(&mw, "web-data", "h1").unwrap();
        assert_eq!(refused.message, "no expansion");
        assert!(left > Duration::ZERO && left <= REFUSAL_BASE);
        assert_eq!(objects.refused(&mw, "web-data", "h1", "no expansion"), REFUSAL_BASE * 2, "doubles");
        assert_eq!(objects.refused(&mw, "web-data", "h1", "no expansion"), REFUSAL_BASE * 4);
        for _ in 0..20 {
            objects.refused(&mw, "web-data", "h1", "no expansion");
        }
        assert_eq!(objects.refused(&mw, "web-data", "h1", "no expansion"), REFUSAL_MAX, "bounded");
        assert_eq!(objects.refusal(&mw, "web-data", "h2"), None, "a changed spec is tried at once");
        assert_eq!(objects.refused(&mw, "web-data", "h2", "again"), REFUSAL_BASE, "and starts over");
        objects.accepted(&mw, "web-data");
        assert_eq!(objects.refusal(&mw, "web-data", "h2"), None);
        objects.refused(&mw, "web-data", "h2", "again");
        objects.observe(&watcher::Event::Delete(workload("u1", "2")));
        assert_eq!(objects.refusal(&mw, "web-data", "h2"), None, "forgotten with the workload");
    }

    #[test]
    fn a_new_term_forgets_status_writes_but_not_what_was_applied() {
        let objects = PerObject::default();
        let Ok(mw) = workload("u1", "10").0 else { unreachable!() };
        let mut deployment = Deployment::default();
        deployment.metadata.resource_version = Some("20".into());
        let deployment = CachedDeployment::from(deployment);
        let written = ManagedWorkloadStatus { phase: Some(Phase::Running), ..Default::default() };
        objects.wrote(&mw, Some("12".into()), written.clone());
        objects.applied(&mw, deployment);
        objects.failed(Some("u1"));
        let detail = status::Urgency::Within(Duration::from_secs(60));
        assert_eq!(
            objects.previous_status(&mw, None),
            Some(written),
            "within the term: the write, not the stale cache"
        );
        assert!(!objects.hold_back(&mw, detail).is_zero(), "within the term: details wait after a write");
        objects.new_term();
        assert_eq!(objects.previous_status(&mw, None), None, "the cache's own status");
        let mut cached = Deployment::default();
        cached.metadata.resource_version = Some("15".into());
        let seen = objects
            .newest_deployment(&mw, Some(CachedDeployment::from(cached)))
            .and_then(|d| d.meta().resource_version.clone());
        assert_eq!(seen.as_deref(), Some("20"), "the earlier term's apply, newer than the stale cache");
        let mut caught_up = Deployment::default();
        caught_up.metadata.resource_version = Some("25".into());
        let seen = objects
            .newest_deployment(&mw, Some(CachedDeployment::from(caught_up)))
            .and_then(|d| d.meta().resource_version.clone());
        assert_eq!(seen.as_deref(), Some("25"), "a newer write (another leader's) once the cache shows it");
        assert!(objects.hold_back(&mw, detail).is_zero(), "a difference is written at once");
        assert_eq!(objects.len(), (1, 0, 0), "failure counts stay");
    }

    #[test]
    fn per_object_state_goes_with_the_object() {
        let objects = PerObject::default();
        for uid in ["u1", "u2", "u3"] {
            objects.failed(Some(uid));
            let Ok(mw) = workload(uid, "1").0 else { unreachable!() };
            objects.wrote(&mw, Some("2".into()), Default::default());
        }
        objects.observe(&watcher::Event::Delete(workload("u1", "2")));
        assert_eq!(objects.len(), (2, 2, 2));
        // A re-list after a watch gap that hid u2's deletion.
        objects.observe(&watcher::Event::Init);
        objects.observe(&watcher::Event::InitApply(workload("u3", "1")));
        objects.observe(&watcher::Event::InitDone);
        assert_eq!(objects.len(), (1, 1, 1), "u3 listed as it was before its write");
        objects.succeeded(Some("u3"));
        assert_eq!(objects.len(), (0, 1, 1));
        // The next re-list shows the write: an echo, as the re-listed CR is cached at once.
        objects.observe(&watcher::Event::Init);
        objects.observe(&watcher::Event::InitApply(workload("u3", "2")));
        assert_eq!(objects.len(), (0, 0, 1));
        objects.observe(&watcher::Event::InitDone);
        assert_eq!(objects.len(), (0, 0, 1));
    }
}
