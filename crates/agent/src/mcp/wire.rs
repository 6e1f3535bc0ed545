//! The MCP wire format on one HTTP POST: JSON-RPC message parsing, which protocol era a request
//! belongs to, the 2026-07-28 header/body validation ladder (routing headers, and the
//! `Mcp-Param-*` headers mirroring a tool's `x-mcp-header` arguments), the error codes with
//! their HTTP statuses, and the response bodies (`application/json`, or one
//! `text/event-stream` event).
//!
//! Pure: no I/O, no auth, no backend. Must never panic on any input: every malformed body or
//! header becomes a typed [`RpcError`].

use bytes::Bytes;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{Map, Value, json};

use super::Body;

/// `params._meta` key carrying the request's protocol version (2026-07-28).
pub(super) const PROTOCOL_VERSION_META_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// `params._meta` key carrying the client's capabilities (2026-07-28).
pub(super) const CLIENT_CAPABILITIES_META_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
/// `params._meta` key carrying the least severe log level the client wants (2026-07-28; no
/// log messages without it).
pub(super) const LOG_LEVEL_META_KEY: &str = "io.modelcontextprotocol/logLevel";
/// `result._meta` key carrying our name and version on `server/discover`.
pub(super) const SERVER_INFO_META_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// A log message's severity (RFC 5424 order, as MCP names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Notice,
    Warning,
    Error,
    Critical,
    Alert,
    Emergency,
}

impl LogLevel {
    /// The level MCP spells `name`, if it is one.
    pub fn parse(name: &str) -> Option<LogLevel> {
        Some(match name {
            "debug" => LogLevel::Debug,
            "info" => LogLevel::Info,
            "notice" => LogLevel::Notice,
            "warning" => LogLevel::Warning,
            "error" => LogLevel::Error,
            "critical" => LogLevel::Critical,
            "alert" => LogLevel::Alert,
            "emergency" => LogLevel::Emergency,
            _ => return None,
        })
    }

    /// The MCP spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Notice => "notice",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
            LogLevel::Alert => "alert",
            LogLevel::Emergency => "emergency",
        }
    }
}

/// The stateless revisions we serve.
pub(super) const MODERN_VERSIONS: [&str; 1] = ["2026-07-28"];
/// The handshake revisions we serve, oldest first.
pub(super) const HANDSHAKE_VERSIONS: [&str; 2] = ["2025-06-18", "2025-11-25"];
/// Our answer to an `initialize` offering a version we do not serve.
pub(super) const LATEST_HANDSHAKE_VERSION: &str = "2025-11-25";
/// Every handshake-era revision ever published: a header naming one of these routes a request to
/// the legacy path (where an unserved one is refused), anything else to the modern ladder.
const KNOWN_HANDSHAKE_VERSIONS: [&str; 4] =
    ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

pub(super) const HEADER_PROTOCOL_VERSION: &str = "mcp-protocol-version";
pub(super) const HEADER_METHOD: &str = "mcp-method";
pub(super) const HEADER_NAME: &str = "mcp-name";
pub(super) const HEADER_SESSION_ID: &str = "mcp-session-id";
/// The prefix of the headers mirroring a tool's `x-mcp-header` arguments (`Mcp-Param-{Name}`).
const HEADER_PARAM_PREFIX: &str = "mcp-param-";
/// The most `Mcp-Param-*` lines one request's headers are read for (hyper bounds the whole
/// head; this bounds what we copy of it).
const MAX_PARAM_HEADERS: usize = 64;
/// The longest `Mcp-Param-*` value compared (a longer one is refused, never decoded).
const MAX_PARAM_HEADER_BYTES: usize = 8 * 1024;
/// The most `x-mcp-header` annotations one input schema may declare, and how deep in nested
/// `properties` they may sit. The schema is the backend's own, so these only stop a runaway.
const MAX_PARAM_ANNOTATIONS: usize = 64;
const MAX_PARAM_ANNOTATION_DEPTH: usize = 8;

/// JSON-RPC and MCP error codes.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    /// Headers missing, duplicated or disagreeing with the body (2026-07-28).
    pub const HEADER_MISMATCH: i64 = -32020;
    /// Answering needs a client capability the request did not declare (2026-07-28).
    pub const MISSING_CLIENT_CAPABILITY: i64 = -32021;
    /// The request's protocol version is not served (2026-07-28).
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
    pub const INTERNAL_ERROR: i64 = -32603;
    // Ours, for HTTP-level refusals of a JSON-RPC request (the answer keeps its HTTP status;
    // `data.code` is the stable code). From the implementation-defined band -32000..-32019,
    // above the Python SDK's own -32000 (connection closed) and -32001 (request timeout),
    // and clear of the retired -32002.
    /// 401: no token, or one that is not accepted (`missing_token`, `invalid_token`, ...).
    pub const UNAUTHORIZED: i64 = -32010;
    /// 403: a forbidden `Origin` or a scope the token lacks.
    pub const FORBIDDEN: i64 = -32011;
    /// 404: the `Mcp-Session-Id` names no live session of this token.
    pub const SESSION_NOT_FOUND: i64 = -32012;
    /// 503: no room right now (`too_many_sessions`, `busy`); retry later.
    pub const UNAVAILABLE: i64 = -32013;
}

