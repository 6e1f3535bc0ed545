//! The executor's shell runner: one command through the sandbox crate's launcher and runner
//! ([`agentworks_sandbox::shell`]: `/bin/sh -c`, the caps, the timeout, the tree ended on
//! cancel), with the executor's environment scrubbed.
//!
//! Owns: what a command gets of the executor's environment ([`kept_env`]: only PATH, HOME,
//! LANG, LC_*, TERM, USER, LOGNAME, SHELL, TZ survive; the runner adds the scratch variables)
//! and the request's extra variables (e.g. `AGENTWORKS_DOWNLOADS`).
//!
//! Must never: pass the executor's environment through (login tokens, provider keys, agent
//! sockets); run a command other than through the launcher.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use agentworks_sandbox::SandboxPolicy;
pub use agentworks_sandbox::process::KILL_GRACE;
use agentworks_sandbox::process::Launcher;
use agentworks_sandbox::shell::ShellCommand;
pub use agentworks_sandbox::shell::{
    DEFAULT_TIMEOUT, MAX_CAPTURE, MAX_TIMEOUT, ShellError, ShellOutcome,
};
use tokio_util::sync::CancellationToken;

/// Environment variables kept from the executor's environment (plus every `LC_*`).
const KEPT_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "TERM", "USER", "LOGNAME", "SHELL", "TZ",
];

/// One command to run.
#[derive(Debug, Clone)]
pub struct ShellRequest {
    pub command: String,
    /// Default [`DEFAULT_TIMEOUT`]; above [`MAX_TIMEOUT`] is refused.
    pub timeout: Option<Duration>,
    pub policy: SandboxPolicy,
    /// Extra variables set for the command (e.g. `AGENTWORKS_DOWNLOADS`).
    pub env_extra: Vec<(String, String)>,
}

/// Runs one command through the launcher (`launcher_exe` is `std::env::current_exe()` in
/// production), with the executor's own environment as the one to scrub.
pub async fn run(
    launcher_exe: &Path,
    request: ShellRequest,
    cancel: CancellationToken,
) -> Result<ShellOutcome, ShellError> {
    run_with_env(launcher_exe, request, cancel, std::env::vars_os().collect()).await
}

/// [`run`] with an explicit parent environment to scrub (tests pass secrets in it without
/// mutating the process environment).
pub async fn run_with_env(
    launcher_exe: &Path,
    request: ShellRequest,
    cancel: CancellationToken,
    parent_env: Vec<(OsString, OsString)>,
) -> Result<ShellOutcome, ShellError> {
    let mut env = scrub_env(parent_env);
    env.extend(
        request
            .env_extra
            .into_iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    let command = ShellCommand {
        command: request.command,
        timeout: request.timeout,
        policy: request.policy,
        env,
    };
    agentworks_sandbox::shell::run(&Launcher::at(launcher_exe), command, cancel).await
}

/// Whether a command keeps this variable of the executor's environment: PATH, HOME, LANG,
/// LC_*, TERM, USER, LOGNAME, SHELL and TZ.
pub fn kept_env(key: &std::ffi::OsStr) -> bool {
    key.to_str()
        .is_some_and(|k| KEPT_ENV.contains(&k) || k.starts_with("LC_"))
}

/// Keeps what [`kept_env`] keeps; drops everything else.
fn scrub_env(parent: Vec<(OsString, OsString)>) -> Vec<(OsString, OsString)> {
    parent
        .into_iter()
        .filter(|(key, _)| kept_env(key))
        .collect()
}
