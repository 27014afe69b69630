//! Noticing at once that a client's connection to its router dropped.
//!
//! A DEALER reconnects by itself and says nothing when its peer goes away,
//! so a client waiting for replies would wait out its whole timeout. The
//! socket's monitor reports the `disconnected` event as it happens.

use std::sync::atomic::{AtomicU64, Ordering};

/// Names each monitor's endpoint uniquely within the process.
static WATCHES: AtomicU64 = AtomicU64::new(0);

/// The `disconnected` events of one socket.
pub struct DropWatch {
    monitor: zmq::Socket,
}

impl DropWatch {
    /// Starts watching `socket`; call it before `connect`, so a drop of the
    /// first connection is seen too.
    pub fn new(context: &zmq::Context, socket: &zmq::Socket) -> Result<Self, zmq::Error> {
        let endpoint = format!(
            "inproc://zinfer-drop-watch-{}",
            WATCHES.fetch_add(1, Ordering::Relaxed)
        );
        socket.monitor(&endpoint, zmq::SocketEvent::DISCONNECTED as i32)?;
        let monitor = context.socket(zmq::PAIR)?;
        monitor.connect(&endpoint)?;
        Ok(Self { monitor })
    }

    /// For `zmq::poll` beside the watched socket: readable when an event
    /// is waiting.
    pub fn as_poll_item(&self) -> zmq::PollItem<'_> {
        self.monitor.as_poll_item(zmq::POLLIN)
    }

    /// Whether the connection dropped since the last call (reads every
    /// event queued).
    pub fn dropped(&self) -> bool {
        let mut dropped = false;
        while let Ok(frames) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            let event = frames
                .first()
                .and_then(|f| f.get(..2))
                .map(|b| u16::from_ne_bytes([b[0], b[1]]));
            dropped |= event == Some(zmq::SocketEvent::DISCONNECTED as u16);
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_peer_that_goes_away_is_reported_once() {
        let context = zmq::Context::new();
        let router = context.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = router.get_last_endpoint().unwrap().unwrap();
        let dealer = context.socket(zmq::DEALER).unwrap();
        dealer.set_linger(0).unwrap();
        let watch = DropWatch::new(&context, &dealer).unwrap();
        dealer.connect(&endpoint).unwrap();
        dealer.send("hello", 0).unwrap();
        assert_eq!(router.recv_multipart(0).unwrap()[1], b"hello");
        assert!(!watch.dropped(), "nothing dropped yet");

        drop(router);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = false;
        while !seen && Instant::now() < deadline {
            let mut items = [watch.as_poll_item()];
            zmq::poll(&mut items, 100).unwrap();
            seen = watch.dropped();
        }
        assert!(seen, "the drop was not reported within 10 s");
        assert!(!watch.dropped(), "a drop is reported once");
    }
}
