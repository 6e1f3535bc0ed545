//! The MCP conformance fixture: agentd's production MCP transport (`agentworks_agent::mcp`:
//! the same router, header ladder, both eras, legacy sessions, error mapping) and its public
//! listener (`serve_public`: the same limits and refusals), over a backend that serves the
//! fixture tools, resources, prompts and completions the official conformance suite
//! (`@modelcontextprotocol/conformance`) calls by name, with the exact content its scenarios
//! expect: progress and log notifications, a tool needing an undeclared capability, and the
//! input-required tools (asked as `input_required` on 2026-07-28, as server-to-client requests
//! in 2025, both by the transport from the same backend answer).
//!
//! A test artefact only: it is an example, so no package installs it. It listens on loopback
//! only and accepts any request without a token (the suite cannot send one); agentd's own
//! endpoint, with its tokens, is checked by the same suite separately in `.ci/run`.
//!
//! Run: `cargo run --example mcp_conformance_fixture -- [PORT]` (0 or none: any free port).
//! It prints `listening on http://127.0.0.1:PORT/mcp` once it accepts connections and serves
//! until SIGINT or SIGTERM.

use agentworks_agent::mcp::{
    Admission, Backend, CacheHint, CallError, Caller, Completion, CompletionRef, Features,
    InputRequired, LogLevel, McpConfig, McpService, Page, PromptResult, RequestContext,
    ResourceContents, ToolResult,
};
use agentworks_daemon::ipc::connections::ConnectionLimits;
use agentworks_daemon::ipc::server::{BodyRefusal, PublicLimits, Screen, Verdict, serve_public};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A 1×1 red PNG, as the suite's reference server sends it.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV, as the suite's reference server sends it.
const WAV: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";
/// The largest request body the fixture reads.
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The fixture's tools, resources, prompts and completions: the names the suite calls and
/// the content it checks.
struct FixtureBackend;

/// The direct resources, paged [`RESOURCES_PER_PAGE`] at a time: (uri, name, title, mimeType).
const RESOURCES: [(&str, &str, &str, &str); 4] = [
    (
        "test://static-text",
        "static-text",
        "Static Text Resource",
        "text/plain",
    ),
    (
        "test://static-binary",
        "static-binary",
        "Static Binary Resource",
        "image/png",
    ),
    (
        "test://watched-resource",
        "watched-resource",
        "Watched Resource",
        "text/plain",
    ),
    (
        "test://stateless-static-text",
        "stateless-static-text",
        "Stateless Static Text Resource",
        "text/plain",
    ),
];
const RESOURCES_PER_PAGE: usize = 3;
/// Lists and reads of the fixture are the same for everybody and never change.
const PUBLIC_FIVE_MINUTES: CacheHint = CacheHint {
    ttl_ms: 300_000,
    public: true,
};

fn elicitation(message: &str, properties: Value, required: &[&str]) -> Value {
    json!({"method": "elicitation/create", "params": {"message": message,
        "requestedSchema": {"type": "object", "properties": properties, "required": required}}})
}

fn sampling(text: &str, max_tokens: u32) -> Value {
    json!({"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        "maxTokens": max_tokens}})
}

fn roots() -> Value {
    json!({"method": "roots/list", "params": {}})
}

/// Asks for `requests` (key, request), carrying `state` to the retry.
fn ask(requests: Vec<(&str, Value)>, state: Option<Value>) -> CallError {
    CallError::InputRequired(InputRequired {
        requests: requests
            .into_iter()
            .map(|(key, request)| (key.to_owned(), request))
            .collect(),
        state,
    })
}

/// The client's answer for `key`, if it sent one.
fn answer<'a>(request: &RequestContext<'a>, key: &str) -> Option<&'a Value> {
    request
        .input_responses
        .and_then(|responses| responses.get(key))
}

