//! The bridge's loop: rows → desired CRs → apply; CR status → row updates.
//!
//! Each poll (default 2 s) reads a cheap fingerprint and the rows changed since the last
//! `updatedAt` seen, maps the changed ones and applies what differs. A full resync (on a
//! timer, or at once when the fingerprint shows a deleted row or a changed node, setting or
//! resource request) re-reads everything and deletes the CRs whose row is gone, once the
//! deletion guard (`plan::DeleteGuard`) lets it: a second full read agrees and the set is
//! within the share or approved; nothing else waits for that. After each pass, and whenever
//! a watched CR changes, the CRs' provider id and Pod IP are written back.
//!
//! Nothing is lost on failure: changed rows stay pending in memory until they are synced, and
//! a failed pass (database or API server down) is retried with exponential backoff.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Resource, ResourceExt};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::cached::{CachedSecret, CachedWorkload, MadeBy};
use super::cluster::{Cluster, CreateStep};
use super::db::{self, Database, WriteBackError};
use super::env::{self, DefaultEnv};
use super::error::{BridgeError, RowError};
use super::mapping::{self, APPROVE_DELETION_ANNOTATION, Context, Desired, SYNCED_BY_LABEL};
use super::metrics::Metrics;
use super::plan::{self, DeleteGuard, Existing, Judgement, Plan, Sighting};
use super::rows::{ContainerRow, Fingerprint, Grants, RowKey};
use crate::retry::Backoff;
use crate::telemetry::Health;
use crate::write::{Write, found_another};

/// Rows committed a little after a later `updatedAt` was already seen are still found: each
/// incremental poll looks this far back (rows already seen unchanged cost nothing).
const OVERLAP: SignedDuration = SignedDuration::from_secs(10);
/// How soon a row blocked by the cluster (a name taken, a CR still being deleted, a unique
/// IP) is tried again.
const ROW_RETRY: Duration = Duration::from_secs(10);
/// Rows mapped and synced per batch within a pass.
const SYNC_CHUNK: usize = 256;
/// After a failed pass: 1 s, doubling, up to a minute (shared rule: `crate::retry`).
const BACKOFF: Backoff = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) };

/// A Manager node and the namespace its containers go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMapping {
    pub node: String,
    pub namespace: String,
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub nodes: Vec<NodeMapping>,
    pub field_manager: String,
    pub poll_interval: Duration,
    pub resync_interval: Duration,
    pub requests_percent: u32,
    /// How the approved rootfs becomes the workload's volume.
    pub rootfs: mapping::RootfsVolume,
    /// Whether and how a row's services become a Service.
    pub service: mapping::ServiceSettings,
    /// Which templates run as system containers.
    pub system_images: mapping::SystemImages,
    /// Isolation for every container (`--isolation-allow-from`).
    pub isolation: Option<crate::resource::Isolation>,
    /// What is written back as `ipv4Address`.
    pub address: plan::AddressSource,
    /// API requests in flight at once during a pass.
    pub concurrency: usize,
    /// The longest one pass (or one write-back) may take before it is abandoned and retried.
    pub pass_timeout: Duration,
    /// How many workloads one pass may delete.
    pub delete_guard: DeleteGuard,
}

/// The longest a healthy loop goes without finishing a pass or a write-back: one that runs
/// into its time limit, then the longest backoff with its jitter (or a poll interval), twice
/// over for room. Beyond it `/healthz` reports the loop stalled.
pub fn stall_limit(settings: &Settings) -> Duration {
    (settings.pass_timeout + BACKOFF.max.mul_f64(1.2).max(settings.poll_interval)) * 2
}

/// What the bridge remembers of one row.
struct Tracked {
    row: ContainerRow,
    namespace: String,
    /// Changed (or re-checked) since last synced.
    pending: bool,
    /// Why the row did not sync, as last reported (logged and counted once per change).
    error: Option<RowError>,
    write_back_error: Option<RowError>,
    retry_at: Option<Instant>,
    synced_at: Option<Instant>,
    /// The `updatedAt` the bridge's last write-back to the row stamped: read back, it is the
    /// bridge's own write, not Manager's, and does not move the watermark.
    own_stamp: Option<String>,
}

