//! Listening sockets: taken from systemd socket activation when started by systemd, bound by
//! the daemon itself otherwise.
//!
//! Owns reading `LISTEN_PID`/`LISTEN_FDS`/`LISTEN_FDNAMES`, picking our descriptor by name,
//! and the self-bind fallback for Unix sockets (parent directory, stale-socket cleanup,
//! mode 0660) and TCP.
//!
//! Must never delete anything at a socket path that is not a dead socket: a regular file or a
//! socket someone still answers on is an error, not something to clean up. Must never take the
//! same inherited descriptor twice.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::socket::{AddressFamily, SockType, SockaddrLike, SockaddrStorage, sockopt};

/// The mode of a socket we bind ourselves: owner and group (the shared `agentworks` group).
pub const SOCKET_MODE: u32 = 0o660;
/// The mode of a socket's parent directory when we have to create it.
pub const SOCKET_DIR_MODE: u32 = 0o755;

/// How a listener was obtained, so the caller can log it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerOrigin {
    /// Passed in by systemd (`LISTEN_FDS`).
    Activated,
    /// Bound by this process.
    Bound,
}

/// A listener a daemon could not take at its start, named by its path or address: the one
/// start error of every daemon's `start::run` for its listeners.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {what}")]
pub struct ListenFailed {
    /// The socket path or the address.
    pub what: String,
    #[source]
    pub source: ListenerError,
}

impl ListenerError {
    /// This error as the start failure of the listener at `what`.
    pub fn at(self, what: impl std::fmt::Display) -> ListenFailed {
        ListenFailed {
            what: what.to_string(),
            source: self,
        }
    }
}

/// Why a listener could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// `LISTEN_PID`/`LISTEN_FDS`/`LISTEN_FDNAMES` are set but malformed.
    #[error("invalid socket-activation environment (LISTEN_FDS/LISTEN_FDNAMES): {source}")]
    ActivationEnv { source: std::io::Error },
    /// systemd passed sockets but none is the one we want.
    #[error(
        "systemd passed sockets [{available}] but none is named {name:?} or is the only one of \
         its kind; set FileDescriptorName={name} in the .socket unit"
    )]
    ActivationNoMatch { name: String, available: String },
    /// The descriptor with our name was already taken by an earlier call.
    #[error("activated socket {name:?} (fd {fd}) was already taken by this process")]
    ActivationTaken { name: String, fd: RawFd },
    /// The descriptor with our name is not the kind of socket we need.
    #[error("activated socket {name:?} (fd {fd}) is not a listening {wanted} stream socket")]
    ActivationWrongKind {
        name: String,
        fd: RawFd,
        wanted: &'static str,
    },
    /// Creating the socket's parent directory failed.
    #[error("cannot create socket directory {path}: {source}")]
    CreateParent {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Looking at what is at the socket path failed.
    #[error("cannot inspect {path}: {source}")]
    Inspect {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Something that is not a socket sits at the path; we never delete it.
    #[error(
        "{path} exists and is not a socket; refusing to remove it (move it away or fix the socket path)"
    )]
    NotASocket { path: PathBuf },
    /// A live socket answers at the path: another instance is probably running.
    #[error("{path} is a live socket (another instance running?); refusing to replace it")]
    InUse { path: PathBuf },
    /// Probing an existing socket failed with something other than "refused".
    #[error("cannot tell whether socket {path} is stale: {source}")]
    Probe {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Removing a stale socket failed.
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Binding the Unix socket failed.
    #[error("cannot bind {path}: {source}")]
    BindUnix {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Setting the socket's mode failed.
    #[error("cannot set mode {SOCKET_MODE:o} on {path}: {source}")]
    Chmod {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Binding the TCP address failed.
    #[error("cannot bind {addr}: {source}")]
    BindTcp {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// Handing the socket to tokio failed (not inside a runtime, or non-blocking mode refused).
    #[error("cannot register listener with the tokio runtime: {source}")]
    Register { source: std::io::Error },
}

/// Which kind of listening socket a caller wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketKind {
    /// `AF_UNIX`, `SOCK_STREAM`.
    UnixStream,
    /// `AF_INET`/`AF_INET6`, `SOCK_STREAM`.
    TcpStream,
}

impl SocketKind {
    fn describe(self) -> &'static str {
        match self {
            SocketKind::UnixStream => "Unix",
            SocketKind::TcpStream => "TCP",
        }
    }
}

/// What [`select_activated`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// No sockets were passed: bind ourselves.
    NonePassed,
    /// Use this descriptor.
    Use(RawFd),
    /// Sockets were passed but none fits: an error (binding ourselves would fight systemd).
    NoMatch,
}

