//! Allocation bounds of `decode`, measured with a counting allocator. Its
//! own test binary, and its tests take `SERIAL` in turn, so no other test's
//! allocations are counted.

#![allow(clippy::unwrap_used)]

use std::{alloc::System, sync::Mutex};

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use zinfer_protocol::{ClientRequest, DecodeError, Limits, decode};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn huge_declared_lengths_allocate_almost_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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

/// The worst valid-looking frame: one array of a million one-byte entries.
/// serde buffers an internally tagged message before picking its variant,
/// so decoding costs a few dozen bytes per input byte, but no more.
#[test]
fn a_full_frame_costs_a_bounded_multiple_of_its_size() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limits = Limits::default();
    let mut frame = b"\x84\xa4type\xa8generate\xa2id\xa1r\xa6prompt\xa1p\xa1x\xdd".to_vec();
    let entries = limits.max_frame_bytes - frame.len() - 4;
    frame.extend_from_slice(&u32::try_from(entries).unwrap().to_be_bytes());
    frame.resize(limits.max_frame_bytes, 0);
    let region = Region::new(GLOBAL);
    let result = decode::<ClientRequest>(&frame, &limits);
    let stats = region.change();
    assert!(result.is_ok(), "{result:?}");
    eprintln!(
        "{} byte frame: {} bytes allocated in total",
        frame.len(),
        stats.bytes_allocated
    );
    assert!(
        stats.bytes_allocated < 64 * limits.max_frame_bytes,
        "allocated {} bytes",
        stats.bytes_allocated
    );
}
