//! The engine thread: owns model, pool, cache and scheduler.