/// Picks our descriptor among those systemd passed: the one named `fd_name`; else, when none
/// carries that name, the only one of the wanted kind (systemd names descriptors after the
/// socket unit when `FileDescriptorName=` is not set, or "unknown" without `LISTEN_FDNAMES`).
///
/// `is_wanted_kind` says whether a descriptor is of the wanted kind. Pure, so it is unit-tested
/// without faking `LISTEN_PID`.
pub fn select_activated(
    passed: &[(RawFd, String)],
    fd_name: &str,
    is_wanted_kind: &dyn Fn(RawFd) -> bool,
) -> Selection {
    if passed.is_empty() {
        return Selection::NonePassed;
    }
    if let Some((fd, _)) = passed.iter().find(|(_, name)| name == fd_name) {
        return Selection::Use(*fd);
    }
    let mut of_kind = passed.iter().filter(|(fd, _)| is_wanted_kind(*fd));
    match (of_kind.next(), of_kind.next()) {
        (Some((fd, _)), None) => Selection::Use(*fd),
        _ => Selection::NoMatch,
    }
}

/// Descriptors already turned into listeners, so no descriptor is owned twice.
static CLAIMED: Mutex<BTreeSet<RawFd>> = Mutex::new(BTreeSet::new());

fn claimed() -> std::sync::MutexGuard<'static, BTreeSet<RawFd>> {
    CLAIMED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether a descriptor is a listening stream socket of `kind`.
fn is_listening(fd: BorrowedFd<'_>, kind: SocketKind) -> bool {
    let stream = matches!(
        nix::sys::socket::getsockopt(&fd, sockopt::SockType),
        Ok(SockType::Stream)
    );
    let listening = matches!(
        nix::sys::socket::getsockopt(&fd, sockopt::AcceptConn),
        Ok(true)
    );
    let family = nix::sys::socket::getsockname::<SockaddrStorage>(fd.as_raw_fd())
        .ok()
        .and_then(|a| a.family());
    let family_ok = match kind {
        SocketKind::UnixStream => family == Some(AddressFamily::Unix),
        SocketKind::TcpStream => {
            matches!(family, Some(AddressFamily::Inet | AddressFamily::Inet6))
        }
    };
    stream && listening && family_ok
}

/// [`is_listening`] for a descriptor systemd passed. The caller must hold or have just checked
/// the CLAIMED set: a claimed descriptor may already be closed.
fn inherited_is_listening(fd: RawFd, kind: SocketKind) -> bool {
    // SAFETY: `fd` comes from LISTEN_FDS (3..3+n), which systemd opened for this process; it
    // is not in CLAIMED (checked by every caller), so nothing in this process owns or has
    // closed it; the borrow ends with this function.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    is_listening(borrowed, kind)
}

/// Takes our activated descriptor, if systemd passed any. `Ok(None)` means "bind yourself".
fn take_activated(fd_name: &str, kind: SocketKind) -> Result<Option<OwnedFd>, ListenerError> {
    let passed: Vec<(RawFd, String)> = sd_notify::listen_fds_with_names()
        .map_err(|source| ListenerError::ActivationEnv { source })?
        .collect();
    let candidate = |fd: RawFd| !claimed().contains(&fd) && inherited_is_listening(fd, kind);
    let fd = match select_activated(&passed, fd_name, &candidate) {
        Selection::NonePassed => return Ok(None),
        Selection::Use(fd) => fd,
        Selection::NoMatch => {
            let available = passed
                .iter()
                .map(|(fd, name)| format!("{name}={fd}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ListenerError::ActivationNoMatch {
                name: fd_name.to_owned(),
                available,
            });
        }
    };
    // Hold the lock from the check to the insert so two callers can never own the same fd.
    let mut claimed_fds = claimed();
    if claimed_fds.contains(&fd) {
        return Err(ListenerError::ActivationTaken {
            name: fd_name.to_owned(),
            fd,
        });
    }
    if !inherited_is_listening(fd, kind) {
        return Err(ListenerError::ActivationWrongKind {
            name: fd_name.to_owned(),
            fd,
            wanted: kind.describe(),
        });
    }
    claimed_fds.insert(fd);
    // SAFETY: `fd` is an open listening socket passed by systemd (checked just above), and the
    // CLAIMED set, held locked since that check, guarantees this is the only place in the
    // process that ever takes ownership of it, so the OwnedFd is its unique owner.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(Some(owned))
}

