//! A Kubernetes operator that runs Manager (mieweb/opensource-server) containers as
//! `ManagedWorkload` resources, each reconciled into a single-replica Deployment.
//!
//! Pure parts: `resource` (the API), `desired` (CR → Deployment), `drift` (is the live
//! Deployment up to date?), `status` (observed objects → status). I/O: `controller`, `client`.

pub mod bridge;
pub mod check;
pub mod client;
pub mod controller;
pub mod crdgen;
pub mod desired;
pub mod drift;
pub mod election;
pub mod error;
pub mod events;
pub mod metrics;
pub mod resource;
pub mod slim;
pub mod status;
pub mod telemetry;

#[cfg(test)]
mod properties;
