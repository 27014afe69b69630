//! Carrying a worker's prefix cache to its replacement over ZeroMQ.
//!
//! The replacement binds a PULL socket (its `import_endpoint`); the old
//! worker's exporter thread connects a PUSH socket and sends the spans the
//! engine hands it, hottest first, then `cache_end`. PUSH blocks when the
//! receiver falls behind, so nothing is dropped and memory stays bounded;
//! a send timeout ends the export if the receiver is gone.
//!
//! When the workers use CURVE the import socket is a CURVE server with a
//! key pair made for this import; `ready` carries its public key to the
//! router, `export_cache` carries it to the exporter, which trusts no
//! other server there, so the K/V travels encrypted to the replacement
//! alone. When the router names the exporter's key (`--import-from-key`),
//! a ZAP handler admits that key alone, so no other CURVE client can push
//! spans into the replacement's cache.

use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use zinfer_model::KvShape;
use zinfer_protocol::{CacheTransfer, Limits};

use zinfer_curve::{ClientCurve, KeyPair, PublicKey};

use crate::engine::{CacheBlock, EngineHandle};

/// Largest frame on the import socket: a span of a few hundred tokens of
/// a big model.
pub const MAX_TRANSFER_FRAME: usize = 64 << 20;

/// Spans buffered between the engine thread and the exporter thread.
const EXPORT_QUEUE: usize = 8;

/// How long one send may wait for a receiver that stopped reading.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// What an export did, for the `control_reply`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOutcome {
    /// Whether the stream reached `cache_end`.
    pub ok: bool,
    /// For a person: tokens, bytes, time, or why it stopped.
    pub message: String,
}

/// Why the cache could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// A socket could not be set up.
    #[error("cache transfer socket error while {context}: {source}")]
    Socket {
        /// What was being done.
        context: &'static str,
        /// What libzmq said.
        source: zmq::Error,
    },
    /// The engine would not start the export.
    #[error("the engine refused the export: {0}")]
    Engine(String),
    /// The thread could not be started.
    #[error("cannot start the exporter thread: {0}")]
    Thread(#[from] std::io::Error),
    /// This worker uses CURVE and the replacement gave no import key (or
    /// a bad one): the K/V is not sent in the clear.
    #[error(
        "the replacement's import socket has no usable CURVE key ({0}); this worker uses \
         CURVE and does not send the cache in the clear: start the replacement with CURVE too"
    )]
    NoImportKey(String),
    /// A CURVE key could not be set or made.
    #[error("cache transfer CURVE error: {0}")]
    Curve(#[from] zinfer_curve::CurveError),
}

/// How the exporter connects to the replacement's import socket when the
/// worker uses CURVE: trusting only the key the replacement announced, as
/// this worker (its own key pair).
pub struct ExportCurve(ClientCurve);

impl ExportCurve {
    /// Nothing when this worker does not use CURVE; the import `key`
    /// (Z85) is then ignored. With CURVE, the key must be there.
    pub fn new(
        own: Option<&ClientCurve>,
        key: Option<&str>,
    ) -> Result<Option<Self>, TransferError> {
        let Some(own) = own else {
            return Ok(None);
        };
        let key = key.ok_or_else(|| TransferError::NoImportKey("none in its ready".into()))?;
        let server =
            PublicKey::from_z85(key).map_err(|e| TransferError::NoImportKey(e.to_string()))?;
        Ok(Some(ExportCurve(ClientCurve {
            server,
            own: own.own.clone(),
        })))
    }
}

fn socket_error(context: &'static str) -> impl Fn(zmq::Error) -> TransferError {
    move |source| TransferError::Socket { context, source }
}

/// Where libzmq asks a context's ZAP handler about handshakes (RFC 27).
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// Binds the import socket on `host` at a free port; the socket and the
/// endpoint to advertise. With `curve` (a key pair made for this import)
/// the socket is a CURVE server: the exporter must know its public key,
/// which `ready` carries, and the K/V travels encrypted. With `exporter`
/// too, only a client with that public key completes the handshake.
pub fn bind_import(
    context: &zmq::Context,
    host: &str,
    curve: Option<&KeyPair>,
    exporter: Option<PublicKey>,
) -> Result<(zmq::Socket, String), TransferError> {
    let pull = context
        .socket(zmq::PULL)
        .map_err(socket_error("creating the import socket"))?;
    if let (Some(_), Some(exporter)) = (curve, exporter) {
        admit_only(context, exporter)?;
        pull.set_zap_domain("import")
            .map_err(socket_error("setting the import socket's ZAP domain"))?;
    }
    if let Some(keys) = curve {
        pull.set_curve_server(true)
            .map_err(socket_error("making the import socket a CURVE server"))?;
        pull.set_curve_secretkey(keys.secret_bytes())
            .map_err(socket_error("setting the import socket's CURVE key"))?;
    }
    pull.set_maxmsgsize(MAX_TRANSFER_FRAME as i64)
        .map_err(socket_error("setting ZMQ_MAXMSGSIZE"))?;
    pull.set_rcvhwm(16)
        .map_err(socket_error("setting ZMQ_RCVHWM"))?;
    pull.bind(&format!("tcp://{host}:*"))
        .map_err(socket_error("binding the import socket"))?;
    let endpoint = match pull.get_last_endpoint() {
        Ok(Ok(endpoint)) => endpoint,
        _ => {
            return Err(TransferError::Socket {
                context: "reading the import endpoint",
                source: zmq::Error::EINVAL,
            });
        }
    };
    Ok((pull, endpoint))
}

