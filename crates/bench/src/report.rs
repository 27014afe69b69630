//! The bench's result: a serde struct for `--json`, and a table for people.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    driver::{Outcome, RequestRecord},
    stats::Summary,
};

/// The settings that shaped the run, echoed so a report can be rerun.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct BenchConfig {
    /// `random`, `shared-prefix`, `multi-turn` or `file`.
    pub(crate) workload: String,
    /// Workload, arrival and sampling seed.
    pub(crate) seed: u64,
    /// Request budget, when the run stopped on a count.
    pub(crate) num_prompts: Option<usize>,
    /// Time budget in seconds, when the run stopped on time.
    pub(crate) duration_s: Option<f64>,
    /// Sessions in progress at once (closed loop), or the cap (open loop).
    pub(crate) concurrency: Option<usize>,
    /// Poisson arrival rate per second (open loop).
    pub(crate) request_rate: Option<f64>,
    /// Prompt lengths in words, when the workload generates them.
    pub(crate) input_len: Option<String>,
    /// `max_tokens` range.
    pub(crate) output_len: String,
    /// Shared-prefix shape `KxM@P` (groups x questions @ prefix words).
    pub(crate) shared_prefix: Option<String>,
    /// User turns per chat (multi-turn).
    pub(crate) turns: Option<u32>,
    /// Model asked for, if any.
    pub(crate) model: Option<String>,
    /// Sampling temperature.
    pub(crate) temperature: f32,
}

/// Totals and latency percentiles of one run against one server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct BenchReport {
    /// `zinfer` (the router protocol) or `openai` (`/v1/completions`).
    pub(crate) backend: String,
    /// Where the requests went.
    pub(crate) url: String,
    /// Requests sent.
    pub(crate) requests: u64,
    /// Requests that finished with `done`.
    pub(crate) completed: u64,
    /// Requests that ended in an error or a timeout.
    pub(crate) failed: u64,
    /// Failures per error code.
    pub(crate) errors_by_code: BTreeMap<String, u64>,
    /// First send to last terminal reply, in seconds.
    pub(crate) duration_s: f64,
    /// Completed requests per second.
    pub(crate) request_throughput: f64,
    /// Generated tokens per second.
    pub(crate) output_throughput: f64,
    /// One stream's decode speed: tokens after each request's first over
    /// the time after its first, pooled over requests (tokens per second).
    /// With one client, what decoding alone delivers, prefill left out.
    #[serde(default)]
    pub(crate) decode_rate: f64,
    /// Time to first token, seconds.
    pub(crate) ttft: Summary,
    /// Time between consecutive streamed chunks, seconds.
    pub(crate) itl: Summary,
    /// Send to `done`, seconds.
    pub(crate) e2e: Summary,
    /// Prompt tokens of completed requests, as the server counted them.
    pub(crate) prompt_tokens: u64,
    /// Generated tokens of completed requests.
    pub(crate) completion_tokens: u64,
    /// Prompt tokens served from the prefix cache; `None` when the server
    /// does not report it.
    pub(crate) cached_tokens: Option<u64>,
    /// `cached_tokens / prompt_tokens`.
    pub(crate) cached_ratio: Option<f64>,
    /// The settings of the run.
    pub(crate) config: BenchConfig,
    /// The same workload against `--compare-url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) compare: Option<Box<BenchReport>>,
}

