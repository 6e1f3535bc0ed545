//! The per-project cross-process lock.
//!
//! One lock file per project root under `<state>/files/locks/`, held with `flock(LOCK_EX)`.
//! `flock` locks belong to the open file description, so two threads of one workspaced, two
//! workspaced processes, or any other writer that opens the same file all exclude each other,
//! and the kernel drops the lock when its holder dies (a SIGKILLed writer never wedges a
//! project). Different projects use different files and never wait on each other.
//!
//! This module never waits forever: acquisition gives up after the configured timeout so a
//! caller gets a retryable `busy` rather than a hung request.

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot open the project lock {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the project is busy: another operation held its lock for more than {waited_ms} ms; retry"
    )]
    Timeout { waited_ms: u128 },
    #[error("cannot take the project lock {path}: {source}")]
    Flock {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl LockError {
    /// The same error again, for each of several callers that waited together (a batch).
    pub fn duplicate(&self) -> LockError {
        let again = |e: &std::io::Error| std::io::Error::new(e.kind(), e.to_string());
        match self {
            LockError::Open { path, source } => LockError::Open {
                path: path.clone(),
                source: again(source),
            },
            LockError::Timeout { waited_ms } => LockError::Timeout {
                waited_ms: *waited_ms,
            },
            LockError::Flock { path, source } => LockError::Flock {
                path: path.clone(),
                source: again(source),
            },
        }
    }
}

/// A held project lock; dropping it (closing the fd) releases it.
#[derive(Debug)]
pub struct ProjectLock {
    _fd: OwnedFd,
}

impl ProjectLock {
    /// Take the lock at `path`, polling with a short backoff until `timeout`.
    pub fn acquire(path: &Path, timeout: Duration) -> Result<ProjectLock, LockError> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| LockError::Open {
            path: path.to_owned(),
            source: e.into(),
        })?;
        let started = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(ProjectLock { _fd: fd }),
                Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {}
                Err(e) => {
                    return Err(LockError::Flock {
                        path: path.to_owned(),
                        source: e.into(),
                    });
                }
            }
            if started.elapsed() >= timeout {
                return Err(LockError::Timeout {
                    waited_ms: started.elapsed().as_millis(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_a_second_holder_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.lock");
        let held = ProjectLock::acquire(&path, Duration::from_secs(1)).unwrap();
        let err = ProjectLock::acquire(&path, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        drop(held);
        ProjectLock::acquire(&path, Duration::from_millis(30)).unwrap();
    }

    #[test]
    fn different_projects_do_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let _a = ProjectLock::acquire(&dir.path().join("a.lock"), Duration::from_secs(1)).unwrap();
        ProjectLock::acquire(&dir.path().join("b.lock"), Duration::from_millis(1)).unwrap();
    }
}