pub struct Bridge {
    db: Database,
    cluster: Arc<Cluster>,
    settings: Settings,
    /// Served node id → namespace, resolved from `Nodes` on each full resync.
    served: HashMap<i64, String>,
    defaults: DefaultEnv,
    /// The system env defaults were read at least once (or are absent). Until then no row is
    /// synced: syncing without them would roll every workload out without its system env.
    defaults_known: bool,
    defaults_error: Option<String>,
    grants: Grants,
    /// Boxed: the table has room for up to twice the rows it holds, and an empty slot then
    /// costs a pointer rather than a whole row.
    rows: HashMap<RowKey, Box<Tracked>>,
    unmapped: HashSet<RowKey>,
    /// Rows updated at or after this (less `OVERLAP`) are read by the next incremental poll:
    /// the newest `updatedAt` seen, but never later than the database's clock at the read,
    /// so a row stamped in the future (a writer whose clock runs ahead) cannot move it past
    /// the edits that follow.
    watermark: Option<Timestamp>,
    /// The database's clock at the start of the current pass.
    db_now: Option<Timestamp>,
    fingerprint: Option<Fingerprint>,
    next_full: Instant,
    /// What the last full read found to delete, for the deletion guard to compare the next
    /// with.
    deletions: Option<Sighting>,
    /// The token of the held set last reported, so a held set is logged once, not every read.
    held: Option<String>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// A CR of this bridge whose row is gone.
struct Orphan {
    namespace: String,
    name: String,
    uid: String,
    key: Option<RowKey>,
    /// Its approval annotation (`APPROVE_DELETION_ANNOTATION`), if set.
    approval: Option<String>,
}

/// Up to ten `namespace/name`s of `orphans`, for a log line, and how many more.
fn named(orphans: &[Orphan]) -> String {
    const SHOWN: usize = 10;
    let mut text =
        orphans.iter().take(SHOWN).map(|o| format!("{}/{}", o.namespace, o.name)).collect::<Vec<_>>().join(", ");
    if orphans.len() > SHOWN {
        text.push_str(&format!(" and {} more", orphans.len() - SHOWN));
    }
    text
}

/// A mapped row to sync: what it should be, what the CR cache holds of it, and whether its
/// Secret is cached.
type Job = (Desired, Option<Existing>, Option<Arc<CachedSecret>>);

/// How one row's sync ended.
enum Outcome {
    Synced,
    Row(RowError),
    Transient(BridgeError),
}

impl Bridge {
    pub fn new(
        db: Database,
        cluster: Arc<Cluster>,
        settings: Settings,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Self {
        // A term starts knowing of no deletion; the gauges say so from the start.
        metrics.set_deletions_pending(0, 0);
        Bridge {
            db,
            cluster,
            settings,
            served: HashMap::new(),
            defaults: DefaultEnv::default(),
            defaults_known: false,
            defaults_error: None,
            grants: Grants::default(),
            rows: HashMap::new(),
            unmapped: HashSet::new(),
            watermark: None,
            db_now: None,
            fingerprint: None,
            next_full: Instant::now(),
            deletions: None,
            held: None,
            metrics,
            health,
        }
    }

    /// Run until `shutdown` resolves.
    pub async fn run(mut self, changed: Arc<Notify>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut failures = 0u32;
        let mut next_poll = Instant::now();
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep_until(next_poll) => {
                    let result = self.poll().instrument(info_span!("poll")).await;
                    self.health.beat();
                    next_poll = Instant::now() + match result {
                        Ok(()) => {
                            if failures > 0 {
                                info!("sync recovered");
                            }
                            failures = 0;
                            self.settings.poll_interval
                        }
                        Err(err) => {
                            failures = failures.saturating_add(1);
                            let delay = BACKOFF.delay(failures);
                            warn!(error = %err, failures, retry_in = ?delay, "sync pass failed; pending rows are kept");
                            delay
                        }
                    };
                }
                _ = changed.notified(), if failures == 0 => {
                    // Coalesce a burst of status changes into one pass.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let limit = self.settings.pass_timeout;
                    let result = tokio::time::timeout(limit, self.write_back())
                        .await
                        .unwrap_or(Err(BridgeError::PassTimeout { limit }));
                    if let Err(err) = result {
                        warn!(error = %err, "writing back to Manager failed; retrying on the next poll");
                    }
                    self.health.beat();
                }
            }
        }
        info!("bridge stopped");
    }

    fn served_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.served.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// One pass: find changes, sync pending rows, write back.
    async fn poll(&mut self) -> Result<(), BridgeError> {
        // Bounded: a connection that hangs without failing (no reply, no reset) would
        // otherwise pin the pass, and with it every row, forever. Whatever the pass finished
        // is kept (each row is recorded as its writes end); the rest stays pending for the next.
        let limit = self.settings.pass_timeout;
        let result = tokio::time::timeout(limit, self.pass()).await.unwrap_or(Err(BridgeError::PassTimeout { limit }));
        self.metrics.pass(result.is_ok());
        let failing = self.rows.values().filter(|t| t.error.is_some() || t.write_back_error.is_some()).count();
        self.metrics.rows.set(i64::try_from(self.rows.len()).unwrap_or(i64::MAX));
        self.metrics.rows_failing.set(i64::try_from(failing).unwrap_or(i64::MAX));
        // Ready while passes succeed: a bridge that cannot reach its database or the API
        // server says so on /readyz (and in its log).
        self.health.set_ready(result.is_ok());
        result
    }

    async fn pass(&mut self) -> Result<(), BridgeError> {
        let started = Instant::now();
        let fingerprint = self.db.fingerprint(&self.served_ids()).await?;
        self.db_now = db::parse_timestamp(&fingerprint.db_now);
        let mut full = Instant::now() >= self.next_full || self.outside_containers_changed(&fingerprint);
        if !full {
            self.incremental().await?;
            // Every row in the cache still exists exactly when count and id sum agree.
            let (count, sum) = self.rows.keys().fold((0i64, 0i64), |(c, s), k| (c + 1, s.wrapping_add(k.id)));
            full = count != fingerprint.containers || sum != fingerprint.id_sum;
        }
        if full {
            self.full_resync().await?;
        }
        // Deletions are judged on full reads only (`plan::DeleteGuard`); whatever waits, every
        // other row is synced and written back meanwhile.
        let deleting = if full { self.judge_deletions() } else { Vec::new() };
        self.fingerprint = Some(fingerprint);
        let allowed: HashSet<String> = deleting.iter().map(|o| o.uid.clone()).collect();
        self.sync_pending(&allowed).await?;
        if full {
            self.collect_orphans(deleting).await?;
            self.next_full = self.next_full_after(Instant::now());
            self.metrics.full_resync_seconds.observe(started.elapsed().as_secs_f64());
            info!(rows = self.rows.len(), took = ?started.elapsed(), "full resync done");
        }
        self.write_back().await
    }

    /// When the next full resync is due: after the resync interval, or sooner while the
    /// deletion guard waits: as soon as a found set may be confirmed, and every
    /// `confirm_after` while a set is held (so an approval takes effect within that).
    fn next_full_after(&self, now: Instant) -> Instant {
        let regular = now + self.settings.resync_interval;
        let Some(sighting) = &self.deletions else { return regular };
        let confirm_after = self.settings.delete_guard.confirm_after;
        let confirmable = Instant::from_std(sighting.at) + confirm_after;
        regular.min(if confirmable > now { confirmable } else { now + confirm_after })
    }

    /// Nodes, settings, resource requests or services changed: every row may map differently.
    fn outside_containers_changed(&self, now: &Fingerprint) -> bool {
        self.fingerprint.as_ref().is_none_or(|before| {
            before.nodes_updated != now.nodes_updated
                || before.settings_updated != now.settings_updated
                || before.grants_updated != now.grants_updated
                || before.services_updated != now.services_updated
        })
    }

    async fn incremental(&mut self) -> Result<(), BridgeError> {
        let since = self.watermark.map(|w| w.saturating_sub(OVERLAP).unwrap_or(w));
        let rows = self.db.containers_with_services(&self.served_ids(), since).await?;
        debug!(rows = rows.len(), "incremental poll");
        for row in rows {
            self.track(row, false);
        }
        Ok(())
    }

