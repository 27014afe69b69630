//! zinfer worker crate.