/// Every version we serve, oldest first (the `supported` list in errors and discovery).
pub(super) fn supported_versions() -> Vec<&'static str> {
    HANDSHAKE_VERSIONS
        .iter()
        .chain(MODERN_VERSIONS.iter())
        .copied()
        .collect()
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("JSON-RPC error {code}: {message}")]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The "unsupported protocol version" error naming what we serve.
    pub fn unsupported_version(code: i64, requested: &str) -> RpcError {
        RpcError {
            code,
            message: "Unsupported protocol version".to_owned(),
            data: Some(json!({"supported": supported_versions(), "requested": requested})),
        }
    }

    /// The HTTP status for this error in the 2026-07-28 era (the specification's table; codes it
    /// does not name answer 200 with the error in the body).
    pub fn modern_status(&self) -> StatusCode {
        match self.code {
            code::PARSE_ERROR
            | code::INVALID_REQUEST
            | code::INVALID_PARAMS
            | code::HEADER_MISMATCH
            | code::MISSING_CLIENT_CAPABILITY
            | code::UNSUPPORTED_PROTOCOL_VERSION => StatusCode::BAD_REQUEST,
            code::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
            _ => StatusCode::OK,
        }
    }
}

/// One decoded POST body.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request: answered on this POST.
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    /// A notification: acknowledged with 202.
    Notification {
        method: String,
        params: Map<String, Value>,
    },
    /// A client's reply to one of our requests (2025 era: sampling, elicitation, roots):
    /// its id, and its `result` or, if it failed, its `error`.
    Reply {
        id: Value,
        outcome: Result<Value, Value>,
    },
}

/// Parses a POST body into one message. Errors carry the request id when it could be read.
/// Batches are refused: none of the revisions we serve allows them.
pub fn parse_message(body: &[u8]) -> Result<Message, (Value, RpcError)> {
    let value = parse_json(body).map_err(|error| (Value::Null, error))?;
    let invalid = |id: Value, message: &str| (id, RpcError::new(code::INVALID_REQUEST, message));
    let mut object = match value {
        Value::Object(object) => object,
        Value::Array(_) => {
            return Err(invalid(
                Value::Null,
                "JSON-RPC batches are not supported: send one request or notification per POST",
            ));
        }
        _ => {
            return Err(invalid(
                Value::Null,
                "Body must be a single JSON-RPC request or notification object",
            ));
        }
    };
    let id = match object.get("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id.clone()),
        Some(id @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(id.clone()),
        Some(_) => return Err(invalid(Value::Null, "id must be a string or an integer")),
    };
    let echo = id.clone().unwrap_or(Value::Null);
    if object.get("jsonrpc") != Some(&Value::String("2.0".to_owned())) {
        return Err(invalid(echo, "jsonrpc must be \"2.0\""));
    }
    let Some(method) = object.get("method") else {
        if let Some(id) = id.clone() {
            if let Some(result) = object.remove("result") {
                return Ok(Message::Reply {
                    id,
                    outcome: Ok(result),
                });
            }
            if let Some(error) = object.remove("error") {
                return Ok(Message::Reply {
                    id,
                    outcome: Err(error),
                });
            }
        }
        return Err(invalid(echo, "method is required"));
    };
    let Some(method) = method.as_str().map(str::to_owned) else {
        return Err(invalid(echo, "method must be a string"));
    };
    // Taken, not copied: a write's params hold its whole content.
    let params = match object.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(params)) => params,
        Some(_) => return Err(invalid(echo, "params must be an object")),
    };
    Ok(match id {
        Some(id) => Message::Request { id, method, params },
        None => Message::Notification { method, params },
    })
}

/// A body as JSON, or the parse error saying what was wrong: the first byte that is not UTF-8
/// (`data.byte`), or serde_json's reason and position (`data.line`, `data.column`).
fn parse_json(body: &[u8]) -> Result<Value, RpcError> {
    let text = std::str::from_utf8(body).map_err(|error| RpcError {
        code: code::PARSE_ERROR,
        message: format!("Parse error: invalid UTF-8 at byte {}", error.valid_up_to()),
        data: Some(json!({"byte": error.valid_up_to()})),
    })?;
    serde_json::from_str(text).map_err(|error| RpcError {
        code: code::PARSE_ERROR,
        message: format!("Parse error: {error}"),
        data: Some(json!({"line": error.line(), "column": error.column()})),
    })
}

/// The id of a JSON-RPC request body, best effort: a valid id (string or integer) when the body
/// is a JSON object carrying one, else `null` (JSON-RPC 2.0 §5). For refusals that happen before
/// or regardless of parsing.
pub fn request_id(body: &[u8]) -> Value {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| match value.get("id") {
            Some(id @ Value::String(_)) => Some(id.clone()),
            Some(id @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(id.clone()),
            _ => None,
        })
        .unwrap_or(Value::Null)
}

/// Which revision family a request speaks; a backend may shape its answers by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2026-07-28: per-request envelope, no sessions.
    Modern,
    /// 2025-06-18 / 2025-11-25: `initialize` handshake, optional sessions.
    Legacy,
}