impl BenchReport {
    /// Sums up `records` from a run of `duration_s` seconds.
    pub(crate) fn from_records(
        backend: &str,
        url: &str,
        config: BenchConfig,
        records: &[RequestRecord],
        duration_s: f64,
    ) -> BenchReport {
        let (mut ttft, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
        let mut errors_by_code = BTreeMap::new();
        let (mut prompt_tokens, mut completion_tokens) = (0, 0);
        let mut cached_tokens: Option<u64> = None;
        let mut completed = 0;
        let (mut decode_tokens, mut decode_s) = (0, 0.0);
        for record in records {
            match &record.outcome {
                Outcome::Done {
                    ttft: first,
                    itl: gaps,
                    e2e: total,
                    counts,
                } => {
                    completed += 1;
                    if let Some(first) = first {
                        decode_tokens += counts.completion.saturating_sub(1);
                        decode_s += (total - first).max(0.0);
                    }
                    ttft.extend(first);
                    itl.extend_from_slice(gaps);
                    e2e.push(*total);
                    prompt_tokens += counts.prompt.unwrap_or(0);
                    completion_tokens += counts.completion;
                    if let Some(cached) = counts.cached {
                        *cached_tokens.get_or_insert(0) += cached;
                    }
                }
                Outcome::Failed { code, .. } => {
                    *errors_by_code.entry(code.clone()).or_insert(0) += 1;
                }
            }
        }
        let per_second = |n: u64| {
            if duration_s > 0.0 {
                n as f64 / duration_s
            } else {
                0.0
            }
        };
        let cached_ratio = cached_tokens
            .filter(|_| prompt_tokens > 0)
            .map(|cached| cached as f64 / prompt_tokens as f64);
        BenchReport {
            backend: backend.into(),
            url: url.into(),
            requests: records.len() as u64,
            completed,
            failed: records.len() as u64 - completed,
            errors_by_code,
            duration_s,
            request_throughput: per_second(completed),
            output_throughput: per_second(completion_tokens),
            decode_rate: if decode_s > 0.0 {
                decode_tokens as f64 / decode_s
            } else {
                0.0
            },
            ttft: Summary::of(&ttft),
            itl: Summary::of(&itl),
            e2e: Summary::of(&e2e),
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            cached_ratio,
            config,
            compare: None,
        }
    }

    /// The report as a table, with the compare run in a second column.
    pub(crate) fn to_table(&self) -> String {
        let runs: Vec<&BenchReport> = std::iter::once(self)
            .chain(self.compare.as_deref())
            .collect();
        let c = &self.config;
        let mut out = format!("zinfer bench: workload {}, seed {}", c.workload, c.seed);
        match (c.concurrency, c.request_rate) {
            (conc, Some(rate)) => {
                out += &format!(", open loop at {rate} req/s");
                if let Some(cap) = conc {
                    out += &format!(" (at most {cap} at once)");
                }
            }
            (Some(conc), None) => out += &format!(", {conc} concurrent clients"),
            (None, None) => {}
        }
        out.push('\n');
        let rows: Vec<(&str, Cell)> = vec![
            ("backend", |r| r.backend.clone()),
            ("url", |r| r.url.clone()),
            ("requests ok / failed", |r| {
                format!("{} / {}", r.completed, r.failed)
            }),
            ("duration (s)", |r| format!("{:.2}", r.duration_s)),
            ("request throughput (req/s)", |r| {
                format!("{:.2}", r.request_throughput)
            }),
            ("output throughput (tok/s)", |r| {
                format!("{:.1}", r.output_throughput)
            }),
            ("decode per stream (tok/s)", |r| {
                format!("{:.1}", r.decode_rate)
            }),
            ("prompt / completion tokens", |r| {
                format!("{} / {}", r.prompt_tokens, r.completion_tokens)
            }),
            ("cached tokens (ratio)", |r| {
                match (r.cached_tokens, r.cached_ratio) {
                    (Some(n), Some(ratio)) => format!("{n} ({ratio:.3})"),
                    (Some(n), None) => n.to_string(),
                    _ => "n/a".into(),
                }
            }),
            ("TTFT mean/p50/p90/p99 (ms)", |r| millis(&r.ttft)),
            ("ITL mean/p50/p90/p99 (ms)", |r| millis(&r.itl)),
            ("E2E mean/p50/p90/p99 (ms)", |r| millis(&r.e2e)),
            ("errors", |r| errors(r)),
        ];
        let label_width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|(_, cell)| runs.iter().map(|r| cell(r)).collect())
            .collect();
        let column_width = cells.iter().flatten().map(String::len).max().unwrap_or(0);
        for ((label, _), row) in rows.iter().zip(&cells) {
            out += &format!("{label:<label_width$}");
            for cell in row {
                out += &format!("  {cell:<column_width$}");
            }
            out = out.trim_end().to_string();
            out.push('\n');
        }
        out
    }
}

/// Renders one run's value in a table row.
type Cell = fn(&BenchReport) -> String;

fn millis(summary: &Summary) -> String {
    if summary.count == 0 {
        return "-".into();
    }
    let ms = |s: f64| s * 1e3;
    format!(
        "{:.1} / {:.1} / {:.1} / {:.1}",
        ms(summary.mean),
        ms(summary.p50),
        ms(summary.p90),
        ms(summary.p99)
    )
}

