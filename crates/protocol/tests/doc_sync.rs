//! `docs/protocol.md` must mention every message type, every field name and
//! every error code, so a message added to the code without documentation
//! fails here.

#![allow(clippy::unwrap_used)]

mod common;

use std::{collections::BTreeSet, path::PathBuf};

use zinfer_protocol::ErrorCode;

fn spec() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn keys(value: &rmpv::Value, out: &mut BTreeSet<String>) {
    match value {
        rmpv::Value::Map(entries) => {
            for (key, value) in entries {
                let key = key.as_str().unwrap().to_string();
                if key == "type" {
                    out.insert(value.as_str().unwrap().to_string());
                }
                out.insert(key);
                keys(value, out);
            }
        }
        rmpv::Value::Array(items) => items.iter().for_each(|item| keys(item, out)),
        _ => {}
    }
}

#[test]
fn spec_names_every_type_and_field() {
    let spec = spec();
    let mut names = BTreeSet::new();
    for (_, frame) in common::all_frames() {
        keys(
            &rmpv::decode::read_value(&mut &frame[..]).unwrap(),
            &mut names,
        );
    }
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !spec.contains(&format!("`{name}`")))
        .collect();
    assert!(missing.is_empty(), "docs/protocol.md lacks {missing:?}");
}

#[test]
fn spec_lists_every_error_code_with_its_retry_rule() {
    let spec = spec();
    for code in ErrorCode::ALL {
        let row = spec
            .lines()
            .find(|line| line.starts_with(&format!("| `{code}` |")))
            .unwrap_or_else(|| panic!("no error table row for {code}"));
        let retryable = row.split('|').nth(3).unwrap().trim();
        assert_eq!(
            retryable.starts_with("yes"),
            code.retryable(),
            "row for {code}: {row}"
        );
    }
}
