//! The deploy kit under `deploy/`: Prometheus config and alert rules pass
//! promtool (and the rules' unit tests), every metric the dashboard, the
//! alerts and the autoscaler use is one a real router or worker exports,
//! and the Kubernetes manifests pass schema validation and use only flags
//! and `ZINFER_*` variables the binary accepts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use zinfer_protocol::ClientReply;

use crate::harness::{Cluster, greedy, scrape, venv_python, zinfer};
use crate::promtool;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The Kubernetes manifests: every YAML file in deploy/k8s but the
/// kustomization, which is not a cluster resource.
fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir().join("k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "manifests missing: {files:?}");
    files
}

/// Every YAML document of `files`, as JSON, parsed by PyYAML.
fn yaml_documents(python: &str, files: &[PathBuf]) -> Vec<(PathBuf, Value)> {
    let script = "import json, sys, yaml\n\
                  print(json.dumps([[d for d in yaml.safe_load_all(open(f)) if d is not None] for f in sys.argv[1:]]))";
    let output = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(files)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "YAML does not parse:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let per_file: Vec<Vec<Value>> = serde_json::from_slice(&output.stdout).unwrap();
    files
        .iter()
        .zip(per_file)
        .flat_map(|(f, docs)| docs.into_iter().map(move |d| (f.clone(), d)))
        .collect()
}

/// The `zinfer_*` names in `text`: maximal runs of `[a-z0-9_]` that start
/// with `zinfer_` at a word boundary.
fn zinfer_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let is_name = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
    let mut names = BTreeSet::new();
    for (start, _) in text.match_indices("zinfer_") {
        if start > 0 && (is_name(bytes[start - 1]) || bytes[start - 1].is_ascii_uppercase()) {
            continue;
        }
        let end = bytes[start..]
            .iter()
            .position(|&b| !is_name(b))
            .map_or(bytes.len(), |n| start + n);
        names.insert(text[start..end].to_string());
    }
    names
}

/// Series names a scrape can hold: each family's name, and for histograms
/// its `_bucket`, `_sum` and `_count` series.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        } else {
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn deploy_prometheus_config_and_alert_rules_pass_promtool() {
    let dir = deploy_dir();
    let config = dir.join("prometheus.yml");
    assert!(
        read(&config).contains("prometheus/alerts.yml"),
        "deploy/prometheus.yml does not load the alert rules"
    );
    promtool(&["check", "config", config.to_str().unwrap()], "");
    promtool(
        &[
            "check",
            "rules",
            dir.join("prometheus/alerts.yml").to_str().unwrap(),
        ],
        "",
    );
    // The alerts fire on the series they are meant for (and their
    // annotations render).
    promtool(
        &[
            "test",
            "rules",
            dir.join("prometheus/alerts_test.yml").to_str().unwrap(),
        ],
        "",
    );
}

