//! Running the server in production: what operators see and what the
//! server asks of the machine.
//!
//! - [`metrics`]: Prometheus metrics and the `/metrics`, `/healthz` and
//!   `/readyz` endpoint;
//! - [`thread_cpu`]: CPU time by thread role, as a metric;
//! - [`allocator`]: jemalloc's statistics, and moving leaves off sparse slabs;
//! - [`priority`]: background threads at a low CPU priority.

pub mod allocator;
pub mod metrics;
pub mod priority;
pub mod thread_cpu;
