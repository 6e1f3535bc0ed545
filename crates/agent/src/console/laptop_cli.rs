//! The laptop CLI this server shipped with (`agentworks`), offered on the public listener to the
//! people who connect a laptop, as Coder's server serves its own CLI: unauthenticated (it is
//! public software, and a person installs it before they can sign in from it).
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/cli` | the [`Manifest`]: the server's version, each binary offered (URL, size, SHA-256 and the one-line install the console shows) and each platform not offered, with why |
//! | `GET /v1/cli/agentworks-linux-x86_64`, `…-aarch64` | the binary: `application/octet-stream`, `Content-Length`, `ETag` and `Repr-Digest` of its SHA-256, `Cache-Control: no-cache` (`If-None-Match` → 304); else 404 saying this server has none and what to do |
//! | any other `/v1/cli/…` | 404 |
//! | another method | 405 (`HEAD` is answered as `GET`, without the body) |
//!
//! Owns finding, hashing and sending those files, and the install line. Must never open a name
//! the request chose: a request path is only compared with the fixed names of [`PLATFORMS`];
//! the file is opened by its fixed name in `[agentd] cli_dir` with `O_NOFOLLOW | O_NONBLOCK` (a
//! symbolic link or a FIFO put there is refused, and opening never blocks), must be a regular
//! file, and is hashed and sent from that one descriptor, so the bytes sent are the bytes
//! hashed (a file replaced meanwhile, as a package upgrade does, is another file; one rewritten
//! in place changes its ctime, so its hash is computed again).

use agentworks_daemon::ipc::envelope::{Body, error_response, full, json_response};
use bytes::Bytes;
use hyper::header::{
    CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE, ETAG, HeaderName,
    HeaderValue, IF_NONE_MATCH, X_CONTENT_TYPE_OPTIONS,
};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde::Serialize;
use sha2::Digest;
use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The manifest's path; each binary is at `<MANIFEST_PATH>/<file>`.
pub const MANIFEST_PATH: &str = "/v1/cli";

/// The package that carries the CLI, for machines with the project's package repository.
pub const PACKAGE: &str = "agentworks-cli";

/// How a person builds the CLI themselves (a Mac, or a platform this server does not offer).
pub const BUILD_COMMAND: &str = "cargo build --release -p agentworks-laptop --features bin";

/// One platform the server may offer the CLI for.
#[derive(Debug)]
pub struct Platform {
    /// As in the manifest: `linux`.
    pub os: &'static str,
    /// As Rust and `uname -m` on Linux name it: `x86_64`, `aarch64`.
    pub arch: &'static str,
    /// The file's fixed name, in `cli_dir` and after [`MANIFEST_PATH`].
    pub file: &'static str,
    /// What `uname -s` and `uname -m` print on it, as the install line checks.
    pub uname: &'static str,
}

/// Every platform the server may offer: the two Linux architectures the packages build.
pub const PLATFORMS: [Platform; 2] = [
    Platform {
        os: "linux",
        arch: "x86_64",
        file: "agentworks-linux-x86_64",
        uname: "Linux x86_64",
    },
    Platform {
        os: "linux",
        arch: "aarch64",
        file: "agentworks-linux-aarch64",
        uname: "Linux aarch64",
    },
];

/// The name cargo gives the CLI in a build folder (`target/debug`, `target/release`), accepted
/// for agentd's own architecture when the platform's file is absent: quickstart offers the
/// folder of the binaries it runs.
const BUILD_FOLDER_NAME: &str = "agentworks";

/// `GET /v1/cli`.
#[derive(Debug, Serialize)]
pub struct Manifest {
    /// This server's version: the CLI it offers was built with it (the packages build both
    /// from one source; quickstart offers its own build folder's).
    pub version: &'static str,
    pub binaries: Vec<Binary>,
    /// The platforms this server does not offer, each with why and what to do instead.
    pub not_offered: Vec<NotOffered>,
    /// The package of the CLI, for machines with the project's package repository.
    pub package: &'static str,
}

/// One binary offered.
#[derive(Debug, Serialize)]
pub struct Binary {
    pub os: &'static str,
    pub arch: &'static str,
    /// Its absolute URL (on `[agentd] public_url`).
    pub url: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
    /// The one line (POSIX sh) that downloads it, checks it against `sha256`, and installs it
    /// as `~/.local/bin/agentworks` without sudo; `None` when the URL holds a character such a
    /// line could not carry safely (then the URL and the SHA-256 are all there is).
    pub install: Option<String>,
}

/// A platform not offered.
#[derive(Debug, Serialize)]
pub struct NotOffered {
    pub os: &'static str,
    pub arch: &'static str,
    pub reason: String,
}

/// What makes a file the same file for its cached hash: a replaced file has another inode, one
/// rewritten in place another ctime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// How long after its last change a file's hash may be kept. File times tick coarsely (a few
/// milliseconds), so a file rewritten in place within the tick of its hashing keeps its times;
/// one changed this recently is hashed on every request instead (git's "racily clean" rule).
const SETTLE_SECS: i64 = 2;

impl FileIdentity {
    /// Whether the file last changed long enough before `now` for its hash to be kept.
    fn settled_at(&self, now: std::time::SystemTime) -> bool {
        let now = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.ctime.0.max(self.mtime.0) + SETTLE_SECS < now
    }

    fn of(metadata: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.size(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }
}

/// A platform's binary, open.
struct Opened {
    file: std::fs::File,
    identity: FileIdentity,
}

/// Why a platform's binary is not offered.
#[derive(Debug, thiserror::Error)]
enum Unavailable {
    #[error("this server's CLI folder ([agentd] cli_dir) holds no {file}")]
    Missing { file: &'static str },
    #[error(
        "{file} in this server's CLI folder ([agentd] cli_dir) is not a regular file (a symbolic link, a folder or a FIFO is never served)"
    )]
    NotRegular { file: &'static str },
    #[error("{file} in this server's CLI folder ([agentd] cli_dir) cannot be read ({source})")]
    Unreadable {
        file: &'static str,
        source: std::io::Error,
    },
}

/// Each platform's last SHA-256 kept, by its file name, with the file it was computed from.
type KnownHashes = HashMap<&'static str, (FileIdentity, [u8; 32])>;

/// The laptop CLI binaries in `[agentd] cli_dir`, and their hashes. Cheap to clone.
#[derive(Clone)]
pub struct LaptopCli {
    dir: PathBuf,
    public_url: String,
    /// Each platform's last hash, by its file name. An async mutex, held while a hash is
    /// computed: concurrent requests wait for that one hash instead of each reading the file.
    hashes: Arc<tokio::sync::Mutex<KnownHashes>>,
    /// agentd's shutdown: a download still being sent then ends (the client sees it cut short).
    shutdown: CancellationToken,
}

impl LaptopCli {
    pub fn new(dir: PathBuf, public_url: String, shutdown: CancellationToken) -> LaptopCli {
        LaptopCli {
            dir,
            public_url,
            hashes: Default::default(),
            shutdown,
        }
    }

    /// At start: logs what `/v1/cli` offers and from where (the manifest names no path), and
    /// hashes the binaries in the background, so that the first manifest does not wait for it.
    pub fn offer(&self) {
        self.log_offer();
        let warm = self.clone();
        tokio::spawn(async move {
            let offered = warm.manifest().await.binaries.len();
            tracing::debug!(offered, "the laptop CLI binaries are hashed");
        });
    }

    fn log_offer(&self) {
        let mut offered = Vec::new();
        for platform in &PLATFORMS {
            match open(&self.dir, platform) {
                Ok(_) => offered.push(format!("{}-{}", platform.os, platform.arch)),
                Err(Unavailable::Missing { .. }) => {}
                Err(error) => tracing::warn!(dir = %self.dir.display(), "{error}"),
            }
        }
        if offered.is_empty() {
            tracing::info!(
                dir = %self.dir.display(),
                "no laptop CLI to offer at /v1/cli ([agentd] cli_dir holds none)"
            );
        } else {
            tracing::info!(
                dir = %self.dir.display(),
                platforms = %offered.join(" "),
                "the laptop CLI is offered at /v1/cli"
            );
        }
    }

    /// Answers `/v1/cli` and `/v1/cli/…`, or `None` for any other path.
    pub async fn handle(&self, parts: &Parts) -> Option<Response<Body>> {
        let path = parts.uri.path();
        let target = if path == MANIFEST_PATH {
            None
        } else {
            let name = path.strip_prefix(MANIFEST_PATH)?.strip_prefix('/')?;
            Some(PLATFORMS.iter().find(|p| p.file == name).ok_or(path))
        };
        if parts.method != Method::GET && parts.method != Method::HEAD {
            return Some(crate::console::assets::get_only(&parts.method, path));
        }
        Some(match target {
            None => self.manifest_response().await,
            Some(Ok(platform)) => self.binary_response(platform, parts).await,
            Some(Err(path)) => error_response(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "{path} is not a CLI binary of this server; {MANIFEST_PATH} lists what it offers"
                ),
                Default::default(),
            ),
        })
    }

    /// The manifest as it is now.
    pub async fn manifest(&self) -> Manifest {
        let mut binaries = Vec::new();
        let mut not_offered = Vec::new();
        for platform in &PLATFORMS {
            match self.open_hashed(platform).await {
                Ok((opened, sha256)) => {
                    let url = format!("{}{MANIFEST_PATH}/{}", self.public_url, platform.file);
                    let sha256 = hex::encode(sha256);
                    binaries.push(Binary {
                        os: platform.os,
                        arch: platform.arch,
                        install: install_line(&url, &sha256, platform),
                        url,
                        size: opened.identity.size,
                        sha256,
                    });
                }
                Err(reason) => not_offered.push(NotOffered {
                    os: platform.os,
                    arch: platform.arch,
                    reason: format!("{reason}; {}", what_to_do(platform)),
                }),
            }
        }
        for arch in ["aarch64", "x86_64"] {
            not_offered.push(NotOffered {
                os: "macos",
                arch,
                reason: format!(
                    "the server carries Linux builds only; build it on the Mac: {BUILD_COMMAND}"
                ),
            });
        }
        Manifest {
            version: env!("CARGO_PKG_VERSION"),
            binaries,
            not_offered,
            package: PACKAGE,
        }
    }

    async fn manifest_response(&self) -> Response<Body> {
        let mut response = json_response(StatusCode::OK, &self.manifest().await);
        // It says what the folder holds now.
        response
            .headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }

    async fn binary_response(&self, platform: &'static Platform, parts: &Parts) -> Response<Body> {
        let (opened, sha256) = match self.open_hashed(platform).await {
            Ok(found) => found,
            Err(reason) => {
                return error_response(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!(
                        "this server has no agentworks CLI for {}: {reason}; {}",
                        platform.uname,
                        what_to_do(platform)
                    ),
                    Default::default(),
                );
            }
        };
        let etag = format!("\"{}\"", hex::encode(sha256));
        let unchanged = parts
            .headers
            .get_all(IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|tag| matches!(tag.trim(), "*") || tag.trim() == etag);
        let size = opened.identity.size;
        let mut response = if unchanged {
            let mut response = Response::new(full(""));
            *response.status_mut() = StatusCode::NOT_MODIFIED;
            response
        } else if parts.method == Method::HEAD {
            Response::new(full(""))
        } else {
            Response::new(file_body(opened.file, size, self.shutdown.clone()))
        };
        let headers = response.headers_mut();
        headers.insert(ETAG, header_value(&etag));
        // Stable paths whose content changes with an upgrade: keep it, but ask first.
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if !unchanged {
            use base64::Engine as _;
            let digest = base64::engine::general_purpose::STANDARD.encode(sha256);
            headers.insert(
                HeaderName::from_static("repr-digest"),
                header_value(&format!("sha-256=:{digest}:")),
            );
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(CONTENT_LENGTH, HeaderValue::from(size));
            headers.insert(
                CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"agentworks\""),
            );
            headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        }
        response
    }

    /// The platform's binary, open, and its SHA-256 (computed from that descriptor unless the
    /// file is the one last hashed).
    async fn open_hashed(
        &self,
        platform: &'static Platform,
    ) -> Result<(Opened, [u8; 32]), Unavailable> {
        let mut hashes = self.hashes.lock().await;
        let dir = self.dir.clone();
        let cached = hashes.get(platform.file).copied();
        let found = tokio::task::spawn_blocking(move || {
            let opened = open(&dir, platform)?;
            match cached {
                Some((identity, sha256)) if identity == opened.identity => {
                    Ok((opened, sha256, false))
                }
                _ => {
                    let settled = opened.identity.settled_at(std::time::SystemTime::now());
                    let sha256 = sha256_of(&opened).map_err(|source| Unavailable::Unreadable {
                        file: platform.file,
                        source,
                    })?;
                    Ok((opened, sha256, settled))
                }
            }
        })
        .await
        .unwrap_or_else(|join| {
            Err(Unavailable::Unreadable {
                file: platform.file,
                source: std::io::Error::other(join.to_string()),
            })
        });
        // Not logged here (anonymous requests would fill the log): the manifest says why, and
        // the start logs it once (log_offer).
        found.map(|(opened, sha256, settled)| {
            if settled {
                hashes.insert(platform.file, (opened.identity, sha256));
            }
            (opened, sha256)
        })
    }
}

/// What to do about a platform's binary that is not offered. The packages carry the CLI for
/// the architecture they are built for only (a cross build of the other costs more than CI
/// gives it: README, "systemd and packages").
fn what_to_do(platform: &Platform) -> String {
    let operator = if platform.arch == std::env::consts::ARCH {
        "the server's operator installs the agentworks package, which carries it".to_owned()
    } else {
        format!(
            "the agentworks package carries the CLI for the server's own architecture ({}) only; \
             the server's operator may put a {} build there",
            std::env::consts::ARCH,
            platform.arch
        )
    };
    format!("{operator}; or build it: {BUILD_COMMAND}")
}

/// Opens the platform's binary in `dir` by its fixed name (or, for agentd's own architecture,
/// the build folder's name when that is absent).
fn open(dir: &Path, platform: &'static Platform) -> Result<Opened, Unavailable> {
    let build_folder = (platform.arch == std::env::consts::ARCH).then_some(BUILD_FOLDER_NAME);
    for name in std::iter::once(platform.file).chain(build_folder) {
        match open_regular(&dir.join(name), platform.file) {
            Err(Unavailable::Missing { .. }) => continue,
            found => return found,
        }
    }
    Err(Unavailable::Missing {
        file: platform.file,
    })
}

/// Opens a regular file without following a symbolic link and without blocking (a FIFO).
fn open_regular(path: &Path, file: &'static str) -> Result<Opened, Unavailable> {
    use nix::libc::{ELOOP, ENOENT, ENOTDIR, O_NOFOLLOW, O_NONBLOCK};
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NOFOLLOW | O_NONBLOCK)
        .open(path);
    let handle = match opened {
        Ok(handle) => handle,
        Err(e) if matches!(e.raw_os_error(), Some(ENOENT | ENOTDIR)) => {
            return Err(Unavailable::Missing { file });
        }
        // O_NOFOLLOW on a symbolic link.
        Err(e) if e.raw_os_error() == Some(ELOOP) => return Err(Unavailable::NotRegular { file }),
        Err(source) => return Err(Unavailable::Unreadable { file, source }),
    };
    let metadata = handle
        .metadata()
        .map_err(|source| Unavailable::Unreadable { file, source })?;
    if !metadata.is_file() {
        return Err(Unavailable::NotRegular { file });
    }
    Ok(Opened {
        file: handle,
        identity: FileIdentity::of(&metadata),
    })
}

/// The SHA-256 of the open file's first `size` bytes (its size when opened), read at offsets so
/// the descriptor still sends from its start.
fn sha256_of(opened: &Opened) -> std::io::Result<[u8; 32]> {
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut offset = 0;
    while offset < opened.identity.size {
        let want = buffer
            .len()
            .min(usize::try_from(opened.identity.size - offset).unwrap_or(usize::MAX));
        let read = opened.file.read_at(&mut buffer[..want], offset)?;
        if read == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was hashed",
            ));
        }
        hasher.update(&buffer[..read]);
        offset += read as u64;
    }
    Ok(hasher.finalize().into())
}

/// The bytes a send reads at a time.
const CHUNK_BYTES: u64 = 256 * 1024;

/// The file's first `size` bytes as a body, read a chunk at a time as the client takes them.
/// A read error, a file that shrank, or agentd's shutdown ends the body early: the connection
/// then closes short of its Content-Length, which no client takes for the whole file.
fn file_body(file: std::fs::File, size: u64, shutdown: CancellationToken) -> Body {
    use http_body_util::BodyExt;
    use tokio::io::AsyncReadExt;
    let file = tokio::fs::File::from_std(file);
    let chunks = futures_util::stream::unfold((file, size), move |(mut file, left)| {
        let shutdown = shutdown.clone();
        async move {
            if left == 0 {
                return None;
            }
            let mut chunk = vec![0u8; usize::try_from(left.min(CHUNK_BYTES)).unwrap_or(0)];
            let read = tokio::select! {
                read = file.read(&mut chunk) => read,
                _ = shutdown.cancelled() => return None,
            };
            match read {
                Ok(0) => {
                    tracing::warn!(left, "a CLI binary shrank while it was sent");
                    None
                }
                Ok(n) => {
                    chunk.truncate(n);
                    let frame = hyper::body::Frame::data(Bytes::from(chunk));
                    Some((
                        Ok::<_, std::convert::Infallible>(frame),
                        (file, left - n as u64),
                    ))
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read a CLI binary while sending it");
                    None
                }
            }
        }
    });
    http_body_util::StreamBody::new(chunks).boxed_unsync()
}

fn header_value(text: &str) -> HeaderValue {
    // Hex and base64 only: always a valid header value.
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Whether `url` can stand inside double quotes inside the single-quoted `sh -c '…'` of the
/// install line as itself: printable ASCII without a quote, `$`, backquote or backslash.
fn fits_in_the_line(url: &str) -> bool {
    url.bytes()
        .all(|b| b.is_ascii_graphic() && !b"'\"$`\\".contains(&b))
}

