//! The bench's scheduler, free of I/O: it decides when each request starts,
//! takes the replies as timestamped events and keeps one record per request.
//!
//! The I/O loop ([`super::run_loop`]) asks [`Driver::poll_send`] for requests
//! that are due, hands them to a transport, feeds the transport's events to
//! [`Driver::handle`], and stops when [`Driver::is_done`]. Time is always
//! passed in, so tests drive it with a made-up clock.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::workload::{Session, Workload, chat_history, chat_prompt};

/// How requests are offered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Load {
    /// `concurrency` clients, each starting its next session as soon as its
    /// last one finished.
    Closed {
        /// Sessions in progress at once.
        concurrency: usize,
    },
    /// New sessions arrive as a Poisson process of `rate` per second, whether
    /// or not earlier ones finished; at most `max_concurrency` run at once
    /// (later arrivals wait their turn).
    Open {
        /// Mean arrivals per second.
        rate: f64,
        /// Cap on sessions in progress, if any.
        max_concurrency: Option<usize>,
    },
}

/// When to stop starting requests; requests already sent are awaited.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Stop {
    /// Most requests to send.
    pub(crate) max_requests: Option<usize>,
    /// Send nothing new after this long.
    pub(crate) duration: Option<Duration>,
}

/// A request for a transport to send.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outgoing {
    /// The full prompt text.
    pub(crate) prompt: String,
    /// Most tokens to generate.
    pub(crate) max_tokens: u32,
    /// Sampling seed, derived from the bench seed, session and turn.
    pub(crate) seed: u64,
}

/// Token counts a server reported for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TokenCounts {
    /// Prompt tokens, when reported.
    pub(crate) prompt: Option<u64>,
    /// Generated tokens.
    pub(crate) completion: u64,
    /// Prompt tokens served from a prefix cache, when reported.
    pub(crate) cached: Option<u64>,
}

/// What a transport saw for one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum EventKind {
    /// Streamed output.
    Chunk {
        /// Text delta.
        text: String,
    },
    /// The request finished.
    Done {
        /// Token counts.
        counts: TokenCounts,
    },
    /// The request failed.
    Error {
        /// A protocol error code, or a client-side one (`timeout`,
        /// `transport`, `http_503`, ...).
        code: String,
        /// For a person.
        message: String,
    },
}

/// One reply, stamped when it was received.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    /// The key [`Driver::poll_send`] gave the request.
    pub(crate) key: u64,
    /// When it arrived.
    pub(crate) at: Instant,
    /// What it said.
    pub(crate) kind: EventKind,
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// It finished.
    Done {
        /// Time to the first chunk, in seconds (`None` if nothing streamed).
        ttft: Option<f64>,
        /// Gaps between consecutive chunks, in seconds.
        itl: Vec<f64>,
        /// Send to `done`, in seconds.
        e2e: f64,
        /// Token counts.
        counts: TokenCounts,
    },
    /// It failed.
    Failed {
        /// Error code.
        code: String,
        /// For a person.
        message: String,
    },
}

/// The measurements of one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RequestRecord {
    /// Session it belonged to.
    pub(crate) session: u64,
    /// Its turn within the session.
    pub(crate) turn: u32,
    /// How it ended.
    pub(crate) outcome: Outcome,
}

/// Counts for the progress display.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Requests sent.
    pub(crate) sent: usize,
    /// Requests finished.
    pub(crate) completed: usize,
    /// Requests failed.
    pub(crate) failed: usize,
    /// Requests awaiting their terminal reply.
    pub(crate) in_flight: usize,
}

#[derive(Debug)]
struct Chat {
    session: Session,
    next_turn: usize,
    history: String,
}

#[derive(Debug)]
struct InFlight {
    chat: Chat,
    sent_at: Instant,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    itl: Vec<f64>,
    reply: String,
}

/// The scheduler; see the module docs.
#[derive(Debug)]
pub(crate) struct Driver {
    workload: Workload,
    exhausted: bool,
    load: Load,
    stop: Stop,
    timeout: Duration,
    seed: u64,
    start: Instant,
    arrivals: StdRng,
    next_arrival: Instant,
    arrived: VecDeque<Session>,
    ready: VecDeque<Chat>,
    in_flight: HashMap<u64, InFlight>,
    next_key: u64,
    sent: usize,
    records: Vec<RequestRecord>,
}

