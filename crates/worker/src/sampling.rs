//! Token sampling.
