//! A Kubernetes operator that runs Manager (mieweb/opensource-server) containers as
//! `ManagedWorkload` resources, each reconciled into a single-replica Deployment.
//!
//! `resource` is the API. Two pipelines: `operator` (ManagedWorkload → the objects it owns,
//! and their state back into its status) and `bridge` (Manager's database → ManagedWorkloads,
//! and their address back). The other modules are shared; CONTRIBUTING.md lists them all.

pub mod allocator;
pub mod bridge;
mod cached;
pub mod check;
pub mod cli;
pub mod client;
pub mod crdgen;
pub mod election;
pub mod error;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod reflect;
pub mod resource;
pub mod retry;
pub mod shutdown;
pub mod telemetry;
pub mod write;