impl Driver {
    /// A driver starting at `start`; each request fails as `timeout` when no
    /// terminal reply came within `timeout` of its send.
    pub(crate) fn new(
        workload: Workload,
        load: Load,
        stop: Stop,
        timeout: Duration,
        seed: u64,
        start: Instant,
    ) -> Driver {
        Driver {
            workload,
            exhausted: false,
            load,
            stop,
            timeout,
            seed,
            start,
            arrivals: StdRng::seed_from_u64(seed ^ 0xa5a5_5a5a_0f0f_f0f0),
            next_arrival: start,
            arrived: VecDeque::new(),
            ready: VecDeque::new(),
            in_flight: HashMap::new(),
            next_key: 0,
            sent: 0,
            records: Vec::new(),
        }
    }

    /// The next request to send now, if any; call until `None`.
    pub(crate) fn poll_send(&mut self, now: Instant) -> Option<(u64, Outgoing)> {
        if !self.accepting(now) {
            self.ready.clear();
            self.arrived.clear();
            return None;
        }
        if let Some(chat) = self.ready.pop_front() {
            return Some(self.launch(chat, now));
        }
        let active = self.in_flight.len();
        let session = match self.load {
            Load::Closed { concurrency } => {
                if active >= concurrency {
                    return None;
                }
                self.next_session()?
            }
            Load::Open {
                rate,
                max_concurrency,
            } => {
                while self.next_arrival <= now && !self.exhausted {
                    if let Some(session) = self.next_session() {
                        self.arrived.push_back(session);
                    }
                    let uniform: f64 = self.arrivals.random();
                    let gap = -(1.0 - uniform).ln() / rate;
                    self.next_arrival += Duration::from_secs_f64(gap);
                }
                if max_concurrency.is_some_and(|cap| active >= cap) {
                    return None;
                }
                self.arrived.pop_front()?
            }
        };
        let chat = Chat {
            session,
            next_turn: 0,
            history: String::new(),
        };
        Some(self.launch(chat, now))
    }

    /// Takes one event; events for unknown keys (already timed out) are
    /// ignored.
    pub(crate) fn handle(&mut self, event: Event) {
        let Some(request) = self.in_flight.get_mut(&event.key) else {
            return;
        };
        match event.kind {
            EventKind::Chunk { text } => {
                if let Some(last) = request.last_at {
                    request.itl.push(secs(event.at, last));
                }
                request.first_at.get_or_insert(event.at);
                request.last_at = Some(event.at);
                if request.chat.session.chat {
                    request.reply.push_str(&text);
                }
            }
            EventKind::Done { counts } => {
                let Some(request) = self.in_flight.remove(&event.key) else {
                    return;
                };
                let outcome = Outcome::Done {
                    ttft: request.first_at.map(|first| secs(first, request.sent_at)),
                    itl: request.itl,
                    e2e: secs(event.at, request.sent_at),
                    counts,
                };
                let mut chat = request.chat;
                self.record(&chat, outcome);
                if let Some(turn) = chat.session.turns.get(chat.next_turn) {
                    chat.history = chat_history(&chat.history, &turn.text, &request.reply);
                }
                chat.next_turn += 1;
                if chat.next_turn < chat.session.turns.len() {
                    self.ready.push_back(chat);
                }
            }
            EventKind::Error { code, message } => {
                if let Some(request) = self.in_flight.remove(&event.key) {
                    self.record(&request.chat, Outcome::Failed { code, message });
                }
            }
        }
    }