fn errors(report: &BenchReport) -> String {
    if report.errors_by_code.is_empty() {
        return "none".into();
    }
    let parts: Vec<String> = report
        .errors_by_code
        .iter()
        .map(|(code, n)| format!("{code}={n}"))
        .collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::TokenCounts;

    fn config() -> BenchConfig {
        BenchConfig {
            workload: "random".into(),
            seed: 3,
            num_prompts: Some(4),
            duration_s: None,
            concurrency: Some(2),
            request_rate: None,
            input_len: Some("8-16".into()),
            output_len: "4".into(),
            shared_prefix: None,
            turns: None,
            model: None,
            temperature: 0.0,
        }
    }

    fn done(ttft: f64, itl: Vec<f64>, e2e: f64, prompt: u64, cached: Option<u64>) -> RequestRecord {
        let completion = itl.len() as u64 + 1;
        let counts = TokenCounts {
            prompt: Some(prompt),
            completion,
            cached,
        };
        RequestRecord {
            session: 0,
            turn: 0,
            outcome: Outcome::Done {
                ttft: Some(ttft),
                itl,
                e2e,
                counts,
            },
        }
    }

    fn failed(code: &str) -> RequestRecord {
        let outcome = Outcome::Failed {
            code: code.into(),
            message: "m".into(),
        };
        RequestRecord {
            session: 1,
            turn: 0,
            outcome,
        }
    }

    #[test]
    fn totals_rates_and_errors_are_summed_from_the_records() {
        let records = [
            done(0.1, vec![0.01, 0.03], 0.2, 100, Some(60)),
            done(0.3, vec![0.02], 0.4, 50, Some(0)),
            failed("overloaded"),
            failed("timeout"),
            failed("overloaded"),
        ];
        let report = BenchReport::from_records("zinfer", "tcp://x", config(), &records, 2.0);
        assert_eq!(
            (report.requests, report.completed, report.failed),
            (5, 2, 3)
        );
        assert_eq!(report.errors_by_code.get("overloaded"), Some(&2));
        assert_eq!(report.errors_by_code.get("timeout"), Some(&1));
        // 2 tokens in 0.1 s after the first, and 1 in 0.1 s.
        assert!(
            (report.decode_rate - 15.0).abs() < 1e-9,
            "{}",
            report.decode_rate
        );
        assert_eq!((report.prompt_tokens, report.completion_tokens), (150, 5));
        assert_eq!(report.cached_tokens, Some(60));
        assert!((report.cached_ratio.unwrap() - 0.4).abs() < 1e-12);
        assert!((report.request_throughput - 1.0).abs() < 1e-12);
        assert!((report.output_throughput - 2.5).abs() < 1e-12);
        assert_eq!(report.itl.count, 3);
        assert!((report.ttft.p50 - 0.2).abs() < 1e-12);
        assert!((report.e2e.mean - 0.3).abs() < 1e-12);
    }

    #[test]
    fn json_has_the_documented_fields_and_round_trips() {
        let mut report = BenchReport::from_records(
            "zinfer",
            "tcp://x",
            config(),
            &[done(0.1, vec![0.01], 0.2, 9, None)],
            1.0,
        );
        report.compare = Some(Box::new(report.clone()));
        let json = serde_json::to_value(&report).unwrap();
        for field in [
            "backend",
            "url",
            "requests",
            "completed",
            "failed",
            "errors_by_code",
            "duration_s",
            "request_throughput",
            "output_throughput",
            "decode_rate",
            "ttft",
            "itl",
            "e2e",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "cached_ratio",
            "config",
            "compare",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
        assert_eq!(json["ttft"]["p99"], 0.1);
        assert!(
            json["cached_tokens"].is_null(),
            "a server that reports no cache gives null"
        );
        let back: BenchReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn the_table_puts_the_compare_run_beside_the_first() {
        let mut report = BenchReport::from_records(
            "zinfer",
            "tcp://x",
            config(),
            &[done(0.1, vec![0.01], 0.2, 9, Some(3))],
            1.0,
        );
        assert!(!report.to_table().contains("openai"));
        let compare =
            BenchReport::from_records("openai", "http://y", config(), &[failed("http_503")], 1.0);
        report.compare = Some(Box::new(compare));
        let table = report.to_table();
        assert!(table.starts_with("zinfer bench: workload random, seed 3, 2 concurrent clients\n"));
        let row = |label: &str| {
            table
                .lines()
                .find(|l| l.starts_with(label))
                .unwrap()
                .to_string()
        };
        assert!(row("backend").contains("zinfer") && row("backend").contains("openai"));
        assert!(
            row("requests ok / failed").contains("1 / 0")
                && row("requests ok / failed").contains("0 / 1")
        );
        assert!(
            row("cached tokens").contains("3 (0.333)") && row("cached tokens").ends_with("n/a")
        );
        assert!(
            row("TTFT").contains("100.0 / 100.0 / 100.0 / 100.0") && row("TTFT").ends_with('-')
        );
        assert!(row("errors").contains("none") && row("errors").ends_with("http_503=1"));
    }
}
