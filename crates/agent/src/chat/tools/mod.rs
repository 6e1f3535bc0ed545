//! A chat turn's tools: one file per kind of tool, and one executor for them all.
//!
//! - [`server_files`]: a server-mode turn's `read_file`, `list_files`, `search_files` and
//!   `write_file` on the chat's project.
//! - [`laptop`]: a turn bound to a laptop folder: `execute_shell_command` and
//!   `diff_patch_workspace_file`, through gatewayd on the person's device.
//! - [`connections`]: the project's MCP connections' tools, in a server-mode turn of an
//!   authoring role.
//! - [`images`]: `read_image`, the images attached to the turn's message.
//! - [`executor`]: the [`Toolset`] a turn is given at its start and the one executor of its
//!   calls, which every driver of a turn calls: the model loop for each call the model asks
//!   for, and a coding CLI's driver for each call of a connection's tool through its bridge.
//!
//! The tool list is fixed when the turn starts, from the chat's binding:
//!
//! - server mode (no binding): exactly `read_file`, `list_files`, `search_files`, `write_file`,
//!   through [`FileTools`](crate::catalog::files::FileTools) with the person's live authority
//!   (source `agent`); the project is always the chat's, and write request ids are made here,
//!   never by the model; and, for a person whose live role authors (owner, co-owner, editor),
//!   the project's MCP connections' tools (none, and no word of them, for a viewer or a runner);
//! - bound to a laptop folder: exactly `execute_shell_command {command, timeout?}` and
//!   `diff_patch_workspace_file {filepath, diff}` (the bridge schemas: no device, folder or
//!   project argument), dispatched through gatewayd to the bound device and folder with
//!   server-made request ids; the patch tool only when the device's folder list at the turn's
//!   start says the folder is shared writable (a read-only folder, or one whose access cannot
//!   be learned, gets the shell tool alone). Nothing else exists in such a turn: no server file
//!   tools, no MCP connections, no secrets. An offline device fails the call
//!   (`device_offline`); nothing ever falls back to the server.
//!
//! `read_image` is offered, in both modes, only to a turn whose message carries an image: it
//! reads server uploads, not the laptop, so it is the one tool a bound turn has beside the two
//! local ones.
//!
//! This file holds what every kind shares: the turn's [`Mode`], a tool's definition, and the
//! checks of a call's arguments.
//!
//! May call: the chat service (its stores, gatewayd's client), `catalog::files`, and the
//! connections through [`ConnectionTools`](crate::connections::ConnectionTools) only. Never a
//! turn's driver: the drivers call the tools.

pub mod connections;
pub mod executor;
pub mod images;
pub mod laptop;
pub mod server_files;

pub use executor::{CallState, MAX_SUMMARY_CHARS, Toolset, call_state};

use crate::chat::model::ToolCall;
use crate::mcp::ToolError;
use serde_json::{Map, Value, json};

/// What a turn may call, fixed at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No binding: the four server file tools.
    Server,
    /// Bound to a laptop folder: the shell, and the patch tool if the folder is writable.
    Local { writable: bool },
}

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required,
           "additionalProperties": false})
}

fn tool(name: &str, description: &str, parameters: Value) -> Value {
    json!({"type": "function",
           "function": {"name": name, "description": description, "parameters": parameters}})
}

/// The arguments as an object with only `allowed` keys.
fn arguments(call: &ToolCall, allowed: &[&str]) -> Result<Map<String, Value>, ToolError> {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&call.arguments) else {
        return Err(ToolError::new(
            "invalid_arguments",
            "the arguments must be a JSON object",
        ));
    };
    if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ToolError::new(
            "invalid_arguments",
            format!(
                "unknown argument {unknown:?}; {} takes only {}",
                call.name,
                allowed.join(", ")
            ),
        ));
    }
    Ok(map)
}

fn string(map: &Map<String, Value>, name: &str) -> Result<String, ToolError> {
    map.get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            ToolError::new(
                "invalid_arguments",
                format!("the argument {name:?} (a string) is required"),
            )
        })
}

fn unknown_tool(name: &str, mode: Mode) -> ToolError {
    let available = match mode {
        Mode::Local { writable: true } => "execute_shell_command and diff_patch_workspace_file",
        Mode::Local { writable: false } => {
            "execute_shell_command (the folder is shared read-only: no patches)"
        }
        Mode::Server => "read_file, list_files, search_files and write_file",
    };
    ToolError::new(
        "unknown_tool",
        format!("there is no tool {name:?} in this turn; the tools are {available}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_refuse_unknown_keys() {
        let call = |args: &str| ToolCall {
            id: "c".into(),
            name: "execute_shell_command".into(),
            arguments: args.into(),
        };
        assert!(arguments(&call(r#"{"command":"ls"}"#), &["command", "timeout"]).is_ok());
        let err =
            arguments(&call(r#"{"command":"ls","device_id":"d"}"#), &["command"]).unwrap_err();
        assert_eq!(err.code, "invalid_arguments");
        assert!(arguments(&call("[1]"), &["command"]).is_err());
    }
}
