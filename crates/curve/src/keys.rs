//! Key pairs and public keys, their Z85 text and their files.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::CurveError;

/// The 85 characters of Z85 (ZeroMQ RFC 32). libzmq's decoder accepts
/// others silently, so keys are checked against this first.
const Z85_ALPHABET: &[u8] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/// Length of a CURVE key in Z85 text.
pub(crate) const Z85_KEY_LEN: usize = 40;

/// A CURVE public key (32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// Parses 40 characters of Z85.
    pub fn from_z85(text: &str) -> Result<Self, CurveError> {
        decode_key(text).map(PublicKey)
    }

    /// A key from its raw 32 bytes (as a ZAP request carries it).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        PublicKey(bytes)
    }

    /// The key as 40 characters of Z85, as files and ZAP user ids hold it.
    pub fn to_z85(&self) -> String {
        encode_key(&self.0)
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The tenant this key stands for: `tenant:` and the first 16 hex
    /// digits of the key's SHA-256. Hex keeps it free of the `/` and `:`
    /// Z85 may contain, so `tenant:X/ns` parses one way only.
    pub fn tenant(&self) -> String {
        let digest = Sha256::digest(self.0);
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("tenant:{hex}")
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_z85())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_z85())
    }
}

/// A CURVE key pair. `Debug` shows only the public half.
#[derive(Clone)]
pub struct KeyPair {
    public: PublicKey,
    secret: [u8; 32],
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair({}, secret hidden)", self.public)
    }
}

impl KeyPair {
    /// A fresh key pair from libzmq (libsodium's random source).
    pub fn generate() -> Result<Self, CurveError> {
        crate::check_available()?;
        let pair = zmq::CurveKeyPair::new()?;
        Ok(KeyPair {
            public: PublicKey(pair.public_key),
            secret: pair.secret_key,
        })
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// The secret half, raw, for socket options.
    pub fn secret_bytes(&self) -> &[u8; 32] {
        &self.secret
    }

    /// Reads a key pair file (`public:` and `secret:` lines).
    pub fn read(path: &Path) -> Result<Self, CurveError> {
        let text = read_text(path)?;
        let format = |detail: String| CurveError::Format {
            path: path.to_path_buf(),
            detail,
        };
        let mut public = None;
        let mut secret = None;
        for line in meaningful_lines(&text) {
            if let Some(value) = line.strip_prefix("public:") {
                public =
                    Some(PublicKey::from_z85(value.trim()).map_err(|e| format(e.to_string()))?);
            } else if let Some(value) = line.strip_prefix("secret:") {
                secret = Some(decode_key(value.trim()).map_err(|e| format(e.to_string()))?);
            } else {
                return Err(format(format!("unexpected line {line:?}")));
            }
        }
        match (public, secret) {
            (Some(public), Some(secret)) => Ok(KeyPair { public, secret }),
            (_, None) => Err(format(
                "no `secret:` line (a .pub file holds only a public key; pass the .key file)"
                    .into(),
            )),
            (None, Some(_)) => Err(format("no `public:` line".into())),
        }
    }

    /// Writes `DIR/NAME.key` (mode 0600) and `DIR/NAME.pub`; refuses to
    /// replace either unless `force`. Returns both paths.
    pub fn write(
        &self,
        dir: &Path,
        name: &str,
        force: bool,
    ) -> Result<(PathBuf, PathBuf), CurveError> {
        let key_path = dir.join(format!("{name}.key"));
        let pub_path = dir.join(format!("{name}.pub"));
        if !force {
            for path in [&key_path, &pub_path] {
                if path.exists() {
                    return Err(CurveError::Exists { path: path.clone() });
                }
            }
        }
        let key_text = format!(
            "# zinfer CURVE key pair (Z85). Keep this file secret.\npublic: {}\nsecret: {}\n",
            self.public,
            encode_key(&self.secret)
        );
        write_file(&key_path, &key_text, 0o600, force)?;
        write_file(&pub_path, &format!("{}\n", self.public), 0o644, force)?;
        Ok((key_path, pub_path))
    }
}

/// Reads a public key from a `.pub` file (one key line) or a key pair file
/// (its `public:` line), so a router's public key can be given either way.
pub fn read_public_key(path: &Path) -> Result<PublicKey, CurveError> {
    let text = read_text(path)?;
    let format = |detail: String| CurveError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let lines: Vec<&str> = meaningful_lines(&text).collect();
    if let Some(value) = lines.iter().find_map(|line| line.strip_prefix("public:")) {
        return PublicKey::from_z85(value.trim()).map_err(|e| format(e.to_string()));
    }
    match lines.as_slice() {
        [line] => PublicKey::from_z85(line).map_err(|e| format(e.to_string())),
        [] => Err(format("it holds no key".into())),
        _ => Err(format(format!(
            "it holds {} lines; a public key file holds one key",
            lines.len()
        ))),
    }
}

/// Non-empty lines that are not `#` comments, trimmed.
pub(crate) fn meaningful_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
}