    async fn full_resync(&mut self) -> Result<(), BridgeError> {
        let started = Instant::now();
        self.resolve_nodes().await?;
        match self.db.default_env_setting().await? {
            None => {
                self.defaults = DefaultEnv::default();
                self.defaults_known = true;
            }
            Some(setting) => match env::parse_defaults(&setting) {
                Ok(defaults) => {
                    if !defaults.skipped_keys.is_empty() && defaults != self.defaults {
                        warn!(keys = ?defaults.skipped_keys, "Settings.default_container_env_vars has keys that are not variable names; skipped, as Manager skips them");
                    }
                    self.defaults = defaults;
                    self.defaults_known = true;
                    self.defaults_error = None;
                }
                Err(why) => {
                    if self.defaults_error.as_deref() != Some(why.as_str()) {
                        if self.defaults_known {
                            error!(error = %why, "Settings.default_container_env_vars cannot be read; keeping the last good defaults");
                        } else {
                            error!(error = %why, "Settings.default_container_env_vars cannot be read and no earlier value is known; no row is synced until it is fixed");
                        }
                        self.metrics.row_error("bad_settings");
                    }
                    self.defaults_error = Some(why);
                }
            },
        }
        self.grants = Grants::from_rows(self.db.approved_grants().await?);
        let rows = self.db.containers_with_services(&self.served_ids(), None).await?;
        let seen: HashSet<RowKey> = rows.iter().map(ContainerRow::key).collect();
        self.rows.retain(|key, _| seen.contains(key));
        for row in rows {
            self.track(row, true);
        }
        self.report_unmapped().await?;
        info!(rows = self.rows.len(), nodes = self.served.len(), took = ?started.elapsed(), "full resync read");
        Ok(())
    }

    async fn resolve_nodes(&mut self) -> Result<(), BridgeError> {
        let nodes = self.db.kubernetes_nodes().await?;
        let mut served = HashMap::new();
        for mapping in &self.settings.nodes {
            let matches: Vec<_> = nodes.iter().filter(|n| n.name == mapping.node).collect();
            match matches.as_slice() {
                [node] => {
                    served.insert(node.id, mapping.namespace.clone());
                }
                [] => {
                    warn!(node = %mapping.node, "no Manager node of type 'kubernetes' has this name; nothing is synced for it")
                }
                _ => {
                    error!(node = %mapping.node, "several Manager nodes of type 'kubernetes' have this name; rename one, nothing is synced for them")
                }
            }
        }
        if served != self.served {
            info!(nodes = ?served, "serving Manager nodes (id → namespace)");
        }
        self.served = served;
        Ok(())
    }

    async fn report_unmapped(&mut self) -> Result<(), BridgeError> {
        let unmapped: HashSet<RowKey> = self
            .db
            .unmapped_containers(&self.served_ids())
            .await?
            .into_iter()
            .map(|(id, node_id)| RowKey { node_id, id })
            .collect();
        for key in unmapped.difference(&self.unmapped) {
            let err = RowError::UnmappedNode { node_id: key.node_id };
            warn!(row = %key, reason = %err.reason(), error = %err, "row not synced");
            self.metrics.row_error(err.reason());
        }
        self.unmapped = unmapped;
        Ok(())
    }

    /// Remember a row read from the database; it is pending when it is new or changed, or
    /// when `recheck` (a full resync compares every row with the cluster again).
    fn track(&mut self, row: ContainerRow, recheck: bool) {
        let own_stamp = self.rows.get(&row.key()).and_then(|t| t.own_stamp.as_deref());
        if let Some(at) = manager_stamp(&row, own_stamp) {
            self.watermark = advance(self.watermark, at, self.db_now);
        }
        let Some(namespace) = self.served.get(&row.node_id).cloned() else { return };
        let mut moved = false;
        match self.rows.get_mut(&row.key()) {
            Some(t) if t.row == row && t.namespace == namespace => t.pending |= recheck,
            Some(t) => {
                // A new hostname means a new CR; the old one goes at the next full resync,
                // which is made the next pass so two copies do not run for long.
                moved = t.row.hostname != row.hostname;
                t.row = row;
                t.namespace = namespace;
                t.pending = true;
                t.retry_at = None;
            }
            None => {
                let tracked = Tracked {
                    row,
                    namespace,
                    pending: true,
                    error: None,
                    write_back_error: None,
                    retry_at: None,
                    synced_at: None,
                    own_stamp: None,
                };
                self.rows.insert(tracked.row.key(), Box::new(tracked));
            }
        }
        if moved {
            self.next_full = Instant::now();
        }
    }

