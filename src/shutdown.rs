//! The shutdown signal every long-running command (the operator, the bridge) stops on, and
//! the bounded wait for work to finish once it came.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

/// How long in-flight reconciles may take to finish once a term ends before they are dropped.
/// With the 5 s to release the Lease it fits the chart's 30 s terminationGracePeriodSeconds;
/// without it, a reconcile stuck on an unreachable API server would wait minutes.
pub const STOP_GRACE: Duration = Duration::from_secs(20);

/// Turns true on the first SIGTERM or SIGINT.
pub fn signal() -> watch::Receiver<bool> {
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
        info!("shutdown requested: finishing in-flight work");
        let _ = tx.send(true);
    });
    rx
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