pub(crate) fn read_text(path: &Path) -> Result<String, CurveError> {
    std::fs::read_to_string(path).map_err(|source| CurveError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `text` to `path` with `mode`; without `replace`, fails if the
/// file appeared since the caller checked (never clobbers a key).
fn write_file(path: &Path, text: &str, mode: u32, replace: bool) -> Result<(), CurveError> {
    let fail = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            CurveError::Exists {
                path: path.to_path_buf(),
            }
        } else {
            CurveError::Write {
                path: path.to_path_buf(),
                source,
            }
        }
    };
    let mut options = std::fs::OpenOptions::new();
    if replace {
        options.write(true).create(true).truncate(true);
    } else {
        options.write(true).create_new(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(mode);
        let mut file = options.open(path).map_err(fail)?;
        // `mode` applies only to a new file; a replaced one keeps its old
        // permissions unless set again.
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(fail)?;
        file.write_all(text.as_bytes()).map_err(fail)
    }
    #[cfg(not(unix))]
    {
        let _ = mode;
        let mut file = options.open(path).map_err(fail)?;
        file.write_all(text.as_bytes()).map_err(fail)
    }
}

fn decode_key(text: &str) -> Result<[u8; 32], CurveError> {
    if text.len() != Z85_KEY_LEN {
        return Err(CurveError::BadKey(format!(
            "a CURVE key is {Z85_KEY_LEN} Z85 characters, got {} ({text:?})",
            text.chars().count()
        )));
    }
    if let Some(bad) = text.bytes().find(|b| !Z85_ALPHABET.contains(b)) {
        return Err(CurveError::BadKey(format!(
            "{text:?} is not Z85: character {:?} is not in the alphabet",
            char::from(bad)
        )));
    }
    let bytes = zmq::z85_decode(text)
        .map_err(|e| CurveError::BadKey(format!("{text:?} is not Z85: {e}")))?;
    bytes
        .try_into()
        .map_err(|_| CurveError::BadKey(format!("{text:?} does not decode to 32 bytes")))
}

fn encode_key(bytes: &[u8; 32]) -> String {
    // 32 bytes is a multiple of 4, the only thing z85_encode can refuse.
    zmq::z85_encode(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_round_trip_and_refuse_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let pair = KeyPair::generate().unwrap();
        let (key, public) = pair.write(dir.path(), "alice", false).unwrap();
        let read = KeyPair::read(&key).unwrap();
        assert_eq!(read.public(), pair.public());
        assert_eq!(read.secret_bytes(), pair.secret_bytes());
        assert_eq!(read_public_key(&public).unwrap(), pair.public());
        assert_eq!(read_public_key(&key).unwrap(), pair.public());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let err = KeyPair::generate()
            .unwrap()
            .write(dir.path(), "alice", false)
            .unwrap_err();
        assert!(err.to_string().contains("--force"), "{err}");
        let other = KeyPair::generate().unwrap();
        other.write(dir.path(), "alice", true).unwrap();
        assert_eq!(KeyPair::read(&key).unwrap().public(), other.public());
    }

    #[test]
    fn bad_key_files_name_the_file_and_the_format() {
        let dir = tempfile::tempdir().unwrap();
        let pair = KeyPair::generate().unwrap();
        let (_, public) = pair.write(dir.path(), "bob", false).unwrap();
        let err = KeyPair::read(&public).unwrap_err().to_string();
        assert!(err.contains("bob.pub") && err.contains("secret:"), "{err}");
        let junk = dir.path().join("junk.key");
        std::fs::write(&junk, "public: short\nsecret: short\n").unwrap();
        let err = KeyPair::read(&junk).unwrap_err().to_string();
        assert!(err.contains("junk.key") && err.contains("40"), "{err}");
        let err = KeyPair::read(&dir.path().join("missing.key")).unwrap_err();
        assert!(err.to_string().contains("missing.key"), "{err}");
        assert!(PublicKey::from_z85(&"~".repeat(40)).is_err());
    }

    #[test]
    fn tenants_are_stable_and_distinct() {
        let a = KeyPair::generate().unwrap().public();
        let b = KeyPair::generate().unwrap().public();
        assert_eq!(a.tenant(), a.tenant());
        assert_ne!(a.tenant(), b.tenant());
        assert_eq!(a.tenant().len(), "tenant:".len() + 16);
        assert!(!a.tenant()["tenant:".len()..].contains(['/', ':']));
    }
}
