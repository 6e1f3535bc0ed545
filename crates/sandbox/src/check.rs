//! Whether this machine can sandbox a command, and how it enforces exclusions.
//!
//! Owns: the support check ([`check_available`]: Landlock on Linux, `sandbox-exec` on macOS),
//! the Landlock ABI ([`landlock_status`], with its debug-build simulation [`TEST_ABI_ENV`]) and
//! the connect-time probe for user and mount namespaces ([`exclusion_mechanism`]). Must never:
//! report a sandbox as available that the launcher would not enforce.

#[cfg(target_os = "linux")]
use std::io;

use crate::SandboxError;
use crate::launcher::PROBE_SUBCOMMAND;
use crate::process::Launcher;
#[cfg(target_os = "macos")]
use crate::sbpl;

/// The lowest Landlock ABI we run commands under: ABI 3 adds `truncate` control, without which
/// a read-only file could still be emptied.
pub const MIN_ABI: i32 = 3;
/// Debug builds only: simulate a kernel reporting this Landlock ABI (`0` = unavailable).
pub const TEST_ABI_ENV: &str = "AGENTWORKS_TEST_LANDLOCK_ABI";
/// Debug builds only, read by [`exclusion_mechanism`] (the laptop's executor at connect): `1` makes it act as on a machine that
/// refuses unprivileged user namespaces (the exclusions then use the rule walk).
pub const TEST_NO_USERNS_ENV: &str = "AGENTWORKS_TEST_NO_USERNS";

/// How this machine enforces a `--block` or `--read-only` path inside a writable folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExclusionMechanism {
    /// macOS: the profile denies the path itself; nothing else loses access.
    Profile,
    /// Linux: a mount covers it in the command's own user and mount namespace, and the folder
    /// keeps file creation; a path that does not exist yet is still carved out by the walk.
    Overmount,
    /// Linux, where the kernel refuses an unprivileged user and mount namespace: the rule walk,
    /// and every directory on the path to an exclusion loses file creation; and no private
    /// terminals ([`SandboxPolicy::private_terminals`](crate::SandboxPolicy::private_terminals)):
    /// commands get no terminal device. Why.
    Walk(String),
}

/// Which [`ExclusionMechanism`] commands get here, found (the laptop: at connect) by running
/// `launcher` as `<launcher> __sandbox-probe`, which tries the namespace steps the launcher
/// takes. Debug builds honour [`TEST_NO_USERNS_ENV`].
pub fn exclusion_mechanism(launcher: &Launcher) -> ExclusionMechanism {
    if cfg!(target_os = "macos") {
        return ExclusionMechanism::Profile;
    }
    if cfg!(debug_assertions) && std::env::var(TEST_NO_USERNS_ENV).is_ok_and(|v| v == "1") {
        return ExclusionMechanism::Walk(format!(
            "{TEST_NO_USERNS_ENV}=1 simulates a machine that refuses them"
        ));
    }
    match std::process::Command::new(launcher.exe())
        .arg(PROBE_SUBCOMMAND)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => ExclusionMechanism::Overmount,
        Ok(out) => ExclusionMechanism::Walk(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        Err(e) => ExclusionMechanism::Walk(format!(
            "the probe {} could not run: {e}",
            launcher.exe().display()
        )),
    }
}

/// Whether this machine can run commands in the sandbox, or an error saying why they are
/// refused: the Landlock ABI on Linux ([`landlock_status`]); on macOS `None` once
/// `sandbox-exec` is there.
pub fn check_available() -> Result<Option<i32>, SandboxError> {
    #[cfg(target_os = "linux")]
    return landlock_status().map(Some);
    #[cfg(target_os = "macos")]
    return std::fs::metadata(sbpl::SANDBOX_EXEC)
        .map(|_| None)
        .map_err(|source| SandboxError::SandboxExecUnavailable {
            path: sbpl::SANDBOX_EXEC.into(),
            source,
        });
}

/// Checks Landlock support and returns the ABI version, or an error saying why commands are
/// refused. Debug builds honour [`TEST_ABI_ENV`] to simulate an older or missing Landlock.
#[cfg(target_os = "linux")]
pub fn landlock_status() -> Result<i32, SandboxError> {
    let kernel = kernel_abi()?;
    let abi = match simulated_abi() {
        Some(simulated) if simulated <= 0 => {
            return Err(SandboxError::LandlockUnavailable {
                reason: format!("{TEST_ABI_ENV}={simulated} simulates a kernel without Landlock"),
            });
        }
        Some(simulated) => simulated.min(kernel),
        None => kernel,
    };
    if abi < MIN_ABI {
        return Err(SandboxError::AbiTooOld {
            found: abi,
            required: MIN_ABI,
        });
    }
    Ok(abi)
}

#[cfg(target_os = "linux")]
fn simulated_abi() -> Option<i32> {
    if !cfg!(debug_assertions) {
        return None;
    }
    std::env::var(TEST_ABI_ENV).ok()?.trim().parse().ok()
}

#[cfg(target_os = "linux")]
fn kernel_abi() -> Result<i32, SandboxError> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only queries the ABI version: the kernel
    // reads no memory (the attribute pointer is NULL, size 0) and creates no descriptor.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if version < 0 {
        let error = io::Error::last_os_error();
        let reason = match error.raw_os_error() {
            Some(libc::EOPNOTSUPP) => {
                "the kernel has Landlock but it is disabled at boot (add `landlock` to the `lsm=` kernel parameter)".to_owned()
            }
            Some(libc::ENOSYS) => {
                "the kernel was built without Landlock (CONFIG_SECURITY_LANDLOCK)".to_owned()
            }
            _ => format!("querying the Landlock ABI failed: {error}"),
        };
        return Err(SandboxError::LandlockUnavailable { reason });
    }
    i32::try_from(version).map_err(|_| SandboxError::LandlockUnavailable {
        reason: format!("the kernel reported an impossible Landlock ABI {version}"),
    })
}
