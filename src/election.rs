//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager), and the shutdown
//! signal. Only the holder of the Lease reconciles and writes; a standby waits with warm
//! caches and takes over once the holder stops renewing (at most the Lease duration after it
//! died), or at once when the holder releases the Lease on a clean shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tracing::{info, warn};

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
    /// Seconds before expiry at which the leader renews; at most half the duration.
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
    /// None when election is off. kube-lease-manager panics on a grace that is not below the
    /// duration, so that is refused here with a message instead.
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
    /// Compete for the Lease until `shutdown`. Each time this replica wins it, `term(stop)`
    /// runs until it returns; `stop` turns true when the Lease is lost or shutdown begins, and
    /// `term` must then finish its in-flight work and return. On shutdown the Lease is
    /// released (so a standby takes over at once) before this returns.
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
        let leases: Api<Lease> = Api::namespaced(client.clone(), &self.namespace);
        metrics.set_leader(&self.lease_name, false);
        info!(lease = %self.describe(), identity = %self.identity, "standing by for leadership");
        let (mut leading, mut task) = self.manager(&client).await?.watch().await;
        loop {
            // kube-lease-manager's standby sleeps until the holder's Lease would expire; a
            // holder that shut down cleanly released it long before. Seeing the release on a
            // watch of the Lease, a fresh manager takes it at once.
            let mut released = std::pin::pin!(released(leases.clone(), self.lease_name.clone()));
            let mut restart = false;
            tokio::select! {
                won = leading.wait_for(|l| *l) => if won.is_err() { break },
                () = &mut released => restart = true,
                _ = shutdown.wait_for(|s| *s) => break,
            }
            if restart {
                drop(leading);
                let _ = tokio::time::timeout(RELEASE_TIMEOUT, task).await;
                // Not in a tight loop should the Lease stay free and taking it keep failing.
                tokio::time::sleep(Duration::from_millis(200)).await;
                (leading, task) = self.manager(&client).await?.watch().await;
                continue;
            }
            info!(lease = %self.describe(), identity = %self.identity, "became leader");
            metrics.set_leader(&self.lease_name, true);
            let (stop, stopped) = watch::channel(false);
            let mut work = std::pin::pin!(term(stopped));
            let lost = tokio::select! {
                () = &mut work => false,
                changed = leading.wait_for(|l| !*l) => changed.is_ok(),
                _ = shutdown.wait_for(|s| *s) => false,
            };
            let _ = stop.send(true);
            finish_within(STOP_GRACE, work).await;
            metrics.set_leader(&self.lease_name, false);
            if *shutdown.borrow() {
                break;
            }
            if lost {
                warn!(lease = %self.describe(), "lost leadership; standing by");
            }
        }
        // Dropping the channel makes the manager's task release the Lease and return.
        drop(leading);
        match tokio::time::timeout(RELEASE_TIMEOUT, task).await {
            Ok(Ok(Ok(_))) => info!(lease = %self.describe(), "lease released"),
            Ok(Ok(Err(err))) => {
                warn!(lease = %self.describe(), error = %err, "could not release the lease; it expires by itself")
            }
            Ok(Err(err)) => warn!(error = %err, "the lease task failed"),
            Err(_) => warn!(lease = %self.describe(), "timed out releasing the lease; it expires by itself"),
        }
        Ok(())
    }

    async fn manager(&self, client: &Client) -> Result<LeaseManager, Error> {
        LeaseManagerBuilder::new(client.clone(), &self.lease_name)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(self.duration)
            .with_grace(self.grace)
            .with_field_manager(format!("mw-operator-{}", self.identity))
            .build()
            .await
            .map_err(|e| Error::Lease(self.describe(), e.to_string()))
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }
}

/// Resolves once the Lease is seen without a holder (released) or gone.
async fn released(leases: Api<Lease>, name: String) {
    let mut changes = std::pin::pin!(kube::runtime::watcher::watch_object(leases, &name));
    while let Some(change) = changes.next().await {
        match change {
            Ok(Some(lease))
                if lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).is_some_and(|h| !h.is_empty()) => {}
            Ok(_) => return,
            // Watch errors are retried by the watcher; meanwhile the manager's own polling
            // still takes the Lease when it expires.
            Err(_) => {}
        }
    }
    // The watch ended (never, short of shutdown): wait for the manager instead.
    std::future::pending::<()>().await
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
}
