//! Leader election on a `coordination.k8s.io` Lease, fenced: leadership ends locally once the
//! last successful renewal is older than the renew deadline, before a standby can take the
//! Lease (see `Fence`); and the shutdown signal. Only the holder of the Lease reconciles and
//! writes; a standby waits with warm caches and takes over once the holder stops renewing (at
//! most the Lease duration after it died), or at once when the holder releases the Lease on a
//! clean shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::error::Error;
use crate::metrics::Metrics;

/// How long a clean shutdown waits for the Lease to be released before exiting anyway (the
/// standby then takes over when the Lease expires instead of at once).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long in-flight reconciles may take to finish once a term ends (shutdown or lost Lease)
/// before they are dropped. With the 5 s for the release it stays inside the chart's 30 s
/// terminationGracePeriodSeconds; a reconcile normally takes milliseconds, but one stuck on an
/// unreachable API server would otherwise wait for the client's own timeout (minutes).
pub const STOP_GRACE: Duration = Duration::from_secs(20);

/// Run `work` to its end, but at most `grace`: dropping it cancels what it still waits for.
pub async fn finish_within(grace: Duration, work: impl Future<Output = ()>) {
    if tokio::time::timeout(grace, work).await.is_err() {
        warn!(grace = ?grace, "in-flight reconciles did not finish in time; abandoning them");
    }
}

/// Run `work` until it ends; once `stop` turns true it gets `grace` more, then is dropped.
pub async fn until_stopped(grace: Duration, mut stop: watch::Receiver<bool>, work: impl Future<Output = ()>) {
    let mut work = std::pin::pin!(work);
    tokio::select! {
        () = &mut work => return,
        _ = stop.wait_for(|s| *s) => {}
    }
    finish_within(grace, work).await;
}

/// Leader election flags of `run`.
#[derive(clap::Args, Clone, Debug)]
pub struct ElectionArgs {
    /// Run without leader election. Only for a single replica: two replicas without it would
    /// both write.
    #[arg(long, env = "MW_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Name of the Lease the replicas compete for.
    #[arg(long, env = "MW_LEASE_NAME", default_value = crate::metrics::DEFAULT_LEASE)]
    pub lease_name: String,
    /// Namespace of the Lease: the operator's own ($POD_NAMESPACE, set by the chart), else
    /// "default".
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease: its Pod name ($POD_NAME, set by the chart), else
    /// the host name and process id.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Seconds a Lease stays valid after its last renewal: the longest a dead leader blocks
    /// takeover.
    #[arg(long, env = "MW_LEASE_DURATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..))]
    pub lease_duration: u64,
    /// The safety margin, in seconds: a leader whose renewals have failed for the duration less
    /// this stops acting (its renew deadline), so it has stopped well before a standby can
    /// take the Lease. At most half the duration.
    #[arg(long, env = "MW_LEASE_RENEW_GRACE", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_grace: u64,
}

/// A checked election configuration.
#[derive(Clone, Debug)]
pub struct Election {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    pub duration: u64,
    pub grace: u64,
}

impl ElectionArgs {
    /// None when election is off. A grace above half the duration is refused: the renew
    /// deadline (duration - grace) would leave too little time to renew before it passes.
    pub fn election(&self, hostname: impl FnOnce() -> String) -> Result<Option<Election>, String> {
        if self.no_leader_election {
            return Ok(None);
        }
        if self.lease_grace.saturating_mul(2) > self.lease_duration {
            return Err(format!(
                "--lease-grace ({}) must be at most half of --lease-duration ({})",
                self.lease_grace, self.lease_duration
            ));
        }
        Ok(Some(Election {
            lease_name: self.lease_name.clone(),
            namespace: self.lease_namespace.clone(),
            identity: self.identity.clone().filter(|i| !i.is_empty()).unwrap_or_else(hostname),
            duration: self.lease_duration,
            grace: self.lease_grace,
        }))
    }
}

/// `<host>-<pid>`: unique per process, stable for its life, and says where it runs.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "mw-operator".into());
    format!("{host}-{}", std::process::id())
}

impl Election {
    /// How long a leader keeps acting without a successful renewal: the Lease duration less
    /// the renew grace (10 s of 15 by default). A standby takes the Lease only once it has
    /// seen it unchanged for the whole duration, so leadership ends locally at least `grace`
    /// before anyone else can hold it.
    fn renew_deadline(&self) -> Duration {
        Duration::from_secs(self.duration.saturating_sub(self.grace))
    }

