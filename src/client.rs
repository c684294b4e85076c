//! Connecting to the API server: an explicit kubeconfig (and context), or the in-cluster
//! service account, with TLS verification always on.

use std::path::PathBuf;
use std::time::Duration;

use kube::api::PatchParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::Error;

/// How to reach the API server.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConnectionArgs {
    /// Kubeconfig file. Without it: $KUBECONFIG or ~/.kube/config when present, otherwise the
    /// in-cluster service account.
    #[arg(long, env = "MW_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Context within the kubeconfig (defaults to its current-context).
    #[arg(long, env = "MW_CONTEXT")]
    pub context: Option<String>,
}

/// The longest a request may wait to connect, send, or receive its next bytes, so a request
/// on a dead connection (a dead load balancer, half-open TCP) fails and is retried instead of
/// hanging.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Watches wait longer: the API server may stay silent until kube's `timeoutSeconds` (290 s).
/// kube's watcher restarts on any error; a dead peer is found sooner (`PING_AFTER`).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(295);

/// An `Api` for `K` in `namespace`, or in all namespaces.
pub fn api_in<K>(client: &Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    }
}

/// Fail fast at start-up instead of retrying a forbidden watch forever. Lists one item's
/// metadata: the cheapest read that needs the watch's permission.
pub async fn may_list<K>(client: &Client, namespace: Option<&str>) -> Result<(), kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    api_in::<K>(client, namespace).list_metadata(&kube::api::ListParams::default().limit(1)).await.map(|_| ())
}

/// Server-side apply parameters without field validation. Every body is serialized from typed
/// structs, so it has no unknown or duplicate fields, and the default (`Warn`) makes the API
/// server decode each body a second time just to look (3% of its CPU in a 10,000-row first
/// sync). kube does not surface the warnings anyway.
pub fn apply_params(manager: &str) -> PatchParams {
    PatchParams::apply(manager).validation_ignore()
}

/// Merge patch parameters; no field validation, as in `apply_params`.
pub fn patch_params(manager: &str) -> PatchParams {
    PatchParams { field_manager: Some(manager.into()), ..Default::default() }.validation_ignore()
}

/// The two clients every long-running command uses.
#[derive(Clone)]
pub struct Clients {
    /// For reads, writes and the Lease: every request bounded by `REQUEST_TIMEOUT`.
    pub requests: Client,
    /// For watches only: bounded by `WATCH_TIMEOUT`.
    pub watches: Client,
    /// What `requests` was made from, for clients with their own connections
    /// (`election::Leadership::client`).
    pub config: Config,
}

/// A client whose requests are bounded by `REQUEST_TIMEOUT`. Refuses a configuration that
/// turns TLS verification off: credentials must never go to an unverified server.
pub async fn connect(args: &ConnectionArgs) -> Result<Client, Error> {
    Ok(connect_all(args).await?.requests)
}

/// `connect`'s client, and one for watches.
pub async fn connect_all(args: &ConnectionArgs) -> Result<Clients, Error> {
    let config = config(args).await?;
    let requests = bounded(config.clone(), REQUEST_TIMEOUT);
    Ok(Clients {
        requests: client(requests.clone()).map_err(Error::Client)?,
        watches: client(bounded(config, WATCH_TIMEOUT)).map_err(Error::Client)?,
        config: requests,
    })
}

/// How far a connection reads ahead of its reader, and so the read buffer it keeps for life.
/// hyper's default (408 KiB) is reached by any list page, and the buffer never shrinks: after
/// an API server restart every watch's connection kept up to 408 KiB. Over HTTP/2 this is the
/// per-stream flow-control window.
pub const READ_BUFFER: usize = 64 * 1024;

/// HTTP/2 connection window: all the operator's watch windows at once (six), with margin.
const CONNECTION_WINDOW: u32 = 1024 * 1024;