    /// Map every pending row and apply what differs, a bounded number of requests at once.
    /// `deletable`: the UIDs of the CRs the deletion guard lets this pass delete (a CR of a
    /// row's name that stands for a gone container is replaced only if it is one of them).
    async fn sync_pending(&mut self, deletable: &HashSet<String>) -> Result<(), BridgeError> {
        if !self.defaults_known {
            return Ok(());
        }
        let now = Instant::now();
        let live: Arc<HashSet<RowKey>> = Arc::new(self.rows.keys().copied().collect());
        let deletable = Arc::new(deletable.clone());
        let fm = self.settings.field_manager.clone();
        let cr_key = |t: &Tracked| {
            let mw = self.cluster.workload(&t.namespace, &t.row.hostname)?;
            plan::made_for(&mw, &fm).map(|(key, _)| key)
        };
        let mut pending: Vec<(bool, RowKey)> = self
            .rows
            .iter()
            .filter(|(_, t)| t.pending && t.retry_at.is_none_or(|at| at <= now))
            .map(|(key, t)| (cr_key(t) != Some(*key), *key))
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        // Two pending rows wanting one name (the same hostname on two sites whose nodes map to
        // one namespace) must not race to create it: the row whose CR it already is keeps
        // it, else the lowest key, and the others are collisions.
        pending.sort_unstable();
        let mut claimed: HashMap<(&str, &str), RowKey> = HashMap::new();
        let mut collisions = Vec::new();
        let mut order = Vec::with_capacity(pending.len());
        for (_, key) in pending {
            let t = &self.rows[&key];
            match claimed.get(&(t.namespace.as_str(), t.row.hostname.as_str())) {
                Some(owner) => collisions.push((
                    key,
                    Outcome::Row(RowError::HostnameCollision {
                        namespace: t.namespace.clone(),
                        name: t.row.hostname.clone(),
                        other: owner.to_string(),
                    }),
                )),
                None => {
                    claimed.insert((t.namespace.as_str(), t.row.hostname.as_str()), key);
                    order.push(key);
                }
            }
        }
        self.record(collisions);
        // Mapped a chunk at a time, so a first sync of thousands of rows never holds every
        // desired object in memory at once; the next chunk is mapped while the writes of the
        // one before are still in flight, so the API server never idles on a chunk's tail.
        // Each row's outcome is recorded as it comes: a pass cut short (its time limit, a
        // failure) keeps whatever it finished.
        let cluster = self.cluster.clone();
        let sync = |(desired, cached, secret): Job| {
            let (cluster, live, deletable, fm) = (cluster.clone(), live.clone(), deletable.clone(), fm.clone());
            async move {
                let key = desired.key;
                let span = info_span!("row", id = key.id, node = key.node_id, name = %desired.name);
                let known = Known { live: &live, deletable: &deletable };
                (key, sync_one(&cluster, &fm, desired, cached, secret, known).instrument(span).await)
            }
        };
        let mut chunks = order.chunks(SYNC_CHUNK);
        let mut failed = None;
        let next_chunk = |bridge: &mut Self| {
            let (jobs, unmappable) = bridge.map_rows(chunks.next()?, &fm);
            bridge.record(unmappable);
            Some(jobs)
        };
        // After a transient failure nothing new starts; what is in flight finishes.
        let done = |bridge: &mut Self, outcome| match bridge.record([outcome]) {
            Some(err) => {
                failed.get_or_insert(err);
                false
            }
            None => true,
        };
        let concurrency = self.settings.concurrency;
        pipeline(self, concurrency, next_chunk, sync, done).await;
        failed.map_or(Ok(()), Err)
    }

    /// `keys`' rows mapped to the objects they should be, each beside what the caches hold
    /// of them; a row that does not map is its outcome at once.
    fn map_rows(&self, keys: &[RowKey], fm: &str) -> (Vec<Job>, Vec<(RowKey, Outcome)>) {
        let mut jobs = Vec::with_capacity(keys.len());
        let mut unmappable = Vec::new();
        for key in keys {
            let t = &self.rows[key];
            let cx = Context {
                namespace: &t.namespace,
                field_manager: fm,
                defaults: &self.defaults,
                grants: &self.grants,
                requests_percent: self.settings.requests_percent,
                rootfs: &self.settings.rootfs,
                service: &self.settings.service,
                system_images: &self.settings.system_images,
                isolation: &self.settings.isolation,
            };
            let cluster = &self.cluster;
            // Where it watches the old namespace, the old workload's deletion (the deletion
            // guard's, as an orphan) lets the row go; elsewhere only the administrator can.
            let still_there = |ns: &str, name: &str| !cluster.watches(ns) || cluster.workload(ns, name).is_some();
            match mapping::desired(&t.row, &cx) {
                Err(err) => unmappable.push((*key, Outcome::Row(err))),
                Ok(desired) => match plan::moved_from(t.row.container_id.as_deref(), &desired, still_there) {
                    Some(held) => unmappable.push((*key, Outcome::Row(held))),
                    None => {
                        let cached =
                            self.cluster.workload(&desired.namespace, &desired.name).map(|mw| Existing::of(&mw, fm));
                        let secret = self.cluster.secret(&desired.namespace, &desired.secret_name);
                        jobs.push((desired, cached, secret));
                    }
                },
            }
        }
        (jobs, unmappable)
    }

    /// Apply the outcomes of syncing rows to what the bridge remembers of them; the first
    /// transient error, if any, fails the pass (the rows stay pending).
    fn record(&mut self, outcomes: impl IntoIterator<Item = (RowKey, Outcome)>) -> Option<BridgeError> {
        let mut transient = None;
        for (key, outcome) in outcomes {
            let Some(t) = self.rows.get_mut(&key) else { continue };
            match outcome {
                Outcome::Synced => {
                    if let Some(err) = t.error.take() {
                        info!(row = %key, hostname = %t.row.hostname, was = %err.reason(), "row synced again");
                    }
                    t.pending = false;
                    t.retry_at = None;
                    t.synced_at = Some(Instant::now());
                }
                Outcome::Row(err) => {
                    // A CR to replace that no full read has found to delete yet (a row that
                    // re-uses a gone container's hostname or id, seen by an incremental
                    // poll): the next pass reads everything, so the guard starts on it.
                    if let RowError::AwaitingDeletion { uid, .. } = &err
                        && !self.deletions.as_ref().is_some_and(|s| s.uids.contains(uid))
                    {
                        self.next_full = Instant::now();
                    }
                    // Conditions in the cluster can clear by themselves; a bad row waits for
                    // the row (or a full resync) to change.
                    let retry = matches!(
                        err,
                        RowError::NameTaken { .. }
                            | RowError::SecretTaken { .. }
                            | RowError::HostnameCollision { .. }
                            | RowError::Replacing { .. }
                            | RowError::AwaitingDeletion { .. }
                            | RowError::NodeMoved { .. }
                    );
                    t.pending = retry;
                    t.retry_at = retry.then(|| Instant::now() + ROW_RETRY);
                    report(&self.metrics, key, &t.row.hostname, &mut t.error, err);
                }
                Outcome::Transient(err) => {
                    transient.get_or_insert(err);
                }
            }
        }
        transient
    }