    /// Fails every request past its timeout; returns their keys so the
    /// caller can cancel them on the server.
    pub(crate) fn poll_timeouts(&mut self, now: Instant) -> Vec<u64> {
        let expired: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, request)| now >= request.sent_at + self.timeout)
            .map(|(key, _)| *key)
            .collect();
        for key in &expired {
            if let Some(request) = self.in_flight.remove(key) {
                let message = format!("no terminal reply within {:?}", self.timeout);
                let outcome = Outcome::Failed {
                    code: "timeout".into(),
                    message,
                };
                self.record(&request.chat, outcome);
            }
        }
        expired
    }

    /// When the driver next has something to do without an event: the
    /// next arrival, the end of `--duration`, or the earliest timeout.
    pub(crate) fn next_wakeup(&self, now: Instant) -> Option<Instant> {
        let arrival = match self.load {
            Load::Open { .. } if self.accepting(now) => Some(self.next_arrival),
            _ => None,
        };
        let end = self.stop.duration.map(|d| self.start + d);
        let timeout = self
            .in_flight
            .values()
            .map(|request| request.sent_at + self.timeout)
            .min();
        [arrival, end, timeout].into_iter().flatten().min()
    }

    /// Whether nothing more will be sent and nothing is awaited.
    pub(crate) fn is_done(&self, now: Instant) -> bool {
        self.in_flight.is_empty() && (!self.accepting(now) || self.idle_for_good())
    }

    /// Counts for the progress display.
    pub(crate) fn progress(&self) -> Progress {
        let failed = self
            .records
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed { .. }))
            .count();
        Progress {
            sent: self.sent,
            completed: self.records.len() - failed,
            failed,
            in_flight: self.in_flight.len(),
        }
    }

    /// The records, in completion order.
    pub(crate) fn into_records(self) -> Vec<RequestRecord> {
        self.records
    }

    fn accepting(&self, now: Instant) -> bool {
        let under_count = self.stop.max_requests.is_none_or(|max| self.sent < max);
        let in_time = self.stop.duration.is_none_or(|d| now < self.start + d);
        under_count && in_time
    }

    /// The workload ran dry and every started session finished.
    fn idle_for_good(&self) -> bool {
        self.exhausted && self.ready.is_empty() && self.arrived.is_empty()
    }

    fn next_session(&mut self) -> Option<Session> {
        let session = self.workload.next_session();
        self.exhausted |= session.is_none();
        session
    }

    fn launch(&mut self, chat: Chat, now: Instant) -> (u64, Outgoing) {
        let key = self.next_key;
        self.next_key += 1;
        self.sent += 1;
        let turn_index = chat.next_turn;
        let (text, max_tokens) = chat
            .session
            .turns
            .get(turn_index)
            .map_or((String::new(), 1), |t| (t.text.clone(), t.max_tokens));
        let prompt = if chat.session.chat {
            chat_prompt(&chat.history, &text)
        } else {
            text
        };
        let seed = mix(self.seed ^ mix(chat.session.id ^ mix(turn_index as u64)));
        self.in_flight.insert(
            key,
            InFlight {
                chat,
                sent_at: now,
                first_at: None,
                last_at: None,
                itl: Vec::new(),
                reply: String::new(),
            },
        );
        let outgoing = Outgoing {
            prompt,
            max_tokens,
            seed,
        };
        (key, outgoing)
    }

    fn record(&mut self, chat: &Chat, outcome: Outcome) {
        self.records.push(RequestRecord {
            session: chat.session.id,
            turn: chat.next_turn as u32,
            outcome,
        });
    }
}

fn secs(later: Instant, earlier: Instant) -> f64 {
    later.saturating_duration_since(earlier).as_secs_f64()
}

