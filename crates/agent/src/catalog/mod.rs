//! agentd's tools on the MCP endpoint: the workflow-file catalog as an [`mcp::Backend`].
//!
//! [`Catalog`] turns an [`OperationRunner`] (who the caller is, which operations their live
//! roles allow, running one) into MCP tools: the two meta tools (`get_api_spec`, `call_tool`)
//! and one tool per effective operation, the token scopes each needs (a missing one is the
//! transport's HTTP 403 with a challenge), argument validation, and the shape of a result
//! (`structuredContent` plus its pretty-JSON text; a failure is `isError` with
//! `{"error": {code, message, …details}}`; a tool name outside the catalog is
//! [`CallError::UnknownTool`], JSON-RPC -32602).
//!
//! Must never widen access: an operation is offered and run only when both the runner allows it
//! and the token carries one of its scopes, and the runner still resolves the caller's live
//! access on every call.
//!
//! Files: `table` (the operations, schemas, scopes and annotations; pure); `resources` (project
//! files as MCP resources, read through the catalog's own operations); [`backend`] (agentd's
//! [`OperationRunner`]: token authentication against the identity store and dispatch to the file
//! tools); [`files`] (the file operations for one caller, through workspaced, which the chats'
//! server-file tools use too).
//!
//! May call: `mcp` (the transport's types), `identity` (live access), the workspaced client.
//! Never calls chats or connections.

pub mod backend;
pub mod files;
mod resources;
mod table;

pub use table::{
    EDIT_FILE_MAX_EDITS, LIST_FILES_MAX_DEPTH, LIST_FILES_MAX_ENTRIES, LIST_FILES_MAX_EXCLUDES,
    Operation, READ_FILES_MAX_PATHS, WORKFLOW_SCOPES,
};

use std::borrow::Cow;

use crate::mcp::{self, Admission, AuthError, CallError, Caller, RequestContext, ToolError};
use serde_json::{Map, Value, json};
use table::{CALL_TOOL, GET_API_SPEC};

/// What a model reading the server's `instructions` should know first.
pub const INSTRUCTIONS: &str = "agentworks workflow files. Call get_api_spec for the operations this token may use. \
Read a file (or get_file_info) before changing it: write_file, edit_file, move_file and delete_file need its current revision \
(write_file takes \"missing\" to create) and a fresh request_id; retry a change with the same request_id. \
Prefer edit_file (exact-text replacements, dry_run to preview the diff) over rewriting a whole file.";

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
        operation: Operation,
        arguments: Map<String, Value>,
    ) -> Result<Result<Value, ToolError>, CallError> {
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
        if let Err(error) = table::validate_arguments(operation.cached_input_schema(), &arguments) {
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

    /// A meta tool or an operation. Tool failures are results with `isError`, and so is a name
    /// `call_tool` does not know (an agent that mistypes one reads why); a tool outside the
    /// catalog is [`CallError::UnknownTool`] (JSON-RPC -32602, as the specification asks) and a
    /// missing scope an HTTP refusal.
    async fn call_tool(
        &self,
        request: RequestContext<'_>,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<mcp::ToolResult, CallError> {
        self.call(request.caller, name, arguments).await
    }

    /// A tool's schema is the same for every caller (what differs is whether they have the
    /// tool, which the call itself checks): no identity lookup for the header check of each
    /// call. None of them annotates `x-mcp-header`. Each schema is the one built once for
    /// argument checks: building it for each call cost about a twentieth of agentd's time per
    /// `write_file`.
    async fn tool_input_schema(
        &self,
        _request: RequestContext<'_>,
        name: &str,
    ) -> Option<Cow<'static, Value>> {
        table::meta_schema(name)
            .or_else(|| Operation::from_name(name).map(Operation::cached_input_schema))
            .map(Cow::Borrowed)
    }

    /// Project files are resources (see [`resources`]); nothing else beyond tools is served.
    fn features(&self) -> mcp::Features {
        mcp::Features {
            resources: true,
            ..mcp::Features::default()
        }
    }

    async fn list_resources(
        &self,
        request: RequestContext<'_>,
        cursor: Option<&str>,
    ) -> Result<mcp::Page, CallError> {
        resources::page(self, request.caller, cursor).await
    }

    async fn list_resource_templates(
        &self,
        _request: RequestContext<'_>,
        _cursor: Option<&str>,
    ) -> Result<mcp::Page, CallError> {
        Ok(mcp::Page {
            items: vec![resources::template()],
            next_cursor: None,
            cache: mcp::CacheHint::default(),
        })
    }

    async fn read_resource(
        &self,
        request: RequestContext<'_>,
        uri: &str,
    ) -> Result<mcp::ResourceContents, CallError> {
        resources::read(self, request.caller, uri).await
    }
}