/// The era of a request. A body carrying the modern `_meta` envelope (its reserved protocol
/// version key, which no handshake-era client sends) is modern whatever the header says, so a
/// header disagreeing with it is reported by the ladder instead of being obeyed. Otherwise a
/// `MCP-Protocol-Version` header naming a handshake revision is legacy, any other value is modern
/// (so the ladder can answer an unknown version with the versions we serve), and no header at all
/// is a legacy client (`initialize`, or a 2025-03-26-style client that sends none).
pub(super) fn classify_era(version_header: Option<&str>, message: &Message) -> Era {
    let has_envelope = match message {
        Message::Request { params, .. } | Message::Notification { params, .. } => params
            .get("_meta")
            .and_then(Value::as_object)
            .is_some_and(|meta| meta.contains_key(PROTOCOL_VERSION_META_KEY)),
        Message::Reply { .. } => false,
    };
    match version_header {
        _ if has_envelope => Era::Modern,
        Some(version) if names_handshake_era(version) => Era::Legacy,
        Some(_) => Era::Modern,
        None => Era::Legacy,
    }
}

/// Whether a `MCP-Protocol-Version` value names a handshake-era revision (served or not).
pub(super) fn names_handshake_era(version: &str) -> bool {
    KNOWN_HANDSHAKE_VERSIONS.contains(&version)
}

/// The routing headers of one request, as the header ladder needs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct RoutingHeaders {
    pub protocol_version: Option<String>,
    pub method: Option<String>,
    pub name: Option<String>,
    /// A routing header sent more than once (first-copy and last-copy readers would disagree).
    pub duplicated: Option<&'static str>,
    /// Every `Mcp-Param-{Name}` line, in order: the name after the prefix (lowercase, as hyper
    /// keeps header names) and the raw value. At most [`MAX_PARAM_HEADERS`] lines.
    pub params: Vec<(String, Vec<u8>)>,
    /// More than [`MAX_PARAM_HEADERS`] `Mcp-Param-*` lines were sent (only refused when the
    /// called tool declares any, since undeclared ones are ignored).
    pub params_overflow: bool,
}

impl RoutingHeaders {
    pub fn from_headers(headers: &HeaderMap) -> RoutingHeaders {
        let mut routing = RoutingHeaders::default();
        for (name, slot) in [
            (HEADER_PROTOCOL_VERSION, &mut routing.protocol_version),
            (HEADER_METHOD, &mut routing.method),
            (HEADER_NAME, &mut routing.name),
        ] {
            let mut values = headers.get_all(name).iter();
            // A value that is not visible ASCII is kept lossily: it can never equal a body value
            // the client mirrored correctly, so it fails the ladder instead of being dropped.
            *slot = values
                .next()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            if values.next().is_some() && routing.duplicated.is_none() {
                routing.duplicated = Some(name);
            }
        }
        for (name, value) in headers {
            let Some(param) = name.as_str().strip_prefix(HEADER_PARAM_PREFIX) else {
                continue;
            };
            if routing.params.len() == MAX_PARAM_HEADERS {
                routing.params_overflow = true;
                break;
            }
            // One byte past the longest value compared is enough to refuse it as too long.
            let value = value.as_bytes();
            let kept = value.get(..=MAX_PARAM_HEADER_BYTES).unwrap_or(value);
            routing.params.push((param.to_owned(), kept.to_vec()));
        }
        routing
    }
}

/// The body parameter mirrored as `Mcp-Name` for a method, if any.
fn name_param(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    }
}

/// The 2026-07-28 ladder for one request; the first failing rung wins. Returns the request's
/// protocol version.
///
/// 1. No routing header is duplicated → `HEADER_MISMATCH`.
/// 2. `params._meta` is an object with the protocol version and client capabilities →
///    `INVALID_PARAMS`.
/// 3. `MCP-Protocol-Version`, `Mcp-Method` and (for name-bearing methods) `Mcp-Name` equal the
///    body → `HEADER_MISMATCH`. Before the version rung, so a client disagreeing with itself is
///    told so rather than told its version is unsupported.
/// 4. The version is one we serve → `UNSUPPORTED_PROTOCOL_VERSION` naming ours.
pub(super) fn check_modern_request(
    method: &str,
    params: &Map<String, Value>,
    headers: &RoutingHeaders,
) -> Result<String, RpcError> {
    let mismatch = |what: &str| RpcError::new(code::HEADER_MISMATCH, what.to_owned());
    if let Some(name) = headers.duplicated {
        return Err(mismatch(&format!("{name} header appears more than once")));
    }
    let Some(meta) = params.get("_meta").and_then(Value::as_object) else {
        return Err(RpcError::new(
            code::INVALID_PARAMS,
            format!(
                "params._meta must be an object carrying {PROTOCOL_VERSION_META_KEY:?} and {CLIENT_CAPABILITIES_META_KEY:?}"
            ),
        ));
    };
    let missing: Vec<&str> = [PROTOCOL_VERSION_META_KEY, CLIENT_CAPABILITIES_META_KEY]
        .into_iter()
        .filter(|key| !meta.contains_key(*key))
        .collect();
    if !missing.is_empty() {
        return Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("params._meta is missing {}", missing.join(", ")),
        ));
    }
    let version = meta.get(PROTOCOL_VERSION_META_KEY).and_then(Value::as_str);
    if version.is_none() || headers.protocol_version.as_deref() != version {
        return Err(mismatch(
            "MCP-Protocol-Version header does not match params._meta's protocol version",
        ));
    }
    if headers.method.as_deref() != Some(method) {
        return Err(mismatch(
            "Mcp-Method header does not match the request's method",
        ));
    }
    if let Some(key) = name_param(method) {
        match params.get(key) {
            None | Some(Value::Null) => {}
            Some(body) => {
                let header = headers.name.as_deref().and_then(decode_header_value);
                if body.as_str() != header.as_deref() {
                    return Err(mismatch(&format!(
                        "Mcp-Name header does not match the request's {key:?} parameter"
                    )));
                }
            }
        }
    }
    let version = version.unwrap_or_default();
    if !MODERN_VERSIONS.contains(&version) {
        return Err(RpcError::unsupported_version(
            code::UNSUPPORTED_PROTOCOL_VERSION,
            version,
        ));
    }
    Ok(version.to_owned())
}

