//! `agentworks`, the laptop CLI: the person's side of the server → laptop direction.
//!
//! - [`app`]: what each subcommand does once parsed, and the hidden modes.
//! - [`cli`]: its command line; [`config`]: its private directories and stored credential.
//! - [`login`]: `agentworks login`/`logout` (the RFC 8628 device grant against agentd).
//! - [`grants`]: what `executor connect` shares, validated and pinned before it dials.
//! - [`connect`]: the WebSocket client loop to gatewayd; [`receipts`]: one private receipt per
//!   request id.
//! - [`shell`]: one command through the launcher, with its limits ([`limits`], [`cgroup`]).
//! - [`sandbox`]: the policy a command runs under and the launcher that enforces it (Linux:
//!   Landlock, [`seccomp`], [`privileges`] for a root launcher; macOS: a `sandbox-exec` profile
//!   generated from the same policy, and the process tree tracked without a subreaper).
//! - [`tls`]: the TLS client (rustls on Linux, the system's Security.framework on macOS);
//!   [`keychain`]: the credential in the macOS login Keychain.
//! - [`resolve`]: a path that may not exist yet, canonicalised as far as it exists (grants
//!   and the sandbox's exclusions).
//! - [`patch`]: `diff_patch_workspace_file` applied inside a granted folder.
//! - [`project_config`]: the files and git config keys that make the person's tools run a
//!   program, recorded before each command and put back after it ([`gitconfig`] reads git's
//!   config files).
//! - [`chat`]: `agentworks chat`, the terminal client for agentd's chats.
//!
//! Platforms: Linux and macOS. Linux-only mechanisms (Landlock, seccomp, capabilities, cgroups,
//! `/proc`, the child subreaper, `openat2`) are `cfg(target_os = "linux")`, each with a macOS
//! counterpart under `cfg(target_os = "macos")`; any other target does not compile.
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
pub mod cgroup;
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
#[cfg(target_os = "linux")]
pub mod privileges;
pub mod project_config;
pub mod receipts;
pub mod resolve;
pub mod sandbox;
#[cfg(target_os = "linux")]
pub mod seccomp;
pub mod shell;
pub mod tls;
