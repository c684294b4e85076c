//! Leader election on a `coordination.k8s.io` Lease, with fencing: every write checks one
//! deadline (`Leadership`), set to "last successful renewal sent + duration − grace". A
//! standby takes the Lease only after seeing it unchanged for a whole duration, timed from the
//! answers it got, so the old leader has stopped writing at least `grace` before anyone else
//! can hold it. A clean shutdown releases the Lease so a standby takes over at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
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
use crate::shutdown::STOP_GRACE;

/// How long shutdown tries to release the Lease before exiting anyway (the standby then
/// waits for it to expire).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Leader election flags of `run`.
#[derive(clap::Args, Clone, Debug)]
pub struct ElectionArgs {
    /// Run without leader election. Only for a single replica: two replicas without it would
    /// both write.
    #[arg(long, env = "MW_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Name of the Lease the replicas compete for: `mw-operator` for the operator, `mw-bridge`
    /// for the bridge (they must differ: each has replicas of its own).
    #[arg(long, env = "MW_LEASE_NAME")]
    pub lease_name: Option<String>,
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
    /// None when election is off. The grace may be at most half the duration, or too little
    /// time is left to renew before the deadline.
    pub fn election(&self, default_lease: &str, hostname: impl FnOnce() -> String) -> Result<Option<Election>, String> {
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
            lease_name: self.lease_name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| default_lease.to_string()),
            namespace: self.lease_namespace.clone(),
            identity: self.identity.clone().filter(|i| !i.is_empty()).unwrap_or_else(hostname),
            duration: self.lease_duration,
            grace: self.lease_grace,
        }))
    }
}

/// `<host>-<pid>`: unique per process and says where it runs.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "mw-operator".into());
    format!("{host}-{}", std::process::id())
}

impl Election {
    /// How long a leader may write after a renewal it sent succeeded (duration − grace; 10 s of
    /// 15 by default). See the module comment for why this is safe.
    fn renew_deadline(&self) -> Duration {
        Duration::from_secs(self.duration.saturating_sub(self.grace))
    }

    /// Pause between renewals and between a standby's looks (client-go's retry period).
    fn retry_period(&self) -> Duration {
        RETRY_PERIOD.min(self.renew_deadline() / 4)
    }

    /// The deadline every writer checks; not leading until `run` wins the Lease. Pass the same
    /// handle to `run` and to every writer (or use `Leadership::client`).
    pub fn leadership(&self) -> Leadership {
        Leadership::new(self.describe(), Term::Standby)
    }

    /// Compete for the Lease until `shutdown`. Each time this replica wins, `term(stop)` runs and
    /// writes are let through until:
    /// - the Lease is lost or the renew deadline passes: writes are refused and `term` is dropped
    ///   at once (its tasks must end when dropped, so nothing left behind can write);
    /// - shutdown begins: `stop` turns true, `term` gets `STOP_GRACE` while renewals go on, then
    ///   the Lease is released;
    /// - `term` returns by itself.
    ///
    /// `leading` is told each change (for the `leader_election_master_status` gauge).
    pub async fn run<F, Fut>(
        self,
        client: Client,
        leadership: &Leadership,
        leading: impl Fn(&str, bool),
        mut shutdown: watch::Receiver<bool>,
        term: F,
    ) -> Result<(), Error>
    where
        F: Fn(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let leases: Api<Lease> = Api::namespaced(client, &self.namespace);
        leading(&self.lease_name, false);
        info!(lease = %self.describe(), identity = %self.identity, "standing by for leadership");
        let mut standby = Standby::default();
        loop {
            let won = tokio::select! {
                biased;
                _ = shutdown.wait_for(|s| *s) => break,
                won = self.acquire(&leases, &mut standby) => won,
            };
            leadership.begin(won + self.renew_deadline());
            info!(lease = %self.describe(), identity = %self.identity, "became leader");
            leading(&self.lease_name, true);
            let (stop, stopped) = watch::channel(false);
            let (lost, stopping) = self.serve(&leases, leadership, &mut shutdown, stop, term(stopped)).await;
            leading(&self.lease_name, false);
            if let Some(reason) = &lost {
                warn!(lease = %self.describe(), %reason, "leadership ended; the term's work was stopped at once");
            }
            if stopping || *shutdown.borrow() {
                if lost.is_none() {
                    self.release(&leases).await;
                }
                return Ok(());
            }
            if lost.is_some() {
                warn!(lease = %self.describe(), "standing by");
            }
            standby = Standby { led: true, ..Standby::default() };
        }
        Ok(())
    }

