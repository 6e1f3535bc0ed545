//! The laptop tools of a turn bound to a laptop folder: `execute_shell_command {command,
//! timeout?}` and `diff_patch_workspace_file {filepath, diff}` (the bridge schemas: no device,
//! folder or project argument), dispatched through gatewayd to the bound device and folder
//! with server-made request ids; the patch tool only when the device's folder list at the
//! turn's start says the folder is shared writable ([`bound_folder_writable`]). An offline
//! device fails the call (`device_offline`); nothing ever falls back to the server.
//!
//! Running commands and patches on a laptop folder is authoring: every call re-checks, from
//! live rows, that the person still has an authoring role (owner, co-owner, editor) on the
//! chat's project ([`require_authoring_role`], which binding a chat checks too).
//!
//! When the exchange with gatewayd fails after the dispatch was sent (connection reset, a bad
//! answer), nobody here knows whether it ran: the call is never reported "not run". agentd asks
//! gatewayd to recover it (`POST /v1/recover`: gatewayd's record, or the device's own receipt)
//! until the operation's deadline, and answers the real result, "never sent" (gatewayd had no
//! record), or `outcome_unknown`, never a guess.

use super::{Mode, arguments, schema, string, tool, unknown_tool};
use crate::catalog::files::require_authoring_role_for;
use crate::chat::model::ToolCall;
use crate::chat::service::ChatService;
use crate::chat::store::Binding;
use crate::identity::Access;
use crate::mcp::{Caller, ToolError};
use agentworks_contract::executor::{DEFAULT_TIMEOUT_SECS, FolderAccess, Operation, Outcome};
use agentworks_contract::gatewayd::{
    CancelResponse, DispatchRequest, DispatchState, Recovery, RequestRef,
};
use agentworks_support::unix_http::ClientError;
use serde_json::{Value, json};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The local tools of a bound turn (the bridge schemas): the shell, and the patch tool only for
/// a writable folder.
pub fn definitions(writable: bool) -> Vec<Value> {
    let mut tools = vec![tool(
        "execute_shell_command",
        "Run a shell command in the shared folder on the person's computer (sandboxed to \
         the folder; the network is reachable). Returns stdout, stderr and the exit code.",
        schema(
            json!({"command": {"type": "string"},
                   "timeout": {"type": "integer", "minimum": 1, "maximum": 300,
                               "description": "seconds; default 60"}}),
            &["command"],
        ),
    )];
    if writable {
        tools.push(tool(
            "diff_patch_workspace_file",
            "Apply a unified diff to one file in the shared folder (writable folders only).",
            schema(
                json!({"filepath": {"type": "string", "description": "relative to the folder"},
                       "diff": {"type": "string"}}),
                &["filepath", "diff"],
            ),
        ));
    }
    tools
}

/// Whether the bound folder is shared writable, from the device's folder list now. Anything
/// that does not say so (a read-only folder, an unknown device or folder, gatewayd unreachable)
/// is false: the patch tool is then not offered.
pub async fn bound_folder_writable(
    service: &ChatService,
    caller: &Caller,
    binding: &Binding,
) -> bool {
    match service.devices(caller).await {
        Ok(devices) => devices
            .iter()
            .find(|d| d.device_id == binding.device_id)
            .and_then(|d| d.folders.iter().find(|f| f.alias == binding.folder))
            .is_some_and(|f| f.access == FolderAccess::ReadWrite),
        Err(error) => {
            tracing::info!(%error, "the bound folder's access is unknown; no patch tool this turn");
            false
        }
    }
}

/// Refuses a local call (or a binding) unless the person's live role on the project authors:
/// running commands and patches on a laptop folder is authoring, whatever a viewer or runner
/// may read.
pub fn require_authoring_role(access: &Access) -> Result<(), ToolError> {
    require_authoring_role_for(access, "running commands or patches in a laptop folder")
}

/// The operation a bound turn's call asks the device for: the shell, or a patch when the
/// folder is writable; any other name is an unknown tool.
pub fn operation(call: &ToolCall, mode: Mode) -> Result<Operation, ToolError> {
    Ok(match call.name.as_str() {
        "execute_shell_command" => {
            let args = arguments(call, &["command", "timeout"])?;
            let timeout = match args.get("timeout") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64().ok_or_else(|| {
                    ToolError::new(
                        "invalid_arguments",
                        "timeout must be a whole number of seconds (1 to 300)",
                    )
                })?),
            };
            Operation::ExecuteShellCommand {
                command: string(&args, "command")?,
                timeout,
            }
        }
        "diff_patch_workspace_file" if mode == (Mode::Local { writable: true }) => {
            let args = arguments(call, &["filepath", "diff"])?;
            Operation::DiffPatchWorkspaceFile {
                filepath: string(&args, "filepath")?,
                diff: string(&args, "diff")?,
            }
        }
        other => return Err(unknown_tool(other, mode)),
    })
}

