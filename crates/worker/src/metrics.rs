//! The worker's Prometheus metrics.