/// Answers the context's CURVE handshakes on a thread of its own: only
/// `exporter` gets in. The thread ends with the context.
fn admit_only(context: &zmq::Context, exporter: PublicKey) -> Result<(), TransferError> {
    let zap = context
        .socket(zmq::REP)
        .map_err(socket_error("creating the ZAP handler socket"))?;
    zap.set_linger(0)
        .map_err(socket_error("setting the ZAP handler's linger"))?;
    zap.bind(ZAP_ENDPOINT)
        .map_err(socket_error("binding the ZAP handler"))?;
    std::thread::Builder::new()
        .name("import-zap".into())
        .spawn(move || {
            // ETERM when the context ends: then the socket closes here.
            while let Ok(request) = zap.recv_multipart(0) {
                let reply = zap_reply(&request, &exporter);
                if let Err(error) = zap.send_multipart(reply, 0) {
                    tracing::warn!(%error, "sending a ZAP reply failed");
                }
            }
        })
        .map_err(|_| TransferError::Socket {
            context: "starting the ZAP handler thread",
            source: zmq::Error::EMFILE,
        })?;
    Ok(())
}

/// The reply to one ZAP request (version, request id, domain, address,
/// routing id, mechanism, credentials): 200 for `exporter`'s key over
/// CURVE, 400 for anything else.
fn zap_reply(request: &[Vec<u8>], exporter: &PublicKey) -> [Vec<u8>; 6] {
    let field = |i: usize| request.get(i).map(Vec::as_slice).unwrap_or_default();
    let admitted =
        field(0) == b"1.0" && field(5) == b"CURVE" && field(6) == exporter.as_bytes().as_slice();
    let (status, text) = if admitted {
        ("200", "OK")
    } else {
        tracing::warn!("a CURVE client other than the expected exporter was refused");
        (
            "400",
            "only the worker being replaced may send its cache here",
        )
    };
    [
        b"1.0".to_vec(),
        field(1).to_vec(),
        status.as_bytes().to_vec(),
        text.as_bytes().to_vec(),
        Vec::new(),
        Vec::new(),
    ]
}

/// Starts streaming the engine's hottest `max_tokens` cached tokens to
/// `endpoint`; the outcome arrives on the returned channel when done.
pub fn start_export(
    context: &zmq::Context,
    engine: &EngineHandle,
    endpoint: &str,
    max_tokens: usize,
    curve: Option<&ExportCurve>,
) -> Result<Receiver<ExportOutcome>, TransferError> {
    let push = context
        .socket(zmq::PUSH)
        .map_err(socket_error("creating the export socket"))?;
    if let Some(curve) = curve {
        curve.0.apply(&push)?;
    }
    push.set_sndhwm(16)
        .map_err(socket_error("setting ZMQ_SNDHWM"))?;
    push.set_sndtimeo(SEND_TIMEOUT.as_millis() as i32)
        .map_err(socket_error("setting ZMQ_SNDTIMEO"))?;
    push.set_linger(SEND_TIMEOUT.as_millis() as i32)
        .map_err(socket_error("setting ZMQ_LINGER"))?;
    push.connect(endpoint)
        .map_err(socket_error("connecting to the import endpoint"))?;
    let (sink, blocks) = crossbeam_channel::bounded(EXPORT_QUEUE);
    engine
        .export_cache(max_tokens, sink)
        .map_err(|e| TransferError::Engine(e.to_string()))?;
    let shape = engine.kv_shape();
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let endpoint = endpoint.to_string();
    std::thread::Builder::new()
        .name("cache-export".into())
        .spawn(move || {
            let outcome = export(&push, &blocks, shape, &endpoint);
            let _ = done_tx.send(outcome);
        })?;
    Ok(done_rx)
}