/// Sends `operation` to the bound device once the person's live authority allows it, and
/// answers its result; a cancel meanwhile is passed on to the device.
pub async fn execute(
    service: &ChatService,
    caller: &Caller,
    project_id: &str,
    binding: &Binding,
    operation: Operation,
    request_id: &str,
    cancel: &CancellationToken,
) -> Result<Value, ToolError> {
    // The person's live authority on the project, now (revoked token, removed member,
    // a role lowered to runner or viewer).
    let (_, access) = service.files.access(caller, project_id).await?;
    require_authoring_role(&access)?;
    // A cancel while the device runs the call asks it to stop (the executor kills the
    // process group) and waits for the result, which says `cancelled`.
    let call = dispatch(service, caller, binding, request_id, operation, cancel);
    tokio::pin!(call);
    tokio::select! {
        result = &mut call => return result,
        _ = cancel.cancelled() => {}
    }
    loop {
        tokio::select! {
            result = &mut call => return result,
            asked = ask_device_to_cancel(service, caller, request_id) => {
                if asked {
                    return call.await;
                }
                tokio::time::sleep(CANCEL_RETRY).await;
            }
        }
    }
}

/// How soon a cancel is asked again when gatewayd did not yet know the request.
const CANCEL_RETRY: Duration = Duration::from_millis(100);

/// `POST /v1/cancel` on gatewayd: true once a cancel frame went to the device, or the request is
/// no longer pending (nothing left to stop).
async fn ask_device_to_cancel(service: &ChatService, caller: &Caller, request_id: &str) -> bool {
    let reference = RequestRef {
        user_id: caller.user_id.clone(),
        request_id: request_id.to_owned(),
    };
    match service
        .gatewayd
        .post::<_, CancelResponse>("/v1/cancel", &reference)
        .await
    {
        Ok(answer) => answer.cancel_sent || answer.state != DispatchState::Pending,
        // Not dispatched yet (404), or gatewayd unreachable: ask again shortly.
        Err(error) => {
            tracing::debug!(%error, request_id, "cancel not delivered yet");
            false
        }
    }
}

/// Whether a failed exchange with gatewayd may have reached it: anything but "could not
/// connect" or "could not build the request". gatewayd's own refusals come before it sends,
/// except `internal`.
fn may_have_been_sent(error: &ClientError) -> bool {
    match error {
        ClientError::Connect { .. } | ClientError::Request { .. } | ClientError::Encode { .. } => {
            false
        }
        ClientError::Remote { body, .. } => body.code == "internal",
        ClientError::Http { .. }
        | ClientError::Decode { .. }
        | ClientError::Unexpected { .. }
        | ClientError::Elsewhere { .. } => true,
    }
}

/// The first and the longest pause between two recovery questions to gatewayd.
const RECOVERY_PAUSE_MIN: Duration = Duration::from_millis(250);
const RECOVERY_PAUSE_MAX: Duration = Duration::from_secs(2);

