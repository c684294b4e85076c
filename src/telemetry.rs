//! Probes and Prometheus metrics over HTTP: `/healthz`, `/readyz` and `/metrics`, for the
//! operator and the bridge alike. A plain hyper HTTP/1 server (hyper is already in the tree
//! through kube) and prometheus-client's registry and text encoder.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Whether the process is ready to serve (caches synced, first pass done). Liveness is the
/// server answering at all.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// Bind `addr` and serve until the task is dropped. Returns the bound address (a port of 0
/// picks a free one, which tests use).
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
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into(), PLAIN),
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
