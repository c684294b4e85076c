//! The command line of the `mw-operator` binary, in the library so that what the docs say
//! about flags, defaults and environment variables can be checked against it
//! (`Cli::command()` in tests/docs.rs).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::{bridge, check, client, election, operator};

#[derive(Parser)]
#[command(name = "mw-operator", version, about = "Runs Manager containers on Kubernetes as ManagedWorkload resources")]
pub struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "MW_LOG_FORMAT", global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the controller.
    Run {
        #[command(flatten)]
        connection: client::ConnectionArgs,
        /// Namespaces to watch (repeat or comma-separate). All namespaces when omitted.
        #[arg(long = "namespace", short = 'n', env = "MW_NAMESPACES", value_delimiter = ',')]
        namespaces: Vec<String>,
        /// Reconciles running at once (per watched namespace). Reconciles mostly wait on the
        /// API server, so this is about requests in flight, not cores.
        #[arg(long, default_value_t = 32, env = "MW_CONCURRENCY", value_parser = clap::value_parser!(u16).range(1..))]
        concurrency: u16,
        /// Where to serve /healthz, /readyz (ready once every watch has synced) and /metrics.
        #[arg(long, default_value = "0.0.0.0:8080", env = "MW_METRICS_ADDRESS")]
        metrics_address: std::net::SocketAddr,
        /// Extended resource `spec.resources.gpus` is requested as: the name the cluster's device
        /// plugin advertises (`nvidia.com/gpu`, `amd.com/gpu`, `gpu.intel.com/i915`, ...).
        #[arg(long, default_value = operator::deployment::DEFAULT_GPU_RESOURCE, env = "MW_GPU_RESOURCE_NAME",
              value_parser = operator::deployment::check_gpu_resource)]
        gpu_resource_name: String,
        /// RuntimeClass of system containers (`spec.systemContainer`) that name none: one
        /// whose runtime handler gives a container a writable cgroup (docs/install.md, "System
        /// containers"). None when empty: the node's default runtime.
        #[arg(long, default_value = "", env = "MW_SYSTEM_CONTAINER_RUNTIME_CLASS")]
        system_container_runtime_class: String,
        #[command(flatten)]
        election: election::ElectionArgs,
    },
    /// Check an install before the first workload: connection, TLS, identity, the CRD and
    /// every permission the operator (or, with --bridge, the bridge) needs in each namespace.
    /// Prints a checklist; exits non-zero when any check fails.
    Check(check::probe::CheckArgs),
    /// Sync Manager's database (PostgreSQL or SQLite) into ManagedWorkloads and write their
    /// provider id and address back (the workload's stable address: its Service's, or the
    /// serving Pod's IP; see --ipv4-address).
    Bridge(Box<bridge::BridgeArgs>),
    /// Print the CustomResourceDefinitions, write them to a directory, or check that a
    /// directory holds exactly what would be written.
    Crd {
        /// Write one file per CRD into this directory instead of printing.
        #[arg(long)]
        out: Option<PathBuf>,
        /// With --out: fail if the files there differ from the generated ones.
        #[arg(long, requires = "out")]
        check: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        // clap's own checks (duplicate flags, conflicting env vars, bad defaults), which
        // otherwise only run when the binary parses its arguments.
        Cli::command().debug_assert();
    }
}