    /// One term. Returns why leadership was lost (if it was) and whether shutdown began. Writes
    /// are refused before `work` is dropped.
    async fn serve(
        &self,
        leases: &Api<Lease>,
        leadership: &Leadership,
        shutdown: &mut watch::Receiver<bool>,
        stop: watch::Sender<bool>,
        work: impl Future<Output = ()>,
    ) -> (Option<String>, bool) {
        let work = std::pin::pin!(work);
        let mut work = leadership.while_leading(work);
        let mut keep = std::pin::pin!(self.keep(leases, leadership));
        // Biased: after a pause past the deadline (SIGSTOP, frozen VM) the renewal loop must be
        // asked first; `while_leading` also refuses to poll the work past the deadline.
        let ended = tokio::select! {
            biased;
            reason = &mut keep => Ended::Lost(reason),
            _ = shutdown.wait_for(|s| *s) => Ended::Shutdown,
            done = &mut work => done.map_or_else(|_| Ended::Lost(self.expired()), |()| Ended::Work),
        };
        let outcome = match ended {
            Ended::Work => (None, false),
            Ended::Lost(reason) => (Some(reason), false),
            // Still leading while in-flight work finishes: renewals go on; a loss ends it at once.
            Ended::Shutdown => {
                let _ = stop.send(true);
                tokio::select! {
                    biased;
                    reason = &mut keep => (Some(reason), true),
                    done = tokio::time::timeout(STOP_GRACE, &mut work) => match done {
                        Ok(done) => (done.err().map(|_| self.expired()), true),
                        Err(_) => {
                            warn!(grace = ?STOP_GRACE, "in-flight work did not finish in time; abandoning it");
                            (None, true)
                        }
                    },
                }
            }
        };
        // Refuse writes before dropping the work, so nothing it still holds can send.
        leadership.end();
        outcome
    }

