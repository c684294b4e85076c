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

/// The longest any single request may wait for the API server: to connect, to send, or for
/// the next bytes of an answer. A request on a connection that stopped forwarding (a dead
/// load balancer, a half-open TCP connection) fails after this instead of hanging, and is
/// retried on a fresh connection.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A watch waits longer: the API server ends a watch after kube's `timeoutSeconds` (290 s) and
/// may be silent until then. kube's watcher restarts it on any error, so a hung watch costs
/// at most this long.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(295);

/// The parameters of `manager`'s server-side applies, asking for no field validation: every
/// body the operator and the bridge send is serialized from the types the CRD and the
/// built-in kinds are generated from, so it has no unknown or duplicate field to report, and
/// the API server's default (`Warn`) decodes each body a second time, strictly, only to look
/// for them (a second YAML decode of each apply: 3% of the API server's CPU in a first sync of
/// 10,000 rows, docs/performance.md). What `Warn` would find comes back as a warning header,
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
        requests: Client::try_from(requests.clone()).map_err(Error::Client)?,
        watches: Client::try_from(bounded(config, WATCH_TIMEOUT)).map_err(Error::Client)?,
        config: requests,
    })
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

    #[test]
    fn every_request_names_the_operator_and_its_version() {
        let config = identify(Config::new("https://127.0.0.1:6443".parse().unwrap()));
        let agents: Vec<_> = config.headers.iter().filter(|(n, _)| n == hyper::header::USER_AGENT).collect();
        assert_eq!(agents.len(), 1);
        assert_eq!(agents[0].1, format!("mw-operator/{}", env!("CARGO_PKG_VERSION")).as_str());
        assert_eq!(identify(config).headers.len(), 1, "applied twice, still one header");
    }
}
