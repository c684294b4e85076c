//! `mw-operator`: the ManagedWorkload operator's single binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mw_operator::cli::{Cli, Command, LogFormat};
use mw_operator::{allocator, bridge, check, client, crdgen, election, metrics, operator, telemetry};
use tracing::error;

#[global_allocator]
static ALLOCATOR: allocator::MiMalloc = allocator::MiMalloc;

fn main() -> ExitCode {
    allocator::configure();
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let result = match cli.command {
        Command::Run {
            connection,
            namespaces,
            concurrency,
            metrics_address,
            gpu_resource_name,
            system_container_runtime_class,
            election,
        } => {
            let pod_settings = operator::deployment::PodSettings {
                gpu_resource: gpu_resource_name,
                system_container_runtime_class: Some(system_container_runtime_class).filter(|c| !c.is_empty()),
            };
            run(connection, namespaces, concurrency, metrics_address, pod_settings, election)
        }
        Command::Crd { out, check } => crd(out, check),
        Command::Bridge(args) => run_bridge(*args),
        Command::Check(args) => run_check(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            error!("{message}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    connection: client::ConnectionArgs,
    namespaces: Vec<String>,
    concurrency: u16,
    metrics_address: std::net::SocketAddr,
    pod_settings: operator::deployment::PodSettings,
    election: election::ElectionArgs,
) -> Result<(), String> {
    let election = election.election(metrics::DEFAULT_LEASE, election::default_identity)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    let result = runtime.block_on(async {
        let clients = client::connect_all(&connection).await.map_err(|e| e.to_string())?;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = metrics::Metrics::register(&mut registry);
        let health = std::sync::Arc::new(telemetry::Health::with_stall_limit(operator::liveness::BEAT_GRACE));
        telemetry::serve(metrics_address, std::sync::Arc::new(registry), health.clone())
            .await
            .map_err(|e| format!("serving probes and metrics on {metrics_address}: {e}"))?;
        let settings = operator::Settings { namespaces, concurrency, election, pod_settings };
        operator::run(clients, settings, metrics, health).await.map_err(|e| e.to_string())
    });
    // Watch and server tasks are still running; they hold nothing that needs a clean end.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

fn run_check(args: check::probe::CheckArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    let report = check::checklist(&runtime.block_on(check::probe::gather(&args)));
    match args.output {
        check::probe::Output::Text => print!("{}", report.to_text()),
        check::probe::Output::Json => {
            println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?)
        }
    }
    if report.ok { Ok(()) } else { Err("the install check failed; see the checklist above".into()) }
}

fn run_bridge(args: bridge::BridgeArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async { bridge::run(args).await }).map_err(|e| e.to_string())
}

fn crd(out: Option<PathBuf>, check: bool) -> Result<(), String> {
    let crds = crdgen::all();
    let Some(dir) = out else {
        for crd in &crds {
            print!("---\n{}", crdgen::to_yaml(crd).map_err(|e| e.to_string())?);
        }
        return Ok(());
    };
    let mut stale = Vec::new();
    for crd in &crds {
        let path = dir.join(crdgen::file_name(crd));
        let yaml = crdgen::to_yaml(crd).map_err(|e| e.to_string())?;
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(yaml.as_str()) {
                stale.push(path.display().to_string());
            }
        } else {
            std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            std::fs::write(&path, yaml).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(format!("generated CRDs differ from {}; run `make crds` and commit the result", stale.join(", ")))
    }
}

fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).init(),
    }
}
