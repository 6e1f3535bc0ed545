//! The executor WebSocket protocol between gatewayd and `agentworks executor connect`.
//!
//! JSON text frames, one message each, tagged by `type`. The laptop dials out to
//! `GET /v1/executor` with `Authorization: Bearer <devices:connect token>`; heartbeats are
//! WebSocket ping/pong. Request ids are made by the server, never by the model. Absolute
//! folder paths never leave the laptop: folders are named by alias.
//!
//! Every frame from the network is hostile until checked: unknown fields and types are
//! refused (`deny_unknown_fields`), and sizes are bounded by the receivers.
//!
//! A result whose frame was lost (the connection or gatewayd went away after the request was
//! sent) is recovered by asking the executor's private receipts: [`GatewayFrame::ReceiptQuery`]
//! asks, [`ExecutorFrame::Receipt`] answers with the recorded outcome, "still running" or
//! "unknown" (never seen). The executor only looks: such a frame never makes it run anything.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The largest frame either side accepts.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;
/// Default and largest command timeout, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
pub const MAX_TIMEOUT_SECS: u64 = 300;
/// Grace beyond a command's own timeout before its request counts as unknown.
pub const SHELL_GRACE: Duration = Duration::from_secs(30);
/// How long a patch may take.
pub const PATCH_DEADLINE: Duration = Duration::from_secs(60);
/// Close code sent when the token was revoked (or the user disabled).
pub const CLOSE_REVOKED: u16 = 4001;
/// Close code sent when the token is not accepted at connect.
pub const CLOSE_UNAUTHORIZED: u16 = 4003;
/// Close code sent to a connection replaced by a newer one of the same device (same person,
/// same device name).
pub const CLOSE_REPLACED: u16 = 4002;
/// Close code sent when no hello arrived in time, or the hello was refused.
pub const CLOSE_POLICY: u16 = 1008;
/// Close code sent to every executor when gatewayd shuts down.
pub const CLOSE_GOING_AWAY: u16 = 1001;

/// What a folder grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FolderAccess {
    /// `--folder`: files and commands read-only.
    ReadOnly,
    /// `--write-folder`: files and commands may change the folder; patches allowed.
    ReadWrite,
}

/// One shared folder as the server sees it: an alias, never an absolute path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FolderInfo {
    pub alias: String,
    pub access: FolderAccess,
    /// `~/Downloads` is shared read/write beside this folder (`$AGENTWORKS_DOWNLOADS`).
    #[serde(default)]
    pub downloads: bool,
}

/// A request the server asks the laptop to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Operation {
    ExecuteShellCommand {
        command: String,
        #[serde(default)]
        timeout: Option<u64>,
    },
    DiffPatchWorkspaceFile {
        filepath: String,
        diff: String,
    },
}

impl Operation {
    /// How long after it was sent a request may take before its outcome counts as unknown: the
    /// command's timeout and [`SHELL_GRACE`], or [`PATCH_DEADLINE`]. gatewayd gives up waiting
    /// for the result then, and agentd stops trying to recover a lost answer then.
    ///
    /// A timeout above [`MAX_TIMEOUT_SECS`] counts as the maximum: such a request is refused
    /// before it runs (by gatewayd and the executor), but the model chooses the timeout and
    /// agentd takes this deadline first, so it must stay a bounded `Duration` for any value
    /// (`u64::MAX` seconds plus the grace overflowed and panicked agentd's turn).
    pub fn deadline(&self) -> Duration {
        match self {
            Operation::ExecuteShellCommand { timeout, .. } => {
                let secs = timeout
                    .unwrap_or(DEFAULT_TIMEOUT_SECS)
                    .min(MAX_TIMEOUT_SECS);
                Duration::from_secs(secs) + SHELL_GRACE
            }
            Operation::DiffPatchWorkspaceFile { .. } => PATCH_DEADLINE,
        }
    }
}

/// The result of one request, as the laptop reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    /// A command ran to completion (or to its timeout).
    Completed {
        stdout: String,
        stderr: String,
        exit_code: Option<i32>,
        #[serde(default)]
        stdout_truncated: bool,
        #[serde(default)]
        stderr_truncated: bool,
        #[serde(default)]
        timed_out: bool,
        #[serde(default)]
        cancelled: bool,
        /// Changes the command made to the protected project config of its folders (git
        /// config keys and hooks that make git run a program, `.envrc`, editor tasks, the
        /// coding CLIs' project config), each undone once the command was gone. Absent when
        /// there were none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        undone: Vec<UndoneChange>,
    },
    /// A patch was applied; every changed file with its new revision.
    Patched { files: Vec<PatchedFile> },
    /// Refused before anything ran or changed (grant, guard, sandbox, validation).
    Refused { code: String, message: String },
    /// It was running when the executor died: the outcome is unknown and it is never re-run
    /// under this request id.
    Interrupted { message: String },
}

