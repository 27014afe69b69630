//! Allow-lists of public keys: who may connect to one of the router's
//! sockets.

use std::collections::BTreeSet;
use std::path::Path;

use crate::keys::{PublicKey, meaningful_lines, read_text};
use crate::{CurveError, read_public_key};

/// A set of public keys allowed on one socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    keys: BTreeSet<PublicKey>,
}

impl AllowList {
    /// Reads a file of keys (one per line, `#` comments) or a directory of
    /// `*.pub` files. An empty result is an error: a list that admits
    /// nobody is almost surely a wrong path.
    pub fn load(path: &Path) -> Result<Self, CurveError> {
        let mut list = AllowList::default();
        let is_dir = std::fs::metadata(path)
            .map_err(|source| CurveError::Read {
                path: path.to_path_buf(),
                source,
            })?
            .is_dir();
        if is_dir {
            let entries = std::fs::read_dir(path).map_err(|source| CurveError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            for entry in entries {
                let entry = entry.map_err(|source| CurveError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                let file = entry.path();
                if file.extension().is_some_and(|ext| ext == "pub") {
                    list.insert(read_public_key(&file)?);
                }
            }
        } else {
            let text = read_text(path)?;
            for (n, line) in meaningful_lines(&text).enumerate() {
                let key = PublicKey::from_z85(line).map_err(|e| CurveError::Format {
                    path: path.to_path_buf(),
                    detail: format!("key {} of the list: {e}", n + 1),
                })?;
                list.insert(key);
            }
        }
        if list.is_empty() {
            return Err(CurveError::Format {
                path: path.to_path_buf(),
                detail: "the allow-list holds no key (a directory needs *.pub files)".into(),
            });
        }
        Ok(list)
    }

    /// Adds a key.
    pub fn insert(&mut self, key: PublicKey) {
        self.keys.insert(key);
    }

    /// Whether `key` is allowed.
    pub fn contains(&self, key: &PublicKey) -> bool {
        self.keys.contains(key)
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl FromIterator<PublicKey> for AllowList {
    fn from_iter<I: IntoIterator<Item = PublicKey>>(iter: I) -> Self {
        AllowList {
            keys: iter.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyPair;

    #[test]
    fn lists_from_files_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let a = KeyPair::generate().unwrap();
        let b = KeyPair::generate().unwrap();
        let outsider = KeyPair::generate().unwrap();
        a.write(dir.path(), "a", false).unwrap();
        b.write(dir.path(), "b", false).unwrap();
        let from_dir = AllowList::load(dir.path()).unwrap();
        assert_eq!(from_dir.len(), 2, "the .key files are not read as lists");
        assert!(from_dir.contains(&a.public()) && from_dir.contains(&b.public()));
        assert!(!from_dir.contains(&outsider.public()));

        let file = dir.path().join("list.txt");
        std::fs::write(
            &file,
            format!(
                "# admins\n{}\n\n  {}  # not a comment\n",
                a.public(),
                b.public()
            ),
        )
        .unwrap();
        let err = AllowList::load(&file).unwrap_err().to_string();
        assert!(err.contains("list.txt") && err.contains("key 2"), "{err}");
        std::fs::write(
            &file,
            format!("# admins\n{}\n\n  {}\n", a.public(), b.public()),
        )
        .unwrap();
        assert_eq!(AllowList::load(&file).unwrap(), from_dir);

        std::fs::write(&file, "# nobody\n").unwrap();
        assert!(
            AllowList::load(&file)
                .unwrap_err()
                .to_string()
                .contains("no key")
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(AllowList::load(empty.path()).is_err());
    }
}
