//! agentd's tools on the MCP endpoint: the workflow-file catalog as an [`mcp::Backend`].
//!
//! [`Catalog`] turns an [`OperationRunner`] (who the caller is, which operations their live
//! roles allow, running one) into MCP tools: the two meta tools (`get_api_spec`, `call_tool`)
//! and one tool per effective operation, the token scopes each needs (a missing one is the
//! transport's HTTP 403 with a challenge), argument validation, and the shape of a result
//! (`structuredContent` plus its pretty-JSON text; a failure is `isError` with
//! `{"error": {code, message, …details}}`).
//!
//! Must never widen access: an operation is offered and run only when both the runner allows it
//! and the token carries one of its scopes, and the runner still resolves the caller's live
//! access on every call.
//!
//! `table` (the operations, schemas, scopes and annotations) is pure.

mod table;

pub use table::{Operation, WORKFLOW_SCOPES};

use crate::mcp::{self, Admission, AuthError, CallError, Caller, RequestContext, ToolError};
use serde_json::{Map, Value, json};
use table::{CALL_TOOL, GET_API_SPEC};

/// What a model reading the server's `instructions` should know first.
pub const INSTRUCTIONS: &str = "agentworks workflow files. Call get_api_spec for the operations this token may use. \
Read a file before writing it: write_file needs the revision read_file returned (or \"missing\" to create) \
and a fresh request_id; retry a write with the same request_id.";

/// What runs the catalog's operations: agentd's identity store and file tools, or a test's
/// fake. It never sees the meta tools or a call the token's scopes do not cover.
pub trait OperationRunner: Send + Sync + 'static {
    /// Resolves the bearer token (`None` when the request carried none).
    fn authenticate(
        &self,
        bearer: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Caller, AuthError>> + Send;
    /// The operations this caller's live roles and policy allow right now (the catalog
    /// separately enforces the token's scopes).
    fn allowed_operations(
        &self,
        caller: &Caller,
    ) -> impl std::future::Future<Output = Vec<Operation>> + Send;
    /// Runs one operation with arguments already checked against its schema.
    fn call(
        &self,
        caller: &Caller,
        operation: Operation,
        arguments: Map<String, Value>,
    ) -> impl std::future::Future<Output = Result<Value, ToolError>> + Send;
}

/// The catalog over a runner.
pub struct Catalog<R> {
    runner: R,
}

impl<R: OperationRunner> Catalog<R> {
    pub fn new(runner: R) -> Catalog<R> {
        Catalog { runner }
    }

    /// The operations this caller may use right now: the runner's ∩ the token's scopes.
    async fn effective_operations(&self, caller: &Caller) -> Vec<Operation> {
        let allowed = self.runner.allowed_operations(caller).await;
        table::effective_operations(caller, &allowed)
    }

    /// Runs one catalog operation after the scope, live-permission and argument checks.
    async fn call_operation(
        &self,
        caller: &Caller,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<Result<Value, ToolError>, CallError> {
        let Some(operation) = Operation::from_name(name) else {
            let mut error = ToolError::new(
                "unknown_tool",
                format!("there is no operation named {name:?}; get_api_spec lists them"),
            );
            error.details.insert("name".to_owned(), json!(name));
            return Ok(Err(error));
        };
        // Scope first: no token scope can be widened by the runner, and the client needs the
        // 403 challenge to ask for a better token.
        if !table::has_any_scope(caller, operation.scopes()) {
            let scope = operation
                .scopes()
                .first()
                .copied()
                .unwrap_or(WORKFLOW_SCOPES[0]);
            return Err(CallError::InsufficientScope(scope.to_owned()));
        }
        if !self
            .runner
            .allowed_operations(caller)
            .await
            .contains(&operation)
        {
            // Live permissions (role, policy) refuse it: the stable code is `forbidden`.
            let mut error = ToolError::new(
                "forbidden",
                format!(
                    "{} is not allowed for {} right now (no project grants it)",
                    operation.name(),
                    caller.user_name
                ),
            );
            error
                .details
                .insert("name".to_owned(), json!(operation.name()));
            error
                .details
                .insert("reason".to_owned(), json!("operation_not_allowed"));
            return Ok(Err(error));
        }
        if let Err(error) = table::validate_arguments(&operation.input_schema(), &arguments) {
            return Ok(Err(error));
        }
        Ok(self.runner.call(caller, operation, arguments).await)
    }
}

impl<R: OperationRunner> mcp::Backend for Catalog<R> {
    async fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, Admission> {
        let caller = self.runner.authenticate(bearer).await?;
        // The endpoint needs a workflows scope at all (a `devices:connect` token has none).
        if !table::has_any_scope(&caller, &WORKFLOW_SCOPES) {
            return Err(Admission::InsufficientScope(WORKFLOW_SCOPES[0].to_owned()));
        }
        Ok(caller)
    }

    async fn list_tools(&self, request: RequestContext<'_>) -> Vec<Value> {
        table::tool_list(&self.effective_operations(request.caller).await)
    }

    /// A meta tool or an operation. Tool failures are results with `isError`; a tool outside
    /// the catalog too (an agent that mistypes a name reads why); only a missing scope is an
    /// HTTP refusal.
    async fn call_tool(
        &self,
        request: RequestContext<'_>,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<mcp::ToolResult, CallError> {
        let caller = request.caller;
        let outcome = if let Some(schema) = table::meta_schema(name) {
            if let Err(error) = table::validate_arguments(&schema, &arguments) {
                Err(error)
            } else if name == GET_API_SPEC {
                Ok(table::api_spec(&self.effective_operations(caller).await))
            } else {
                debug_assert_eq!(name, CALL_TOOL);
                let target = arguments
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let inner = match arguments.get("arguments") {
                    Some(Value::Object(inner)) => inner.clone(),
                    _ => Map::new(),
                };
                self.call_operation(caller, target, inner).await?
            }
        } else {
            self.call_operation(caller, name, arguments).await?
        };
        Ok(tool_result(outcome))
    }
}

/// A `tools/call` result: `structuredContent` plus a pretty-JSON text rendering; failures carry
/// `isError: true` and `{"error": {code, message, ...details}}`.
fn tool_result(outcome: Result<Value, ToolError>) -> mcp::ToolResult {
    let (structured, is_error) = match outcome {
        Ok(value) => (value, false),
        Err(error) => {
            let mut body = error.details;
            // Written last, so a detail cannot forge them.
            body.insert("code".to_owned(), Value::String(error.code));
            body.insert("message".to_owned(), Value::String(error.message));
            (json!({ "error": body }), true)
        }
    };
    let text = serde_json::to_string_pretty(&structured).unwrap_or_default();
    mcp::ToolResult {
        content: vec![json!({"type": "text", "text": text})],
        structured_content: Some(structured),
        is_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_errors_put_code_and_message_last_so_details_cannot_forge_them() {
        let mut error = ToolError::new("revision_conflict", "changed");
        error
            .details
            .insert("current_revision".into(), json!("sha256:ab"));
        error.details.insert("code".into(), json!("forged"));
        let result = tool_result(Err(error));
        assert!(result.is_error);
        let structured = result.structured_content.unwrap();
        assert_eq!(structured["error"]["code"], "revision_conflict");
        assert_eq!(structured["error"]["current_revision"], "sha256:ab");
        let text: Value =
            serde_json::from_str(result.content[0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text, structured);
    }
}