/// One change to a folder's protected project config, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UndoneChange {
    /// The folder's alias (or `~/Downloads`), then the path in it, e.g. `proj/.git/config`.
    pub path: String,
    /// What the command changed and what was done about it, for a person to read.
    pub change: String,
    /// Whether it was put back; `false` when putting it back failed (the change says why).
    pub undone: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchedFile {
    pub path: String,
    pub revision: String,
}

/// What the executor's private receipts record for one request id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReceiptState {
    /// Finished (or interrupted): the outcome as recorded.
    Done { outcome: Outcome },
    /// Recorded as running, and still running in this executor.
    Running,
    /// No receipt of this request id: it never arrived here (or the receipts were lost).
    Unknown,
}

/// Frames from the laptop to the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecutorFrame {
    /// The first frame: who this device is and what it shares.
    Hello {
        device_name: String,
        version: String,
        folders: Vec<FolderInfo>,
    },
    /// The request was received and is running (or being looked up in the receipts).
    Accepted { request_id: String },
    Result {
        request_id: String,
        outcome: Outcome,
    },
    /// The answer to a [`GatewayFrame::ReceiptQuery`].
    Receipt {
        request_id: String,
        receipt: ReceiptState,
    },
}

/// Frames from the gateway to the laptop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum GatewayFrame {
    Welcome {
        device_id: String,
        heartbeat_secs: u64,
        /// Something the person should know about this connection, e.g. that another device of
        /// theirs (another credential) already has this name. Absent when there is nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        notice: Option<String>,
        /// The gateways of this deployment (`[gatewayd] advertised_urls`: base URLs, as
        /// `--gateway` takes them), for the executor to fail over between. Absent: only those
        /// it was given.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gateways: Vec<String>,
        /// The account the connection's token belongs to: the one whose agent this laptop now
        /// serves, which the executor shows on every (re)connect. Absent from older gateways.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        account: Option<String>,
    },
    Request {
        request_id: String,
        folder: String,
        operation: Operation,
    },
    Cancel {
        request_id: String,
    },
    /// What do your receipts record for this request id? Answered with
    /// [`ExecutorFrame::Receipt`]; never runs anything.
    ReceiptQuery {
        request_id: String,
    },
}

// ----- the hello: what both sides check -----

/// The longest device name, in characters.
pub const MAX_DEVICE_NAME_CHARS: usize = 64;
/// The longest version string, in characters.
pub const MAX_VERSION_CHARS: usize = 64;
/// The most folders one executor shares.
pub const MAX_FOLDERS: usize = 64;
/// The longest folder alias, in characters.
pub const MAX_ALIAS_CHARS: usize = 64;
/// The punctuation a folder alias may hold besides letters and digits.
const ALIAS_PUNCTUATION: &str = " ._-+()[],@'&#~";

/// Why a folder alias is refused, if it is: 1 to [`MAX_ALIAS_CHARS`] letters, digits, spaces
/// and `._-+()[],@'&#~`, not starting or ending with a space, not `.` or `..`.
///
/// The laptop names a folder after its base name and applies this rule before it dials;
/// gatewayd applies it to every hello and dispatch. No alias can hold a path separator, a
/// control or formatting character (no terminal escapes, no bidi overrides).
pub fn check_alias(alias: &str) -> Result<(), String> {
    let chars = alias.chars().count();
    if chars == 0 || chars > MAX_ALIAS_CHARS {
        return Err(format!(
            "a folder alias must be 1 to {MAX_ALIAS_CHARS} characters"
        ));
    }
    if alias == "." || alias == ".." {
        return Err("a folder alias cannot be . or ..".into());
    }
    if alias.starts_with(' ') || alias.ends_with(' ') {
        return Err("a folder alias cannot start or end with a space".into());
    }
    if let Some(bad) = alias
        .chars()
        .find(|c| !c.is_alphanumeric() && !ALIAS_PUNCTUATION.contains(*c))
    {
        return Err(format!(
            "a folder alias holds letters, digits, spaces and {ALIAS_PUNCTUATION:?} only, not {bad:?}"
        ));
    }
    Ok(())
}

/// True when [`check_alias`] accepts `alias`.
pub fn valid_alias(alias: &str) -> bool {
    check_alias(alias).is_ok()
}

/// Why a device name is refused, if it is: 1 to [`MAX_DEVICE_NAME_CHARS`] printable
/// characters, without leading or trailing whitespace. Printable: no control and no
/// bidirectional formatting character, since the name is shown beside the login code on the
/// approval page and in every device list, where U+202E could reorder what a person reads.
pub fn check_device_name(device_name: &str) -> Result<(), String> {
    let name_chars = device_name.chars().count();
    if name_chars == 0
        || name_chars > MAX_DEVICE_NAME_CHARS
        || device_name.trim() != device_name
        || device_name
            .chars()
            .any(agentworks_core::text::is_control_or_bidi)
    {
        return Err(format!(
            "device_name must be 1 to {MAX_DEVICE_NAME_CHARS} printable characters"
        ));
    }
    Ok(())
}