/// Gets the Unix stream listener for `fd_name`.
///
/// If `LISTEN_PID`/`LISTEN_FDS` say systemd passed sockets, takes the one whose
/// `LISTEN_FDNAMES` name equals `fd_name` (or the only Unix stream socket, see
/// [`select_activated`]), sets it non-blocking and returns it. Otherwise binds `path`: creates
/// the parent directory if missing (0755), removes a stale socket file only if it is a socket
/// and connecting to it is refused (a regular file or a live socket is an error), binds, and
/// sets mode 0660.
///
/// Must be called inside a tokio runtime.
pub fn unix_listener(
    fd_name: &str,
    path: &Path,
) -> Result<(tokio::net::UnixListener, ListenerOrigin), ListenerError> {
    if let Some(fd) = take_activated(fd_name, SocketKind::UnixStream)? {
        let std_listener = std::os::unix::net::UnixListener::from(fd);
        let listener = register_unix(std_listener)?;
        return Ok((listener, ListenerOrigin::Activated));
    }
    let std_listener = bind_unix(path)?;
    Ok((register_unix(std_listener)?, ListenerOrigin::Bound))
}

fn register_unix(
    listener: std::os::unix::net::UnixListener,
) -> Result<tokio::net::UnixListener, ListenerError> {
    listener
        .set_nonblocking(true)
        .map_err(|source| ListenerError::Register { source })?;
    tokio::net::UnixListener::from_std(listener)
        .map_err(|source| ListenerError::Register { source })
}

/// The self-bind fallback of [`unix_listener`].
fn bind_unix(path: &Path) -> Result<std::os::unix::net::UnixListener, ListenerError> {
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
        && !parent.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(SOCKET_DIR_MODE)
            .create(parent)
            .map_err(|source| ListenerError::CreateParent {
                path: parent.to_path_buf(),
                source,
            })?;
    }
    remove_if_stale(path)?;
    let listener =
        std::os::unix::net::UnixListener::bind(path).map_err(|source| ListenerError::BindUnix {
            path: path.to_path_buf(),
            source,
        })?;
    // Between bind and chmod the socket has the umask's mode; nothing is accepted yet and every
    // accepted peer is checked with SO_PEERCRED anyway, so the window grants nothing.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(
        |source| ListenerError::Chmod {
            path: path.to_path_buf(),
            source,
        },
    )?;
    Ok(listener)
}

