//! A frame that declares billions of entries must be refused before the
//! decoder allocates for them. Its own test binary, so no other test's
//! allocations are counted.

#![allow(clippy::unwrap_used)]

use std::alloc::System;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use zinfer_protocol::{ClientRequest, DecodeError, Limits, decode};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn huge_declared_lengths_allocate_almost_nothing() {
    let limits = Limits::default();
    let prefix = b"\x83\xa4type\xa8generate\xa2id\xa1r\xa6tokens".to_vec();
    let frames: Vec<Vec<u8>> = [
        &b"\xdd\xff\xff\xff\xff"[..],
        b"\xdf\xff\xff\xff\xff",
        b"\xdb\xff\xff\xff\xff",
    ]
    .iter()
    .map(|header| {
        let mut frame = prefix.clone();
        frame.extend_from_slice(header);
        frame.extend_from_slice(&[0; 16]);
        frame
    })
    .collect();
    for frame in &frames {
        let region = Region::new(GLOBAL);
        let result = decode::<ClientRequest>(frame, &limits);
        let stats = region.change();
        assert!(
            matches!(result, Err(DecodeError::NotAMessage(_))),
            "{result:?}"
        );
        // The error message and the scanner's stack of open containers;
        // nothing proportional to the declared length.
        assert!(
            stats.bytes_allocated < 4096,
            "allocated {} bytes in {} allocations",
            stats.bytes_allocated,
            stats.allocations
        );
    }
}
