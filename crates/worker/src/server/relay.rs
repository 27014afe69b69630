//! The relay thread: engine events become protocol frames for the I/O
//! thread, and latency metrics are observed on the way.

use std::collections::HashMap;
use std::time::Instant;

use crossbeam_channel::Receiver;
use zinfer_protocol::WorkerToRouter;

use crate::engine::EngineEvent;
use crate::metrics::WorkerMetrics;

/// Per-request timing the relay needs for inter-token latency.
struct Stream {
    last_chunk: Instant,
}

/// Turns engine events into frames for the I/O thread, observing latency
/// metrics on the way. Ends when the engine drops its event sender.
pub(super) fn relay_events(
    events: Receiver<EngineEvent>,
    out: zmq::Socket,
    metrics: WorkerMetrics,
) {
    let mut streams: HashMap<u64, Stream> = HashMap::new();
    for event in events {
        match &event {
            EngineEvent::Chunk { rid, .. } => {
                let now = Instant::now();
                if let Some(stream) = streams.get_mut(rid) {
                    metrics
                        .inter_token
                        .observe(now.duration_since(stream.last_chunk).as_secs_f64());
                    stream.last_chunk = now;
                } else {
                    streams.insert(*rid, Stream { last_chunk: now });
                }
            }
            EngineEvent::Done {
                rid,
                finish_reason,
                usage,
                timings,
                ..
            } => {
                streams.remove(rid);
                let outcome = finish_reason.as_str();
                metrics.requests.with_label_values(&[outcome]).inc();
                metrics.ttft.observe(timings.ttft_s);
                metrics.queue_time.observe(timings.queue_s);
                metrics.e2e.observe(timings.ttft_s + timings.decode_s);
                metrics.prompt_tokens.inc_by(u64::from(usage.prompt_tokens));
                metrics
                    .generation_tokens
                    .inc_by(u64::from(usage.completion_tokens));
                metrics.cached_tokens.inc_by(u64::from(usage.cached_tokens));
            }
            EngineEvent::Error { rid, code, .. } => {
                streams.remove(rid);
                metrics.requests.with_label_values(&[code.as_str()]).inc();
            }
        }
        let message = WorkerToRouter::from(event);
        match zinfer_protocol::encode(&message) {
            Ok(frame) => {
                if out.send(frame, 0).is_err() {
                    return;
                }
            }
            Err(error) => tracing::error!(%error, "cannot encode an engine event"),
        }
    }
}
