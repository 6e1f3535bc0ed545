//! Crash failpoints for tests, compiled only into debug builds.
//!
//! `AGENTWORKS_FAILPOINT=<name>` makes workspaced SIGKILL itself the first time it reaches
//! that point, so tests can crash a real process at each step of a write.
//! `AGENTWORKS_FAILPOINT=<name>:sleep:<ms>` pauses there instead (to hold a lock long).
//! `AGENTWORKS_FAILPOINT=<name>:fail` makes the step report an I/O error (`openat2:fail`: the
//! kernel or a seccomp filter lacks `openat2`, see [`crate::confine`]). In release builds
//! every call compiles to nothing: no environment variable can crash a packaged daemon.

/// Outcome of a failpoint that did not kill the process.
#[derive(Debug, PartialEq, Eq)]
pub enum Hit {
    Continue,
    Fail,
}

#[cfg(debug_assertions)]
pub fn hit(name: &str) -> Hit {
    use std::sync::OnceLock;
    static SPEC: OnceLock<Option<String>> = OnceLock::new();
    let spec = SPEC.get_or_init(|| std::env::var("AGENTWORKS_FAILPOINT").ok());
    let Some(spec) = spec else {
        return Hit::Continue;
    };
    for entry in spec.split(',') {
        let mut parts = entry.splitn(3, ':');
        if parts.next() != Some(name) {
            continue;
        }
        match (parts.next(), parts.next()) {
            (None, _) => {
                tracing::warn!(
                    failpoint = name,
                    "failpoint: killing workspaced with SIGKILL"
                );
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            (Some("sleep"), Some(ms)) => {
                let ms = ms.parse().unwrap_or(1000);
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            (Some("fail"), _) => return Hit::Fail,
            _ => {}
        }
    }
    Hit::Continue
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit(_name: &str) -> Hit {
    Hit::Continue
}
