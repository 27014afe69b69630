//! The relay thread: engine events become protocol frames for the I/O
//! thread, and request metrics are observed on the way (latencies from the
//! engine's own timings, so they are measured once).

use crossbeam_channel::Receiver;
use zinfer_protocol::{DoneBody, WorkerToRouter};

use crate::engine::EngineEvent;
use crate::metrics::WorkerMetrics;

/// Turns engine events into frames for the I/O thread, observing latency
/// metrics on the way. Ends when the engine drops its event sender.
pub(super) fn relay_events(
    events: Receiver<EngineEvent>,
    out: zmq::Socket,
    metrics: WorkerMetrics,
) {
    for event in events {
        match &event {
            EngineEvent::Chunk { .. } => {}
            EngineEvent::Done {
                body:
                    DoneBody {
                        finish_reason,
                        usage,
                        timings,
                        ..
                    },
                ..
            } => metrics.observe_done(finish_reason.as_str(), usage, timings),
            EngineEvent::Error { code, .. } => {
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