/// The resources reach the files through the catalog's own operations, with every check.
impl<R: OperationRunner> resources::Operations for Catalog<R> {
    async fn run(
        &self,
        caller: &Caller,
        operation: Operation,
        arguments: Map<String, Value>,
    ) -> Result<Result<Value, ToolError>, CallError> {
        self.call_operation(caller, operation, arguments).await
    }
}

impl<R: OperationRunner> Catalog<R> {
    /// `tools/call` of `name` for `caller`: a meta tool or an operation (see
    /// [`mcp::Backend::call_tool`] above for which failure takes which shape).
    async fn call(
        &self,
        caller: &Caller,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<mcp::ToolResult, CallError> {
        let outcome = if let Some(schema) = table::meta_schema(name) {
            if let Err(error) = table::validate_arguments(schema, &arguments) {
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
                match Operation::from_name(target) {
                    Some(operation) => self.call_operation(caller, operation, inner).await?,
                    None => Err(unknown_operation(target)),
                }
            }
        } else {
            let operation = Operation::from_name(name)
                .ok_or_else(|| CallError::UnknownTool(name.to_owned()))?;
            self.call_operation(caller, operation, arguments).await?
        };
        Ok(tool_result(outcome))
    }
}

/// `call_tool` naming no operation: a tool error the model reads, naming what it asked for.
fn unknown_operation(name: &str) -> ToolError {
    let mut error = ToolError::new(
        "unknown_tool",
        format!("there is no operation named {name:?}; get_api_spec lists them"),
    );
    error.details.insert("name".to_owned(), json!(name));
    error
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

    /// Runs nothing: answers which operation it was asked for, with the arguments it got.
    struct EchoRunner;

    impl OperationRunner for EchoRunner {
        async fn authenticate(&self, _bearer: Option<&str>) -> Result<Caller, AuthError> {
            Err(AuthError::Missing)
        }
        async fn allowed_operations(&self, _caller: &Caller) -> Vec<Operation> {
            Operation::ALL.to_vec()
        }
        async fn call(
            &self,
            _caller: &Caller,
            operation: Operation,
            arguments: Map<String, Value>,
        ) -> Result<Value, ToolError> {
            Ok(json!({"ran": operation.name(), "arguments": arguments}))
        }
    }

    fn caller(scopes: &[&str]) -> Caller {
        Caller {
            token_id: "t".into(),
            user_id: "u".into(),
            user_name: "user".into(),
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            reach: None,
        }
    }

    #[tokio::test]
    async fn the_header_check_reads_the_schema_tools_list_publishes_without_a_lookup() {
        use crate::mcp::{Backend, Era, Notifier};
        let catalog = Catalog::new(EchoRunner);
        let caller = caller(&["workflows:write"]);
        let (capabilities, notifier) = (Map::new(), Notifier::silent());
        let request = RequestContext {
            caller: &caller,
            era: Era::Modern,
            client_capabilities: &capabilities,
            notifier: &notifier,
            input_responses: None,
            request_state: None,
        };
        let tools = catalog.list_tools(request).await;
        assert_eq!(tools.len(), Operation::ALL.len() + 2);
        for tool in &tools {
            let name = tool["name"].as_str().unwrap();
            let schema = catalog.tool_input_schema(request, name).await;
            assert_eq!(schema.as_deref(), Some(&tool["inputSchema"]), "{name}");
            assert!(
                !schema.unwrap().to_string().contains("x-mcp-header"),
                "{name}"
            );
        }
        assert_eq!(
            catalog.tool_input_schema(request, "format_disk").await,
            None
        );
    }

    /// The least value `schema` accepts: its required properties, an array's fewest items.
    fn minimal(schema: &Value) -> Value {
        match schema["type"].as_str() {
            Some("string") => json!("x"),
            Some("integer") => schema.get("minimum").cloned().unwrap_or(json!(1)),
            Some("boolean") => json!(false),
            Some("array") => {
                let count = schema["minItems"].as_u64().unwrap_or(0) as usize;
                Value::Array(vec![minimal(&schema["items"]); count])
            }
            Some("object") => {
                let mut object = Map::new();
                for name in schema["required"].as_array().into_iter().flatten() {
                    let name = name.as_str().unwrap();
                    object.insert(name.into(), minimal(&schema["properties"][name]));
                }
                Value::Object(object)
            }
            other => panic!("no minimal value for {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_unknown_tool_is_a_protocol_error_but_an_unknown_call_tool_name_a_tool_error() {
        let catalog = Catalog::new(EchoRunner);
        let writer = caller(&["workflows:write"]);
        assert_eq!(
            catalog.call(&writer, "format_disk", Map::new()).await,
            Err(CallError::UnknownTool("format_disk".into()))
        );
        let args = json!({"name": "format_disk"}).as_object().cloned().unwrap();
        let result = catalog.call(&writer, CALL_TOOL, args).await.unwrap();
        assert!(result.is_error);
        let error = &result.structured_content.unwrap()["error"];
        assert_eq!(error["code"], "unknown_tool");
        assert_eq!(error["name"], "format_disk");
    }

    #[tokio::test]
    async fn every_operation_is_reachable_directly_and_through_call_tool() {
        let catalog = Catalog::new(EchoRunner);
        let writer = caller(&["workflows:write"]);
        for op in Operation::ALL {
            let arguments = minimal(&op.input_schema()).as_object().cloned().unwrap();
            let direct = catalog
                .call(&writer, op.name(), arguments.clone())
                .await
                .unwrap();
            assert!(!direct.is_error, "{}: {direct:?}", op.name());
            let via = json!({"name": op.name(), "arguments": arguments});
            let via = catalog
                .call(&writer, CALL_TOOL, via.as_object().cloned().unwrap())
                .await
                .unwrap();
            assert!(!via.is_error, "{}: {via:?}", op.name());
            assert_eq!(direct.structured_content, via.structured_content);
            assert_eq!(via.structured_content.unwrap()["ran"], op.name());
        }
    }

    #[tokio::test]
    async fn a_change_through_call_tool_needs_the_write_scope_like_its_own_tool() {
        let catalog = Catalog::new(EchoRunner);
        let reader = caller(&["workflows:read"]);
        for op in Operation::ALL.into_iter().filter(|op| op.is_change()) {
            let arguments = minimal(&op.input_schema()).as_object().cloned().unwrap();
            let refused = Err(CallError::InsufficientScope("workflows:write".into()));
            assert_eq!(
                catalog.call(&reader, op.name(), arguments.clone()).await,
                refused
            );
            let via = json!({"name": op.name(), "arguments": arguments});
            assert_eq!(
                catalog
                    .call(&reader, CALL_TOOL, via.as_object().cloned().unwrap())
                    .await,
                refused
            );
        }
        // The reader's spec lists no change at all.
        let spec = catalog
            .call(&reader, GET_API_SPEC, Map::new())
            .await
            .unwrap();
        let spec = spec.structured_content.unwrap();
        let names: Vec<&str> = spec["operations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"read_files") && names.contains(&"get_file_info"));
        assert!(
            !names
                .iter()
                .any(|n| Operation::from_name(n).unwrap().is_change())
        );
    }

    #[tokio::test]
    async fn invalid_arguments_never_reach_the_runner() {
        let catalog = Catalog::new(EchoRunner);
        let writer = caller(&["workflows:write"]);
        let args = json!({"workflow_id": "w", "path": "a", "expected_revision": "r", "request_id": "q",
                          "edits": [{"old_text": "a", "new_text": "b", "fuzzy": true}]});
        let result = catalog
            .call(&writer, "edit_file", args.as_object().cloned().unwrap())
            .await
            .unwrap();
        assert!(result.is_error);
        let error = &result.structured_content.unwrap()["error"];
        assert_eq!(error["code"], "invalid_arguments");
        assert_eq!(error["field"], "edits[0].fuzzy");
    }

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