/// The dispatch's answer was lost after it may have reached gatewayd: asks gatewayd to recover
/// it (its record, or the device's receipt) until `deadline`. Returns the real state, or an
/// error that says the outcome is unknown (or, when gatewayd never recorded it, that it was
/// never sent). Never re-sends the request.
async fn recover(
    service: &ChatService,
    request: &DispatchRequest,
    deadline: tokio::time::Instant,
    cancel: &CancellationToken,
    lost: ClientError,
) -> Result<DispatchState, ToolError> {
    tracing::warn!(error = %lost, request_id = %request.request_id, "the dispatch's answer was lost; recovering it");
    let unknown = |why: &str| {
        let mut error = ToolError::new(
            "outcome_unknown",
            format!(
                "the device gateway failed after the request was sent ({lost}); {why}: whether it ran on the device is unknown and it is not re-sent; inspect the files before trying again"
            ),
        );
        error
            .details
            .insert("request_id".into(), json!(request.request_id));
        error
    };
    let mut pause = RECOVERY_PAUSE_MIN;
    loop {
        let last = match service
            .gatewayd
            .post::<_, Recovery>("/v1/recover", request)
            .await
        {
            Ok(Recovery::Settled {
                state,
                from_receipt,
            }) => {
                tracing::info!(request_id = %request.request_id, from_receipt, "a lost dispatch answer was recovered");
                return Ok(state);
            }
            Ok(Recovery::NeverSent) => {
                let mut error = ToolError::new(
                    "not_run",
                    "the device gateway failed before it recorded the request, so it was never sent to the device (and never will be under this request id); it did not run",
                );
                error
                    .details
                    .insert("request_id".into(), json!(request.request_id));
                return Err(error);
            }
            Ok(Recovery::Unsettled { reason }) => reason,
            Err(ClientError::Remote { body, .. }) if body.code == "request_id_reused" => {
                return Err(ToolError {
                    code: body.code,
                    message: body.message,
                    details: body.details,
                });
            }
            Err(error) => format!("gatewayd cannot be asked ({error})"),
        };
        if tokio::time::Instant::now() + pause >= deadline {
            return Err(unknown(&format!(
                "it could not be recovered before the request's deadline ({last})"
            )));
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = cancel.cancelled() => {
                return Err(unknown(&format!("the turn was cancelled while it was being recovered ({last})")));
            }
        }
        pause = (pause * 2).min(RECOVERY_PAUSE_MAX);
    }
}

async fn dispatch(
    service: &ChatService,
    caller: &Caller,
    binding: &Binding,
    request_id: &str,
    operation: Operation,
    cancel: &CancellationToken,
) -> Result<Value, ToolError> {
    // The same deadline gatewayd keeps for the result; a lost answer is recovered until then.
    let deadline = tokio::time::Instant::now() + operation.deadline();
    // Said with a timed-out result, so its summary can name the limit it hit.
    let timeout_secs = match &operation {
        Operation::ExecuteShellCommand { timeout, .. } => timeout.unwrap_or(DEFAULT_TIMEOUT_SECS),
        Operation::DiffPatchWorkspaceFile { .. } => 0,
    };
    let request = DispatchRequest {
        user_id: caller.user_id.clone(),
        device_id: binding.device_id.clone(),
        folder: binding.folder.clone(),
        request_id: request_id.to_owned(),
        operation,
    };
    let state: DispatchState = match service.gatewayd.dispatch(&request).await {
        Ok(state) => state,
        Err(lost) if may_have_been_sent(&lost) => {
            recover(service, &request, deadline, cancel, lost).await?
        }
        Err(ClientError::Remote { body, .. }) => {
            return Err(ToolError {
                code: body.code,
                message: body.message,
                details: body.details,
            });
        }
        Err(other) => {
            return Err(ToolError::new(
                "gateway_unavailable",
                format!(
                    "the device gateway is not reachable ({other}); the call was not sent, so it was not run anywhere"
                ),
            ));
        }
    };
    let with_id = |mut error: ToolError| {
        error.details.insert("request_id".into(), json!(request_id));
        error
    };
    match state {
        DispatchState::Done { outcome } => match outcome {
            Outcome::Completed {
                stdout,
                stderr,
                exit_code,
                stdout_truncated,
                stderr_truncated,
                timed_out,
                cancelled,
                undone,
            } => {
                let mut result = json!({
                    "stdout": stdout, "stderr": stderr, "exit_code": exit_code,
                    "stdout_truncated": stdout_truncated, "stderr_truncated": stderr_truncated,
                    "timed_out": timed_out, "cancelled": cancelled, "request_id": request_id,
                });
                if timed_out {
                    result["timeout_secs"] = json!(timeout_secs);
                }
                // The laptop put back what the command changed in the project config that
                // makes the person's tools run programs: the model and the person see it.
                if !undone.is_empty() {
                    result["undone"] = json!(undone);
                }
                Ok(result)
            }
            Outcome::Patched { files } => Ok(json!({"files": files, "request_id": request_id})),
            Outcome::Refused { code, message } => Err(with_id(ToolError::new(code, message))),
            Outcome::Interrupted { message } => Err(with_id(ToolError::new(
                "interrupted",
                format!("{message}; inspect the files before trying again"),
            ))),
        },
        DispatchState::Pending => Err(with_id(ToolError::new(
            "outcome_unknown",
            "the request is still running on the device; inspect the files before trying again",
        ))),
        DispatchState::Unknown { reason } => Err(with_id(ToolError::new(
            "outcome_unknown",
            format!("{reason}; inspect the files before trying again"),
        ))),
    }
}
