//! `agentworks`, the laptop CLI: the person's side of the server → laptop direction.
//!
//! - [`app`]: what each subcommand does once parsed, and the hidden modes.
//! - [`cli`]: its command line; [`config`]: its private directories and stored credential.
//! - [`login`]: `agentworks login`/`logout` (the RFC 8628 device grant against agentd).
//! - [`grants`]: what `executor connect` shares, validated and pinned before it dials.
//! - [`connect`]: the WebSocket client loop to gatewayd; [`receipts`]: one private receipt per
//!   request id.
//! - [`shell`]: one command through the launcher of the sandbox crate (`agentworks_sandbox`:
//!   the policy, Landlock, seccomp, the limits and cgroups; on macOS a `sandbox-exec` profile
//!   generated from the same policy), with the executor's environment scrubbed;
//!   [`limits`]: what the person is told about the limits at connect.
//! - [`tls`]: the TLS client (rustls on Linux, the system's Security.framework on macOS);
//!   [`keychain`]: the credential in the macOS login Keychain.
//! - [`patch`]: `diff_patch_workspace_file` applied inside a granted folder.
//! - [`project_config`]: the files and git config keys that make the person's tools run a
//!   program, recorded before each command and put back after it ([`gitconfig`] reads git's
//!   config files).
//! - [`chat`]: `agentworks chat`, the terminal client for agentd's chats.
//!
//! Platforms: Linux and macOS. Linux-only mechanisms (`/proc`, `openat2`; the sandbox crate's
//! Landlock, seccomp, capabilities, cgroups and subreaper) are `cfg(target_os = "linux")`, each
//! with a macOS counterpart under `cfg(target_os = "macos")`; any other target does not compile.
//!
//! Owns: how a granted shell command is confined and bounded on the person's machine.
//! Never: runs a command outside a fully enforced sandbox (a Landlock ruleset, a `sandbox-exec`
//! profile), or links daemon plumbing
//! (this is not a daemon: no systemd, journald or capability handling of the daemons).

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "the agentworks laptop CLI runs commands only under Landlock (Linux) or sandbox-exec (macOS); \
     this target's OS has neither, so it is not built for it"
);

pub mod app;
pub mod chat;
pub mod cli;
pub mod config;
pub mod connect;
pub mod gitconfig;
pub mod grants;
#[cfg(target_os = "macos")]
pub mod keychain;
pub mod limits;
pub mod login;
pub mod patch;
pub mod project_config;
pub mod receipts;
pub mod shell;
pub mod tls;