/// Removes `path` only if it is a socket nobody answers on.
fn remove_if_stale(path: &Path) -> Result<(), ListenerError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ListenerError::Inspect {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ListenerError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(ListenerError::InUse {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(|source| ListenerError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })
        }
        Err(source) => Err(ListenerError::Probe {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Gets the TCP listener for `fd_name`: activated by name (or the only TCP stream socket), else
/// bound to `addr`. Must be called inside a tokio runtime.
pub fn tcp_listener(
    fd_name: &str,
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, ListenerOrigin), ListenerError> {
    let (std_listener, origin) = match take_activated(fd_name, SocketKind::TcpStream)? {
        Some(fd) => (std::net::TcpListener::from(fd), ListenerOrigin::Activated),
        None => {
            let listener = std::net::TcpListener::bind(addr)
                .map_err(|source| ListenerError::BindTcp { addr, source })?;
            (listener, ListenerOrigin::Bound)
        }
    };
    std_listener
        .set_nonblocking(true)
        .map_err(|source| ListenerError::Register { source })?;
    let listener = tokio::net::TcpListener::from_std(std_listener)
        .map_err(|source| ListenerError::Register { source })?;
    Ok((listener, origin))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn passed(list: &[(RawFd, &str)]) -> Vec<(RawFd, String)> {
        list.iter().map(|(fd, n)| (*fd, n.to_string())).collect()
    }

    #[test]
    fn select_none_passed_means_bind() {
        assert_eq!(
            select_activated(&[], "workspaced", &|_| true),
            Selection::NonePassed
        );
    }

    #[test]
    fn select_by_name_wins() {
        let p = passed(&[(3, "agentd"), (4, "workspaced"), (5, "http")]);
        assert_eq!(
            select_activated(&p, "workspaced", &|_| true),
            Selection::Use(4)
        );
        // Name match is taken even if another fd is of the wanted kind.
        assert_eq!(
            select_activated(&p, "http", &|fd| fd == 3),
            Selection::Use(5)
        );
    }

    #[test]
    fn select_only_one_of_kind_without_names() {
        let p = passed(&[(3, "unknown")]);
        assert_eq!(
            select_activated(&p, "workspaced", &|_| true),
            Selection::Use(3)
        );
        let p = passed(&[
            (3, "agentworks-agentd.socket"),
            (4, "agentworks-agentd.socket"),
        ]);
        // Exactly one Unix socket and one TCP socket: each caller finds its own.
        assert_eq!(
            select_activated(&p, "agentd", &|fd| fd == 4),
            Selection::Use(4)
        );
        // Two candidates and no name: ambiguous.
        assert_eq!(
            select_activated(&p, "agentd", &|_| true),
            Selection::NoMatch
        );
        // None of the wanted kind.
        assert_eq!(
            select_activated(&p, "agentd", &|_| false),
            Selection::NoMatch
        );
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn binds_a_socket_with_mode_0660_and_creates_parent() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/sub/test.sock");
        let (listener, origin) = unix_listener("test-bind", &path).unwrap();
        assert_eq!(origin, ListenerOrigin::Bound);
        assert_eq!(mode_of(&path), 0o660);
        assert_eq!(mode_of(path.parent().unwrap()), 0o755);
        // It really listens.
        let client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (_server, _) = listener.accept().await.unwrap();
        drop(client);
    }

    #[tokio::test]
    async fn refuses_to_delete_a_regular_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("test.sock");
        std::fs::write(&path, b"precious").unwrap();
        let err = unix_listener("test-file", &path).unwrap_err();
        assert!(matches!(err, ListenerError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }

    #[tokio::test]
    async fn replaces_a_stale_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("test.sock");
        // A socket file nobody listens on any more.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_socket()
        );
        let (listener, origin) = unix_listener("test-stale", &path).unwrap();
        assert_eq!(origin, ListenerOrigin::Bound);
        let _client = tokio::net::UnixStream::connect(&path).await.unwrap();
        listener.accept().await.unwrap();
    }

    #[tokio::test]
    async fn refuses_a_live_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("test.sock");
        let (_live, _) = unix_listener("test-live", &path).unwrap();
        let err = unix_listener("test-live", &path).unwrap_err();
        assert!(matches!(err, ListenerError::InUse { .. }), "{err}");
        // The live socket still works.
        tokio::net::UnixStream::connect(&path).await.unwrap();
    }

    #[tokio::test]
    async fn tcp_binds_when_not_activated() {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let (listener, origin) = tcp_listener("test-tcp", addr).unwrap();
        assert_eq!(origin, ListenerOrigin::Bound);
        let local = listener.local_addr().unwrap();
        let _c = tokio::net::TcpStream::connect(local).await.unwrap();
        listener.accept().await.unwrap();
    }

    #[test]
    fn is_listening_tells_kinds_apart() {
        use std::os::fd::AsFd;
        let tmp = tempfile::tempdir().unwrap();
        let unix = std::os::unix::net::UnixListener::bind(tmp.path().join("k.sock")).unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(is_listening(unix.as_fd(), SocketKind::UnixStream));
        assert!(!is_listening(unix.as_fd(), SocketKind::TcpStream));
        assert!(is_listening(tcp.as_fd(), SocketKind::TcpStream));
        assert!(!is_listening(tcp.as_fd(), SocketKind::UnixStream));
    }
}