/// An accepted elicitation's `content.<field>`, as text.
fn elicited(answer: &Value, field: &str) -> String {
    match &answer["content"][field] {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn declared(request: &RequestContext<'_>, capability: &str) -> bool {
    request.client_capabilities.contains_key(capability)
}

fn tool(name: &str, description: &str, input_schema: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": input_schema})
}

fn no_arguments() -> Value {
    json!({"type": "object", "properties": {}})
}

fn text(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

fn content(items: Vec<Value>) -> ToolResult {
    ToolResult {
        content: items,
        structured_content: None,
        is_error: false,
    }
}

/// `json_schema_2020_12_tool`'s input schema, which the suite checks is passed through
/// verbatim (`$schema`, `$defs`, `$anchor`, composition and conditional keywords).
fn json_schema_2020_12() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {"address": {"$anchor": "addressDef", "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"},
            "contactMethod": {"type": "string", "enum": ["phone", "email"]},
            "phone": {"type": "string"},
            "email": {"type": "string"},
        },
        "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
        "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
        "then": {"required": ["phone"]},
        "else": {"required": ["email"]},
        "additionalProperties": false,
    })
}

impl Backend for FixtureBackend {
    async fn authenticate(&self, _bearer: Option<&str>) -> Result<Caller, Admission> {
        Ok(Caller {
            token_id: "conformance".into(),
            user_id: "conformance".into(),
            user_name: "conformance".into(),
            scopes: Vec::new(),
            reach: None,
        })
    }

    async fn list_tools(&self, _request: RequestContext<'_>) -> Vec<Value> {
        vec![
            tool(
                "test_simple_text",
                "Returns a simple text response.",
                no_arguments(),
            ),
            tool("test_image_content", "Returns an image.", no_arguments()),
            tool(
                "test_audio_content",
                "Returns an audio clip.",
                no_arguments(),
            ),
            tool(
                "test_embedded_resource",
                "Returns an embedded resource.",
                no_arguments(),
            ),
            tool(
                "test_multiple_content_types",
                "Returns text, an image and a resource.",
                no_arguments(),
            ),
            tool(
                "test_error_handling",
                "Always fails, as a tool result.",
                no_arguments(),
            ),
            tool(
                "json_schema_2020_12_tool",
                "Has a JSON Schema 2020-12 input schema.",
                json_schema_2020_12(),
            ),
            tool(
                "test_tool_with_progress",
                "Reports progress 0, 50 and 100 of 100.",
                no_arguments(),
            ),
            tool(
                "test_tool_with_logging",
                "Logs three info messages.",
                no_arguments(),
            ),
            tool(
                "test_logging_tool",
                "Logs one info message.",
                no_arguments(),
            ),
            tool(
                "test_missing_capability",
                "Needs the client's sampling capability.",
                no_arguments(),
            ),
            tool(
                "test_streaming_elicitation",
                "Asks for input by elicitation, never by a request on the stream.",
                no_arguments(),
            ),
            tool(
                "test_sampling",
                "Asks the client's model.",
                json!({"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}),
            ),
            tool(
                "test_elicitation",
                "Asks the user.",
                json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}),
            ),
            tool(
                "test_elicitation_sep1034_defaults",
                "Asks the user with defaults.",
                no_arguments(),
            ),
            tool(
                "test_elicitation_sep1330_enums",
                "Asks the user with enums.",
                no_arguments(),
            ),
            tool(
                "test_input_required_result_elicitation",
                "Asks for a name.",
                no_arguments(),
            ),
            tool(
                "test_input_required_result_sampling",
                "Asks the client's model.",
                no_arguments(),
            ),
            tool(
                "test_input_required_result_list_roots",
                "Asks for the client's roots.",
                no_arguments(),
            ),
            tool(
                "test_input_required_result_request_state",
                "Asks for confirmation, carrying state.",
                no_arguments(),
            ),
            tool(
                "test_input_required_result_multiple_inputs",
                "Asks for three inputs at once.",
                no_arguments(),
            ),
            tool(
                "test_input_required_result_multi_round",
                "Asks twice.",
                no_arguments(),
            ),
            tool(
                "test_input_required_result_tampered_state",
                "Asks for confirmation with sealed state.",
                no_arguments(),
            ),
            tool(
                "test_input_required_result_capabilities",
                "Asks only for what the client declared.",
                no_arguments(),
            ),
            // SEP-2243 custom headers (`http-custom-header-server-validation`): the transport
            // refuses a 2026-07-28 call whose Mcp-Param-Region header does not mirror `region`.
            // Last, since `http-header-validation` calls the first tool with no arguments.
            tool(
                "test_custom_header_param",
                "Echoes its region, which clients mirror as the Mcp-Param-Region header.",
                json!({"type": "object", "properties": {"region": {"type": "string",
                    "description": "Mirrored as Mcp-Param-Region.", "x-mcp-header": "Region"}},
                    "required": ["region"]}),
            ),
        ]
    }

