//! Feeds arbitrary bytes to the GGUF header reader.
//!
//! Properties: reading never panics, under the default limits or tight
//! ones; a header it takes has every sized tensor aligned, inside the
//! bytes and apart from the others, and its derived figures (parameters,
//! data bytes, KV shape) compute without panicking.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zinfer_probe::{KvShape, Limits, parse_header};

fuzz_target!(|bytes: &[u8]| {
    let tight = Limits {
        metadata_bytes: 2048,
        entries: 16,
        tensors: 8,
        array_len: 16,
        string_bytes: 64,
    };
    for limits in [Limits::default(), tight] {
        let Ok(header) = parse_header(bytes, limits) else {
            continue;
        };
        let mut extents = Vec::new();
        for t in &header.tensors {
            if let Some(size) = t.bytes() {
                let end = header.data_offset + t.offset + size;
                assert!(end <= bytes.len() as u64, "`{}` ends past the input", t.name);
                extents.push((t.offset, t.offset + size));
            }
        }
        extents.sort_unstable();
        for pair in extents.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "tensors overlap");
        }
        let _ = header.parameter_count();
        let _ = header.tensor_data_bytes();
        if let Ok(shape) = KvShape::from_header(&header) {
            let _ = shape.bytes_per_token(zinfer_probe::KvDtype::F32);
        }
    }
});
