//! The executor WebSocket protocol between gatewayd and `agentworks executor connect`, and the
//! bodies of gatewayd's dispatch API on `gatewayd.sock`.
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
    pub fn deadline(&self) -> Duration {
        match self {
            Operation::ExecuteShellCommand { timeout, .. } => {
                Duration::from_secs(timeout.unwrap_or(DEFAULT_TIMEOUT_SECS)) + SHELL_GRACE
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
    },
    /// A patch was applied; every changed file with its new revision.
    Patched { files: Vec<PatchedFile> },
    /// Refused before anything ran or changed (grant, guard, sandbox, validation).
    Refused { code: String, message: String },
    /// It was running when the executor died: the outcome is unknown and it is never re-run
    /// under this request id.
    Interrupted { message: String },
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

// ----- gatewayd.sock (served to agentd) -----

/// A connected (or recently seen) device, as listed to its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub device_id: String,
    pub name: String,
    pub user_id: String,
    pub online: bool,
    pub folders: Vec<FolderInfo>,
    pub connected_at_ms: Option<i64>,
    pub last_seen_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesRequest {
    /// Only this person's devices are ever listed.
    pub user_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchRequest {
    /// The person on whose behalf agentd dispatches; must own the device.
    pub user_id: String,
    pub device_id: String,
    pub folder: String,
    /// Made by the server (agentd), unique per intended operation.
    pub request_id: String,
    pub operation: Operation,
}

/// The answer to a dispatch or an outcome lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DispatchState {
    Done {
        outcome: Outcome,
    },
    /// Still running on the laptop.
    Pending,
    /// The device disconnected (or its token was revoked) while the request was pending: the
    /// outcome is unknown; it is never re-sent.
    Unknown {
        reason: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestRef {
    pub user_id: String,
    pub request_id: String,
}

/// The answer to `POST /v1/recover` (body: the [`DispatchRequest`] whose answer agentd lost).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "recovery", rename_all = "snake_case")]
pub enum Recovery {
    /// The request's final state: as recorded, or recovered now from the device's receipt
    /// (`from_receipt`). `Unknown` here is for good: the device has no receipt of it, or it
    /// was recorded unknown and the device's receipt cannot change that.
    Settled {
        state: DispatchState,
        from_receipt: bool,
    },
    /// gatewayd had no record of the request id, so it was never sent (a request is recorded
    /// before it is sent); the id is now claimed, so it never will be.
    NeverSent,
    /// Not final yet (still running, the device is offline, or it did not answer the receipt
    /// query): ask again later.
    Unsettled { reason: String },
}

/// The answer to `POST /v1/cancel`: whether a cancel frame was sent (only while the request
/// is pending on a connected device), and the request's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelResponse {
    pub cancel_sent: bool,
    #[serde(flatten)]
    pub state: DispatchState,
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
}