/// As client-go (ReadIdleTimeout, PingTimeout): an HTTP/2 connection idle this long is pinged
/// and closed without an answer within `PING_TIMEOUT`. Finds a dead peer behind quiet watches,
/// and keeps a live idle connection open so the next burst of requests reuses it.
const PING_AFTER: Duration = Duration::from_secs(20);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// kube's client, but with each connection's read buffer bounded by `READ_BUFFER` and HTTP/2
/// where the API server speaks it.
pub fn client(config: Config) -> Result<Client, kube::Error> {
    client_on(config, hyper_util::rt::TokioExecutor::new())
}

/// `client`, its connections run by `executor`.
///
/// kube's builder has no settings for hyper's connections, so this rebuilds kube's stack: TLS,
/// timeouts, base URI, retries of 429/503/504, credentials and extra headers. Left out: kube's
/// per-request debug span, and proxies (a proxy goes to kube's builder, which reports the
/// error: this build of kube has no proxy support).
///
/// It offers HTTP/2 as client-go does, so all requests share one connection. Over HTTP/1.1 a
/// burst of reconciles opened 60+ TLS connections, 2–3 MiB of heap held for half a minute.
pub fn client_on<E>(config: Config, executor: E) -> Result<Client, kube::Error>
where
    E: hyper::rt::Executor<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> + Send + Sync + Clone + 'static,
{
    use kube::client::ConfigExt;
    use kube::client::retry::RetryPolicy;
    use tower::ServiceBuilder;

    if config.proxy_url.is_some() {
        return Ok(kube::client::ClientBuilder::try_from((config, executor))?.build());
    }
    let mut plain = hyper_util::client::legacy::connect::HttpConnector::new();
    plain.enforce_http(false);
    // As Go does. Over HTTP/2 headers and body are separate small writes; with Nagle on, the
    // body waited for the server's delayed ACK: 40 ms more on every write with a body.
    plain.set_nodelay(true);
    let mut connector = hyper_timeout::TimeoutConnector::new(https_connector(&config, plain)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let connections = hyper_util::client::legacy::Builder::new(executor)
        .http1_max_buf_size(READ_BUFFER)
        .http2_initial_stream_window_size(READ_BUFFER as u32)
        .http2_initial_connection_window_size(CONNECTION_WINDOW)
        .timer(hyper_util::rt::TokioTimer::new())
        .http2_keep_alive_interval(PING_AFTER)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        // The read timeout bounds a connection's silence; on a busy shared HTTP/2 connection, a
        // request could otherwise wait longer for its own answer.
        .option_layer(config.read_timeout.map(tower::timeout::TimeoutLayer::new))
        .map_err(tower::BoxError::from)
        .service(connections);
    Ok(Client::new(service, config.default_namespace))
}

/// kube's TLS connector (kubeconfig's CA, client certificate, `tls-server-name`), offering
/// HTTP/2 and HTTP/1.1.
fn https_connector<H>(config: &Config, plain: H) -> Result<hyper_rustls::HttpsConnector<H>, kube::Error> {
    use kube::client::ConfigExt;

    let builder =
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config.rustls_client_config()?).https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = name
                .clone()
                .try_into()
                .map_err(|e| kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e)))?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    Ok(builder.enable_http1().enable_http2().wrap_connector(plain))
}

fn bounded(mut config: Config, read: Duration) -> Config {
    config.connect_timeout = Some(REQUEST_TIMEOUT.min(read));
    config.write_timeout = Some(REQUEST_TIMEOUT.min(read));
    config.read_timeout = Some(read);
    config
}

