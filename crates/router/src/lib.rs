//! zinfer router crate.