    /// Until this replica holds the Lease: take it when it is absent, released, or unchanged for
    /// a whole duration by this replica's own clock (clocks need not agree, as in client-go).
    /// Returns when the winning write was sent: the leader's deadline counts from there.
    async fn acquire(&self, leases: &Api<Lease>, standby: &mut Standby) -> Instant {
        loop {
            let read = async { leases.get_opt(&self.lease_name).await.map_err(LeaseError::Api) };
            match bounded(self.attempt_timeout(), read).await {
                Ok(current) => {
                    // Time from the answer: a renewal may land during a slow request, and timing
                    // from the request could take over before it expires.
                    let answered = Instant::now();
                    let own = (Duration::from_secs(self.duration), self.identity.as_str());
                    if standby.observe(current.as_ref(), answered, own) {
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

    /// While leading: renew every retry period, moving the deadline on each success; returns why
    /// leadership ended. Attempts are bounded by the deadline, so a hung connection cannot stall.
    async fn keep(&self, leases: &Api<Lease>, leadership: &Leadership) -> String {
        loop {
            let Some(left) = leadership.left(Instant::now()) else { return self.expired() };
            let pause = self.retry_period().min(left);
            tokio::time::sleep(pause).await;
            let Some(left) = leadership.left(Instant::now()) else { continue };
            let sent = Instant::now();
            let renewal = async {
                let current = leases.get_opt(&self.lease_name).await.map_err(LeaseError::Api)?;
                if holder(current.as_ref()) != Some(self.identity.as_str()) {
                    return Err(LeaseError::Taken(holder(current.as_ref()).unwrap_or("nobody").to_string()));
                }
                self.write(leases, current.as_ref(), false).await
            };
            match bounded(self.attempt_timeout().min(left), renewal).await {
                Ok(()) => leadership.renewed(sent + self.renew_deadline()),
                Err(LeaseError::Taken(by)) => return format!("the lease is held by {by}"),
                Err(err) => warn!(lease = %self.describe(), error = %err, "renewing the lease failed"),
            }
        }
    }
    /// Why a term ended at its deadline.
    fn expired(&self) -> String {
        format!("no renewal succeeded within {:?}", self.renew_deadline())
    }

    /// Take or renew the Lease, conditional on `current`'s resourceVersion: of two replicas
    /// writing at once, one gets 409.
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

    /// Give the Lease up on shutdown, so a standby takes it at its next look instead of after
    /// the Lease duration.
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

    /// Bound on one Lease request: a quarter of the renew deadline, so several renewals are tried
    /// before it passes.
    fn attempt_timeout(&self) -> Duration {
        (self.renew_deadline() / 4).max(Duration::from_millis(500))
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }
}

/// client-go's default retry period.
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

async fn bounded<T>(limit: Duration, request: impl Future<Output = Result<T, LeaseError>>) -> Result<T, LeaseError> {
    tokio::time::timeout(limit, request).await.unwrap_or(Err(LeaseError::TimedOut(limit)))
}

fn holder(lease: Option<&Lease>) -> Option<&str> {
    lease?.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// This replica's right to write: one deadline, moved by each successful renewal and checked
/// by every write (`check`, `write`, and the client from `client`). A refused write is never
/// sent; one still unanswered at the deadline is abandoned (it left before the deadline).
#[derive(Clone, Debug)]
pub struct Leadership {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// `namespace/name` of the Lease, for the refusal's message.
    lease: String,
    state: Mutex<State>,
}

#[derive(Clone, Copy, Debug)]
struct State {
    /// Counts terms and the gaps between them: a fenced connection ends with the one it was
    /// opened in.
    epoch: u64,
    term: Term,
}

/// Where this replica stands. Pure, so the fencing rule can be unit-tested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Term {
    /// Election is off: one replica, always writing.
    Unfenced,
    /// Not leading (yet, or any more).
    Standby,
    /// Leading until this instant: when the last successful renewal was *sent* (the API server
    /// stored it no earlier) plus the renew deadline.
    Until(Instant),
}

impl Term {
    /// How long this replica may still write (None: without limit), or why it may not.
    fn left(self, now: Instant) -> Result<Option<Duration>, Refused> {
        match self {
            Term::Unfenced => Ok(None),
            Term::Standby => Err(Refused::NotLeading),
            Term::Until(deadline) => match deadline.checked_duration_since(now) {
                Some(left) if !left.is_zero() => Ok(Some(left)),
                _ => Err(Refused::DeadlinePassed),
            },
        }
    }

    /// A renewal succeeded. A late answer to an older renewal, or one after the term ended,
    /// moves nothing.
    fn renewed(&mut self, until: Instant) {
        if let Term::Until(deadline) = self {
            *deadline = (*deadline).max(until);
        }
    }
}

/// Why a write was not made as leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not sent: this replica stands by (its term ended, or none began).
    NotLeading,
    /// Not sent: the term's deadline passed (no renewal succeeded in time).
    DeadlinePassed,
    /// Sent before the deadline, unanswered at it: no longer waited for.
    Unanswered,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::NotLeading => "write refused: this replica does not lead",
            Refused::DeadlinePassed => {
                "write refused: this replica's renew deadline passed without a successful renewal"
            }
            Refused::Unanswered => {
                "write abandoned: the renew deadline passed before the API server answered (it may have applied it)"
            }
        })
    }
}

/// The fence refused this write before it was sent (not leading, or deadline passed). An
/// abandoned write was sent.
pub fn refused_before_sending(err: &kube::Error) -> bool {
    let kube::Error::Service(source) = err else { return false };
    source.downcast_ref::<NotLeading>().is_some_and(|refused| refused.why != Refused::Unanswered)
}

/// A write refused because this replica may no longer lead.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{why} (Lease {lease}); another replica may lead")]
pub struct NotLeading {
    pub lease: String,
    pub why: Refused,
}

impl Leadership {
    fn new(lease: String, term: Term) -> Self {
        Leadership { inner: Arc::new(Shared { lease, state: Mutex::new(State { epoch: 0, term }) }) }
    }

    /// Election off: every write goes through.
    pub fn unfenced() -> Self {
        Leadership::new(String::new(), Term::Unfenced)
    }