/// One `x-mcp-header` annotation of a tool's input schema: the header's `{Name}` and the chain
/// of `properties` keys leading to the annotated argument.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ParamAnnotation<'a> {
    header: &'a str,
    path: Vec<&'a str>,
}

/// The `x-mcp-header` annotations of `schema`: reachable through `properties` keys only (the
/// specification's static reachability; `items`, composition keywords and `$ref` are not
/// followed), each a non-empty RFC 9110 token, unique ignoring case. `Err` says what is wrong.
fn param_annotations(schema: &Value) -> Result<Vec<ParamAnnotation<'_>>, String> {
    fn walk<'a>(
        schema: &'a Value,
        path: &mut Vec<&'a str>,
        out: &mut Vec<ParamAnnotation<'a>>,
    ) -> Result<(), String> {
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            return Ok(());
        };
        if path.len() == MAX_PARAM_ANNOTATION_DEPTH {
            return Err(format!(
                "properties nested deeper than {MAX_PARAM_ANNOTATION_DEPTH} levels"
            ));
        }
        for (key, property) in properties {
            if !property.is_object() {
                continue;
            }
            path.push(key);
            if let Some(header) = property.get("x-mcp-header") {
                let shown = path.join(".");
                let Some(header) = header.as_str() else {
                    return Err(format!("the annotation of {shown:?} is not a string"));
                };
                if header.is_empty() || !header.bytes().all(is_tchar) {
                    return Err(format!(
                        "the annotation of {shown:?} is not an HTTP header-name token"
                    ));
                }
                if out
                    .iter()
                    .any(|seen| seen.header.eq_ignore_ascii_case(header))
                {
                    return Err(format!("{header:?} is declared twice (ignoring case)"));
                }
                if out.len() == MAX_PARAM_ANNOTATIONS {
                    return Err(format!("more than {MAX_PARAM_ANNOTATIONS} annotations"));
                }
                out.push(ParamAnnotation {
                    header,
                    path: path.clone(),
                });
            }
            walk(property, path, out)?;
            path.pop();
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(schema, &mut Vec::new(), &mut out)?;
    Ok(out)
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// SEP-2243 custom headers (2026-07-28 `tools/call`): for a tool whose `input_schema` declares
/// `x-mcp-header` arguments, every argument with a value (not `null`) must come with exactly
/// one `Mcp-Param-{Name}` header equal to it, and no such header may come without one.
/// Undeclared `Mcp-Param-*` headers are ignored (the specification has intermediaries forward
/// them); a schema declaring none is not looked at further, so its calls are unaffected.
///
/// A value in exactly the form `=?base64?…?=` is decoded strictly (standard alphabet, padded,
/// canonical, UTF-8); any other value is a literal. Strings compare exactly, booleans as
/// `true`/`false`, numbers numerically (`42.0` equals `42`, the specification's SHOULD).
/// A value outside visible ASCII, space and tab is refused before it is compared.
/// Every refusal is `HEADER_MISMATCH` (HTTP 400), except an invalid declaration: that is the
/// backend's fault, an internal error.
pub(super) fn check_param_headers(
    tool: &str,
    input_schema: &Value,
    arguments: &Map<String, Value>,
    headers: &RoutingHeaders,
) -> Result<(), RpcError> {
    let annotations = param_annotations(input_schema).map_err(|why| {
        RpcError::new(
            code::INTERNAL_ERROR,
            format!("tool {tool:?} declares an invalid x-mcp-header: {why}"),
        )
    })?;
    if annotations.is_empty() {
        return Ok(());
    }
    let mismatch =
        |what: String| RpcError::new(code::HEADER_MISMATCH, format!("Header mismatch: {what}"));
    if headers.params_overflow {
        return Err(mismatch(format!(
            "more than {MAX_PARAM_HEADERS} Mcp-Param headers"
        )));
    }
    for annotation in &annotations {
        let header = format!("Mcp-Param-{}", annotation.header);
        let argument = annotation.path.join(".");
        let mut sent = headers
            .params
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(annotation.header))
            .map(|(_, value)| value.as_slice());
        let value = sent.next();
        if sent.next().is_some() {
            return Err(mismatch(format!("{header} header appears more than once")));
        }
        let body = argument_at(arguments, &annotation.path);
        let (body, value) = match (body, value) {
            (None, None) => continue,
            (None, Some(_)) => {
                return Err(mismatch(format!(
                    "{header} header is sent but argument {argument:?} has no value"
                )));
            }
            (Some(_), None) => {
                return Err(mismatch(format!(
                    "{header} header is missing; argument {argument:?} has a value"
                )));
            }
            (Some(body), Some(value)) => (body, value),
        };
        let decoded =
            decode_param_value(value).map_err(|why| mismatch(format!("{header} {why}")))?;
        if !param_value_matches(body, &decoded) {
            return Err(mismatch(format!(
                "{header} header does not match argument {argument:?}"
            )));
        }
    }
    Ok(())
}

