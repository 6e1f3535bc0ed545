//! Secrets at rest: AES-256-GCM sealing for what agentd must keep but never show (an MCP
//! connection's access and refresh tokens, its client registration).
//!
//! A sealed blob is `version (1 byte) ‖ nonce (12) ‖ ciphertext ‖ tag (16)`. The additional
//! data binds it to its [`Place`] (the store and the path inside it), so a blob copied to
//! another row, another connection or another store does not open: it fails like a forged one.
//! Nonces are random (96 bits from the operating system per seal); agentd seals a few blobs per
//! sign-in, far below the 2^32 seals one key may take with random nonces.
//!
//! The key is 32 bytes, from the first of:
//! 1. the systemd credential `sealing-key` (`$CREDENTIALS_DIRECTORY/sealing-key`, e.g. from
//!    `LoadCredentialEncrypted=`): 32 raw bytes or 64 hex digits (a trailing newline allowed);
//! 2. `<agentd's state dir>/sealing.key`, 32 raw bytes, which must be a regular file owned by
//!    this user with no group or other bits; made at first start (written and synced under a
//!    temporary name, then linked into place, so a crash never leaves a short key and two
//!    starts racing agree on one).
//!
//! Anything else (a short file, a wider mode, a link, an unreadable credential) refuses to
//! start rather than run with a key that may be known or lost. AES-GCM is `ring`'s, already in
//! the build through rustls.
//!
//! Must never: write a key or a plaintext anywhere but the key file, log either, or accept a
//! blob whose tag does not verify.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The key file's name in agentd's state directory.
pub const KEY_FILE: &str = "sealing.key";
/// The systemd credential's name.
pub const CREDENTIAL: &str = "sealing-key";
const KEY_LEN: usize = 32;
const VERSION: u8 = 1;
const TAG_LEN: usize = 16;
/// The prefix of every blob's additional data: a blob sealed by something else never opens.
const AAD_DOMAIN: &[u8] = b"agentworks-sealed-v1";

/// Where a blob lives: the store (e.g. `mcp_connections`) and the path inside it (e.g. the
/// connection's internal name and the field). Both go into the additional data.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    pub store: &'a str,
    pub path: &'a str,
}

impl Place<'_> {
    /// `domain ‖ 0 ‖ len(store) ‖ store ‖ len(path) ‖ path`: length-prefixed, so no two
    /// different places share additional data.
    fn additional_data(&self) -> Vec<u8> {
        let mut aad =
            Vec::with_capacity(AAD_DOMAIN.len() + 17 + self.store.len() + self.path.len());
        aad.extend_from_slice(AAD_DOMAIN);
        aad.push(0);
        for part in [self.store, self.path] {
            aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
            aad.extend_from_slice(part.as_bytes());
        }
        aad
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("cannot read the sealing key {path}: {source}")]
    ReadKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the sealing key {path} is unusable: {reason} (it must hold exactly 32 bytes{hex}; \
         a lost key cannot be recovered, so agentd does not make a new one over it)"
    )]
    BadKey {
        path: PathBuf,
        reason: String,
        hex: &'static str,
    },
    #[error("cannot create the sealing key {path}: {source}")]
    CreateKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the operating system's random source failed")]
    Random,
    #[error("a sealed blob for {store}/{path} does not open: {reason}")]
    Open {
        store: String,
        path: String,
        reason: &'static str,
    },
}

/// The loaded key. Cheap to share behind an `Arc`; it never leaves this module.
pub struct SealingKey {
    key: LessSafeKey,
    random: SystemRandom,
}

impl std::fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealingKey(..)")
    }
}

impl SealingKey {
    /// The credential if systemd passed one, else the key file in `state_dir` (made if absent).
    pub fn load_or_create(
        state_dir: &Path,
        credentials_dir: Option<&Path>,
    ) -> Result<SealingKey, SealError> {
        if let Some(dir) = credentials_dir {
            let path = dir.join(CREDENTIAL);
            if path.exists() {
                return Self::from_credential(&path);
            }
        }
        let path = state_dir.join(KEY_FILE);
        match Self::from_key_file(&path) {
            Err(SealError::ReadKey { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                create_key_file(&path)?;
                Self::from_key_file(&path)
            }
            other => other,
        }
    }

    fn from_bytes(bytes: &[u8]) -> Option<SealingKey> {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).ok()?;
        Some(SealingKey {
            key: LessSafeKey::new(unbound),
            random: SystemRandom::new(),
        })
    }