    fn state(&self) -> State {
        *self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.inner.state.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn refused(&self, why: Refused) -> NotLeading {
        NotLeading { lease: self.inner.lease.clone(), why }
    }

    /// May this replica write now? How long it still may (None: without limit).
    pub fn check(&self) -> Result<Option<Duration>, NotLeading> {
        self.state().term.left(Instant::now()).map_err(|why| self.refused(why))
    }

    /// `write`, only while this replica may write: never polled again once it may not (so a retry
    /// inside cannot start another request), and abandoned at the deadline.
    pub async fn write<F: Future>(&self, write: F) -> Result<F::Output, NotLeading> {
        let left = self.check()?;
        let write = std::pin::pin!(write);
        let write = self.while_leading(write);
        let answered = match left {
            None => write.await,
            Some(left) => {
                tokio::time::timeout(left, write).await.unwrap_or_else(|_| Err(self.refused(Refused::Unanswered)))
            }
        };
        // Checked above, so a refusal from here on means the write had already left.
        answered.map_err(|_| self.refused(Refused::Unanswered))
    }

    /// A client whose every non-read request (not GET, HEAD, OPTIONS) goes through `write`, so
    /// all writes are fenced wherever they are made. Each connection ends with the term (or gap
    /// between terms) it was opened in, or at the deadline: a request queued just before a pause
    /// is never written after the process resumes. Unfenced: the plain client.
    pub fn client(&self, config: kube::Config) -> Result<Client, kube::Error> {
        if self.state().term == Term::Unfenced {
            return crate::client::client(config);
        }
        let namespace = config.default_namespace.clone();
        let connections = crate::client::client_on(config, Connections(self.clone()))?;
        let leadership = self.clone();
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            let (client, leadership) = (connections.clone(), leadership.clone());
            async move {
                let read =
                    matches!(*request.method(), hyper::Method::GET | hyper::Method::HEAD | hyper::Method::OPTIONS);
                let response =
                    if read { client.send(request).await } else { leadership.write(client.send(request)).await? };
                // Pass the client's own errors through unchanged (kube unwraps them again).
                response.map_err(tower::BoxError::from)
            }
        });
        Ok(Client::new(service, namespace))
    }

    /// `work`, polled only while this replica may write (a resumed process may find work ready
    /// before anything noticed the time); ends with the refusal otherwise.
    fn while_leading<'a, F: Future>(
        &'a self,
        mut work: Pin<&'a mut F>,
    ) -> impl Future<Output = Result<F::Output, NotLeading>> + Unpin + 'a {
        std::future::poll_fn(move |cx| match self.check() {
            Ok(_) => work.as_mut().poll(cx).map(Ok),
            Err(refused) => Poll::Ready(Err(refused)),
        })
    }

    /// A connection runs only within its epoch and never past the deadline (a standby's
    /// connections carry its reads).
    fn connection_may_run(&self, epoch: u64) -> bool {
        let state = self.state();
        state.epoch == epoch && state.term.left(Instant::now()) != Err(Refused::DeadlinePassed)
    }

    fn begin(&self, until: Instant) {
        self.set(|s| *s = State { epoch: s.epoch + 1, term: Term::Until(until) });
    }

    fn renewed(&self, until: Instant) {
        self.set(|s| s.term.renewed(until));
    }

    /// The term ended: nothing more is written.
    fn end(&self) {
        self.set(|s| {
            if s.term != Term::Unfenced {
                *s = State { epoch: s.epoch + 1, term: Term::Standby };
            }
        });
    }

    /// How long the term has left; None once it is over.
    fn left(&self, now: Instant) -> Option<Duration> {
        self.state().term.left(now).ok().map(|left| left.unwrap_or(Duration::MAX))
    }
}

/// Runs the fenced client's connections (hyper's tasks that write queued requests), polling
/// them only while `Leadership::connection_may_run`.
#[derive(Clone)]
struct Connections(Leadership);

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for Connections {
    fn execute(&self, connection: F) {
        let leadership = self.0.clone();
        let epoch = leadership.state().epoch;
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            std::future::poll_fn(|cx| {
                if leadership.connection_may_run(epoch) { connection.as_mut().poll(cx) } else { Poll::Ready(()) }
            })
            .await
        });
    }
}

/// What a standby has seen of the Lease and when (by its own clock) that last changed. Pure.
#[derive(Debug, Default)]
struct Standby {
    record: Option<(Option<String>, Option<String>)>,
    since: Option<Instant>,
    /// This process has led under its identity, so a Lease held by that identity is its own.
    /// Before that, it may be another process with the same `--identity`, and is waited for.
    led: bool,
}

