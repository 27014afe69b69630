//! CURVE keys for zinfer: key files, allow-lists and the socket set-up that
//! every process (router, worker, supervisor, CLI clients, the HTTP front)
//! shares, so the rules live in one place.
//!
//! # Files
//!
//! A key pair file (`NAME.key`, written mode 0600 by `zinfer keys
//! generate`) holds both halves as Z85 text, so the public half can be read
//! back from it:
//!
//! ```text
//! # zinfer CURVE key pair (Z85). Keep this file secret.
//! public: rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7
//! secret: JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6
//! ```
//!
//! A public key file (`NAME.pub`) holds the public key alone on one line.
//! An allow-list is a file of public keys, one per line, with `#` comments
//! and blank lines ignored (so a `.pub` file is an allow-list of one), or a
//! directory whose `*.pub` files are read.

mod allow;
mod keys;
mod watch;

pub use crate::allow::AllowList;
pub use crate::keys::{KeyPair, PublicKey, read_public_key};
pub use crate::watch::DropWatch;

use std::path::{Path, PathBuf};

/// What went wrong reading, writing or applying keys. Every message names
/// the file and says what was expected.
#[derive(Debug, thiserror::Error)]
pub enum CurveError {
    /// A key or allow-list file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A key file is not in the expected format.
    #[error(
        "{} is not a zinfer CURVE key file: {detail} (expected a key pair file with \
         `public: <40 Z85 chars>` and `secret: <40 Z85 chars>` lines, or a public key \
         file with one 40-character Z85 key; make them with `zinfer keys generate`)",
        path.display()
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A text is not a 40-character Z85 CURVE key.
    #[error("{0}")]
    BadKey(String),
    /// A key file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Writing would replace an existing key.
    #[error("{} already exists; pass --force to replace it", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// The linked libzmq was built without CURVE (no libsodium).
    #[error(
        "this libzmq has no CURVE support; install a libzmq built with libsodium \
         (Debian: libzmq3-dev) and rebuild zinfer"
    )]
    Unsupported,
    /// libzmq refused a key or socket option.
    #[error("setting up CURVE on a socket failed: {0}")]
    Zmq(#[from] zmq::Error),
}

/// Fails with [`CurveError::Unsupported`] when libzmq cannot do CURVE.
pub fn check_available() -> Result<(), CurveError> {
    if zmq::has("curve") == Some(true) {
        Ok(())
    } else {
        Err(CurveError::Unsupported)
    }
}

/// The client side of CURVE: whom to trust (the router's public key) and
/// who we are (our own key pair).
#[derive(Clone)]
pub struct ClientCurve {
    /// The router's public key; the handshake fails unless the server
    /// proves it holds the matching secret.
    pub server: PublicKey,
    /// Our key pair; the router's allow-list decides on its public half.
    pub own: KeyPair,
}

impl std::fmt::Debug for ClientCurve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCurve")
            .field("server", &self.server)
            .field("own", &self.own.public())
            .finish()
    }
}

impl ClientCurve {
    /// Reads the router's public key from `server_key` (a `.pub` or `.key`
    /// file) and our key pair from `own_key`. Without `own_key` a fresh key
    /// pair is made for this process: encryption without identity, which a
    /// router accepts only on a socket that has no allow-list.
    pub fn from_files(server_key: &Path, own_key: Option<&Path>) -> Result<Self, CurveError> {
        check_available()?;
        let server = read_public_key(server_key)?;
        let own = match own_key {
            Some(path) => KeyPair::read(path)?,
            None => KeyPair::generate()?,
        };
        Ok(ClientCurve { server, own })
    }

    /// The optional client CURVE of a command's flags: none without
    /// `server_key`; `own_key` alone is a mistake worth stopping on.
    pub fn from_flags(
        server_key: Option<&Path>,
        own_key: Option<&Path>,
    ) -> Result<Option<Self>, CurveError> {
        match (server_key, own_key) {
            (Some(server), own) => Self::from_files(server, own).map(Some),
            (None, Some(own)) => Err(CurveError::BadKey(format!(
                "--curve-key {} was given without --curve-server-key; pass the router's \
                 public key file (ROUTER.pub) too",
                own.display()
            ))),
            (None, None) => Ok(None),
        }
    }

    /// Makes `socket` a CURVE client. Call before `connect`.
    pub fn apply(&self, socket: &zmq::Socket) -> Result<(), CurveError> {
        socket.set_curve_serverkey(self.server.as_bytes())?;
        socket.set_curve_publickey(self.own.public().as_bytes())?;
        socket.set_curve_secretkey(self.own.secret_bytes())?;
        Ok(())
    }
}

/// Applies an optional client CURVE to `socket` (nothing when `None`), so
/// callers need no branch of their own.
pub fn apply_client(socket: &zmq::Socket, curve: Option<&ClientCurve>) -> Result<(), CurveError> {
    match curve {
        Some(curve) => curve.apply(socket),
        None => Ok(()),
    }
}

/// Makes `socket` a CURVE server with `keys`, checked by the ZAP handler
/// under `domain`. Call before `bind`.
pub fn apply_server(socket: &zmq::Socket, keys: &KeyPair, domain: &str) -> Result<(), CurveError> {
    socket.set_curve_server(true)?;
    socket.set_curve_secretkey(keys.secret_bytes())?;
    socket.set_zap_domain(domain)?;
    Ok(())
}