    async fn call_tool(
        &self,
        request: RequestContext<'_>,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<ToolResult, CallError> {
        let notifier = request.notifier;
        let argument = |key: &str| {
            arguments
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Ok(match name {
            "test_tool_with_progress" => {
                for step in [0u32, 50, 100] {
                    if step > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let message = format!("Completed step {step} of 100");
                    notifier.progress(f64::from(step), Some(100.0), Some(&message));
                }
                content(vec![text("Progress complete")])
            }
            "test_tool_with_logging" => {
                for (i, message) in [
                    "Tool execution started",
                    "Tool processing data",
                    "Tool execution completed",
                ]
                .into_iter()
                .enumerate()
                {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    notifier.log(LogLevel::Info, Some("conformance"), json!(message));
                }
                content(vec![text("Tool with logging executed successfully")])
            }
            "test_logging_tool" => {
                notifier.log(
                    LogLevel::Info,
                    Some("conformance"),
                    json!("test_logging_tool ran"),
                );
                content(vec![text("Logged (if a log level was asked for)")])
            }
            "test_missing_capability" => {
                if !declared(&request, "sampling") {
                    let mut required = Map::new();
                    required.insert("sampling".to_owned(), json!({}));
                    return Err(CallError::MissingCapability(required));
                }
                content(vec![text("The client declared sampling")])
            }
            "test_streaming_elicitation" => match answer(&request, "confirm") {
                None => {
                    return Err(ask(
                        vec![(
                            "confirm",
                            elicitation("Continue?", json!({"ok": {"type": "boolean"}}), &["ok"]),
                        )],
                        None,
                    ));
                }
                Some(reply) => content(vec![text(&format!("ok={}", elicited(reply, "ok")))]),
            },
            "test_sampling" => match answer(&request, "sampling") {
                None => {
                    return Err(ask(
                        vec![("sampling", sampling(&argument("prompt"), 100))],
                        None,
                    ));
                }
                Some(reply) => content(vec![text(&format!(
                    "LLM response: {}",
                    reply["content"]["text"].as_str().unwrap_or_default()
                ))]),
            },
            "test_elicitation" => match answer(&request, "elicitation") {
                None => {
                    return Err(ask(
                        vec![(
                            "elicitation",
                            elicitation(
                                &argument("message"),
                                json!({"username": {"type": "string"}, "email": {"type": "string"}}),
                                &["username", "email"],
                            ),
                        )],
                        None,
                    ));
                }
                Some(reply) => content(vec![text(&format!(
                    "User response: action={}, content={}",
                    reply["action"].as_str().unwrap_or_default(),
                    reply["content"]
                ))]),
            },
            "test_elicitation_sep1034_defaults" => match answer(&request, "elicitation") {
                None => {
                    return Err(ask(
                        vec![(
                            "elicitation",
                            elicitation(
                                "Please review and update the form fields with defaults",
                                json!({
                                    "name": {"type": "string", "description": "User name", "default": "John Doe"},
                                    "age": {"type": "integer", "description": "User age", "default": 30},
                                    "score": {"type": "number", "description": "User score", "default": 95.5},
                                    "status": {"type": "string", "description": "User status",
                                        "enum": ["active", "inactive", "pending"], "default": "active"},
                                    "verified": {"type": "boolean", "description": "Verification status", "default": true},
                                }),
                                &[],
                            ),
                        )],
                        None,
                    ));
                }
                Some(reply) => content(vec![text(&format!("Elicitation result: {reply}"))]),
            },
            "test_elicitation_sep1330_enums" => match answer(&request, "elicitation") {
                None => {
                    return Err(ask(
                        vec![(
                            "elicitation",
                            elicitation(
                                "Please select options from the enum fields",
                                json!({
                                    "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                                    "titledSingle": {"type": "string", "oneOf": [
                                        {"const": "value1", "title": "First Option"},
                                        {"const": "value2", "title": "Second Option"},
                                        {"const": "value3", "title": "Third Option"}]},
                                    "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                                        "enumNames": ["Option One", "Option Two", "Option Three"]},
                                    "untitledMulti": {"type": "array", "minItems": 1, "maxItems": 3,
                                        "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                                    "titledMulti": {"type": "array", "minItems": 1, "maxItems": 3,
                                        "items": {"anyOf": [
                                            {"const": "value1", "title": "First Choice"},
                                            {"const": "value2", "title": "Second Choice"},
                                            {"const": "value3", "title": "Third Choice"}]}},
                                }),
                                &[],
                            ),
                        )],
                        None,
                    ));
                }
                Some(reply) => content(vec![text(&format!("Elicitation result: {reply}"))]),
            },
            "test_input_required_result_elicitation" => match answer(&request, "user_name") {
                None => {
                    return Err(ask(
                        vec![(
                            "user_name",
                            elicitation(
                                "What is your name?",
                                json!({"name": {"type": "string"}}),
                                &["name"],
                            ),
                        )],
                        None,
                    ));
                }
                Some(reply) => content(vec![text(&format!("Hello, {}!", elicited(reply, "name")))]),
            },
            "test_input_required_result_sampling" => match answer(&request, "sample_request") {
                None => {
                    return Err(ask(
                        vec![(
                            "sample_request",
                            sampling("What is the capital of France?", 100),
                        )],
                        None,
                    ));
                }
                Some(reply) => content(vec![text(&format!(
                    "Sampling result: {}",
                    reply["content"]["text"].as_str().unwrap_or_default()
                ))]),
            },
            "test_input_required_result_list_roots" => match answer(&request, "roots_request") {
                None => return Err(ask(vec![("roots_request", roots())], None)),
                Some(reply) => content(vec![text(&format!(
                    "Found {} root(s)",
                    reply["roots"].as_array().map_or(0, Vec::len)
                ))]),
            },
            "test_input_required_result_request_state"
            | "test_input_required_result_tampered_state" => {
                match (answer(&request, "confirm"), request.request_state) {
                    (Some(reply), Some(state)) if state["tool"] == name => {
                        content(vec![text(&format!(
                            "state-ok: requestState validated (ok={})",
                            elicited(reply, "ok")
                        ))])
                    }
                    _ => {
                        return Err(ask(
                            vec![(
                                "confirm",
                                elicitation(
                                    "Please confirm",
                                    json!({"ok": {"type": "boolean"}}),
                                    &["ok"],
                                ),
                            )],
                            Some(json!({"tool": name})),
                        ));
                    }
                }
            }
            "test_input_required_result_multiple_inputs" => {
                match (
                    answer(&request, "user_name"),
                    answer(&request, "greeting"),
                    answer(&request, "client_roots"),
                    request.request_state,
                ) {
                    (Some(user), Some(greeting), Some(client_roots), Some(_)) => {
                        content(vec![text(&format!(
                            "Name: {}; Greeting: {}; Roots: {}",
                            elicited(user, "name"),
                            greeting["content"]["text"].as_str().unwrap_or_default(),
                            client_roots["roots"].as_array().map_or(0, Vec::len)
                        ))])
                    }
                    _ => {
                        return Err(ask(
                            vec![
                                (
                                    "user_name",
                                    elicitation(
                                        "What is your name?",
                                        json!({"name": {"type": "string"}}),
                                        &["name"],
                                    ),
                                ),
                                ("greeting", sampling("Generate a greeting", 50)),
                                ("client_roots", roots()),
                            ],
                            Some(json!({"tool": name})),
                        ));
                    }
                }
            }
            "test_input_required_result_multi_round" => {
                let round = request
                    .request_state
                    .and_then(|state| state["round"].as_u64())
                    .unwrap_or(0);
                match (round, answer(&request, "step1"), answer(&request, "step2")) {
                    (1, Some(step1), _) => {
                        return Err(ask(
                            vec![(
                                "step2",
                                elicitation(
                                    "Step 2: What is your favorite color?",
                                    json!({"color": {"type": "string"}}),
                                    &["color"],
                                ),
                            )],
                            Some(json!({"round": 2, "name": elicited(step1, "name")})),
                        ));
                    }
                    (2, _, Some(step2)) => {
                        let name = request
                            .request_state
                            .and_then(|state| state["name"].as_str())
                            .unwrap_or_default();
                        content(vec![text(&format!(
                            "Multi-round complete for {name} who likes {}",
                            elicited(step2, "color")
                        ))])
                    }
                    _ => {
                        return Err(ask(
                            vec![(
                                "step1",
                                elicitation(
                                    "Step 1: What is your name?",
                                    json!({"name": {"type": "string"}}),
                                    &["name"],
                                ),
                            )],
                            Some(json!({"round": 1})),
                        ));
                    }
                }
            }
            "test_input_required_result_capabilities" => {
                if let Some(reply) = answer(&request, "sample").or(answer(&request, "user_input")) {
                    content(vec![text(&format!("Got: {reply}"))])
                } else {
                    let mut requests = Vec::new();
                    if declared(&request, "sampling") {
                        requests.push(("sample", sampling("Say hello", 50)));
                    }
                    if declared(&request, "elicitation") {
                        requests.push((
                            "user_input",
                            elicitation(
                                "Say hello",
                                json!({"text": {"type": "string"}}),
                                &["text"],
                            ),
                        ));
                    }
                    if requests.is_empty() {
                        let mut required = Map::new();
                        required.insert("sampling".to_owned(), json!({}));
                        return Err(CallError::MissingCapability(required));
                    }
                    return Err(ask(requests, None));
                }
            }
            "test_simple_text" => {
                content(vec![text("This is a simple text response for testing.")])
            }
            "test_custom_header_param" => {
                content(vec![text(&format!("region: {}", argument("region")))])
            }
            "test_image_content" => content(vec![
                json!({"type": "image", "data": PNG, "mimeType": "image/png"}),
            ]),
            "test_audio_content" => content(vec![
                json!({"type": "audio", "data": WAV, "mimeType": "audio/wav"}),
            ]),
            "test_embedded_resource" => content(vec![json!({"type": "resource", "resource": {
                "uri": "test://embedded-resource", "mimeType": "text/plain",
                "text": "This is an embedded resource content."}})]),
            "test_multiple_content_types" => content(vec![
                text("Multiple content types test:"),
                json!({"type": "image", "data": PNG, "mimeType": "image/png"}),
                json!({"type": "resource", "resource": {"uri": "test://mixed-content-resource",
                    "mimeType": "application/json", "text": "{\"test\":\"data\",\"value\":123}"}}),
            ]),
            "test_error_handling" => ToolResult {
                content: vec![text("This tool intentionally returns an error for testing")],
                structured_content: None,
                is_error: true,
            },
            "json_schema_2020_12_tool" => content(vec![text(&format!(
                "Received: {}",
                Value::Object(arguments)
            ))]),
            other => return Err(CallError::UnknownTool(other.to_owned())),
        })
    }

    fn features(&self) -> Features {
        Features {
            resources: true,
            // The fixture's resources never change, so a subscription has nothing to miss.
            resource_subscriptions: true,
            prompts: true,
            completions: true,
            logging: true,
        }
    }

    async fn list_resources(
        &self,
        _request: RequestContext<'_>,
        cursor: Option<&str>,
    ) -> Result<Page, CallError> {
        // The cursor is the index of the page's first resource.
        let start = match cursor {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .ok()
                .filter(|start| *start < RESOURCES.len())
                .ok_or_else(|| CallError::InvalidParams(format!("unknown cursor {cursor:?}")))?,
        };
        let end = (start + RESOURCES_PER_PAGE).min(RESOURCES.len());
        Ok(Page {
            items: RESOURCES[start..end]
                .iter()
                .map(|(uri, name, title, mime)| {
                    json!({"uri": uri, "name": name, "title": title, "mimeType": mime})
                })
                .collect(),
            next_cursor: (end < RESOURCES.len()).then(|| end.to_string()),
            cache: PUBLIC_FIVE_MINUTES,
        })
    }

    async fn list_resource_templates(
        &self,
        _request: RequestContext<'_>,
        _cursor: Option<&str>,
    ) -> Result<Page, CallError> {
        Ok(Page {
            items: vec![
                json!({"uriTemplate": "test://template/{id}/data", "name": "template",
                "title": "Template Resource", "mimeType": "application/json"}),
            ],
            next_cursor: None,
            cache: PUBLIC_FIVE_MINUTES,
        })
    }

    async fn read_resource(
        &self,
        _request: RequestContext<'_>,
        uri: &str,
    ) -> Result<ResourceContents, CallError> {
        let item =
            |mime: &str, body: (&str, &str)| json!({"uri": uri, "mimeType": mime, body.0: body.1});
        let contents = match uri {
            "test://static-text" => vec![item(
                "text/plain",
                ("text", "This is the content of the static text resource."),
            )],
            "test://static-binary" => vec![item("image/png", ("blob", PNG))],
            "test://watched-resource" => vec![item("text/plain", ("text", "Watched resource content."))],
            "test://stateless-static-text" => vec![item(
                "text/plain",
                ("text", "This is the content of the stateless static text resource."),
            )],
            _ => match uri
                .strip_prefix("test://template/")
                .and_then(|rest| rest.strip_suffix("/data"))
                .filter(|id| !id.is_empty() && !id.contains('/'))
            {
                Some(id) => vec![item(
                    "application/json",
                    (
                        "text",
                        &json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")})
                            .to_string(),
                    ),
                )],
                None => return Err(CallError::UnknownResource(uri.to_owned())),
            },
        };
        Ok(ResourceContents {
            contents,
            cache: CacheHint {
                ttl_ms: 300_000,
                public: false,
            },
        })
    }

    async fn subscribe_resource(
        &self,
        _request: RequestContext<'_>,
        uri: &str,
        _subscribe: bool,
    ) -> Result<(), CallError> {
        if RESOURCES.iter().any(|(known, ..)| *known == uri) {
            Ok(())
        } else {
            Err(CallError::UnknownResource(uri.to_owned()))
        }
    }

    async fn list_prompts(
        &self,
        request: RequestContext<'_>,
        _cursor: Option<&str>,
    ) -> Result<Page, CallError> {
        let argument = |name: &str, description: &str| json!({"name": name, "description": description, "required": true});
        let mut items = vec![
            json!({"name": "test_simple_prompt", "description": "A prompt without arguments."}),
            json!({"name": "test_prompt_with_arguments", "description": "A prompt with two arguments.",
                "arguments": [argument("arg1", "First test argument"), argument("arg2", "Second test argument")]}),
            json!({"name": "test_prompt_with_embedded_resource", "description": "A prompt embedding a resource.",
                "arguments": [argument("resourceUri", "The URI of the resource to embed")]}),
            json!({"name": "test_prompt_with_image", "description": "A prompt with an image."}),
        ];
        if request.era == agentworks_agent::mcp::Era::Modern {
            items.push(json!({"name": "test_input_required_result_prompt",
                "description": "A prompt that asks for context first."}));
        }
        Ok(Page {
            items,
            next_cursor: None,
            cache: PUBLIC_FIVE_MINUTES,
        })
    }

    async fn get_prompt(
        &self,
        request: RequestContext<'_>,
        name: &str,
        arguments: &BTreeMap<String, String>,
    ) -> Result<PromptResult, CallError> {
        let user = |content: Value| json!({"role": "user", "content": content});
        let argument = |key: &str| arguments.get(key).map(String::as_str).unwrap_or_default();
        let messages = match name {
            "test_simple_prompt" => vec![user(text("This is a simple prompt for testing."))],
            "test_prompt_with_arguments" => vec![user(text(&format!(
                "Prompt with arguments: arg1='{}', arg2='{}'",
                argument("arg1"),
                argument("arg2")
            )))],
            "test_prompt_with_embedded_resource" => vec![
                user(
                    json!({"type": "resource", "resource": {"uri": argument("resourceUri"),
                    "mimeType": "text/plain", "text": "Embedded resource content for testing."}}),
                ),
                user(text("Please process the embedded resource above.")),
            ],
            "test_prompt_with_image" => vec![
                user(json!({"type": "image", "data": PNG, "mimeType": "image/png"})),
                user(text("Please analyze the image above.")),
            ],
            "test_input_required_result_prompt" => match answer(&request, "user_context") {
                None => {
                    return Err(ask(
                        vec![(
                            "user_context",
                            elicitation(
                                "What context should the prompt use?",
                                json!({"context": {"type": "string"}}),
                                &["context"],
                            ),
                        )],
                        None,
                    ));
                }
                Some(reply) => vec![user(text(&format!(
                    "Prompt with context: {}",
                    elicited(reply, "context")
                )))],
            },
            other => return Err(CallError::UnknownPrompt(other.to_owned())),
        };
        Ok(PromptResult {
            description: None,
            messages,
        })
    }

    async fn complete(
        &self,
        _request: RequestContext<'_>,
        reference: &CompletionRef,
        argument: (&str, &str),
        _context: &BTreeMap<String, String>,
    ) -> Result<Completion, CallError> {
        let values: Vec<String> = match (reference, argument.0) {
            (CompletionRef::Prompt(prompt), "arg1" | "arg2")
                if prompt == "test_prompt_with_arguments" =>
            {
                ["testValue1", "testValue2"]
                    .iter()
                    .filter(|v| v.starts_with(argument.1))
                    .map(|v| (*v).to_owned())
                    .collect()
            }
            _ => Vec::new(),
        };
        Ok(Completion {
            total: Some(values.len() as u64),
            values,
            has_more: false,
        })
    }
}