/// The one line a person pastes into any shell (sh, bash, zsh, fish: it is a single
/// `sh -c '…'`) to install the binary at `url` as `~/.local/bin/agentworks`, no sudo:
///
/// 1. refuses a machine that is not `platform` (`uname -sm`), and one without sha256sum;
/// 2. downloads into a temp file beside the destination (so the final move is a rename);
/// 3. checks it with `sha256sum -c` against `sha256`, the value the server published: a
///    mismatch removes the temp file, installs nothing and says so (exit 1);
/// 4. makes it 0755, moves it over `~/.local/bin/agentworks`, runs its `--version`, and says
///    how to put `~/.local/bin` on PATH when it is not.
///
/// `None` when `url` does not [fit in the line](fits_in_the_line).
pub fn install_line(url: &str, sha256: &str, platform: &Platform) -> Option<String> {
    if !fits_in_the_line(url) || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let uname = platform.uname;
    // Short on purpose: the console shows it whole. A missing curl is reported by sh itself.
    let script = [
        "set -eu".to_owned(),
        format!(
            "case \"$(uname -sm)\" in \"{uname}\") ;; *) echo \"agentworks: this line is for \
             {uname}, not $(uname -sm)\" >&2; exit 1;; esac"
        ),
        "command -v sha256sum >/dev/null || { echo \"agentworks: the install needs sha256sum\" \
         >&2; exit 1; }"
            .to_owned(),
        "d=\"$HOME/.local/bin\"".to_owned(),
        "mkdir -p \"$d\"".to_owned(),
        "t=$(mktemp \"$d/.agentworks.XXXXXX\")".to_owned(),
        "trap \"rm -f \\\"\\$t\\\"\" EXIT".to_owned(),
        format!("curl -fsS -o \"$t\" \"{url}\""),
        format!(
            "printf \"%s  %s\\n\" {sha256} \"$t\" | sha256sum -c - >/dev/null || {{ echo \
             \"agentworks: the download does not match the SHA-256 this server published; \
             nothing was installed\" >&2; exit 1; }}"
        ),
        "chmod 0755 \"$t\"".to_owned(),
        "mv -f \"$t\" \"$d/agentworks\"".to_owned(),
        "echo \"installed $d/agentworks: $(\"$d/agentworks\" --version)\"".to_owned(),
        "case \":$PATH:\" in *\":$d:\"*) ;; *) echo \"$d is not on your PATH: add it \
         (export PATH=\\\"\\$HOME/.local/bin:\\$PATH\\\" in ~/.profile)\";; esac"
            .to_owned(),
    ];
    Some(format!("sh -c '{}'", script.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::os::unix::fs::PermissionsExt;

    fn request(method: Method, path: &str, if_none_match: Option<&str>) -> Parts {
        let mut builder = hyper::Request::builder().method(method).uri(path);
        if let Some(tag) = if_none_match {
            builder = builder.header(IF_NONE_MATCH, tag);
        }
        builder.body(()).expect("a valid request").into_parts().0
    }

    fn cli(dir: &Path) -> LaptopCli {
        LaptopCli::new(
            dir.to_owned(),
            "http://127.0.0.1:8470".into(),
            CancellationToken::new(),
        )
    }

    async fn answer(cli: &LaptopCli, method: Method, path: &str) -> (StatusCode, Vec<u8>) {
        let response = cli
            .handle(&request(method, path, None))
            .await
            .unwrap_or_else(|| panic!("{path} is the CLI's"));
        let status = response.status();
        let body = response.into_body().collect().await.expect("a body");
        (status, body.to_bytes().to_vec())
    }

    fn own_platform() -> &'static Platform {
        PLATFORMS
            .iter()
            .find(|p| p.arch == std::env::consts::ARCH)
            .expect("the tests run on x86_64 or aarch64")
    }

    fn other_platform() -> &'static Platform {
        PLATFORMS
            .iter()
            .find(|p| p.arch != std::env::consts::ARCH)
            .expect("two platforms")
    }

    #[tokio::test]
    async fn the_manifest_lists_each_binary_with_its_hash_and_says_what_is_not_offered() {
        let dir = tempfile::tempdir().unwrap();
        let content = b"\x7fELF a laptop CLI".repeat(100_000);
        std::fs::write(dir.path().join(own_platform().file), &content).unwrap();
        let manifest = cli(dir.path()).manifest().await;
        assert_eq!(manifest.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(manifest.binaries.len(), 1);
        let binary = &manifest.binaries[0];
        assert_eq!(binary.arch, std::env::consts::ARCH);
        assert_eq!(binary.size, content.len() as u64);
        assert_eq!(binary.sha256, hex::encode(sha2::Sha256::digest(&content)));
        assert_eq!(
            binary.url,
            format!("http://127.0.0.1:8470/v1/cli/{}", own_platform().file)
        );
        let line = binary.install.as_deref().expect("an install line");
        assert!(line.contains(&binary.sha256) && line.contains(&binary.url));
        let other = &manifest.not_offered[0];
        assert_eq!(other.arch, other_platform().arch);
        for says in [
            other_platform().file,
            BUILD_COMMAND,
            "for the server's own architecture",
        ] {
            assert!(other.reason.contains(says), "{says}: {}", other.reason);
        }
        assert!(
            !other.reason.contains(&dir.path().display().to_string()),
            "the public manifest names no path: {}",
            other.reason
        );
        let macos: Vec<_> = manifest
            .not_offered
            .iter()
            .filter(|n| n.os == "macos")
            .collect();
        assert_eq!(macos.len(), 2);
    }

    #[tokio::test]
    async fn a_build_folder_offers_its_agentworks_for_agentds_own_architecture_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("agentworks"), b"built by cargo").unwrap();
        let manifest = cli(dir.path()).manifest().await;
        let offered: Vec<_> = manifest.binaries.iter().map(|b| b.arch).collect();
        assert_eq!(offered, [std::env::consts::ARCH]);
        // The platform's own name wins over the build folder's.
        std::fs::write(dir.path().join(own_platform().file), b"packaged").unwrap();
        let (status, body) = answer(
            &cli(dir.path()),
            Method::GET,
            &format!("/v1/cli/{}", own_platform().file),
        )
        .await;
        assert_eq!(
            (status, body.as_slice()),
            (StatusCode::OK, &b"packaged"[..])
        );
    }

    #[tokio::test]
    async fn a_binary_is_sent_whole_with_its_hash_and_revalidated_by_its_etag() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..(3 * CHUNK_BYTES + 17)).map(|i| i as u8).collect();
        std::fs::write(dir.path().join(own_platform().file), &content).unwrap();
        let cli = cli(dir.path());
        let path = format!("/v1/cli/{}", own_platform().file);
        let response = cli
            .handle(&request(Method::GET, &path, None))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers().clone();
        let sha = hex::encode(sha2::Sha256::digest(&content));
        assert_eq!(headers[ETAG], format!("\"{sha}\""));
        assert_eq!(headers[CONTENT_LENGTH], content.len().to_string());
        assert_eq!(headers[CONTENT_TYPE], "application/octet-stream");
        assert_eq!(headers[CACHE_CONTROL], "no-cache");
        assert!(
            headers["repr-digest"]
                .to_str()
                .unwrap()
                .starts_with("sha-256=:")
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(body.as_ref() == content.as_slice(), "the body is the file");

        let head = cli
            .handle(&request(Method::HEAD, &path, None))
            .await
            .unwrap();
        assert_eq!(head.headers()[CONTENT_LENGTH], content.len().to_string());
        assert!(
            head.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .is_empty()
        );

        let tag = format!("\"{sha}\"");
        let unchanged = cli
            .handle(&request(Method::GET, &path, Some(&tag)))
            .await
            .unwrap();
        assert_eq!(unchanged.status(), StatusCode::NOT_MODIFIED);
        let stale = cli
            .handle(&request(Method::GET, &path, Some("\"0000\"")))
            .await
            .unwrap();
        assert_eq!(stale.status(), StatusCode::OK);
    }

    #[test]
    fn only_a_hash_of_a_file_that_has_not_changed_lately_is_kept() {
        let changed_at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let identity = FileIdentity {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: (1_000_000, 5),
            ctime: (1_000_000, 5),
        };
        let later = |secs| changed_at + std::time::Duration::from_secs(secs);
        assert!(!identity.settled_at(changed_at));
        assert!(!identity.settled_at(later(SETTLE_SECS as u64)));
        assert!(identity.settled_at(later(SETTLE_SECS as u64 + 1)));
    }

    #[tokio::test]
    async fn a_file_replaced_or_rewritten_is_hashed_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(own_platform().file);
        std::fs::write(&path, b"version one").unwrap();
        let cli = cli(dir.path());
        let first = cli.manifest().await.binaries[0].sha256.clone();
        // Replaced (a package upgrade renames a new file over it).
        let staged = dir.path().join("staged");
        std::fs::write(&staged, b"version two").unwrap();
        std::fs::rename(&staged, &path).unwrap();
        let second = cli.manifest().await.binaries[0].sha256.clone();
        assert_eq!(second, hex::encode(sha2::Sha256::digest(b"version two")));
        assert_ne!(first, second);
        // Rewritten in place, same size.
        std::fs::write(&path, b"version 3!!").unwrap();
        let third = cli.manifest().await.binaries[0].sha256.clone();
        assert_eq!(third, hex::encode(sha2::Sha256::digest(b"version 3!!")));
    }

    /// A symbolic link or a FIFO at a fixed name is not served (the link is not followed to
    /// what it names; the FIFO does not hang the request), and no request path reaches
    /// another file.
    #[tokio::test]
    async fn only_regular_files_of_the_fixed_names_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"not for the public").unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join(own_platform().file)).unwrap();
        nix::unistd::mkfifo(
            &dir.path().join(other_platform().file),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let cli = cli(dir.path());
        for platform in &PLATFORMS {
            let (status, body) =
                answer(&cli, Method::GET, &format!("/v1/cli/{}", platform.file)).await;
            let body = String::from_utf8_lossy(&body);
            assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
            assert!(body.contains("not a regular file"), "{body}");
        }
        assert!(cli.manifest().await.binaries.is_empty());
        for path in [
            "/v1/cli/secret",
            "/v1/cli/agentworks",
            "/v1/cli/",
            "/v1/cli/../cli/secret",
            "/v1/cli/%2e%2e/secret",
            "/v1/cli/agentworks-linux-x86_64/",
            "/v1/cli/agentworks-linux-x86_64/../secret",
            "/v1/cli/AGENTWORKS-LINUX-X86_64",
        ] {
            let (status, body) = answer(&cli, Method::GET, path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            assert!(
                !String::from_utf8_lossy(&body).contains("not for the public"),
                "{path}"
            );
        }
        for path in ["/v1/clix", "/v1/cli-x", "/v1/health"] {
            assert!(
                cli.handle(&request(Method::GET, path, None))
                    .await
                    .is_none()
            );
        }
    }

    #[tokio::test]
    async fn a_missing_binary_is_404_saying_what_to_do_and_other_methods_are_405() {
        let dir = tempfile::tempdir().unwrap();
        let cli = cli(&dir.path().join("absent"));
        let (status, body) = answer(
            &cli,
            Method::GET,
            &format!("/v1/cli/{}", own_platform().file),
        )
        .await;
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        for says in ["no agentworks CLI for", "agentworks package", BUILD_COMMAND] {
            assert!(body.contains(says), "{body}");
        }
        for method in [Method::POST, Method::PUT, Method::DELETE] {
            for path in ["/v1/cli", "/v1/cli/agentworks-linux-aarch64"] {
                let (status, _) = answer(&cli, method.clone(), path).await;
                assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            }
        }
    }

    #[tokio::test]
    async fn an_unreadable_binary_is_not_offered() {
        if nix::unistd::geteuid().is_root() {
            // Root reads a 0000 file: nothing to check here.
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(own_platform().file);
        std::fs::write(&path, b"x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
        let manifest = cli(dir.path()).manifest().await;
        assert!(manifest.binaries.is_empty());
    }

    #[test]
    fn the_install_line_is_one_sh_word_and_refuses_what_it_cannot_carry() {
        let sha = "ab".repeat(32);
        let platform = &PLATFORMS[0];
        let line = install_line("https://agents.example.com/v1/cli/x", &sha, platform).unwrap();
        let inner = line
            .strip_prefix("sh -c '")
            .and_then(|l| l.strip_suffix('\''))
            .expect("sh -c '…'");
        assert!(!inner.contains('\''), "one single-quoted word: {inner}");
        for part in [
            "sha256sum -c",
            "$HOME/.local/bin",
            "chmod 0755",
            "\"$(uname -sm)\" in \"Linux x86_64\")",
            &sha,
        ] {
            assert!(inner.contains(part), "{part}: {inner}");
        }
        assert!(!inner.contains("sudo"));
        for url in [
            "https://a.example/it's",
            "https://a.example/$(id)",
            "https://a.example/`id`",
            "https://a.example/\"x",
            "https://a.example/a b",
            "https://a.example/\\x",
            "https://a.example/\u{e9}",
        ] {
            assert_eq!(install_line(url, &sha, platform), None, "{url}");
        }
        assert_eq!(
            install_line("https://a.example/x", "ab; rm -rf ~", platform),
            None
        );
    }
}
