//! A Kubernetes operator that runs Manager (mieweb/opensource-server) containers as
//! `ManagedWorkload` resources, each reconciled into a single-replica Deployment.
//!
//! `resource` is the API. Two pipelines of the same shape, each its own module tree:
//! `operator` (ManagedWorkload → the objects it owns, and their state back into its status) and
//! `bridge` (Manager's database → ManagedWorkloads, and their address back). Shared: `client`
//! (connecting), `election` (leader election), `error`, `metrics`, `telemetry` (probes and
//! metrics server), `retry` (backoff), `cached` (how a cache's trimmed type stands for its
//! kind), `reflect` (a cache kept in step with its watch, re-lists taken in place, lists
//! streamed where the API server can), `allocator` (mimalloc, built for resident memory), `write` (every apply changes the object
//! it was decided on, or nothing);
//! `check` verifies an install; `crdgen` prints the CRDs; `cli` is the binary's command line.

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
