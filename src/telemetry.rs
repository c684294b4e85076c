//! Probes and Prometheus metrics over HTTP (`/healthz`, `/readyz`, `/metrics`), for the
//! operator and the bridge: a plain hyper HTTP/1 server (hyper comes with kube) and
//! prometheus-client's text encoder.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

/// Readiness, and liveness. Without a stall limit, alive means the server answers; with one,
/// the loop must `beat` at least that often, so a loop stuck where no timeout reaches (a hung
/// connection, a deadlock) gets the Pod restarted.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    liveness: Option<Liveness>,
}

impl Default for Health {
    /// Ready when told; always alive (no progress is tracked).
    fn default() -> Self {
        Health { ready: AtomicBool::new(false), liveness: None }
    }
}

impl Health {
    /// Alive only while `beat` is called at least every `limit`. The clock starts now, so a hung
    /// start-up counts too.
    pub fn with_stall_limit(limit: Duration) -> Self {
        Health { ready: AtomicBool::new(false), liveness: Some(Liveness::new(limit)) }
    }
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
    /// The loop made progress (finished a pass, successful or not).
    pub fn beat(&self) {
        if let Some(liveness) = &self.liveness {
            liveness.beat();
        }
    }
    /// `None` while alive; else how long since the last progress.
    pub fn stalled_for(&self) -> Option<Duration> {
        self.liveness.as_ref().and_then(|l| l.stalled_for(Instant::now()))
    }
}

/// The time of the last `beat`, as milliseconds since `origin`, in an atomic so the probe
/// server can read it without a lock.
#[derive(Debug)]
pub struct Liveness {
    origin: Instant,
    last_beat_ms: AtomicU64,
    limit: Duration,
}

impl Liveness {
    pub fn new(limit: Duration) -> Self {
        Liveness { origin: Instant::now(), last_beat_ms: AtomicU64::new(0), limit }
    }

    pub fn beat(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_beat_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// `None` while the last beat is at most `limit` before `now`; else the time since it.
    pub fn stalled_for(&self, now: Instant) -> Option<Duration> {
        let last = Duration::from_millis(self.last_beat_ms.load(Ordering::Relaxed));
        stale(last, now.saturating_duration_since(self.origin), self.limit)
    }
}

/// The pure rule: the loop is stalled when more than `limit` passed since the last beat; the
/// answer is how long it has been.
pub fn stale(last: Duration, now: Duration, limit: Duration) -> Option<Duration> {
    let since = now.saturating_sub(last);
    (since > limit).then_some(since)
}

/// Bind `addr` and serve until the task is dropped. Returns the bound address (port 0 picks
/// a free one, for tests).
pub async fn serve(addr: SocketAddr, registry: Arc<Registry>, health: Arc<Health>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    info!(address = %bound, "serving /healthz, /readyz and /metrics");
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(err) => {
                    warn!(error = %err, "accepting a probe/metrics connection");
                    continue;
                }
            };
            let (registry, health) = (registry.clone(), health.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let response = respond(&req, &registry, &health);
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(err) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                    debug!(error = %err, "probe/metrics connection ended");
                }
            });
        }
    });
    Ok(bound)
}

fn respond(req: &Request<Incoming>, registry: &Registry, health: &Health) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String, content_type: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into(), PLAIN);
    }
    match req.uri().path() {
        "/healthz" | "/livez" => match health.stalled_for() {
            None => text(StatusCode::OK, "ok\n".into(), PLAIN),
            Some(since) => {
                text(StatusCode::SERVICE_UNAVAILABLE, format!("stalled: no progress for {}s\n", since.as_secs()), PLAIN)
            }
        },
        "/readyz" if health.is_ready() => text(StatusCode::OK, "ok\n".into(), PLAIN),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into(), PLAIN),
        "/metrics" => {
            let mut body = String::new();
            match encode(&mut body, registry) {
                Ok(()) => text(StatusCode::OK, body, "application/openmetrics-text; version=1.0.0; charset=utf-8"),
                Err(err) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {err}\n"), PLAIN),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), PLAIN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_only_after_the_limit() {
        let s = Duration::from_secs;
        assert_eq!(stale(s(10), s(10), s(30)), None);
        assert_eq!(stale(s(10), s(40), s(30)), None, "exactly the limit is still alive");
        assert_eq!(stale(s(10), s(41), s(30)), Some(s(31)));
        assert_eq!(stale(s(50), s(40), s(30)), None, "a beat after `now` (clock read order) is no stall");
    }

    #[test]
    fn liveness_follows_beats() {
        let limit = Duration::from_secs(30);
        let l = Liveness::new(limit);
        let origin = l.origin;
        assert_eq!(l.stalled_for(origin + Duration::from_secs(5)), None);
        assert_eq!(
            l.stalled_for(origin + Duration::from_secs(31)),
            Some(Duration::from_secs(31)),
            "no beat since start"
        );
        l.beat();
        // The beat was taken just after `origin`: 31 s from the origin is at most 31 s since it.
        assert!(l.stalled_for(origin + Duration::from_secs(29)).is_none());
        // A health without a limit is always alive; with one, it starts alive.
        assert_eq!(Health::default().stalled_for(), None);
        let h = Health::with_stall_limit(limit);
        h.beat();
        assert_eq!(h.stalled_for(), None);
        let h = Health::with_stall_limit(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(h.stalled_for().is_some(), "no beat within a zero limit: stalled");
    }
}