    /// A systemd credential: systemd made the file and its mode; its content is the key.
    fn from_credential(path: &Path) -> Result<SealingKey, SealError> {
        let bad = |reason: String| SealError::BadKey {
            path: path.to_path_buf(),
            reason,
            hex: " or 64 hex digits",
        };
        let content = std::fs::read(path).map_err(|source| SealError::ReadKey {
            path: path.to_path_buf(),
            source,
        })?;
        let trimmed = content.strip_suffix(b"\n").unwrap_or(&content);
        let bytes = match trimmed.len() {
            KEY_LEN => trimmed.to_vec(),
            n if n == 2 * KEY_LEN => {
                hex::decode(trimmed).map_err(|_| bad("64 characters that are not hex".into()))?
            }
            n => return Err(bad(format!("it holds {n} bytes"))),
        };
        Self::from_bytes(&bytes).ok_or_else(|| bad("rejected by AES-256-GCM".into()))
    }

    /// The key file: a regular file of this user's, mode 0600 or narrower, exactly 32 bytes.
    /// Opened without following a link, and checked on the open descriptor.
    fn from_key_file(path: &Path) -> Result<SealingKey, SealError> {
        let bad = |reason: String| SealError::BadKey {
            path: path.to_path_buf(),
            reason,
            hex: "",
        };
        let read = |source| SealError::ReadKey {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(code) if code == nix::libc::ELOOP => bad("it is a symbolic link".into()),
                _ => read(e),
            })?;
        let meta = file.metadata().map_err(read)?;
        if !meta.file_type().is_file() {
            return Err(bad("it is not a regular file".into()));
        }
        if meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(bad(format!(
                "it belongs to uid {}, not to this user",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "its mode is {:o}: group or others may read it (chmod 600)",
                meta.mode() & 0o7777
            )));
        }
        let mut bytes = Vec::with_capacity(KEY_LEN + 1);
        file.take(KEY_LEN as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        if bytes.len() != KEY_LEN {
            return Err(bad(format!("it holds {} bytes", bytes.len())));
        }
        Self::from_bytes(&bytes).ok_or_else(|| bad("rejected by AES-256-GCM".into()))
    }

    /// Seal `plaintext` for `place`.
    pub fn seal(&self, place: Place<'_>, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| SealError::Random)?;
        let mut in_out = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(place.additional_data()),
                &mut in_out,
            )
            .map_err(|_| SealError::Random)?;
        let mut blob = Vec::with_capacity(1 + NONCE_LEN + in_out.len());
        blob.push(VERSION);
        blob.extend_from_slice(&nonce);
        blob.extend_from_slice(&in_out);
        Ok(blob)
    }

    /// Open a blob sealed for `place`; any change to the blob, the place or the key fails.
    pub fn open(&self, place: Place<'_>, blob: &[u8]) -> Result<Vec<u8>, SealError> {
        let fail = |reason| SealError::Open {
            store: place.store.to_string(),
            path: place.path.to_string(),
            reason,
        };
        let (&version, rest) = blob.split_first().ok_or_else(|| fail("it is empty"))?;
        if version != VERSION {
            return Err(fail("unknown version"));
        }
        if rest.len() < NONCE_LEN + TAG_LEN {
            return Err(fail("it is too short"));
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| fail("bad nonce"))?;
        let mut in_out = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(place.additional_data()), &mut in_out)
            .map_err(|_| fail("wrong key, wrong place, or altered"))?;
        Ok(plain.to_vec())
    }
}