    /// How long in-flight work may go on once leadership was lost: half the margin between
    /// the renew deadline and the Lease duration, so it is over before a standby can take the
    /// Lease (the other half covers clock rates and requests in flight).
    fn loss_grace(&self) -> Duration {
        Duration::from_secs(self.grace) / 2
    }

    /// Pause between renewals, and between a standby's looks at the Lease (client-go's
    /// retry period).
    fn retry_period(&self) -> Duration {
        RETRY_PERIOD.min(self.renew_deadline() / 4)
    }

    /// Compete for the Lease until `shutdown`. Each time this replica wins it, `term(stop)`
    /// runs until it returns; `stop` turns true when leadership ends (the Lease was taken, or
    /// it could not be renewed within the renew deadline) or shutdown begins, and `term` must
    /// then finish its in-flight work and return: it is dropped after `loss_grace` when
    /// leadership was lost, after `STOP_GRACE` on shutdown while the Lease is still renewed.
    /// On shutdown the Lease is released (so a standby takes over at once) before this
    /// returns.
    pub async fn run<F, Fut>(
        self,
        client: Client,
        metrics: &Arc<Metrics>,
        mut shutdown: watch::Receiver<bool>,
        term: F,
    ) -> Result<(), Error>
    where
        F: Fn(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let leases: Api<Lease> = Api::namespaced(client, &self.namespace);
        metrics.set_leader(&self.lease_name, false);
        info!(lease = %self.describe(), identity = %self.identity, "standing by for leadership");
        let mut standby = Standby::default();
        loop {
            let won = tokio::select! {
                won = self.acquire(&leases, &mut standby) => won,
                _ = shutdown.wait_for(|s| *s) => break,
            };
            let mut fence = Fence::new(won, self.renew_deadline());
            info!(lease = %self.describe(), identity = %self.identity, "became leader");
            metrics.set_leader(&self.lease_name, true);
            let (stop, stopped) = watch::channel(false);
            let mut work = std::pin::pin!(term(stopped));
            let (lost, stopping) = {
                let mut keep = std::pin::pin!(self.keep(&leases, &mut fence));
                let ended = tokio::select! {
                    () = &mut work => Ended::Work,
                    reason = &mut keep => Ended::Lost(reason),
                    _ = shutdown.wait_for(|s| *s) => Ended::Shutdown,
                };
                let _ = stop.send(true);
                match ended {
                    Ended::Work => (None, false),
                    Ended::Lost(reason) => (Some(reason), false),
                    // Still the leader while in-flight work finishes: renewals go on, and a
                    // loss cuts the work's time to what is safe.
                    Ended::Shutdown => tokio::select! {
                        () = finish_within(STOP_GRACE, &mut work) => (None, true),
                        reason = &mut keep => (Some(reason), true),
                    },
                }
            };
            if let Some(reason) = &lost {
                warn!(lease = %self.describe(), %reason, "leadership ended; stopping work");
                metrics.set_leader(&self.lease_name, false);
                finish_within(self.loss_grace(), &mut work).await;
            }
            metrics.set_leader(&self.lease_name, false);
            if stopping || *shutdown.borrow() {
                if lost.is_none() {
                    self.release(&leases).await;
                }
                return Ok(());
            }
            if lost.is_some() {
                warn!(lease = %self.describe(), "standing by");
            }
            standby = Standby::default();
        }
        Ok(())
    }

    /// Until this replica holds the Lease: look at it every retry period, and take it when it
    /// is free, released, or has not changed for a whole Lease duration by this replica's own
    /// clock (so clocks need not agree, as in client-go). Returns when the winning write was
    /// sent: the fence counts from there.
    async fn acquire(&self, leases: &Api<Lease>, standby: &mut Standby) -> Instant {
        loop {
            let sent = Instant::now();
            let read = async { leases.get_opt(&self.lease_name).await.map_err(LeaseError::Api) };
            match bounded(self.attempt_timeout(), read).await {
                Ok(current) => {
                    let expired = standby.observe(current.as_ref(), sent, Duration::from_secs(self.duration));
                    let ours = holder(current.as_ref()) == Some(self.identity.as_str());
                    if expired || ours {
                        let sent = Instant::now();
                        match bounded(self.attempt_timeout(), self.write(leases, current.as_ref(), true)).await {
                            Ok(()) => return sent,
                            Err(err) => debug!(lease = %self.describe(), error = %err, "could not take the lease"),
                        }
                    }
                }
                Err(err) => debug!(lease = %self.describe(), error = %err, "could not read the lease"),
            }
            tokio::time::sleep(self.retry_period()).await;
        }
    }