    /// The CRs this bridge made whose row is gone (or belongs elsewhere now).
    fn orphans(&self) -> Vec<Orphan> {
        let fm = &self.settings.field_manager;
        let target = |key: RowKey| {
            self.rows.get(&key).map(|t| plan::RowTarget {
                created_at: t.row.created_at.clone(),
                namespace: t.namespace.clone(),
                name: t.row.hostname.clone(),
            })
        };
        let mut orphans = Vec::new();
        for mw in self.cluster.workloads() {
            let existing = Existing::of(&mw, fm);
            if !plan::is_orphan(&existing, |node| self.served.contains_key(&node), target) {
                continue;
            }
            if let (Some(namespace), Some(uid)) = (mw.namespace(), existing.uid) {
                orphans.push(Orphan {
                    namespace,
                    name: mw.name_any(),
                    uid,
                    key: existing.key,
                    approval: mw.approval.clone(),
                });
            }
        }
        orphans.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        orphans
    }

    /// How many CRs of this bridge, not being deleted, stand for rows of the nodes it serves:
    /// what the deletion guard's share is of.
    fn owned(&self) -> usize {
        let fm = &self.settings.field_manager;
        self.cluster
            .workloads()
            .iter()
            .filter(|mw| mw.meta().deletion_timestamp.is_none())
            .filter(|mw| plan::made_for(mw, fm).is_some_and(|(key, _)| self.served.contains_key(&key.node_id)))
            .count()
    }

    /// After a full read: put the CRs whose row is gone before the deletion guard, say what
    /// it decided (once per change), and return the ones it lets this pass delete.
    fn judge_deletions(&mut self) -> Vec<Orphan> {
        let orphans = self.orphans();
        let found = orphans.iter().map(|o| (o.uid.clone(), o.approval.clone())).collect();
        let owned = self.owned();
        let guard = self.settings.delete_guard;
        let now = Instant::now();
        let judgement = guard.judge(self.deletions.as_ref(), &found, owned, now.into_std());
        let names = || named(&orphans);
        let fresh = |s: &Sighting| self.deletions.as_ref().is_none_or(|d| d.uids != s.uids);
        match &judgement {
            Judgement::Nothing => {
                if self.deletions.is_some() {
                    info!(
                        "no ManagedWorkload is to be deleted any more (their rows are back, or they went otherwise); nothing was deleted"
                    );
                }
                self.metrics.set_deletions_pending(0, 0);
            }
            Judgement::Unconfirmed { sighting, recheck_at } => {
                if fresh(sighting) {
                    info!(
                        count = orphans.len(),
                        workloads = %names(),
                        confirm_in = ?recheck_at.saturating_duration_since(now.into_std()),
                        "rows are gone; their ManagedWorkloads are deleted once a second full read agrees"
                    );
                }
                self.metrics.set_deletions_pending(orphans.len(), 0);
            }
            Judgement::Delete { .. } => self.metrics.set_deletions_pending(0, 0),
            Judgement::Held { token, approved, .. } => {
                if self.held.as_ref() != Some(token) {
                    warn!(
                        deleting = orphans.len(),
                        owned,
                        max_percent = guard.max_percent,
                        approved,
                        workloads = %names(),
                        "holding back the deletion of {} of the bridge's {owned} ManagedWorkloads (more than {}%): is this \
                         the right Manager database? Everything else goes on syncing. If the rows really are gone, approve \
                         exactly these deletions with `kubectl annotate mw -A -l {SYNCED_BY_LABEL}={} \
                         {APPROVE_DELETION_ANNOTATION}={token} --overwrite`, or run the bridge with --max-delete-percent 100",
                        orphans.len(),
                        guard.max_percent,
                        self.settings.field_manager,
                    );
                }
                self.metrics.set_deletions_pending(0, orphans.len());
            }
        }
        self.held = match &judgement {
            Judgement::Held { token, .. } => Some(token.clone()),
            _ => None,
        };
        self.deletions = judgement.sighting().cloned();
        if matches!(judgement, Judgement::Delete { .. }) { orphans } else { Vec::new() }
    }

    /// Delete the CRs the deletion guard let go, and Secrets this bridge wrote whose CR never
    /// came (a crash between the two writes).
    async fn collect_orphans(&mut self, deleting: Vec<Orphan>) -> Result<(), BridgeError> {
        for Orphan { namespace: ns, name, uid, key, .. } in deleting {
            info!(namespace = %ns, name = %name, row = ?key, "row is gone; deleting its ManagedWorkload");
            self.cluster.delete_workload(&ns, &name, &uid).await.map_err(|source| BridgeError::Kube {
                operation: format!("deleting ManagedWorkload {ns}/{name}"),
                source,
            })?;
        }
        // A Secret's age is its creationTimestamp, stamped by the API server: judged by the
        // API server's clock, never this machine's, which may be off from it.
        let server_now = match self.cluster.server_time().await {
            Ok(now) => now,
            Err(err) => {
                warn!(error = %err, "cannot read the API server's clock; orphaned env Secrets wait for the next full resync");
                return Ok(());
            }
        };
        let secrets = self.cluster.secrets();
        let workloads = self.cluster.workloads();
        let names = workloads.iter().filter_map(|mw| Some((mw.namespace()?, mw.name_any())));
        let orphaned =
            plan::orphan_secrets(secrets.iter().map(|s| &**s), names, &self.settings.field_manager, server_now);
        for secret in orphaned {
            let meta = secret.meta();
            let (Some(ns), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else { continue };
            info!(namespace = %ns, name = %name, "deleting an env Secret whose ManagedWorkload was never created");
            self.cluster
                .delete_secret(ns, name, uid)
                .await
                .map_err(|source| BridgeError::Kube { operation: format!("deleting Secret {ns}/{name}"), source })?;
        }
        Ok(())
    }

    /// Write each CR's provider id and Pod IP to its row where they differ.
    async fn write_back(&mut self) -> Result<(), BridgeError> {
        let fm = self.settings.field_manager.clone();
        let stale_after = Instant::now() - ROW_RETRY;
        for (key, t) in self.rows.iter_mut() {
            // A container held in the namespace its node was mapped to before runs there: its
            // row keeps what it says, the address Manager's agent reaches it at included.
            if matches!(t.error, Some(RowError::NodeMoved { .. })) {
                continue;
            }
            // Also for a row in error: its workload (made from an earlier, good version of
            // the row) may still run, and the row must follow it, not keep its last address.
            let cr = self
                .cluster
                .workload(&t.namespace, &t.row.hostname)
                .filter(|mw| plan::made_for(mw, &fm) == Some((*key, Some(t.row.created_at.as_str()))));
            // Synced a while ago and gone now: deleted by hand. Create it again (a row in
            // error waits for its fix instead).
            if cr.is_none() && t.error.is_none() && !t.pending && t.synced_at.is_some_and(|at| at < stale_after) {
                info!(row = %key, hostname = %t.row.hostname, "ManagedWorkload is gone but its row is not; creating it again");
                t.pending = true;
            }
            let target = plan::write_back_target(cr.as_deref(), &t.row.written(), self.settings.address);
            if target == t.row.written() {
                continue;
            }
            match self.db.write_back(&t.row, &target).await {
                Ok(written) => {
                    if let Some(updated_at) = written {
                        info!(row = %key, hostname = %t.row.hostname, container_id = ?target.container_id, ipv4_address = ?target.ipv4_address, "wrote back to Manager");
                        t.own_stamp = Some(updated_at.clone());
                        t.row.updated_at = updated_at;
                        self.metrics.wrote("row_update");
                    }
                    // Also when nothing was written (the row already held it): do not retry.
                    t.row.container_id = target.container_id;
                    t.row.ipv4_address = target.ipv4_address;
                    t.row.mac_address = None;
                    if let Some(err) = t.write_back_error.take() {
                        info!(row = %key, was = %err.reason(), "write-back succeeded again");
                    }
                }
                Err(WriteBackError::Row(err)) => {
                    report(&self.metrics, *key, &t.row.hostname, &mut t.write_back_error, err)
                }
                Err(WriteBackError::Bridge(err)) => return Err(err),
            }
        }
        Ok(())
    }
}

/// Log and count a row error once per change, so a row stuck on the same error does not
/// flood the log every poll.
fn report(metrics: &Metrics, key: RowKey, hostname: &str, slot: &mut Option<RowError>, err: RowError) {
    if slot.as_ref() != Some(&err) {
        warn!(row = %key, %hostname, reason = %err.reason(), error = %err, "row not synced");
        metrics.row_error(err.reason());
    }
    *slot = Some(err);
}

/// What a row's sync needs to know of the others: which rows exist (`live`), and which CRs
/// the deletion guard lets this pass delete (`deletable`, by UID).
#[derive(Clone, Copy)]
struct Known<'a> {
    live: &'a HashSet<RowKey>,
    deletable: &'a HashSet<String>,
}