/// The argument at a chain of property keys; `null` counts as no value.
fn argument_at<'a>(arguments: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let mut value = arguments.get(*first)?;
    for key in rest {
        value = value.as_object()?.get(*key)?;
    }
    (!value.is_null()).then_some(value)
}

/// An `Mcp-Param-*` value as text: optional whitespace around it dropped (RFC 9110 §5.5), only
/// visible ASCII, space and tab allowed, then decoded if in the base64 form. `Err` says why not.
fn decode_param_value(raw: &[u8]) -> Result<String, &'static str> {
    if raw.len() > MAX_PARAM_HEADER_BYTES {
        return Err("header is too long");
    }
    let is_ows = |byte: &u8| *byte == b' ' || *byte == b'\t';
    let start = raw.iter().position(|b| !is_ows(b)).unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |last| last + 1);
    let trimmed = raw.get(start..end).unwrap_or_default();
    if !trimmed
        .iter()
        .all(|&byte| byte == b'\t' || (0x20..=0x7e).contains(&byte))
    {
        return Err("header contains characters outside visible ASCII (use =?base64?…?=)");
    }
    let text = std::str::from_utf8(trimmed).map_err(|_| "header is not ASCII")?;
    decode_header_value(text)
        .ok_or("header is not valid base64 (standard alphabet, padded) of UTF-8")
}

/// Whether a decoded header value mirrors a (non-null) argument.
fn param_value_matches(body: &Value, header: &str) -> bool {
    match body {
        Value::String(text) => text == header,
        Value::Bool(flag) => header == if *flag { "true" } else { "false" },
        Value::Number(number) => {
            if let Some(body) = number
                .as_i64()
                .map(i128::from)
                .or_else(|| number.as_u64().map(i128::from))
            {
                integer_value(header) == Some(body)
            } else {
                let finite = |n: f64| n.is_finite().then_some(n);
                match (
                    number.as_f64().and_then(finite),
                    header.parse::<f64>().ok().and_then(finite),
                ) {
                    (Some(body), Some(header)) => body == header,
                    _ => false,
                }
            }
        }
        // Objects and arrays cannot be mirrored (the annotation is for primitives only).
        _ => false,
    }
}

/// A decimal integer, optionally written with a zero fraction (`42`, `-7`, `42.0`).
fn integer_value(text: &str) -> Option<i128> {
    let whole = match text.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() && fraction.bytes().all(|b| b == b'0') => {
            whole
        }
        Some(_) => return None,
        None => text,
    };
    let digits = whole.strip_prefix('-').unwrap_or(whole);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    whole.parse().ok()
}

/// Decodes a routing header value: verbatim, unless wrapped as `=?base64?…?=`, in which case the
/// payload must be canonical base64 of UTF-8 (anything else is `None`, so it never matches).
pub(super) fn decode_header_value(value: &str) -> Option<String> {
    let Some(payload) = value
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    else {
        return Some(value.to_owned());
    };
    let bytes = base64_decode(payload)?;
    String::from_utf8(bytes).ok()
}