#[test]
fn deploy_metric_names_are_exported_by_router_and_worker() {
    let dir = deploy_dir();

    // What the dashboard, the alerts and the autoscaler ask for.
    let dashboard: Value = serde_json::from_str(&read(&dir.join("grafana/zinfer.json")))
        .expect("deploy/grafana/zinfer.json is not JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("dashboard panels") {
        for target in panel["targets"].as_array().expect("panel targets") {
            exprs.push(target["expr"].as_str().expect("target expr").to_string());
        }
    }
    let mut used = vec![
        ("grafana/zinfer.json", zinfer_names(&exprs.join("\n"))),
        (
            "prometheus/alerts.yml",
            zinfer_names(&read(&dir.join("prometheus/alerts.yml"))),
        ),
        (
            "k8s/hpa.yaml",
            zinfer_names(&read(&dir.join("k8s/hpa.yaml"))),
        ),
        (
            "k8s/prometheus-adapter.yaml",
            zinfer_names(&read(&dir.join("k8s/prometheus-adapter.yaml"))),
        ),
    ];
    for (file, names) in &used {
        assert!(!names.is_empty(), "{file}: no zinfer metric found");
    }
    // The adapter serves every metric the autoscaler scales on.
    let hpa_names = used[2].1.clone();
    let adapter = read(&dir.join("k8s/prometheus-adapter.yaml"));
    for name in &hpa_names {
        assert!(
            adapter.contains(&format!("as: \"{name}\"")),
            "the Prometheus adapter rules do not serve {name}, which hpa.yaml scales on"
        );
    }

    // What a real router and worker export once a request went through.
    let cluster = Cluster::start("cache_aware", 1);
    let outcome = cluster.client().generate(greedy("d1", "Name a color:", 4));
    assert!(matches!(outcome.terminal, Some(ClientReply::Done { .. })));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut exported = exported_names(&scrape(&cluster.router_metrics));
    exported.extend(exported_names(&scrape(&cluster.workers[0].2)));
    assert!(
        exported.contains("zinfer_router_queue_depth"),
        "{exported:?}"
    );
    assert!(
        exported.contains("zinfer_worker_waiting_requests"),
        "{exported:?}"
    );

    let mut missing = Vec::new();
    for (file, names) in used.drain(..) {
        for name in names.difference(&exported) {
            missing.push(format!("{file}: {name}"));
        }
    }
    assert!(
        missing.is_empty(),
        "metrics used under deploy/ that zinfer does not export:\n{}\nexported: {exported:?}",
        missing.join("\n")
    );
}

#[test]
fn deploy_k8s_manifests_pass_schema_and_flag_checks() {
    let python = venv_python("k8s");
    let files = manifests();

    // Schema validation, strict: unknown fields are errors.
    let output = Command::new(&python)
        .args(["-m", "kubernetes_validate", "--strict", "--no-warn"])
        .args(&files)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kubernetes-validate failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // Every zinfer container uses only flags and environment variables its
    // subcommand's --help lists.
    let mut containers = 0;
    for (file, doc) in yaml_documents(&python, &files) {
        let file = file.display();
        for key in ["apiVersion", "kind"] {
            assert!(doc[key].is_string(), "{file}: a document lacks {key}");
        }
        assert!(
            doc["metadata"]["name"].is_string(),
            "{file}: a {} lacks metadata.name",
            doc["kind"]
        );
        let Some(list) = doc["spec"]["template"]["spec"]["containers"].as_array() else {
            continue;
        };
        for container in list {
            assert_eq!(container["image"], "zinfer", "{file}: {container}");
            let args: Vec<&str> = container["args"]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_str().expect("string arg")).collect())
                .unwrap_or_default();
            let command = *args
                .first()
                .expect("container args start with a subcommand");
            let help = Command::new(zinfer())
                .args([command, "--help"])
                .output()
                .unwrap();
            assert!(
                help.status.success(),
                "{file}: `zinfer {command}` is no command"
            );
            let help = String::from_utf8_lossy(&help.stdout).to_string();
            for flag in args.iter().filter(|a| a.starts_with("--")) {
                assert!(
                    help.lines()
                        .any(|l| l.trim_start().starts_with(&format!("{flag} "))),
                    "{file}: `zinfer {command}` has no flag {flag}"
                );
            }
            for env in container["env"].as_array().into_iter().flatten() {
                let name = env["name"].as_str().unwrap();
                assert!(
                    // `[env: NAME=value]`, or `[env: NAME]` for hidden values.
                    ["=", "]"]
                        .iter()
                        .any(|end| help.contains(&format!("[env: {name}{end}"))),
                    "{file}: `zinfer {command}` reads no {name}"
                );
            }
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                if let Some(path) = container[probe]["httpGet"]["path"].as_str() {
                    assert!(
                        ["/health", "/ready"].contains(&path),
                        "{file}: {probe} on {path}"
                    );
                }
            }
            containers += 1;
        }
    }
    assert_eq!(containers, 3, "router, worker and http containers");
}
