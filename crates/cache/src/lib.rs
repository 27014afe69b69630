//! zinfer cache crate.