    /// While leading: renew every retry period. Returns why leadership ended: someone else
    /// holds the Lease, or no renewal succeeded within the renew deadline (each attempt is
    /// bounded, so a hung connection cannot keep it waiting).
    async fn keep(&self, leases: &Api<Lease>, fence: &mut Fence) -> String {
        loop {
            let Some(left) = fence.left(Instant::now()) else {
                return format!("no renewal succeeded within {:?}", self.renew_deadline());
            };
            let pause = self.retry_period().min(left);
            tokio::time::sleep(pause).await;
            let Some(left) = fence.left(Instant::now()) else { continue };
            let sent = Instant::now();
            let renewal = async {
                let current = leases.get_opt(&self.lease_name).await.map_err(LeaseError::Api)?;
                if holder(current.as_ref()) != Some(self.identity.as_str()) {
                    return Err(LeaseError::Taken(holder(current.as_ref()).unwrap_or("nobody").to_string()));
                }
                self.write(leases, current.as_ref(), false).await
            };
            match bounded(self.attempt_timeout().min(left), renewal).await {
                Ok(()) => fence.renewed(sent),
                Err(LeaseError::Taken(by)) => return format!("the lease is held by {by}"),
                Err(err) => warn!(lease = %self.describe(), error = %err, "renewing the lease failed"),
            }
        }
    }

    /// Take (`acquire`) or renew the Lease, conditional on the resourceVersion `current` was
    /// read at: of two replicas writing the same version, one gets 409.
    async fn write(&self, leases: &Api<Lease>, current: Option<&Lease>, acquire: bool) -> Result<(), LeaseError> {
        let now = MicroTime(Timestamp::now());
        let duration = i32::try_from(self.duration).unwrap_or(i32::MAX);
        let Some(current) = current else {
            let mut lease = Lease::default();
            lease.metadata.name = Some(self.lease_name.clone());
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(duration),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            });
            leases.create(&PostParams::default(), &lease).await.map_err(LeaseError::Api)?;
            return Ok(());
        };
        let spec = current.spec.clone().unwrap_or_default();
        let changes_hands = acquire && spec.holder_identity.as_deref() != Some(self.identity.as_str());
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(changes_hands);
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": duration,
                "renewTime": now,
                "acquireTime": if changes_hands { Some(&now) } else { spec.acquire_time.as_ref() },
                "leaseTransitions": transitions,
            },
        });
        leases
            .patch(&self.lease_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(LeaseError::Api)?;
        Ok(())
    }

    /// Give the Lease up (on shutdown, while still holding it), so a standby takes it at its
    /// next look instead of after the Lease duration.
    async fn release(&self, leases: &Api<Lease>) {
        let release = async {
            let current = leases.get_opt(&self.lease_name).await.map_err(LeaseError::Api)?;
            if holder(current.as_ref()) != Some(self.identity.as_str()) {
                return Ok(());
            }
            let patch = serde_json::json!({
                "metadata": { "resourceVersion": current.as_ref().and_then(|l| l.metadata.resource_version.clone()) },
                "spec": { "holderIdentity": null, "leaseDurationSeconds": 1, "renewTime": MicroTime(Timestamp::now()) },
            });
            leases
                .patch(&self.lease_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(LeaseError::Api)?;
            Ok::<_, LeaseError>(())
        };
        match bounded(RELEASE_TIMEOUT, release).await {
            Ok(()) => info!(lease = %self.describe(), "lease released"),
            Err(err) => {
                warn!(lease = %self.describe(), error = %err, "could not release the lease; it expires by itself")
            }
        }
    }

    /// One request to the Lease may take at most this long: a quarter of the renew deadline,
    /// so several renewals are tried before the deadline passes.
    fn attempt_timeout(&self) -> Duration {
        (self.renew_deadline() / 4).max(Duration::from_millis(500))
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }
}