/// Sends every block until the end marker (or a failure).
fn export(
    push: &zmq::Socket,
    blocks: &Receiver<CacheBlock>,
    shape: KvShape,
    endpoint: &str,
) -> ExportOutcome {
    let started = Instant::now();
    let (mut bytes, mut sent_tokens) = (0u64, 0u64);
    for block in blocks {
        let end = matches!(block, CacheBlock::End { .. });
        let message = to_frame(block, shape);
        let frame = match zinfer_protocol::encode(&message) {
            Ok(frame) => frame,
            Err(error) => {
                return ExportOutcome {
                    ok: false,
                    message: format!("cannot encode a cache span: {error}"),
                };
            }
        };
        if let CacheTransfer::CacheSpan {
            tokens, prefix_len, ..
        } = &message
        {
            sent_tokens += (tokens.len() - *prefix_len as usize) as u64;
        }
        bytes += frame.len() as u64;
        if let Err(error) = push.send(frame, 0) {
            return ExportOutcome {
                ok: false,
                message: format!(
                    "sending the cache to {endpoint} failed after {sent_tokens} tokens: {error}"
                ),
            };
        }
        if end {
            let secs = started.elapsed().as_secs_f64();
            return ExportOutcome {
                ok: true,
                message: format!(
                    "exported {sent_tokens} cached tokens ({:.1} MiB) in {secs:.2} s",
                    bytes as f64 / f64::from(1 << 20)
                ),
            };
        }
    }
    ExportOutcome {
        ok: false,
        message: "the engine stopped before the export ended".into(),
    }
}

/// An engine block as a wire frame: K/V as little-endian f32 bytes.
fn to_frame(block: CacheBlock, shape: KvShape) -> CacheTransfer {
    match block {
        CacheBlock::Span {
            namespace,
            tokens,
            prefix_len,
            kv,
        } => CacheTransfer::CacheSpan {
            namespace,
            tokens,
            prefix_len: u32::try_from(prefix_len).unwrap_or(u32::MAX),
            layers: u32::try_from(shape.layers).unwrap_or(u32::MAX),
            kv_dim: u32::try_from(shape.kv_dim()).unwrap_or(u32::MAX),
            kv: kv.iter().flat_map(|x| x.to_le_bytes()).collect(),
        },
        CacheBlock::End { spans, tokens } => CacheTransfer::CacheEnd {
            spans: spans as u64,
            tokens: tokens as u64,
        },
    }
}

/// Why a frame from the import socket cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FrameError {
    /// Not a cache transfer frame within the limits.
    #[error(transparent)]
    Decode(#[from] zinfer_protocol::DecodeError),
    /// K/V of another model's shape.
    #[error(
        "K/V of {layers} layers x {kv_dim} does not fit this model's {} layers x {}",
        expected.layers,
        expected.kv_dim()
    )]
    Shape {
        /// Layers in the frame.
        layers: u32,
        /// Row width in the frame.
        kv_dim: u32,
        /// This model's shape.
        expected: KvShape,
    },
    /// The K/V bytes end inside an f32.
    #[error("K/V bytes are not whole f32 values")]
    PartialValue,
}