/// The public listener's screen: `/mcp` as agentd screens it; nothing else is served.
struct FixtureScreen {
    mcp: Arc<McpService<FixtureBackend>>,
}

impl Screen for FixtureScreen {
    async fn screen(&self, head: &hyper::http::request::Parts) -> Verdict {
        if head.uri.path() == "/mcp" {
            return self.mcp.verdict(head, MAX_BODY_BYTES).await;
        }
        Verdict::Anonymous
    }

    fn body_refusal(
        &self,
        head: &hyper::http::request::Parts,
        refusal: BodyRefusal,
    ) -> hyper::Response<agentworks_daemon::ipc::envelope::Body> {
        self.mcp.body_refusal(&head.method, &head.headers, refusal)
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let port: u16 = match std::env::args().nth(1).map(|p| p.parse()) {
        None => 0,
        Some(Ok(port)) => port,
        Some(Err(error)) => {
            eprintln!("mcp_conformance_fixture: the port must be a number: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("mcp_conformance_fixture: cannot listen on 127.0.0.1:{port}: {error}");
            return std::process::ExitCode::from(1);
        }
    };
    let Ok(address) = listener.local_addr() else {
        eprintln!("mcp_conformance_fixture: the listener has no address");
        return std::process::ExitCode::from(1);
    };
    let public_url = format!("http://{address}");
    let mcp = Arc::new(McpService::new(
        Arc::new(FixtureBackend),
        McpConfig {
            public_url,
            instructions: "The MCP conformance suite's fixture server.".into(),
            scopes_supported: Vec::new(),
            authorization_servers: Vec::new(),
            allowed_origins: Vec::new(),
            loopback_port: Some(address.port()),
            server_name: "agentworks-conformance-fixture".into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            // Every client of the suite shares the one anonymous caller.
            max_sessions_per_token: 1024,
        },
    ));
    let screen = Arc::new(FixtureScreen { mcp: mcp.clone() });
    let handler = move |_peer, parts: hyper::http::request::Parts, body: bytes::Bytes| {
        let mcp = mcp.clone();
        async move {
            let path = parts.uri.path().to_owned();
            let request = hyper::Request::from_parts(parts, body);
            mcp.handle(request).await.unwrap_or_else(|| {
                agentworks_daemon::ipc::envelope::error_response(
                    hyper::StatusCode::NOT_FOUND,
                    "not_found",
                    format!("{path} is not served here; MCP is at /mcp"),
                    Default::default(),
                )
            })
        }
    };
    let shutdown = agentworks_support::signals::cancel_on_signals(|_| ());
    let limits = PublicLimits::new(
        ConnectionLimits::with_reserved_quarter(256, 256),
        64 * MAX_BODY_BYTES,
    );
    println!("listening on http://{address}/mcp");
    serve_public(listener, screen, handler, shutdown, limits).await;
    std::process::ExitCode::SUCCESS
}