/// Sync one mapped row with the cluster.
async fn sync_one(
    cluster: &Cluster,
    fm: &str,
    desired: Desired,
    cached: Option<Existing>,
    secret_cached: Option<Arc<CachedSecret>>,
    known: Known<'_>,
) -> Outcome {
    let mut result = try_sync_one(cluster, fm, &desired, cached, secret_cached, known).await;
    if let Err(Failure::Appeared(likely)) = &result {
        // A create found an object of that name after all (made since the cache or the GET
        // said there was none), or an update found another object than the one it read:
        // whose it is, a fresh read tells (someone else's is `name_taken`/`secret_taken`).
        debug!(likely = %likely, "an object appeared while writing; reading it again");
        result = try_sync_one(cluster, fm, &desired, None, None, known).await;
    }
    match result {
        Ok(outcome) => outcome,
        Err(Failure::Row(err)) => Outcome::Row(err),
        // Twice in a row: reported as what it most likely is, and retried.
        Err(Failure::Appeared(err)) => Outcome::Row(err),
        Err(Failure::Api(operation, source)) => Outcome::Transient(BridgeError::Kube { operation, source }),
    }
}

enum Failure {
    Row(RowError),
    /// A write found another object than it was for (`write::found_another`); with the row
    /// error that most likely means (`NameTaken`, `SecretTaken`).
    Appeared(RowError),
    Api(String, kube::Error),
}