/// Make the key file: 32 random bytes written and synced under a temporary name (0600, created
/// exclusively), then hard-linked to `path`, which fails if `path` exists: a crash leaves at
/// most a stray temporary file, never a short key, and of two starts racing, one key wins and
/// both load it. The directory is synced so the key outlives a power cut.
fn create_key_file(path: &Path) -> Result<(), SealError> {
    let err = |source| SealError::CreateKey {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .ok_or_else(|| err(std::io::Error::other("the key path has no directory")))?;
    let mut key = [0u8; KEY_LEN];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| SealError::Random)?;
    // A random name: starts racing (threads or processes) never share a temporary file.
    let mut suffix = [0u8; 8];
    SystemRandom::new()
        .fill(&mut suffix)
        .map_err(|_| SealError::Random)?;
    let temp = dir.join(format!(".{KEY_FILE}.{}.tmp", hex::encode(suffix)));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&temp)?;
        file.write_all(&key)?;
        file.sync_all()?;
        match std::fs::hard_link(&temp, path) {
            Ok(()) => {}
            // Another start made it first: load theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        File::open(dir)?.sync_all()
    })();
    let _ = std::fs::remove_file(&temp);
    result.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const PLACE: Place<'static> = Place {
        store: "mcp_connections",
        path: "conn_1/access_token",
    };

    fn key_in(dir: &Path) -> SealingKey {
        SealingKey::load_or_create(dir, None).expect("key")
    }

    #[test]
    fn sealing_round_trips_and_the_blob_hides_the_plaintext() {
        let dir = tempfile::tempdir().unwrap();
        let key = key_in(dir.path());
        let secret = b"ya29.a-very-secret-access-token";
        let blob = key.seal(PLACE, secret).unwrap();
        assert!(!blob.windows(secret.len()).any(|w| w == secret));
        assert_eq!(blob.len(), 1 + NONCE_LEN + secret.len() + TAG_LEN);
        assert_eq!(key.open(PLACE, &blob).unwrap(), secret);
        // A fresh nonce each time: the same secret never seals to the same blob.
        assert_ne!(key.seal(PLACE, secret).unwrap(), blob);
    }

    #[test]
    fn a_blob_moved_to_another_place_or_altered_or_under_another_key_does_not_open() {
        let dir = tempfile::tempdir().unwrap();
        let key = key_in(dir.path());
        let blob = key.seal(PLACE, b"refresh-token").unwrap();
        for other in [
            Place {
                store: "mcp_connections",
                path: "conn_2/access_token",
            },
            Place {
                store: "mcp_apps",
                path: "conn_1/access_token",
            },
            // Length-prefixed: moving a byte between store and path is another place.
            Place {
                store: "mcp_connections/",
                path: "conn_1access_token",
            },
        ] {
            assert!(matches!(
                key.open(other, &blob),
                Err(SealError::Open { .. })
            ));
        }
        for i in 0..blob.len() {
            let mut altered = blob.clone();
            altered[i] ^= 0x01;
            assert!(
                key.open(PLACE, &altered).is_err(),
                "byte {i} flipped opened"
            );
        }
        assert!(key.open(PLACE, &blob[..blob.len() - 1]).is_err());
        assert!(key.open(PLACE, &[]).is_err());
        let elsewhere = tempfile::tempdir().unwrap();
        assert!(key_in(elsewhere.path()).open(PLACE, &blob).is_err());
    }

    #[test]
    fn the_key_file_is_made_once_private_and_kept_across_starts() {
        let dir = tempfile::tempdir().unwrap();
        let blob = key_in(dir.path()).seal(PLACE, b"kept").unwrap();
        let path = dir.path().join(KEY_FILE);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(KEY_FILE)]);
        assert_eq!(key_in(dir.path()).open(PLACE, &blob).unwrap(), b"kept");
    }

    #[test]
    fn a_key_file_that_is_wide_short_or_a_link_is_refused_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        key_in(dir.path());
        let path = dir.path().join(KEY_FILE);
        let original = std::fs::read(&path).unwrap();

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = SealingKey::load_or_create(dir.path(), None).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

        std::fs::write(&path, &original[..16]).unwrap();
        let err = SealingKey::load_or_create(dir.path(), None).unwrap_err();
        assert!(err.to_string().contains("holds 16 bytes"), "{err}");
        assert_eq!(
            std::fs::read(&path).unwrap().len(),
            16,
            "replaced a bad key"
        );

        std::fs::remove_file(&path).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join("key");
        std::fs::write(&target, &original).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let err = SealingKey::load_or_create(dir.path(), None).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }

    #[test]
    fn a_systemd_credential_wins_raw_or_hex_and_a_bad_one_is_refused() {
        let state = tempfile::tempdir().unwrap();
        let creds = tempfile::tempdir().unwrap();
        let raw = [7u8; KEY_LEN];
        std::fs::write(creds.path().join(CREDENTIAL), raw).unwrap();
        let blob = SealingKey::load_or_create(state.path(), Some(creds.path()))
            .unwrap()
            .seal(PLACE, b"s")
            .unwrap();
        // The credential was used: no key file was made.
        assert!(!state.path().join(KEY_FILE).exists());
        std::fs::write(
            creds.path().join(CREDENTIAL),
            format!("{}\n", hex::encode(raw)),
        )
        .unwrap();
        let hex_key = SealingKey::load_or_create(state.path(), Some(creds.path())).unwrap();
        assert_eq!(hex_key.open(PLACE, &blob).unwrap(), b"s");
        std::fs::write(creds.path().join(CREDENTIAL), b"too short").unwrap();
        let err = SealingKey::load_or_create(state.path(), Some(creds.path())).unwrap_err();
        assert!(err.to_string().contains("holds 9 bytes"), "{err}");
        // A credentials directory without this credential falls back to the key file.
        std::fs::remove_file(creds.path().join(CREDENTIAL)).unwrap();
        SealingKey::load_or_create(state.path(), Some(creds.path())).unwrap();
        assert!(state.path().join(KEY_FILE).exists());
    }

    #[test]
    fn two_starts_racing_agree_on_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<SealingKey> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| SealingKey::load_or_create(dir.path(), None).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let blob = keys[0].seal(PLACE, b"one key").unwrap();
        for key in &keys {
            assert_eq!(key.open(PLACE, &blob).unwrap(), b"one key");
        }
    }
}