/// The client configuration `connect` uses, checked for disabled TLS verification.
pub async fn config(args: &ConnectionArgs) -> Result<Config, Error> {
    let options = KubeConfigOptions { context: args.context.clone(), ..Default::default() };
    let config = match &args.kubeconfig {
        Some(path) => {
            // Errors name the file but never echo its contents (it holds credentials).
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("reading kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?
        }
        None if args.context.is_some() => {
            Config::from_kubeconfig(&options).await.map_err(|e| Error::Config(format!("kubeconfig context: {e}")))?
        }
        None => Config::infer().await.map_err(|e| Error::Config(e.to_string()))?,
    };
    check_tls(&config)?;
    Ok(identify(config))
}

/// Lets the audit log and API priority and fairness tell the operator and the bridge from
/// other clients.
pub const USER_AGENT: &str = concat!("mw-operator/", env!("CARGO_PKG_VERSION"));

fn identify(mut config: Config) -> Config {
    use hyper::header::{HeaderValue, USER_AGENT as NAME};
    config.headers.retain(|(name, _)| name != NAME);
    config.headers.push((NAME, HeaderValue::from_static(USER_AGENT)));
    config
}

fn check_tls(config: &Config) -> Result<(), Error> {
    if config.accept_invalid_certs {
        return Err(Error::Config(
            "the kubeconfig sets insecure-skip-tls-verify; the operator requires a verified API server \
             (set certificate-authority or certificate-authority-data instead)"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insecure_configurations_are_refused() {
        let mut config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(check_tls(&config).is_ok());
        config.accept_invalid_certs = true;
        let err = check_tls(&config).unwrap_err().to_string();
        assert!(err.contains("insecure-skip-tls-verify"), "{err}");
    }

    /// The client's own stack (`client_on`) does what kube's would: every request goes to the
    /// configured server, with the credentials and the user agent, and an answer many times
    /// `READ_BUFFER` comes back whole.
    #[tokio::test]
    async fn the_client_sends_credentials_and_headers_and_reads_answers_larger_than_its_buffer() {
        use http_body_util::Full;
        use hyper::body::Bytes;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(|request: hyper::Request<hyper::body::Incoming>| async move {
                let header = |name| request.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                let seen = format!("{} {} {}", request.uri().path(), header("authorization"), header("user-agent"));
                // The line seen, then 1 MiB: sixteen times the read buffer.
                let body = format!("{seen}\n{}", "x".repeat(1 << 20));
                Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from(body))))
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            hyper::server::conn::http1::Builder::new().serve_connection(io, service).await.unwrap();
        });
        let mut config = identify(Config::new(url.parse().unwrap()));
        config.auth_info.token = Some("s3cret".to_string().into());
        let answer = client(config)
            .unwrap()
            .request_text(hyper::Request::get("/api/v1/namespaces").body(Vec::new()).unwrap())
            .await
            .unwrap();
        let (seen, rest) = answer.split_once('\n').unwrap();
        assert_eq!(seen, format!("/api/v1/namespaces Bearer s3cret {USER_AGENT}"));
        assert_eq!(rest.len(), 1 << 20, "read whole, {} KiB at a time", READ_BUFFER / 1024);
        server.abort();
    }

    /// The bound is hyper's own: what it cannot fit in `READ_BUFFER` before a response's
    /// body starts (its head) is refused. kube's default client (408 KiB) reads this one.
    #[tokio::test]
    async fn a_connection_reads_into_no_more_than_its_buffer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper::service::service_fn(|_| async {
                    let big = "x".repeat(2 * READ_BUFFER);
                    let response = hyper::Response::builder().header("x-big", big).body(String::from("{}")).unwrap();
                    Ok::<_, std::convert::Infallible>(response)
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
            }
        });
        let config = Config::new(url.parse().unwrap());
        let get = || hyper::Request::get("/version").body(Vec::new()).unwrap();
        assert!(Client::try_from(config.clone()).unwrap().request_text(get()).await.is_ok(), "kube's default");
        let refused = client(config).unwrap().request_text(get()).await.unwrap_err();
        assert!(format!("{refused:?}").contains("TooLarge"), "{refused:?}");
        server.abort();
    }

    #[test]
    fn every_request_names_the_operator_and_its_version() {
        let config = identify(Config::new("https://127.0.0.1:6443".parse().unwrap()));
        let agents: Vec<_> = config.headers.iter().filter(|(n, _)| n == hyper::header::USER_AGENT).collect();
        assert_eq!(agents.len(), 1);
        assert_eq!(agents[0].1, format!("mw-operator/{}", env!("CARGO_PKG_VERSION")).as_str());
        assert_eq!(identify(config).headers.len(), 1, "applied twice, still one header");
    }
}