async fn try_sync_one(
    cluster: &Cluster,
    fm: &str,
    d: &Desired,
    cached: Option<Existing>,
    secret_cached: Option<Arc<CachedSecret>>,
    known: Known<'_>,
) -> Result<Outcome, Failure> {
    let (ns, name) = (d.namespace.as_str(), d.name.as_str());
    let api = |what: &str| {
        let what = what.to_string();
        move |e: kube::Error| classify(e, what)
    };
    // Not in the cache of our own CRs: absent, not seen yet, or someone else's.
    let existing = match cached {
        Some(e) => Some(e),
        None => cluster
            .get_workload(ns, name)
            .await
            .map_err(api(&format!("reading ManagedWorkload {ns}/{name}")))?
            .map(|mw| Existing::of(&CachedWorkload::from(mw), fm)),
    };
    let name_taken = || RowError::NameTaken { namespace: ns.into(), name: name.into() };
    let secret_taken = || RowError::SecretTaken { namespace: ns.into(), name: d.secret_name.clone() };
    // Not in the cache of our own Secrets: absent, not seen yet, or someone else's.
    let secret = match secret_cached {
        Some(secret) => Some(secret),
        None => match cluster
            .get_secret(ns, &d.secret_name)
            .await
            .map_err(api(&format!("reading Secret {ns}/{}", d.secret_name)))?
        {
            Some(meta) if !MadeBy::of(meta.labels()).bridge(fm) => {
                stop_using_anothers_secret(cluster, existing.as_ref(), d).await?;
                return Ok(Outcome::Row(secret_taken()));
            }
            found => found.map(|meta| Arc::new(CachedSecret::from(meta))),
        },
    };
    // The API server's 409 on a create-only write (an object of that name exists after all)
    // or on a write for a UID the object no longer has (it was deleted and made again).
    // A write that found another object than it was for (`write::found_another`) is not
    // the row's error yet: whose the object is, a fresh read tells.
    let write = |what: String, taken: RowError| {
        move |e: kube::Error| if found_another(&e) { Failure::Appeared(taken) } else { classify(e, what) }
    };
    let secret_uid = secret.as_ref().and_then(|s| s.meta().uid.clone());
    match plan::plan(d, existing.as_ref(), secret.as_deref(), |k| known.live.contains(&k)) {
        Plan::UpToDate => Ok(Outcome::Synced),
        Plan::Blocked(err) => Ok(Outcome::Row(err)),
        Plan::Replace { uid } if !known.deletable.contains(&uid) => {
            Ok(Outcome::Row(RowError::AwaitingDeletion { namespace: ns.into(), name: name.into(), uid }))
        }
        Plan::Replace { uid } => {
            info!("ManagedWorkload {ns}/{name} stands for an earlier container; deleting it to create this one");
            cluster
                .delete_workload(ns, name, &uid)
                .await
                .map_err(api(&format!("deleting ManagedWorkload {ns}/{name}")))?;
            Ok(Outcome::Row(RowError::Replacing { namespace: ns.into(), name: name.into() }))
        }
        Plan::Create => {
            // The Secret first, so no Pod of the new workload ever starts with values that are
            // not its own: where the bridge's Secret of that name serves no CR yet (an earlier
            // container's, its CR deleted and garbage collection behind; or one whose CR was
            // never made), it is deleted, by its UID, before anything is written. Then the
            // Secret, the CR (both create-only), then the Secret's owner. Should a later write
            // not happen, the next pass finds the CR without a Secret that serves it
            // (`Plan::Update`).
            let secret = mapping::secret(d, fm, None);
            cluster.create_with_secret(&d.workload, secret, secret_uid.as_deref()).await.map_err(
                |(step, e)| match step {
                    CreateStep::Earlier => api(&format!("deleting the earlier Secret {ns}/{}", d.secret_name))(e),
                    CreateStep::Secret => write(format!("writing Secret {ns}/{}", d.secret_name), secret_taken())(e),
                    CreateStep::Workload => write(format!("creating ManagedWorkload {ns}/{name}"), name_taken())(e),
                    CreateStep::Undo => {
                        api(&format!("deleting Secret {ns}/{}, the CR's name being taken", d.secret_name))(e)
                    }
                    CreateStep::Owner => {
                        write(format!("giving Secret {ns}/{} its owner", d.secret_name), secret_taken())(e)
                    }
                },
            )?;
            info!("created ManagedWorkload {ns}/{name}");
            Ok(Outcome::Synced)
        }
        Plan::Update => {
            let uid = existing.and_then(|e| e.uid);
            let mut owner = d.workload.clone();
            owner.metadata.uid = uid.clone();
            // The Secret first, so the CR never asks for an env its Secret does not hold; the
            // one read, by its UID (or created where there is none).
            let secret_write = match &secret_uid {
                Some(uid) => Write::Update { uid: Some(uid) },
                None => Write::Create,
            };
            let secret = mapping::secret(d, fm, mapping::owner_reference(&owner));
            cluster
                .apply_secret(&secret, secret_write)
                .await
                .map_err(write(format!("applying Secret {ns}/{}", d.secret_name), secret_taken()))?;
            // For the object read, by its UID: a CR deleted and made again by someone else
            // since (a stale cache) answers 409 instead of being forced over.
            cluster
                .apply_workload(&owner, Write::Update { uid: uid.as_deref() })
                .await
                .map_err(write(format!("applying ManagedWorkload {ns}/{name}"), name_taken()))?;
            info!("updated ManagedWorkload {ns}/{name}");
            Ok(Outcome::Synced)
        }
    }
}

/// The row's Secret name holds someone else's Secret, made after the bridge's was deleted. A
/// CR of this bridge's for that name would start its next Pod with their values: it is
/// deleted, by its UID, and made again once the name is free. Its disk stays, as on any deletion of a
/// bridged workload (the bridge's volumes are retained), and comes back with it.
async fn stop_using_anothers_secret(
    cluster: &Cluster,
    existing: Option<&Existing>,
    d: &Desired,
) -> Result<(), Failure> {
    let (ns, name) = (d.namespace.as_str(), d.name.as_str());
    let Some(uid) = existing.filter(|cr| cr.ours && !cr.deleting).and_then(|cr| cr.uid.as_deref()) else {
        return Ok(());
    };
    warn!(
        "Secret {ns}/{} is not the bridge's; deleting ManagedWorkload {ns}/{name}, whose Pod would start with it",
        d.secret_name
    );
    cluster
        .delete_workload(ns, name, uid)
        .await
        .map_err(|e| classify(e, format!("deleting ManagedWorkload {ns}/{name}, its Secret being someone else's")))
}

/// The API server refusing the object (400, 422) is the row's problem and waits for the row
/// to change; anything else (down, throttled, a 5xx) is retried with the whole pass.
/// `operation` names the object ("applying Secret ns/x-manager-env").
fn classify(err: kube::Error, operation: String) -> Failure {
    match err {
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => {
            Failure::Row(RowError::Rejected { object: operation, message: s.message })
        }
        other => Failure::Api(operation, other),
    }
}

/// The `updatedAt` of a row read that may move the watermark: Manager's stamp, not the
/// bridge's own. A write-back is stamped by the database's clock, Manager's edits by Manager's:
/// were the bridge's stamps to move the watermark, a database clock ahead of Manager's would
/// put it past the edits Manager stamps meanwhile, and the incremental poll would miss them
/// until the next full resync. (A row read back with the bridge's stamp but other values is
/// still seen as changed: `track` compares the whole row.)
fn manager_stamp(row: &ContainerRow, own_stamp: Option<&str>) -> Option<Timestamp> {
    if own_stamp == Some(row.updated_at.as_str()) {
        return None;
    }
    db::parse_timestamp(&row.updated_at)
}

/// The watermark after seeing a row updated at `seen`: the newest seen, but capped at the
/// database's clock (`db_now`, when known), so a future stamp never moves it past now.
fn advance(watermark: Option<Timestamp>, seen: Timestamp, db_now: Option<Timestamp>) -> Option<Timestamp> {
    let seen = db_now.map_or(seen, |now| seen.min(now));
    Some(watermark.map_or(seen, |w| w.max(seen)))
}