impl Standby {
    /// Whether the Lease may be taken: absent, without a holder, held by this process's own
    /// identity after a term, or unchanged (holder and renew time) for the longer of this
    /// replica's duration and the Lease's (during an upgrade that shortens it the old leader
    /// still uses the old length; client-go also uses the Lease's). `answered` is when the
    /// answer came.
    fn observe(&mut self, lease: Option<&Lease>, answered: Instant, (duration, identity): (Duration, &str)) -> bool {
        let Some(l) = lease else { return true };
        match holder(Some(l)) {
            None => return true,
            Some(holder) if self.led && holder == identity => return true,
            Some(_) => {}
        }
        let spec = l.spec.as_ref();
        let record = (
            spec.and_then(|s| s.holder_identity.clone()),
            spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string()),
        );
        if self.record.as_ref() != Some(&record) {
            self.record = Some(record);
            self.since = Some(answered);
        }
        let stated = spec.and_then(|s| s.lease_duration_seconds).and_then(|s| u64::try_from(s).ok());
        let wait = duration.max(Duration::from_secs(stated.unwrap_or(0)));
        self.since.is_some_and(|since| answered.duration_since(since) >= wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ElectionArgs {
        ElectionArgs {
            no_leader_election: false,
            lease_name: None,
            lease_namespace: "mw-system".into(),
            identity: None,
            lease_duration: 15,
            lease_grace: 5,
        }
    }

    #[test]
    fn identity_falls_back_to_the_host_and_bad_timings_are_refused() {
        let e = args().election("mw-operator", || "host-1".into()).unwrap().unwrap();
        assert_eq!((e.identity.as_str(), e.namespace.as_str(), e.duration, e.grace), ("host-1", "mw-system", 15, 5));
        assert_eq!(e.lease_name, "mw-operator", "the component's own Lease unless named");
        let bridge = args().election("mw-bridge", || "h".into()).unwrap().unwrap();
        assert_eq!(bridge.lease_name, "mw-bridge");
        let named = ElectionArgs { lease_name: Some("other".into()), ..args() };
        assert_eq!(named.election("mw-bridge", || "h".into()).unwrap().unwrap().lease_name, "other");
        let named = ElectionArgs { identity: Some("pod-a".into()), ..args() };
        assert_eq!(named.election("mw-operator", || unreachable!()).unwrap().unwrap().identity, "pod-a");
        let empty = ElectionArgs { identity: Some(String::new()), ..args() };
        assert_eq!(empty.election("mw-operator", || "h".into()).unwrap().unwrap().identity, "h");
        let bad = ElectionArgs { lease_grace: 8, ..args() };
        assert!(bad.election("mw-operator", || "h".into()).unwrap_err().contains("--lease-grace"));
        let off = ElectionArgs { no_leader_election: true, ..args() };
        assert!(off.election("mw-operator", || "h".into()).unwrap().is_none());
        assert!(default_identity().ends_with(&format!("-{}", std::process::id())));
    }

    fn timing(duration: u64, grace: u64) -> Election {
        ElectionArgs { lease_duration: duration, lease_grace: grace, ..args() }
            .election("mw-operator", || "a".into())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn the_deadline_counts_from_the_last_renewal_sent_and_ends_with_the_term() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut term = Term::Until(t0 + s(10));
        assert_eq!(term.left(t0 + s(4)), Ok(Some(s(6))));
        assert_eq!(term.left(t0 + s(10)), Err(Refused::DeadlinePassed), "over at the deadline");
        term.renewed(t0 + s(18));
        assert_eq!(term.left(t0 + s(10)), Ok(Some(s(8))));
        term.renewed(t0 + s(12));
        assert_eq!(term.left(t0 + s(10)), Ok(Some(s(8))), "a late answer to an older renewal moves nothing");
        assert_eq!(term.left(t0 + s(30)), Err(Refused::DeadlinePassed));
        let mut ended = Term::Standby;
        ended.renewed(t0 + s(100));
        assert_eq!(ended.left(t0), Err(Refused::NotLeading), "a renewal answered after the term ended leads nothing");
        assert_eq!(Term::Unfenced.left(t0 + s(1_000_000)), Ok(None), "election off: no limit");
        let e = timing(15, 5);
        assert_eq!(e.renew_deadline(), s(10));
        assert!(e.attempt_timeout() < e.renew_deadline() && e.retry_period() < e.renew_deadline());
    }

    /// A model of one takeover on the real rules (`Term`, `Standby::observe`). The leader
    /// (configured as `e`) took the Lease at t0 and renews every retry period, each renewal stored
    /// `up` after it was sent, until it is paused after its fifth. The standby (configured as
    /// `standby`) looks a retry period after each answer (first at `offset`); look n is read
    /// `read(n)` after sending and answered `back` later. Returns the leader's deadline and the
    /// answer on which the standby takes the Lease, timing from the answer (as `acquire` does) or,
    /// with `from_request`, from when the look was sent (the old, unsafe rule).
    fn takeover(
        e: &Election,
        standby_config: &Election,
        up: Duration,
        read: impl Fn(u32) -> Duration,
        back: Duration,
        offset: Duration,
        from_request: bool,
    ) -> (Instant, Instant) {
        let t0 = Instant::now();
        let period = e.retry_period();
        let renewals = 5;
        let sent = |k: u32| t0 + period * k;
        let mut term = Term::Until(sent(0) + e.renew_deadline());
        for k in 1..=renewals {
            term.renewed(sent(k) + e.renew_deadline());
        }
        let Term::Until(deadline) = term else { unreachable!("leading") };
        // The renewal the API server holds at `t`, as the Lease's renew time (the take at t0
        // is renewal 0).
        let stored = |t: Instant| (0..=renewals).rev().find(|&k| sent(k) + up <= t).map_or(0, |k| k + 1);
        let mut standby = Standby::default();
        let mut look = t0 + offset;
        for n in 0u32..10_000 {
            let served = look + read(n);
            let answered = served + back;
            let mut seen = lease(Some("a"), i64::from(stored(served)));
            if let Some(spec) = seen.spec.as_mut() {
                spec.lease_duration_seconds = i32::try_from(e.duration).ok();
            }
            let at = if from_request { look } else { answered };
            let own = (Duration::from_secs(standby_config.duration), "b");
            if standby.observe(Some(&seen), at, own) {
                return (deadline, answered);
            }
            look = answered + period;
        }
        unreachable!("the standby takes a Lease nobody renews")
    }

    /// How long the API server takes to read the standby's n-th look.
    type Latency = Box<dyn Fn(u32) -> Duration>;

    #[test]
    fn a_standby_takes_over_only_after_the_leaders_deadline_whatever_the_latencies() {
        let mut early_by_the_old_rule = Vec::new();
        let alike = [(2, 1), (4, 2), (15, 5), (60, 30), (60, 1)].map(|t| (t, t));
        // A `helm upgrade` that changes the Lease's length: the new replica stands by with
        // the new one while the old leader renews with the old one.
        let upgrades = [((60, 30), (15, 5)), ((15, 5), (4, 2)), ((4, 2), (60, 30))];
        for ((duration, grace), (standby_duration, standby_grace)) in alike.into_iter().chain(upgrades) {
            let e = timing(duration, grace);
            let standby = timing(standby_duration, standby_grace);
            let bound = e.attempt_timeout();
            let latencies = [Duration::ZERO, Duration::from_millis(100), bound / 2, bound];
            // Every look as slow as the next, or a single slow one among fast looks.
            let mut reads: Vec<(String, Latency)> = Vec::new();
            for latency in latencies {
                reads.push((format!("every look {latency:?}"), Box::new(move |_| latency)));
                for k in 0..8 {
                    let read = move |n| if n == k { latency } else { Duration::ZERO };
                    reads.push((format!("look {k} {latency:?}"), Box::new(read)));
                }
            }
            for up in latencies {
                for (pattern, read) in &reads {
                    for back in [Duration::ZERO, Duration::from_millis(100)] {
                        for offset in (0..8).map(|i| e.retry_period() * i / 8) {
                            let case = format!(
                                "{duration}/{grace} (standby {standby_duration}/{standby_grace}) up {up:?} {pattern} \
                                 back {back:?} offset {offset:?}"
                            );
                            // Each attempt is bounded: a look answered later is no look.
                            let read = |n| read(n).min(bound - back);
                            let (deadline, took) = takeover(&e, &standby, up, read, back, offset, false);
                            // The leader's last write was sent before its deadline; the standby
                            // holds the Lease the grace after it at the earliest.
                            assert!(
                                took >= deadline + Duration::from_secs(grace),
                                "{case}: took {:?} after the deadline",
                                took.checked_duration_since(deadline)
                            );
                            let (deadline, took) = takeover(&e, &standby, up, read, back, offset, true);
                            if took < deadline {
                                early_by_the_old_rule.push(case);
                            }
                        }
                    }
                }
            }
        }
        // The model tells the rules apart: timed from the request, a slow look that shows
        // the leader's last renewal lets the standby take the Lease while the leader still
        // writes (where a request may take longer than the grace).
        assert!(
            early_by_the_old_rule.iter().any(|c| c.starts_with("60/1 (standby 60/1)")),
            "the old rule was never early: {early_by_the_old_rule:?}"
        );
    }

    #[tokio::test]
    async fn work_is_not_polled_once_the_deadline_has_passed() {
        let leadership = Leadership::new("ns/lease".into(), Term::Standby);
        let ran = std::sync::atomic::AtomicBool::new(false);
        let work = std::pin::pin!(async { ran.store(true, std::sync::atomic::Ordering::SeqCst) });
        let refused = leadership.while_leading(work).await.expect_err("refused");
        assert_eq!(refused.why, Refused::NotLeading);
        leadership.begin(Instant::now());
        let work = std::pin::pin!(async { ran.store(true, std::sync::atomic::Ordering::SeqCst) });
        let refused = leadership.while_leading(work).await.expect_err("refused");
        assert_eq!(refused.why, Refused::DeadlinePassed);
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "work ready to run was never polled");
        // Positive control: the same work runs while the term lasts.
        leadership.begin(Instant::now() + Duration::from_secs(30));
        let work = std::pin::pin!(async { ran.store(true, std::sync::atomic::Ordering::SeqCst) });
        assert!(leadership.while_leading(work).await.is_ok());
        assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
    }

