//! Continuous batching scheduler (sans-IO).