/// Run jobs `concurrency` at a time without a pause between chunks: whenever one can start
/// and none is queued, `next_chunk` is asked for more (`None`: there are no more); `done` is
/// given each result as it comes, with `state`, and says whether to go on starting new jobs
/// (those in flight finish either way). The chunks bound what is held at once; asking for
/// the next while the last writes of the one before are in flight keeps the API server busy.
async fn pipeline<S, J, F: Future>(
    state: &mut S,
    concurrency: usize,
    mut next_chunk: impl FnMut(&mut S) -> Option<Vec<J>>,
    start: impl Fn(J) -> F,
    mut done: impl FnMut(&mut S, F::Output) -> bool,
) {
    let mut queue = Vec::new().into_iter();
    let mut in_flight = FuturesUnordered::new();
    let mut go_on = true;
    loop {
        while go_on && in_flight.len() < concurrency.max(1) {
            if let Some(job) = queue.next() {
                in_flight.push(start(job));
                continue;
            }
            let Some(chunk) = next_chunk(state) else { break };
            queue = chunk.into_iter();
        }
        let Some(result) = in_flight.next().await else { break };
        go_on &= done(state, result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// What a run of `pipeline` did: jobs started, jobs in flight when each chunk was asked
    /// for, results seen.
    #[derive(Default)]
    struct Trace {
        started: Vec<usize>,
        in_flight_at_ask: Vec<usize>,
        results: Vec<usize>,
    }

    /// `jobs` jobs in chunks of `chunk`, `concurrency` at once. Job 0 finishes at once; job
    /// k + 1 finishes only once job k's result has been seen, so every job but the first
    /// overlaps the one before. `go_on` says, for each result, whether to start more.
    async fn trace(jobs: usize, chunk: usize, concurrency: usize, go_on: impl Fn(usize) -> bool) -> Trace {
        let trace = RefCell::new(Trace::default());
        let in_flight = Cell::new(0usize);
        let release: Vec<Notify> = (0..=jobs).map(|_| Notify::new()).collect();
        release[0].notify_one();
        let mut next = 0;
        let next_chunk = |_: &mut ()| {
            (next < jobs).then(|| {
                trace.borrow_mut().in_flight_at_ask.push(in_flight.get());
                let ids: Vec<usize> = (next..jobs.min(next + chunk)).collect();
                next += ids.len();
                ids
            })
        };
        let start = |id: usize| {
            trace.borrow_mut().started.push(id);
            in_flight.set(in_flight.get() + 1);
            let (released, in_flight) = (&release[id], &in_flight);
            async move {
                released.notified().await;
                in_flight.set(in_flight.get() - 1);
                id
            }
        };
        let done = |_: &mut (), id: usize| {
            trace.borrow_mut().results.push(id);
            release[id + 1].notify_one();
            go_on(id)
        };
        pipeline(&mut (), concurrency, next_chunk, start, done).await;
        trace.into_inner()
    }

    #[tokio::test]
    async fn the_next_chunk_is_asked_for_while_the_one_before_is_still_in_flight() {
        let t = trace(7, 3, 2, |_| true).await;
        assert_eq!(t.results, [0, 1, 2, 3, 4, 5, 6], "every job, each once");
        assert_eq!(t.started, [0, 1, 2, 3, 4, 5, 6]);
        // The first chunk with nothing in flight; the second and third while the last job of
        // the chunk before runs (a barrier between chunks would have 0 there).
        assert_eq!(t.in_flight_at_ask, [0, 1, 1]);
    }

    #[tokio::test]
    async fn a_result_that_says_stop_starts_nothing_more_and_lets_the_rest_finish() {
        let t = trace(7, 3, 2, |id| id < 2).await;
        // Jobs 0 and 1 start; 0's result starts 2; 1's starts 3; 2's says stop: 3 finishes, and
        // nothing after it starts.
        assert_eq!(t.started, [0, 1, 2, 3]);
        assert_eq!(t.results, [0, 1, 2, 3]);
    }

    #[test]
    fn future_stamps_never_move_the_watermark_past_the_database_clock() {
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        assert_eq!(advance(None, t(0), Some(t(5))), Some(t(0)));
        assert_eq!(advance(Some(t(0)), t(3), Some(t(5))), Some(t(3)), "moves forward");
        assert_eq!(advance(Some(t(3)), t(1), Some(t(5))), Some(t(3)), "never back");
        assert_eq!(advance(Some(t(3)), t(3600), Some(t(5))), Some(t(5)), "a future row: capped at the database's now");
        assert_eq!(advance(None, t(30), Some(t(0))), Some(t(0)));
        assert_eq!(advance(Some(t(3)), t(9), None), Some(t(9)), "no clock known: as seen");
    }

    #[test]
    fn the_bridges_own_stamps_never_move_the_watermark() {
        let mut row = plan::tests::row();
        row.updated_at = "2026-01-01 00:05:00.000 +00:00".into();
        let manager = db::parse_timestamp(&row.updated_at);
        assert!(manager.is_some());
        assert_eq!(manager_stamp(&row, None), manager, "Manager's stamp moves it");
        assert_eq!(
            manager_stamp(&row, Some("2026-01-01 00:01:00.000 +00:00")),
            manager,
            "an earlier write-back's stamp"
        );
        // Read back after the bridge wrote it (the database's clock, here a minute ahead of
        // Manager's): the watermark stays where Manager's stamps put it.
        row.updated_at = "2026-01-01 00:06:00.000 +00:00".into();
        assert_eq!(manager_stamp(&row, Some("2026-01-01 00:06:00.000 +00:00")), None);
    }

    #[test]
    fn the_stall_limit_outlasts_a_timed_out_pass_and_the_longest_backoff() {
        let settings = Settings {
            nodes: vec![],
            field_manager: "mw-bridge".into(),
            poll_interval: Duration::from_secs(2),
            resync_interval: Duration::from_secs(300),
            requests_percent: 100,
            rootfs: Default::default(),
            service: Default::default(),
            system_images: Default::default(),
            isolation: None,
            address: Default::default(),
            concurrency: 16,
            pass_timeout: Duration::from_secs(300),
            delete_guard: DeleteGuard { max_percent: 50, minimum: 2, confirm_after: Duration::from_secs(30) },
        };
        let limit = stall_limit(&settings);
        assert!(limit > settings.pass_timeout + BACKOFF.delay(u32::MAX), "{limit:?}");
        assert_eq!(limit, Duration::from_secs(744));
    }
}
