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

/// The longest any single request may wait for the API server: to connect, to send, for its
/// answer to begin, or for the next bytes on its connection. A request on a connection that
/// stopped forwarding (a dead load balancer, a half-open TCP connection) fails after this
/// instead of hanging, and is retried on a fresh connection.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A watch waits longer: the API server ends a watch after kube's `timeoutSeconds` (290 s) and
/// may be silent until then. kube's watcher restarts it on any error, so a hung connection
/// costs at most this long (a dead one is found sooner: `PING_AFTER`).
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

/// Fail fast at start-up rather than retry a forbidden watch forever: may `client` list `K`
/// in `namespace` (every namespace: `None`)? One list of one item's metadata, the cheapest
/// read that needs the watch's permission.
pub async fn may_list<K>(client: &Client, namespace: Option<&str>) -> Result<(), kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    api_in::<K>(client, namespace).list_metadata(&kube::api::ListParams::default().limit(1)).await.map(|_| ())
}

/// The parameters of `manager`'s server-side applies, asking for no field validation: every
/// body the operator and the bridge send is serialized from the types the CRD and the
/// built-in kinds are generated from, so it has no unknown or duplicate field to report, and
/// the API server's default (`Warn`) decodes each body a second time, strictly, only to look
/// for them (a second YAML decode of each apply: 3% of the API server's CPU in a first sync of
/// 10,000 rows, profiled on 2026-12-04). What `Warn` would find comes back as a warning header,
/// which kube does not surface anyway.
pub fn apply_params(manager: &str) -> PatchParams {
    PatchParams::apply(manager).validation_ignore()
}

/// The parameters of `manager`'s merge patches; no field validation, as for `apply_params`.
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
    /// What `requests` was made from (bounded as it is): for a client of the same kind with
    /// connections of its own (a leader's writes, `election::Leadership::client`).
    pub config: Config,
}

/// A client for the configured cluster, every request bounded by `REQUEST_TIMEOUT`. Refuses a
/// configuration that turns TLS verification off: the operator's credentials must never be
/// sent to an unverified server.
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

/// The most a connection reads ahead of what its response's reader has taken, and so the
/// read buffer it keeps for as long as it lives (HTTP/1.1). hyper's default (408 KiB) is
/// reached by any list of a page of objects, and a connection keeps its buffer at the size it
/// reached: after the first re-list of every watch (an API server restart), each watch's
/// connection held one of 256 to 408 KiB for good. Reading 64 KiB at a time costs a list only
/// more reads. Over HTTP/2 the same bound is each stream's flow-control window: the API server
/// sends no more of an answer than that ahead of its reader.
pub const READ_BUFFER: usize = 64 * 1024;

/// What the API server may send over one HTTP/2 connection ahead of its readers, all streams
/// together: every watch's window at once (six watches in the operator), with room to spare.
const CONNECTION_WINDOW: u32 = 1024 * 1024;

/// An HTTP/2 connection that has read nothing for this long is sent a PING, and closed if no
/// answer comes within `PING_TIMEOUT`, as client-go does (its ReadIdleTimeout and
/// PingTimeout): a dead peer behind a quiet connection (every watch on it waiting) is found,
/// and a live idle one is kept (the answer is read before `REQUEST_TIMEOUT` would end it), so
/// a burst after a quiet spell finds its connection open rather than racing to open one per
/// request until the first has said it speaks HTTP/2.
const PING_AFTER: Duration = Duration::from_secs(20);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for `config`: kube's own (`Client::try_from`), with each connection's read buffer
/// bounded by `READ_BUFFER`, speaking HTTP/2 where the API server does.
pub fn client(config: Config) -> Result<Client, kube::Error> {
    client_on(config, hyper_util::rt::TokioExecutor::new())
}

/// `client`, its connections run by `executor` (hyper's background tasks for each).
///
/// kube builds its stack with no setting for hyper's connections, so this is its stack:
/// TLS over a plain connector, the timeouts, the base URI, retries of 429, 503 and 504 (its
/// `default_retry`), the credentials and extra headers. Left out: kube's debug span per
/// request, and proxies, which this build of kube refuses anyway (no `http-proxy` or `socks5`
/// feature): a proxy in the kubeconfig goes to kube's own builder, for its error.
///
/// Unlike kube's, it offers HTTP/2 (ALPN), as client-go does: every request of a client then
/// shares one connection. Over HTTP/1.1 each request in flight holds a TLS connection of its
/// own, and a burst of reconciles (32 at once, each with an apply and a status write in
/// flight) opened 60 and more, each holding its TLS and read buffers until it had been idle
/// for `REQUEST_TIMEOUT`: 2 to 3 MiB of the operator's heap for half a minute after every
/// burst (measured with `make bench` before the change). A plain-HTTP server is spoken to in
/// HTTP/1.1.
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
    // As Go (and so client-go) does for every TCP connection. Over HTTP/2 a request's headers
    // and its body leave as separate small writes, and with Nagle's algorithm on, the body
    // waited for the API server's delayed ACK of the headers: 40 ms more on every write with
    // a body (a status write took 49 ms in the API server where kube-controller-manager's took
    // 16; `make bench`, 2026-12-06).
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
        // The read timeout bounds a connection's silence; on a shared HTTP/2 connection that
        // others keep busy, a request of its own could wait longer for its answer to begin.
        .option_layer(config.read_timeout.map(tower::timeout::TimeoutLayer::new))
        .map_err(tower::BoxError::from)
        .service(connections);
    Ok(Client::new(service, config.default_namespace))
}

/// kube's TLS connector (`ConfigExt::rustls_https_connector_with_connector`: the kubeconfig's
/// CA, client certificate and `tls-server-name`), offering HTTP/2 and HTTP/1.1.
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

/// The client configuration `connect` uses, already checked for disabled TLS verification.
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

/// What every request says it comes from: `mw-operator/<version>`, so the API server's audit
/// log and API priority and fairness can tell the operator (and the bridge, which connects
/// through here too) from any other client.
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