    /// Runs `Connections` tasks on this (single-threaded) test runtime: one is spawned, then
    /// `between` happens before it is first polled; returns whether it ran.
    async fn connection_ran(leadership: &Leadership, between: impl FnOnce()) -> bool {
        use hyper::rt::Executor;
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        Connections(leadership.clone()).execute(async move { flag.store(true, std::sync::atomic::Ordering::SeqCst) });
        between();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        ran.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_connection_writes_nothing_once_its_term_is_over() {
        let leadership = Leadership::new("ns/lease".into(), Term::Standby);
        assert!(connection_ran(&leadership, || {}).await, "a standby's connections carry its reads");
        let term = Instant::now() + Duration::from_secs(30);
        assert!(
            !connection_ran(&leadership, || leadership.begin(term)).await,
            "one of the standby ends as a term begins"
        );
        assert!(connection_ran(&leadership, || {}).await, "the term's own run");
        // A request queued on a connection just before a pause, the process resumed past the
        // deadline: the connection is not polled again, so the request is never written.
        leadership.begin(Instant::now() + Duration::from_millis(50));
        let pause = || std::thread::sleep(Duration::from_millis(100));
        assert!(!connection_ran(&leadership, pause).await, "past the deadline");
        leadership.begin(term);
        assert!(!connection_ran(&leadership, || leadership.end()).await, "ended with its term");
    }

    /// An API server that answers every request with a ConfigMap named as asked, after
    /// `delay` for the name "slow", and records the method of each request it received.
    async fn api_server(delay: Duration) -> (String, Arc<Mutex<Vec<String>>>) {
        use http_body_util::Full;
        use hyper::body::Bytes;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let log = log.clone();
                let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let log = log.clone();
                    async move {
                        log.lock().unwrap().push(request.method().to_string());
                        let name = request.uri().path().rsplit('/').next().unwrap_or_default().to_string();
                        if name == "slow" {
                            tokio::time::sleep(delay).await;
                        }
                        let body =
                            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
                        let response = hyper::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(body.to_string())))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(socket), service),
                );
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn a_write_after_the_deadline_is_refused_and_never_sent() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let (url, seen) = api_server(Duration::from_secs(2)).await;
        let leadership = Leadership::new("ns/lease".into(), Term::Standby);
        let api: Api<ConfigMap> =
            Api::namespaced(leadership.client(kube::Config::new(url.parse().unwrap())).unwrap(), "a");
        let change = Patch::Merge(serde_json::json!({"data": {"k": "v"}}));
        let write = |name: &'static str| {
            let (api, change) = (api.clone(), change.clone());
            async move { api.patch(name, &PatchParams::default(), &change).await }
        };

        // A standby reads, and writes nothing.
        api.get("x").await.expect("reads go through");
        let refused = write("x").await.unwrap_err();
        assert!(refused_before_sending(&refused), "{refused:?}");
        let refused = refused.to_string();
        assert!(refused.contains("does not lead") && refused.contains("ns/lease"), "{refused}");
        // Leading: writes go through (the positive control: this server does record them).
        leadership.begin(Instant::now() + Duration::from_secs(30));
        write("x").await.expect("a leader writes");
        // The deadline passed (no renewal succeeded): refused, whatever still runs.
        leadership.begin(Instant::now());
        let refused = write("x").await.unwrap_err().to_string();
        assert!(refused.contains("renew deadline passed"), "{refused}");
        // Unanswered at the deadline: abandoned (the request had left before it).
        leadership.begin(Instant::now() + Duration::from_millis(300));
        let refused = write("slow").await.unwrap_err();
        assert!(!refused_before_sending(&refused), "abandoned, but it had left: {refused:?}");
        let refused = refused.to_string();
        assert!(refused.contains("abandoned"), "{refused}");
        leadership.end();
        assert!(write("x").await.is_err());
        api.get("x").await.expect("reads go through after the term too");
        let methods = seen.lock().unwrap().clone();
        // The leader's write, and the one abandoned unanswered (it had left in time).
        assert_eq!(methods, ["GET", "PATCH", "PATCH", "GET"], "no refused write reached the API server");
    }

    #[tokio::test]
    async fn without_election_every_write_goes_through() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let (url, seen) = api_server(Duration::ZERO).await;
        let leadership = Leadership::unfenced();
        let api: Api<ConfigMap> =
            Api::namespaced(leadership.client(kube::Config::new(url.parse().unwrap())).unwrap(), "a");
        api.patch("x", &PatchParams::default(), &Patch::Merge(serde_json::json!({}))).await.unwrap();
        leadership.end();
        api.patch("x", &PatchParams::default(), &Patch::Merge(serde_json::json!({}))).await.unwrap();
        assert_eq!(seen.lock().unwrap().len(), 2);
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
        let d = (Duration::from_secs(15), "me");
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

    #[test]
    fn a_standby_waits_for_the_longer_lease_and_for_its_own_identity_held_by_another_process() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut longer = lease(Some("a"), 1);
        longer.spec.as_mut().unwrap().lease_duration_seconds = Some(60);
        let mut standby = Standby::default();
        let own = (Duration::from_secs(15), "me");
        assert!(!standby.observe(Some(&longer), at(0), own));
        assert!(!standby.observe(Some(&longer), at(59), own), "the holder's 60 s, not the standby's 15");
        assert!(standby.observe(Some(&longer), at(60), own));
        let mut shorter = lease(Some("a"), 1);
        shorter.spec.as_mut().unwrap().lease_duration_seconds = Some(5);
        let mut standby = Standby::default();
        assert!(!standby.observe(Some(&shorter), at(0), own));
        assert!(!standby.observe(Some(&shorter), at(14), own), "its own 15 s, the longer");
        assert!(standby.observe(Some(&shorter), at(15), own));
        // Its own identity in the Lease: another process given the same identity, waited for...
        let mut standby = Standby::default();
        assert!(!standby.observe(Some(&lease(Some("me"), 1)), at(0), own), "not taken at once");
        assert!(standby.observe(Some(&lease(Some("me"), 1)), at(15), own));
        // ...unless this process held it in a term of its own.
        let mut standby = Standby { led: true, ..Standby::default() };
        assert!(standby.observe(Some(&lease(Some("me"), 1)), at(0), own), "its own, from its last term");
        assert!(!standby.observe(Some(&lease(Some("a"), 1)), at(0), own));
    }
}
