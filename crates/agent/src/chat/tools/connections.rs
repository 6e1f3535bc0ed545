//! The project's MCP connections' tools in a server-mode turn, through
//! [`ConnectionTools`], the one way from a chat to the connections: opened at the turn's start
//! for the turn's person and project ([`open`]: none for a viewer or a runner, and no word of
//! them), and each call checked again there ([`call`]: the person's live role, the connection
//! still in the project). A turn bound to a laptop folder never comes here.

use crate::chat::model::ToolCall;
use crate::connections::{ConnectionTools, TurnConnections};
use crate::mcp::{Caller, ToolError};
use serde_json::Value;

/// The connections a server-mode turn of `caller` in `project_id` may use now, opened.
pub async fn open(tools: &ConnectionTools, caller: &Caller, project_id: &str) -> TurnConnections {
    tools.for_turn(caller, project_id).await
}

/// One call of a connection's tool the turn offers (`remote`).
pub async fn call(
    tools: &ConnectionTools,
    remote: &TurnConnections,
    caller: &Caller,
    project_id: &str,
    call: &ToolCall,
) -> Result<Value, ToolError> {
    let arguments = serde_json::from_str(&call.arguments).map_err(|e| {
        ToolError::new(
            "invalid_arguments",
            format!("the arguments are not JSON: {e}"),
        )
    })?;
    tools
        .call(remote, caller, project_id, &call.name, arguments)
        .await
}