/// Why a hello is refused, if it is.
pub fn check_hello(device_name: &str, version: &str, folders: &[FolderInfo]) -> Result<(), String> {
    check_device_name(device_name)?;
    if version.chars().count() > MAX_VERSION_CHARS || version.chars().any(char::is_control) {
        return Err("version is too long or not printable".into());
    }
    if folders.len() > MAX_FOLDERS {
        return Err(format!("at most {MAX_FOLDERS} folders"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for folder in folders {
        check_alias(&folder.alias)?;
        if !seen.insert(folder.alias.as_str()) {
            return Err("folder aliases must be unique".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_refuse_unknown_fields() {
        let frame = GatewayFrame::Request {
            request_id: "r1".into(),
            folder: "proj".into(),
            operation: Operation::ExecuteShellCommand {
                command: "true".into(),
                timeout: Some(5),
            },
        };
        let text = serde_json::to_string(&frame).unwrap();
        assert_eq!(serde_json::from_str::<GatewayFrame>(&text).unwrap(), frame);
        assert!(
            text.contains("\"type\":\"request\"")
                && text.contains("\"kind\":\"execute_shell_command\"")
        );
        let sneaky =
            r#"{"type":"hello","device_name":"x","version":"1","folders":[],"root":"/home/me"}"#;
        assert!(serde_json::from_str::<ExecutorFrame>(sneaky).is_err());
        let unknown = r#"{"type":"format_disk"}"#;
        assert!(serde_json::from_str::<ExecutorFrame>(unknown).is_err());
    }

    #[test]
    fn deadlines_are_bounded_whatever_the_timeout() {
        let shell = |timeout| Operation::ExecuteShellCommand {
            command: "true".into(),
            timeout,
        };
        assert_eq!(
            shell(None).deadline(),
            Duration::from_secs(60) + SHELL_GRACE
        );
        assert_eq!(
            shell(Some(5)).deadline(),
            Duration::from_secs(5) + SHELL_GRACE
        );
        // Caught by the deadline rule of fuzz/checks/executor_frame.rs: u64::MAX overflowed.
        for huge in [301, u64::MAX - 29, u64::MAX] {
            assert_eq!(
                shell(Some(huge)).deadline(),
                Duration::from_secs(MAX_TIMEOUT_SECS) + SHELL_GRACE
            );
        }
    }

    fn folder(alias: &str) -> FolderInfo {
        FolderInfo {
            alias: alias.into(),
            access: FolderAccess::ReadOnly,
            downloads: false,
        }
    }

    #[test]
    fn hellos_are_checked() {
        assert!(check_hello("laptop", "0.1.0", &[folder("proj")]).is_ok());
        assert!(check_hello("Jane's MacBook", "0.1.0", &[]).is_ok());
        assert!(check_hello("", "1", &[]).is_err());
        assert!(check_hello(" padded", "1", &[]).is_err());
        assert!(check_hello("bell\u{7}", "1", &[]).is_err());
        assert!(check_hello("laptop\u{202e}exe.txt", "1", &[]).is_err());
        assert!(check_hello("c1\u{9b}2J", "1", &[]).is_err());
        assert!(check_hello(&"x".repeat(65), "1", &[]).is_err());
        assert!(check_hello("l", "1", &[folder("..")]).is_err());
        assert!(check_hello("l", "1", &[folder("a/b")]).is_err());
        assert!(check_hello("l", "1", &[folder("a"), folder("a")]).is_err());
        let many: Vec<_> = (0..=MAX_FOLDERS).map(|n| folder(&n.to_string())).collect();
        assert!(check_hello("l", "1", &many).is_err());
    }

    #[test]
    fn aliases_a_person_names_folders_with_are_accepted() {
        for alias in [
            "My Notes",
            "proj",
            "proj-2",
            "v1.2_final",
            "Übersicht",
            "日本語",
            "Q&A (2026)",
            "a",
        ] {
            assert_eq!(check_alias(alias), Ok(()), "{alias}");
        }
        let long = "x".repeat(MAX_ALIAS_CHARS);
        assert_eq!(check_alias(&long), Ok(()));
    }

    #[test]
    fn aliases_that_could_mislead_are_refused_with_the_reason() {
        let refused = [
            ("", "1 to 64"),
            (".", ". or .."),
            ("..", ". or .."),
            (" lead", "space"),
            ("trail ", "space"),
            ("a/b", "'/'"),
            ("a\\b", "'\\\\'"),
            ("tab\there", "'\\t'"),
            ("esc\u{1b}[31m", "'\\u{1b}'"),
            ("rtl\u{202e}txt", "'\\u{202e}'"),
            ("colon:", "':'"),
        ];
        for (alias, reason) in refused {
            let error = check_alias(alias).expect_err(alias);
            assert!(error.contains(reason), "{alias:?}: {error}");
        }
        assert!(check_alias(&"x".repeat(MAX_ALIAS_CHARS + 1)).is_err());
    }
}
