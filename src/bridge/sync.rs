//! The bridge's loop: rows → desired CRs → apply; CR status → row updates.
//!
//! Each poll (default 2 s) reads a cheap fingerprint and the rows changed since the last
//! `updatedAt` seen, and applies what differs. A full resync (on a timer, or when the
//! fingerprint shows a deleted row or a changed node, setting or resource request) re-reads
//! everything and deletes CRs whose rows are gone once the deletion guard allows it. After
//! each pass, and whenever a watched CR changes, provider ids and addresses are written back.
//! Changed rows stay pending until synced; a failed pass is retried with backoff.
//!
//! Submodules: `row` syncs one row, `deletions` deletes, `write_back` writes back.

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
use super::mapping::{self, Context, Desired};
use super::metrics::Metrics;
use super::plan::{self, DeleteGuard, Existing, Judgement, Plan, Sighting};
use super::rows::{ContainerRow, Fingerprint, Grants, RowKey};
use crate::retry::Backoff;
use crate::telemetry::Health;
use crate::write::{Write, found_another};

mod deletions;
mod row;
mod write_back;

use row::{Known, sync_one};

/// Each incremental poll looks back this far, so a row committed just after a later
/// `updatedAt` was seen is still found (rows seen unchanged cost nothing).
const OVERLAP: SignedDuration = SignedDuration::from_secs(10);
/// How soon a row blocked by the cluster (a name taken, a CR still being deleted) is retried.
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

/// The longest a healthy loop goes without finishing a pass or write-back (a pass hitting its
/// time limit plus the longest backoff), doubled as a margin. Beyond it `/healthz` reports
/// the loop stalled.
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
    /// The `updatedAt` our last write-back stamped: read back, it is our own write and does not
    /// move the watermark (`manager_stamp`).
    own_stamp: Option<String>,
}

pub struct Bridge {
    db: Database,
    cluster: Arc<Cluster>,
    settings: Settings,
    /// Served node id → namespace, resolved from `Nodes` on each full resync.
    served: HashMap<i64, String>,
    defaults: DefaultEnv,
    /// The system env defaults were read (or are absent). Until then no row is synced, or every
    /// workload would roll out without its system env.
    defaults_known: bool,
    defaults_error: Option<String>,
    grants: Grants,
    /// Boxed: a hash map keeps up to twice as many slots as rows, and an empty slot then costs a
    /// pointer instead of a whole row.
    rows: HashMap<RowKey, Box<Tracked>>,
    unmapped: HashSet<RowKey>,
    /// The next incremental poll reads rows updated since this (less `OVERLAP`): the newest
    /// `updatedAt` seen, capped at the database's clock so a row stamped in the future cannot
    /// hide the edits that follow.
    watermark: Option<Timestamp>,
    /// The database's clock at the start of the current pass.
    db_now: Option<Timestamp>,
    fingerprint: Option<Fingerprint>,
    next_full: Instant,
    /// What the last full read found to delete, for the deletion guard.
    deletions: Option<Sighting>,
    /// The token of the held set last reported, so a held set is logged once, not every read.
    held: Option<String>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// A mapped row to sync: its desired objects, the cached CR and the cached Secret.
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
        // Bounded: a connection that hangs without failing would otherwise stall every row forever.
        // Rows finished so far are kept; the rest stay pending.
        let limit = self.settings.pass_timeout;
        let result = tokio::time::timeout(limit, self.pass()).await.unwrap_or(Err(BridgeError::PassTimeout { limit }));
        self.metrics.pass(result.is_ok());
        let failing = self.rows.values().filter(|t| t.error.is_some() || t.write_back_error.is_some()).count();
        self.metrics.rows.set(i64::try_from(self.rows.len()).unwrap_or(i64::MAX));
        self.metrics.rows_failing.set(i64::try_from(failing).unwrap_or(i64::MAX));
        // Ready while passes succeed, so an unreachable database or API server shows on /readyz.
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

    /// Remember a row read from the database; it is pending if new, changed, or `recheck` (a full
    /// resync compares every row with the cluster again).
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
        // A chunk at a time, so a first sync of thousands of rows never holds every desired object
        // at once; the next chunk is mapped while the previous one's writes are in flight. Outcomes
        // are recorded as they come, so a pass cut short keeps what it finished.
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
                    // A CR to replace that no full read has seen yet (found by an incremental
                    // poll): make the next pass a full one so the deletion guard starts on it.
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

/// The `updatedAt` of a row that may move the watermark: Manager's stamp, not our own. Our
/// write-backs are stamped by the database's clock, Manager's edits by Manager's; if ours moved
/// the watermark, a database clock running ahead could skip Manager's edits until the next
/// full resync. (A row with our stamp but other changes is still seen: `track` compares rows.)
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

/// Run jobs `concurrency` at a time with no pause between chunks: when a slot is free and the
/// queue is empty, `next_chunk` is asked for more (`None`: done). `done` gets each result and
/// says whether to start more (those in flight finish either way).
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