/// A frame from the import socket as an engine block.
pub fn from_frame(frame: &[u8], shape: KvShape) -> Result<CacheBlock, FrameError> {
    let limits = Limits {
        max_frame_bytes: MAX_TRANSFER_FRAME,
        ..Limits::default()
    };
    match zinfer_protocol::decode::<CacheTransfer>(frame, &limits)? {
        CacheTransfer::CacheSpan {
            namespace,
            tokens,
            prefix_len,
            layers,
            kv_dim,
            kv,
        } => {
            if layers as usize != shape.layers || kv_dim as usize != shape.kv_dim() {
                return Err(FrameError::Shape {
                    layers,
                    kv_dim,
                    expected: shape,
                });
            }
            if kv.len() % 4 != 0 {
                return Err(FrameError::PartialValue);
            }
            let kv = kv
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Ok(CacheBlock::Span {
                namespace,
                tokens,
                prefix_len: prefix_len as usize,
                kv,
            })
        }
        CacheTransfer::CacheEnd { spans, tokens } => Ok(CacheBlock::End {
            spans: spans as usize,
            tokens: tokens as usize,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_survive_the_wire_and_other_shapes_are_refused() {
        let shape = KvShape {
            layers: 2,
            kv_heads: 1,
            key_dim: 3,
            value_dim: 3,
        };
        let kv: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        let block = CacheBlock::Span {
            namespace: "t".into(),
            tokens: vec![5, 6, 7, 8, 9],
            prefix_len: 3,
            kv: kv.clone(),
        };
        let frame = zinfer_protocol::encode(&to_frame(block.clone(), shape)).unwrap();
        assert_eq!(from_frame(&frame, shape).unwrap(), block);
        let other = KvShape {
            layers: 30,
            ..shape
        };
        let err = from_frame(&frame, other).unwrap_err().to_string();
        assert!(err.contains("30 layers"), "{err}");
        let end = zinfer_protocol::encode(&to_frame(
            CacheBlock::End {
                spans: 1,
                tokens: 2,
            },
            shape,
        ))
        .unwrap();
        assert_eq!(
            from_frame(&end, shape).unwrap(),
            CacheBlock::End {
                spans: 1,
                tokens: 2
            }
        );
        assert!(from_frame(b"\x81\xa4type\xa3bad", shape).is_err());
    }

    /// With CURVE the import socket takes frames from an exporter that
    /// knows its key, and nothing from one that talks in the clear.
    #[test]
    fn a_curve_import_socket_takes_only_encrypted_frames() {
        if zinfer_curve::check_available().is_err() {
            return;
        }
        let context = zmq::Context::new();
        let keys = KeyPair::generate().unwrap();
        let (pull, endpoint) = bind_import(&context, "127.0.0.1", Some(&keys), None).unwrap();
        pull.set_rcvtimeo(2000).unwrap();
        let own = ClientCurve {
            server: KeyPair::generate().unwrap().public(),
            own: KeyPair::generate().unwrap(),
        };
        // In the clear: the handshake never completes, nothing arrives.
        let clear = context.socket(zmq::PUSH).unwrap();
        clear.set_linger(0).unwrap();
        clear.connect(&endpoint).unwrap();
        clear.send("clear", zmq::DONTWAIT).ok();
        // Encrypted to the announced key: arrives.
        let key = keys.public().to_z85();
        let curve = ExportCurve::new(Some(&own), Some(&key)).unwrap().unwrap();
        let push = context.socket(zmq::PUSH).unwrap();
        push.set_linger(0).unwrap();
        curve.0.apply(&push).unwrap();
        push.connect(&endpoint).unwrap();
        push.send("sealed", 0).unwrap();
        assert_eq!(pull.recv_bytes(0).unwrap(), b"sealed");
        pull.set_rcvtimeo(300).unwrap();
        assert!(pull.recv_bytes(0).is_err(), "a frame in the clear got in");

        // A CURVE worker refuses a replacement without a usable key; one
        // without CURVE needs none.
        for bad in [None, Some("short")] {
            assert!(matches!(
                ExportCurve::new(Some(&own), bad),
                Err(TransferError::NoImportKey(_))
            ));
        }
        assert!(ExportCurve::new(None, Some(&key)).unwrap().is_none());
    }
}

#[cfg(test)]
mod zap_tests {
    use super::*;

    /// Told the exporter's key, the import socket takes its frames and
    /// none from another CURVE client that knows the socket's key.
    #[test]
    fn only_the_named_exporter_gets_into_the_import_socket() {
        if zinfer_curve::check_available().is_err() {
            return;
        }
        let context = zmq::Context::new();
        let keys = KeyPair::generate().unwrap();
        let (exporter, stranger) = (KeyPair::generate().unwrap(), KeyPair::generate().unwrap());
        let (pull, endpoint) =
            bind_import(&context, "127.0.0.1", Some(&keys), Some(exporter.public())).unwrap();
        let import_key = keys.public().to_z85();
        let push_as = |own: &KeyPair, payload: &str| {
            let curve = ClientCurve {
                server: keys.public(),
                own: own.clone(),
            };
            let curve = ExportCurve::new(Some(&curve), Some(&import_key))
                .unwrap()
                .unwrap();
            let push = context.socket(zmq::PUSH).unwrap();
            push.set_linger(0).unwrap();
            curve.0.apply(&push).unwrap();
            push.connect(&endpoint).unwrap();
            push.send(payload, zmq::DONTWAIT).ok();
            push
        };
        let _stranger = push_as(&stranger, "from a stranger");
        let _exporter = push_as(&exporter, "from the exporter");
        pull.set_rcvtimeo(3000).unwrap();
        assert_eq!(pull.recv_bytes(0).unwrap(), b"from the exporter");
        pull.set_rcvtimeo(500).unwrap();
        assert!(pull.recv_bytes(0).is_err(), "the stranger's frame got in");

        let ok = zap_reply(
            &[
                b"1.0".to_vec(),
                b"7".to_vec(),
                b"import".to_vec(),
                b"127.0.0.1".to_vec(),
                Vec::new(),
                b"CURVE".to_vec(),
                exporter.public().as_bytes().to_vec(),
            ],
            &exporter.public(),
        );
        assert_eq!(
            (ok[1].as_slice(), ok[2].as_slice()),
            (&b"7"[..], &b"200"[..])
        );
        let plain = zap_reply(
            &[
                b"1.0".to_vec(),
                b"8".to_vec(),
                b"import".to_vec(),
                Vec::new(),
                Vec::new(),
                b"NULL".to_vec(),
            ],
            &exporter.public(),
        );
        assert_eq!(plain[2], b"400");
    }
}