/// Between renewals and a standby's looks at the Lease (client-go's default retry period).
const RETRY_PERIOD: Duration = Duration::from_secs(2);

enum Ended {
    Work,
    Lost(String),
    Shutdown,
}

#[derive(Debug, thiserror::Error)]
enum LeaseError {
    #[error("{0}")]
    Api(kube::Error),
    #[error("held by {0}")]
    Taken(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// `request`, but at most `limit`.
async fn bounded<T>(limit: Duration, request: impl Future<Output = Result<T, LeaseError>>) -> Result<T, LeaseError> {
    tokio::time::timeout(limit, request).await.unwrap_or(Err(LeaseError::TimedOut(limit)))
}

fn holder(lease: Option<&Lease>) -> Option<&str> {
    lease?.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The leader's own measure of whether it still leads: the last renewal that succeeded, timed
/// from when it was *sent* (the API server stored it no earlier, so a standby saw it no
/// earlier), and the renew deadline. Pure, so the fencing rule is unit-tested.
#[derive(Debug)]
struct Fence {
    renewed: Instant,
    deadline: Duration,
}

impl Fence {
    fn new(won: Instant, deadline: Duration) -> Self {
        Fence { renewed: won, deadline }
    }

    fn renewed(&mut self, sent: Instant) {
        self.renewed = self.renewed.max(sent);
    }

    /// How long this replica may still act as leader; None once the deadline has passed.
    fn left(&self, now: Instant) -> Option<Duration> {
        (self.renewed + self.deadline).checked_duration_since(now).filter(|d| !d.is_zero())
    }
}

/// What a standby has seen of the Lease: its record, and when (by this replica's clock) that
/// record last changed. Pure.
#[derive(Debug, Default)]
struct Standby {
    record: Option<(Option<String>, Option<String>)>,
    since: Option<Instant>,
}

impl Standby {
    /// Whether the Lease may be taken: absent, without a holder, or unchanged (holder and
    /// renew time) for `duration` since this replica first saw it so.
    fn observe(&mut self, lease: Option<&Lease>, now: Instant, duration: Duration) -> bool {
        let Some(l) = lease else { return true };
        if holder(Some(l)).is_none() {
            return true;
        }
        let spec = l.spec.as_ref();
        let record = (
            spec.and_then(|s| s.holder_identity.clone()),
            spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string()),
        );
        if self.record.as_ref() != Some(&record) {
            self.record = Some(record);
            self.since = Some(now);
        }
        self.since.is_some_and(|since| now.duration_since(since) >= duration)
    }
}

/// Turns true on the first SIGTERM or SIGINT.
pub fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = ctrl_c => {}
                        _ = term.recv() => {}
                    }
                }
                Err(err) => {
                    warn!(error = %err, "cannot listen for SIGTERM; only SIGINT stops the operator");
                    let _ = ctrl_c.await;
                }
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        info!("shutdown requested: finishing in-flight reconciles");
        let _ = tx.send(true);
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ElectionArgs {
        ElectionArgs {
            no_leader_election: false,
            lease_name: "mw-operator".into(),
            lease_namespace: "mw-system".into(),
            identity: None,
            lease_duration: 15,
            lease_grace: 5,
        }
    }

    #[tokio::test]
    async fn stopping_work_gets_its_grace_and_no_more() {
        // Work that would never end is dropped once stopped and the grace is over: this
        // returning at all is the bound.
        let (tx, rx) = watch::channel(false);
        let _ = tx.send(true);
        until_stopped(Duration::from_millis(50), rx, std::future::pending()).await;

        // Stopped work that needs less than its grace is not cut short: it finishes.
        let (tx, rx) = watch::channel(false);
        let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = finished.clone();
        let stopping = rx.clone();
        let _ = tx.send(true);
        until_stopped(Duration::from_millis(500), rx, async move {
            let mut stopping = stopping;
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await;
        assert!(finished.load(std::sync::atomic::Ordering::SeqCst), "work within its grace runs to its end");

        // Work that ends by itself runs to its end, stop or no stop.
        let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = finished.clone();
        let (_tx, rx) = watch::channel(false);
        until_stopped(Duration::from_millis(50), rx, async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await;
        assert!(finished.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn identity_falls_back_to_the_host_and_bad_timings_are_refused() {
        let e = args().election(|| "host-1".into()).unwrap().unwrap();
        assert_eq!((e.identity.as_str(), e.namespace.as_str(), e.duration, e.grace), ("host-1", "mw-system", 15, 5));
        let named = ElectionArgs { identity: Some("pod-a".into()), ..args() };
        assert_eq!(named.election(|| unreachable!()).unwrap().unwrap().identity, "pod-a");
        let empty = ElectionArgs { identity: Some(String::new()), ..args() };
        assert_eq!(empty.election(|| "h".into()).unwrap().unwrap().identity, "h");
        let bad = ElectionArgs { lease_grace: 8, ..args() };
        assert!(bad.election(|| "h".into()).unwrap_err().contains("--lease-grace"));
        let off = ElectionArgs { no_leader_election: true, ..args() };
        assert!(off.election(|| "h".into()).unwrap().is_none());
        assert!(default_identity().ends_with(&format!("-{}", std::process::id())));
    }

    #[test]
    fn leadership_ends_locally_before_anyone_else_can_take_the_lease() {
        let e = args().election(|| "a".into()).unwrap().unwrap();
        let duration = Duration::from_secs(e.duration);
        assert_eq!(e.renew_deadline(), Duration::from_secs(10));
        // The leader stops acting at most renew_deadline + loss_grace after its last renewal
        // was sent; a standby can take over no earlier than the Lease duration after it saw
        // that renewal, which was stored after it was sent.
        assert!(e.renew_deadline() + e.loss_grace() < duration, "{:?} + {:?}", e.renew_deadline(), e.loss_grace());
        assert!(e.loss_grace() < STOP_GRACE);
        assert!(e.attempt_timeout() < e.renew_deadline() && e.retry_period() < e.renew_deadline());
        // Any accepted timing keeps the rule.
        for (duration, grace) in [(2, 1), (4, 2), (15, 5), (60, 30), (60, 1)] {
            let e = ElectionArgs { lease_duration: duration, lease_grace: grace, ..args() }
                .election(|| "a".into())
                .unwrap()
                .unwrap();
            assert!(e.renew_deadline() + e.loss_grace() < Duration::from_secs(duration), "{duration}/{grace}");
        }
    }

    #[test]
    fn the_fence_counts_from_the_last_renewal_sent() {
        let t0 = Instant::now();
        let mut fence = Fence::new(t0, Duration::from_secs(10));
        assert_eq!(fence.left(t0 + Duration::from_secs(4)), Some(Duration::from_secs(6)));
        assert_eq!(fence.left(t0 + Duration::from_secs(10)), None, "over at the deadline");
        fence.renewed(t0 + Duration::from_secs(8));
        assert_eq!(fence.left(t0 + Duration::from_secs(10)), Some(Duration::from_secs(8)));
        fence.renewed(t0 + Duration::from_secs(2));
        assert_eq!(
            fence.left(t0 + Duration::from_secs(10)),
            Some(Duration::from_secs(8)),
            "a late answer to an older renewal moves nothing"
        );
        assert_eq!(fence.left(t0 + Duration::from_secs(30)), None);
    }

    fn lease(holder: Option<&str>, renewed: i64) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_standby_takes_a_lease_unchanged_for_its_duration_by_its_own_clock() {
        let t0 = Instant::now();
        let d = Duration::from_secs(15);
        let at = |s| t0 + Duration::from_secs(s);
        let mut standby = Standby::default();
        assert!(standby.observe(None, t0, d), "absent: take it");
        assert!(standby.observe(Some(&lease(None, 1)), t0, d), "released: take it");
        assert!(standby.observe(Some(&lease(Some(""), 1)), t0, d), "released: take it");
        // The renew time is the holder's clock, which may be far off: only change counts.
        let mut standby = Standby::default();
        assert!(!standby.observe(Some(&lease(Some("a"), 100_000)), at(0), d));
        assert!(!standby.observe(Some(&lease(Some("a"), 100_000)), at(14), d));
        assert!(!standby.observe(Some(&lease(Some("a"), 100_002)), at(15), d), "renewed: counts again");
        assert!(!standby.observe(Some(&lease(Some("a"), 100_002)), at(29), d));
        assert!(standby.observe(Some(&lease(Some("a"), 100_002)), at(30), d), "unchanged for 15 s");
        assert!(!standby.observe(Some(&lease(Some("b"), 100_002)), at(31), d), "another holder: counts again");
    }
}
