//! Fetching the default model into `$ZINFER_HOME`.