const BASE64_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard padded base64, canonical only (re-encoding must give the input back).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for chunk in bytes.chunks(4) {
        let mut sextets = [0u32; 4];
        let mut padding = 0;
        for (i, &c) in chunk.iter().enumerate() {
            if c == b'=' {
                padding += 1;
                continue;
            }
            if padding > 0 {
                return None;
            }
            let index = BASE64_ALPHABET.iter().position(|&a| a == c)?;
            sextets[i] = u32::try_from(index).ok()?;
        }
        if padding > 2 {
            return None;
        }
        let n = (sextets[0] << 18) | (sextets[1] << 12) | (sextets[2] << 6) | sextets[3];
        let decoded = n.to_be_bytes();
        out.extend_from_slice(&decoded[1..4 - padding]);
    }
    (base64_encode(&out) == text).then_some(out)
}

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let mut n = 0u32;
        for (i, &b) in chunk.iter().enumerate() {
            n |= u32::from(b) << (16 - 8 * i);
        }
        for i in 0..4 {
            if i <= chunk.len() {
                let index = (n >> (18 - 6 * i)) & 0x3f;
                out.push(char::from(BASE64_ALPHABET[index as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What the client's `Accept` header allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Accept {
    pub json: bool,
    pub sse: bool,
}

/// Parses `Accept` with wildcards. No header at all accepts anything (RFC 9110 §12.5.1).
pub(super) fn parse_accept(header: Option<&str>) -> Accept {
    let Some(header) = header else {
        return Accept {
            json: true,
            sse: true,
        };
    };
    let types: Vec<String> = header
        .split(',')
        .map(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    let any = types.iter().any(|t| t == "*/*");
    Accept {
        json: any
            || types
                .iter()
                .any(|t| t == "application/json" || t == "application/*"),
        sse: any
            || types
                .iter()
                .any(|t| t == "text/event-stream" || t == "text/*"),
    }
}

/// How a JSON-RPC answer travels back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// `application/json`, preferred whenever the client accepts it.
    Json,
    /// One `event: message` on a `text/event-stream`, for clients accepting only that.
    Sse,
}

impl Accept {
    /// JSON when acceptable, else one SSE event, else nothing (406).
    pub fn framing(self) -> Option<Framing> {
        if self.json {
            Some(Framing::Json)
        } else if self.sse {
            Some(Framing::Sse)
        } else {
            None
        }
    }
}

/// Whether a `Content-Type` is `application/json` (parameters allowed).
pub(super) fn is_json_content_type(header: Option<&str>) -> bool {
    header
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`.
pub(super) fn result_message(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// `{"jsonrpc":"2.0","id":…,"error":{…}}`; `id` is `null` when the request's could not be read.
pub(super) fn error_message(id: &Value, error: &RpcError) -> Value {
    let mut body = json!({"code": error.code, "message": error.message});
    if let (Some(data), Some(object)) = (&error.data, body.as_object_mut()) {
        object.insert("data".to_owned(), data.clone());
    }
    json!({"jsonrpc": "2.0", "id": id, "error": body})
}

/// A JSON-RPC message as an HTTP response.
pub(super) fn message_response(
    status: StatusCode,
    framing: Framing,
    message: &Value,
) -> Response<Body> {
    // Serializing a `Value` cannot fail (its map keys are strings), but fail closed if it does.
    let json = serde_json::to_string(message).unwrap_or_else(|_| {
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#
            .to_owned()
    });
    let (content_type, body) = match framing {
        Framing::Json => ("application/json", json),
        Framing::Sse => (
            "text/event-stream",
            format!("event: message\ndata: {json}\n\n"),
        ),
    };
    let mut response = Response::new(agentworks_daemon::ipc::envelope::full(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if framing == Framing::Sse {
        headers.insert(
            CACHE_CONTROL,
            HeaderValue::from_static("no-cache, no-transform"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, params: Value) -> (String, Map<String, Value>) {
        (method.to_owned(), params.as_object().cloned().unwrap())
    }

    fn modern_params(extra: Value) -> Value {
        let mut params = json!({"_meta": {
            PROTOCOL_VERSION_META_KEY: "2026-07-28",
            CLIENT_CAPABILITIES_META_KEY: {},
        }});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        params
    }

    fn headers(version: Option<&str>, method: Option<&str>, name: Option<&str>) -> RoutingHeaders {
        RoutingHeaders {
            protocol_version: version.map(str::to_owned),
            method: method.map(str::to_owned),
            name: name.map(str::to_owned),
            ..RoutingHeaders::default()
        }
    }

    #[test]
    fn parse_accepts_requests_notifications_and_replies() {
        let m = parse_message(br#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#).unwrap();
        assert_eq!(
            m,
            Message::Request {
                id: json!(7),
                method: "tools/list".into(),
                params: Map::new()
            }
        );
        let n =
            parse_message(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(matches!(n, Message::Notification { .. }));
        let r = parse_message(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#).unwrap();
        assert_eq!(
            r,
            Message::Reply {
                id: json!("a"),
                outcome: Ok(json!({}))
            }
        );
        let r = parse_message(br#"{"jsonrpc":"2.0","id":3,"error":{"code":1}}"#).unwrap();
        assert_eq!(
            r,
            Message::Reply {
                id: json!(3),
                outcome: Err(json!({"code": 1}))
            }
        );
    }

    #[test]
    fn parse_errors_say_what_was_wrong_and_where() {
        let (_, e) = parse_message(b"{\"jsonrpc\": \"2.0\",\n  \"id\": 1,,}").unwrap_err();
        assert_eq!(e.code, code::PARSE_ERROR);
        assert!(e.message.starts_with("Parse error: "), "{}", e.message);
        assert!(e.message.contains("line 2 column"), "{}", e.message);
        assert_eq!(e.data.as_ref().unwrap()["line"], 2);
        let (_, e) = parse_message(b"{\"method\": \"p\xffing\"}").unwrap_err();
        assert_eq!(e.code, code::PARSE_ERROR);
        assert_eq!(e.message, "Parse error: invalid UTF-8 at byte 13");
        assert_eq!(e.data, Some(json!({"byte": 13})));
        let (_, e) = parse_message(b"").unwrap_err();
        assert!(e.message.contains("EOF"), "{}", e.message);
    }

    #[test]
    fn request_ids_are_read_best_effort() {
        assert_eq!(
            request_id(br#"{"jsonrpc":"2.0","id":7,"method":"m"}"#),
            json!(7)
        );
        assert_eq!(request_id(br#"{"id":"a"}"#), json!("a"));
        for body in [
            &b"{oops"[..],
            b"[]",
            br#"{"id":1.5}"#,
            br#"{"id":null}"#,
            b"",
        ] {
            assert_eq!(request_id(body), Value::Null, "{body:?}");
        }
    }

    #[test]
    fn parse_refuses_garbage_without_panicking() {
        let (id, e) = parse_message(b"{not json").unwrap_err();
        assert_eq!((id, e.code), (Value::Null, code::PARSE_ERROR));
        let (_, e) = parse_message(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_REQUEST);
        assert!(e.message.contains("batch"));
        for body in [
            &br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#[..],
            br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":3}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#,
            br#""just a string""#,
            b"",
        ] {
            let (_, e) = parse_message(body).unwrap_err();
            assert!(
                matches!(e.code, code::INVALID_REQUEST | code::PARSE_ERROR),
                "{body:?}"
            );
        }
        let (id, _) =
            parse_message(br#"{"jsonrpc":"2.0","id":"x","method":"m","params":5}"#).unwrap_err();
        assert_eq!(id, json!("x"));
        // serde_json's recursion limit turns deep nesting into an error, not a stack overflow.
        let deep = "[".repeat(100_000);
        assert_eq!(
            parse_message(deep.as_bytes()).unwrap_err().1.code,
            code::PARSE_ERROR
        );
    }

    #[test]
    fn era_follows_the_header_then_the_body_envelope() {
        let plain = parse_message(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#)
            .unwrap();
        let enveloped = parse_message(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        )
        .unwrap();
        assert_eq!(classify_era(None, &plain), Era::Legacy);
        assert_eq!(classify_era(None, &enveloped), Era::Modern);
        assert_eq!(classify_era(Some("2025-11-25"), &enveloped), Era::Modern);
        assert_eq!(classify_era(Some("2025-06-18"), &plain), Era::Legacy);
        assert_eq!(classify_era(Some("2024-11-05"), &plain), Era::Legacy);
        assert_eq!(classify_era(Some("2026-07-28"), &plain), Era::Modern);
        assert_eq!(classify_era(Some("2099-01-01"), &plain), Era::Modern);
        assert_eq!(
            classify_era(
                None,
                &Message::Reply {
                    id: json!(1),
                    outcome: Ok(json!({}))
                }
            ),
            Era::Legacy
        );
    }

    #[test]
    fn ladder_accepts_a_consistent_request() {
        let (m, p) = request("tools/call", modern_params(json!({"name": "read_file"})));
        let h = headers(Some("2026-07-28"), Some("tools/call"), Some("read_file"));
        assert_eq!(check_modern_request(&m, &p, &h).unwrap(), "2026-07-28");
        let (m, p) = request("server/discover", modern_params(json!({})));
        let h = headers(Some("2026-07-28"), Some("server/discover"), None);
        assert!(check_modern_request(&m, &p, &h).is_ok());
    }

    #[test]
    fn ladder_rejects_in_order() {
        let (m, p) = request("tools/call", modern_params(json!({"name": "read_file"})));
        let good = headers(Some("2026-07-28"), Some("tools/call"), Some("read_file"));
        let mut dup = good.clone();
        dup.duplicated = Some(HEADER_METHOD);
        assert_eq!(
            check_modern_request(&m, &p, &dup).unwrap_err().code,
            code::HEADER_MISMATCH
        );
        for bad in [
            headers(None, Some("tools/call"), Some("read_file")),
            headers(Some("2025-11-25"), Some("tools/call"), Some("read_file")),
            headers(Some("2026-07-28"), Some("tools/list"), Some("read_file")),
            headers(Some("2026-07-28"), None, Some("read_file")),
            headers(Some("2026-07-28"), Some("tools/call"), Some("write_file")),
            headers(Some("2026-07-28"), Some("tools/call"), None),
        ] {
            let e = check_modern_request(&m, &p, &bad).unwrap_err();
            assert_eq!(e.code, code::HEADER_MISMATCH, "{bad:?}");
            assert_eq!(e.modern_status(), StatusCode::BAD_REQUEST);
        }
        let (m2, p2) = request(
            "tools/list",
            json!({"_meta": {PROTOCOL_VERSION_META_KEY: "2026-07-28"}}),
        );
        let e = check_modern_request(
            &m2,
            &p2,
            &headers(Some("2026-07-28"), Some("tools/list"), None),
        )
        .unwrap_err();
        assert_eq!(e.code, code::INVALID_PARAMS);
        let (m3, p3) = request(
            "tools/list",
            json!({"_meta": {PROTOCOL_VERSION_META_KEY: "2099-01-01", CLIENT_CAPABILITIES_META_KEY: {}}}),
        );
        let e = check_modern_request(
            &m3,
            &p3,
            &headers(Some("2099-01-01"), Some("tools/list"), None),
        )
        .unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(
            e.data.unwrap()["supported"],
            json!(["2025-06-18", "2025-11-25", "2026-07-28"])
        );
        // A non-string version in the body can never match a header.
        let (m4, p4) = request(
            "tools/list",
            json!({"_meta": {PROTOCOL_VERSION_META_KEY: 2026, CLIENT_CAPABILITIES_META_KEY: {}}}),
        );
        let e = check_modern_request(&m4, &p4, &headers(Some("2026"), Some("tools/list"), None))
            .unwrap_err();
        assert_eq!(e.code, code::HEADER_MISMATCH);
    }

    #[test]
    fn param_header_values_are_checked_byte_by_byte_without_panicking() {
        assert_eq!(decode_param_value(b" \tHello\t ").as_deref(), Ok("Hello"));
        assert_eq!(decode_param_value(b"").as_deref(), Ok(""));
        assert_eq!(decode_param_value(b"  ").as_deref(), Ok(""));
        assert_eq!(decode_param_value(b"a\tb").as_deref(), Ok("a\tb"));
        for odd in [
            &b"\xff"[..],
            b"a\x00b",
            b"a\rb",
            b"a\nb",
            b"\x7f",
            b"h\xc3\xa9llo",
            b"=?base64?\xff?=",
        ] {
            assert!(decode_param_value(odd).is_err(), "{odd:?}");
        }
        assert!(decode_param_value("a".repeat(MAX_PARAM_HEADER_BYTES + 1).as_bytes()).is_err());
        assert_eq!(integer_value("42"), Some(42));
        assert_eq!(integer_value("-7.000"), Some(-7));
        for bad in [
            "",
            "-",
            "4 2",
            "42.",
            "42.5",
            "+4",
            "1e3",
            "0x2a",
            ".0",
            "9".repeat(60).as_str(),
        ] {
            assert_eq!(integer_value(bad), None, "{bad:?}");
        }
        assert!(param_value_matches(&json!(u64::MAX), &u64::MAX.to_string()));
        assert!(param_value_matches(&json!(1.5), "1.5"));
        assert!(!param_value_matches(&json!(1.5), "NaN"));
        assert!(!param_value_matches(&json!([1]), "[1]"));
    }

    #[test]
    fn param_annotations_follow_properties_only_and_must_be_unique_tokens() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "string", "x-mcp-header": "A"},
            "o": {"type": "object", "properties": {"b": {"type": "integer", "x-mcp-header": "B"}}},
            "l": {"type": "array", "items": {"type": "string", "x-mcp-header": "Ignored"}},
        }, "$defs": {"d": {"properties": {"c": {"x-mcp-header": "Ignored"}}}}});
        let found = param_annotations(&schema).unwrap();
        assert_eq!(
            found,
            vec![
                ParamAnnotation {
                    header: "A",
                    path: vec!["a"]
                },
                ParamAnnotation {
                    header: "B",
                    path: vec!["o", "b"]
                },
            ]
        );
        assert_eq!(
            param_annotations(&json!({"type": "object"})).unwrap(),
            vec![]
        );
        assert_eq!(param_annotations(&json!("not a schema")).unwrap(), vec![]);
        for bad in [
            json!({"properties": {"a": {"x-mcp-header": ""}}}),
            json!({"properties": {"a": {"x-mcp-header": "My Region"}}}),
            json!({"properties": {"a": {"x-mcp-header": "R\u{e9}gion"}}}),
            json!({"properties": {"a": {"x-mcp-header": 7}}}),
            json!({"properties": {"a": {"x-mcp-header": "X"}, "b": {"x-mcp-header": "x"}}}),
        ] {
            assert!(param_annotations(&bad).is_err(), "{bad}");
        }
        let mut deep = json!({"type": "string", "x-mcp-header": "Deep"});
        for _ in 0..=MAX_PARAM_ANNOTATION_DEPTH {
            deep = json!({"properties": {"p": deep}});
        }
        assert!(param_annotations(&deep).is_err());
    }

    #[test]
    fn mcp_name_may_be_base64_wrapped() {
        let (m, p) = request("tools/call", modern_params(json!({"name": "héllo"})));
        let wrapped = format!("=?base64?{}?=", base64_encode("héllo".as_bytes()));
        let h = headers(Some("2026-07-28"), Some("tools/call"), Some(&wrapped));
        assert!(check_modern_request(&m, &p, &h).is_ok());
        assert_eq!(decode_header_value("plain"), Some("plain".into()));
        assert_eq!(decode_header_value("=?base64?aGk=?="), Some("hi".into()));
        assert_eq!(
            decode_header_value("=?base64?aGl=?="),
            None,
            "non-canonical"
        );
        assert_eq!(decode_header_value("=?base64?a?="), None);
        assert_eq!(decode_header_value("=?base64?//8=?="), None, "not UTF-8");
        for s in ["", "f", "fo", "foo", "foob", "fooba", "foobar"] {
            assert_eq!(
                base64_decode(&base64_encode(s.as_bytes())).unwrap(),
                s.as_bytes()
            );
        }
    }

    #[test]
    fn routing_headers_notice_duplicates() {
        let mut map = HeaderMap::new();
        map.append(HEADER_METHOD, HeaderValue::from_static("tools/list"));
        map.append(HEADER_METHOD, HeaderValue::from_static("tools/call"));
        map.insert(
            HEADER_PROTOCOL_VERSION,
            HeaderValue::from_static("2026-07-28"),
        );
        let h = RoutingHeaders::from_headers(&map);
        assert_eq!(h.duplicated, Some(HEADER_METHOD));
        assert_eq!(h.protocol_version.as_deref(), Some("2026-07-28"));
    }

    #[test]
    fn accept_and_content_type() {
        assert_eq!(
            parse_accept(Some("application/json, text/event-stream")).framing(),
            Some(Framing::Json)
        );
        assert_eq!(
            parse_accept(Some("text/event-stream")).framing(),
            Some(Framing::Sse)
        );
        assert_eq!(parse_accept(Some("*/*")).framing(), Some(Framing::Json));
        assert_eq!(parse_accept(Some("text/html")).framing(), None);
        assert_eq!(parse_accept(None).framing(), Some(Framing::Json));
        assert!(is_json_content_type(Some(
            "application/json; charset=utf-8"
        )));
        assert!(!is_json_content_type(Some("text/plain")));
        assert!(!is_json_content_type(None));
    }

    #[test]
    fn status_table() {
        assert_eq!(
            RpcError::new(code::METHOD_NOT_FOUND, "").modern_status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            RpcError::new(code::PARSE_ERROR, "").modern_status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(RpcError::new(-32603, "").modern_status(), StatusCode::OK);
    }
}
