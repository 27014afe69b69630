//! Incremental detokenization and stop strings.