/// SplitMix64's finaliser: spreads nearby inputs over all 64 bits.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{LenRange, WorkloadSpec};

    fn random(seed: u64) -> Workload {
        let spec = WorkloadSpec::Random {
            input: LenRange { min: 3, max: 6 },
            output: LenRange { min: 4, max: 4 },
        };
        Workload::new(spec, seed)
    }

    fn driver(workload: Workload, load: Load, stop: Stop, t0: Instant) -> Driver {
        Driver::new(workload, load, stop, Duration::from_secs(10), 9, t0)
    }

    fn drain(driver: &mut Driver, now: Instant) -> Vec<(u64, Outgoing)> {
        std::iter::from_fn(|| driver.poll_send(now)).collect()
    }

    fn event(key: u64, at: Instant, kind: EventKind) -> Event {
        Event { key, at, kind }
    }

    fn done(completion: u64) -> EventKind {
        EventKind::Done {
            counts: TokenCounts {
                prompt: Some(5),
                completion,
                cached: Some(0),
            },
        }
    }

    fn chunk(text: &str) -> EventKind {
        EventKind::Chunk { text: text.into() }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn closed_loop_keeps_n_in_flight_and_stops_at_the_count() {
        let t0 = Instant::now();
        let stop = Stop {
            max_requests: Some(5),
            duration: None,
        };
        let mut d = driver(random(1), Load::Closed { concurrency: 2 }, stop, t0);
        let first = drain(&mut d, t0);
        assert_eq!(first.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [0, 1]);
        let mut now = t0;
        let mut finished = 0;
        while !d.is_done(now) {
            now += ms(10);
            let key = finished;
            d.handle(event(key, now, done(4)));
            finished += 1;
            let sent = drain(&mut d, now);
            assert!(d.progress().in_flight <= 2);
            assert!(sent.len() <= 1);
        }
        assert_eq!(finished, 5);
        assert_eq!(
            d.progress(),
            Progress {
                sent: 5,
                completed: 5,
                failed: 0,
                in_flight: 0
            }
        );
    }

    #[test]
    fn latencies_are_measured_at_the_first_chunk_between_chunks_and_at_done() {
        let t0 = Instant::now();
        let stop = Stop {
            max_requests: Some(1),
            duration: None,
        };
        let mut d = driver(random(1), Load::Closed { concurrency: 1 }, stop, t0);
        let (key, _) = drain(&mut d, t0).remove(0);
        d.handle(event(key, t0 + ms(100), chunk("a")));
        d.handle(event(key, t0 + ms(130), chunk("b")));
        d.handle(event(key, t0 + ms(190), chunk("c")));
        d.handle(event(key, t0 + ms(200), done(3)));
        d.handle(event(key, t0 + ms(300), chunk("late, ignored")));
        assert!(d.is_done(t0 + ms(200)));
        let records = d.into_records();
        assert_eq!(records.len(), 1);
        let Outcome::Done {
            ttft,
            itl,
            e2e,
            counts,
        } = &records[0].outcome
        else {
            panic!("not done: {records:?}");
        };
        assert!((ttft.unwrap() - 0.1).abs() < 1e-9);
        assert_eq!(itl.len(), 2);
        assert!((itl[0] - 0.03).abs() < 1e-9 && (itl[1] - 0.06).abs() < 1e-9);
        assert!((e2e - 0.2).abs() < 1e-9);
        assert_eq!(counts.completion, 3);
    }

    #[test]
    fn open_loop_arrivals_are_poisson_at_the_rate_and_fixed_by_the_seed() {
        let t0 = Instant::now();
        let arrivals = |seed: u64| {
            let stop = Stop {
                max_requests: Some(2000),
                duration: None,
            };
            let load = Load::Open {
                rate: 50.0,
                max_concurrency: None,
            };
            let mut d = Driver::new(random(1), load, stop, Duration::from_secs(1000), seed, t0);
            let mut times = Vec::new();
            while times.len() < 2000 {
                let at = d.next_wakeup(t0).unwrap();
                let sent = drain(&mut d, at);
                times.extend(sent.iter().map(|_| at.duration_since(t0).as_secs_f64()));
            }
            times
        };
        let times = arrivals(5);
        assert_eq!(times[0], 0.0, "the first request goes out at once");
        let mean_gap = times.last().unwrap() / (times.len() - 1) as f64;
        assert!((mean_gap - 0.02).abs() < 0.002, "mean gap {mean_gap}");
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let short = gaps.iter().filter(|g| **g < 0.02).count() as f64 / gaps.len() as f64;
        // Exponential gaps: P(gap < mean) = 1 - 1/e = 0.632.
        assert!((short - 0.632).abs() < 0.04, "share of short gaps {short}");
        assert_eq!(times, arrivals(5));
        assert_ne!(times, arrivals(6));
    }

    #[test]
    fn open_loop_sends_regardless_of_replies_up_to_its_cap() {
        let t0 = Instant::now();
        let stop = Stop {
            max_requests: None,
            duration: Some(Duration::from_secs(1)),
        };
        let load = Load::Open {
            rate: 100.0,
            max_concurrency: Some(3),
        };
        let mut d = driver(random(1), load, stop, t0);
        let sent = drain(&mut d, t0 + ms(500));
        assert_eq!(sent.len(), 3, "about 50 arrived but only 3 may run");
        d.handle(event(sent[0].0, t0 + ms(500), done(1)));
        assert_eq!(
            drain(&mut d, t0 + ms(500)).len(),
            1,
            "a waiting arrival takes the free place"
        );
        assert!(
            drain(&mut d, t0 + ms(1000)).is_empty(),
            "nothing starts after --duration"
        );
        assert!(!d.is_done(t0 + ms(1000)), "requests in flight are awaited");
    }

    #[test]
    fn duration_stops_new_requests_and_waits_for_those_in_flight() {
        let t0 = Instant::now();
        let stop = Stop {
            max_requests: None,
            duration: Some(ms(100)),
        };
        let mut d = driver(random(1), Load::Closed { concurrency: 1 }, stop, t0);
        let (key, _) = drain(&mut d, t0).remove(0);
        assert_eq!(d.next_wakeup(t0), Some(t0 + ms(100)));
        assert!(!d.is_done(t0 + ms(150)));
        d.handle(event(key, t0 + ms(150), done(2)));
        assert!(drain(&mut d, t0 + ms(150)).is_empty());
        assert!(d.is_done(t0 + ms(150)));
    }

    #[test]
    fn multi_turn_sends_the_next_turn_with_the_reply_in_its_history() {
        let t0 = Instant::now();
        let spec = WorkloadSpec::MultiTurn {
            turns: 3,
            turn: LenRange { min: 2, max: 2 },
            output: LenRange { min: 8, max: 8 },
        };
        let stop = Stop {
            max_requests: Some(3),
            duration: None,
        };
        let mut d = driver(
            Workload::new(spec, 4),
            Load::Closed { concurrency: 1 },
            stop,
            t0,
        );
        let (k0, first) = drain(&mut d, t0).remove(0);
        assert!(first.prompt.starts_with("User: ") && first.prompt.ends_with("\nAssistant:"));
        d.handle(event(k0, t0 + ms(5), chunk(" Hello")));
        d.handle(event(k0, t0 + ms(6), chunk(" there.")));
        assert!(drain(&mut d, t0 + ms(6)).is_empty(), "one turn at a time");
        d.handle(event(k0, t0 + ms(7), done(2)));
        let (k1, second) = drain(&mut d, t0 + ms(7)).remove(0);
        assert!(
            second
                .prompt
                .starts_with(&format!("{} Hello there.\nUser: ", first.prompt))
        );
        assert_ne!(first.seed, second.seed);
        d.handle(event(
            k1,
            t0 + ms(9),
            EventKind::Error {
                code: "overloaded".into(),
                message: String::new(),
            },
        ));
        assert!(
            drain(&mut d, t0 + ms(9))
                .iter()
                .all(|(_, o)| !o.prompt.starts_with(&second.prompt)),
            "a failed turn ends its chat"
        );
        let turns: Vec<(u64, u32)> = d
            .into_records()
            .iter()
            .map(|r| (r.session, r.turn))
            .collect();
        assert_eq!(turns, [(0, 0), (0, 1)]);
    }

    #[test]
    fn requests_past_the_timeout_fail_and_are_returned_for_cancelling() {
        let t0 = Instant::now();
        let stop = Stop {
            max_requests: Some(2),
            duration: None,
        };
        let mut d = Driver::new(
            random(1),
            Load::Closed { concurrency: 2 },
            stop,
            ms(50),
            0,
            t0,
        );
        let sent = drain(&mut d, t0);
        d.handle(event(sent[0].0, t0 + ms(10), done(1)));
        assert_eq!(d.next_wakeup(t0 + ms(10)), Some(t0 + ms(50)));
        assert!(d.poll_timeouts(t0 + ms(49)).is_empty());
        assert_eq!(d.poll_timeouts(t0 + ms(50)), vec![sent[1].0]);
        assert!(d.is_done(t0 + ms(50)));
        let records = d.into_records();
        assert!(matches!(&records[1].outcome, Outcome::Failed { code, .. } if code == "timeout"));
    }
}
