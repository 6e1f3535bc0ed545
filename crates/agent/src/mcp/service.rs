//! [`McpService`]: one HTTP request in, one response out. Routes `/mcp` and the RFC 9728
//! metadata paths, runs the checks in a fixed order (Origin, authentication, endpoint scope,
//! HTTP method, media types, JSON-RPC framing, era, era rules), then answers the MCP method,
//! asking the [`Backend`] for the caller's live operations and for the operation itself.
//!
//! Owns the mapping of every rejection to its HTTP answer, once ([`Rejection`]), written as the
//! request needs ([`Spelling`]: a JSON-RPC error for a JSON-RPC request, else the envelope),
//! and the shape of results per era. Must never call the backend before the caller is authenticated, never let a
//! tool failure become a JSON-RPC error or an HTTP 5xx, and never hold the session lock across an
//! `.await`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::{
    ACCEPT, ALLOW, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, ORIGIN, WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value, json};

use super::access;
use super::session::{SessionError, SessionTable};
use super::wire::{self, Era, Framing, Message, RoutingHeaders, RpcError, code};
use super::{
    Admission, AuthError, Backend, Body, CallError, Caller, McpConfig, RequestContext, ToolResult,
};
use agentworks_daemon::ipc::bearer::{Bearer, bearer};
use agentworks_daemon::ipc::envelope::{error_response, json_response};
use agentworks_daemon::ipc::server::{BodyRefusal, MAX_ANONYMOUS_BODY_BYTES, Verdict};

/// Legacy sessions kept at once; beyond this, idle ones are dropped, then opening fails (503).
/// With [`McpConfig::max_sessions_per_token`] it takes that many distinct tokens to get here.
const MAX_SESSIONS: usize = 4096;
/// A legacy session unused this long is forgotten (its id then answers 404).
const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// The MCP endpoint over a [`Backend`].
pub struct McpService<B: Backend> {
    /// Authenticates callers, lists their live operations, runs operations.
    backend: Arc<B>,
    /// Public URL, allowed origins, server name and version.
    config: McpConfig,
    /// Legacy-era sessions minted at `initialize`.
    sessions: SessionTable,
    /// `<public_url>/.well-known/oauth-protected-resource/mcp`, named in every challenge.
    metadata_url: String,
}

/// How a refusal is written for the request it answers (see the module docs of
/// [`super`], "Refusals").
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Spelling {
    /// Not a JSON-RPC request (GET, DELETE, a body that is not `application/json`): the
    /// agentworks error envelope `{"error": {code, message, ...details}}`.
    Envelope,
    /// A JSON-RPC request (a POST with a JSON content type): a JSON-RPC error answering this
    /// id, `null` when it is not known (the body was not read, or has none that is valid).
    JsonRpc(Value),
}

impl Spelling {
    /// From the request's head alone (before its body is read): the id is not known.
    pub(super) fn for_head(method: &Method, headers: &HeaderMap) -> Spelling {
        let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
        if method == Method::POST && wire::is_json_content_type(content_type) {
            Spelling::JsonRpc(Value::Null)
        } else {
            Spelling::Envelope
        }
    }

    /// For a whole request: as [`Spelling::for_head`], answering the body's id when it has one.
    fn for_request(request: &Request<bytes::Bytes>) -> Spelling {
        match Spelling::for_head(request.method(), request.headers()) {
            Spelling::JsonRpc(_) => Spelling::JsonRpc(wire::request_id(request.body())),
            Spelling::Envelope => Spelling::Envelope,
        }
    }

    /// The answer: `status`, with our stable `code`, `message` and `details` in the envelope, or
    /// as a JSON-RPC error whose `data` is `{code, message, ...details}` (`code` and `message`
    /// written last, so a detail cannot forge them).
    fn answer(
        &self,
        status: StatusCode,
        rpc_code: i64,
        code: &str,
        message: String,
        details: Map<String, Value>,
    ) -> Response<Body> {
        match self {
            Spelling::Envelope => error_response(status, code, message, details),
            Spelling::JsonRpc(id) => {
                let mut data = details;
                data.insert("code".to_owned(), Value::String(code.to_owned()));
                data.insert("message".to_owned(), Value::String(message.clone()));
                let error = RpcError {
                    code: rpc_code,
                    message,
                    data: Some(Value::Object(data)),
                };
                wire::message_response(status, Framing::Json, &wire::error_message(id, &error))
            }
        }
    }
}

/// A request refused at the HTTP layer, answered with the agentworks error envelope or, for a
/// JSON-RPC request, a JSON-RPC error carrying the same code and message ([`Spelling`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum Rejection {
    #[error("origin {0:?} may not call this endpoint")]
    OriginForbidden(String),
    #[error("{0}")]
    Unauthorized(AuthError),
    #[error("this token lacks the scope {scope}")]
    InsufficientScope { scope: String },
    #[error("method not allowed here; allowed: {allow}")]
    MethodNotAllowed { allow: &'static str },
    #[error("the client must accept application/json or text/event-stream")]
    NotAcceptable,
    #[error("the request body must be application/json")]
    UnsupportedMediaType,
    #[error("bad Mcp-Session-Id header: {0}")]
    BadSessionHeader(&'static str),
    #[error(transparent)]
    Session(#[from] SessionError),
}

impl Rejection {
    /// The one mapping from rejection to HTTP answer: status, stable code, JSON-RPC code (used
    /// when `spelling` is [`Spelling::JsonRpc`]) and headers.
    fn into_response(self, metadata_url: &str, spelling: &Spelling) -> Response<Body> {
        let message = self.to_string();
        let mut details = Map::new();
        let (status, rpc_code, code, challenge, allow) = match self {
            Rejection::OriginForbidden(_) => (
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                "origin_forbidden",
                None,
                None,
            ),
            Rejection::Unauthorized(error) => (
                StatusCode::UNAUTHORIZED,
                code::UNAUTHORIZED,
                error.code(),
                Some(access::unauthorized_challenge(error, metadata_url)),
                None,
            ),
            Rejection::InsufficientScope { scope } => {
                details.insert("scope".to_owned(), Value::String(scope.clone()));
                (
                    StatusCode::FORBIDDEN,
                    code::FORBIDDEN,
                    "insufficient_scope",
                    Some(access::insufficient_scope_challenge(&scope, metadata_url)),
                    None,
                )
            }
            Rejection::MethodNotAllowed { allow } => (
                StatusCode::METHOD_NOT_ALLOWED,
                code::INVALID_REQUEST,
                "method_not_allowed",
                None,
                Some(allow),
            ),
            Rejection::NotAcceptable => (
                StatusCode::NOT_ACCEPTABLE,
                code::INVALID_REQUEST,
                "not_acceptable",
                None,
                None,
            ),
            Rejection::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                code::INVALID_REQUEST,
                "unsupported_media_type",
                None,
                None,
            ),
            Rejection::BadSessionHeader(_) => (
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                "bad_session_header",
                None,
                None,
            ),
            Rejection::Session(SessionError::NotFound) => (
                StatusCode::NOT_FOUND,
                code::SESSION_NOT_FOUND,
                "session_not_found",
                None,
                None,
            ),
            Rejection::Session(SessionError::Full) => (
                StatusCode::SERVICE_UNAVAILABLE,
                code::UNAVAILABLE,
                "too_many_sessions",
                None,
                None,
            ),
        };
        let mut response = spelling.answer(status, rpc_code, code, message, details);
        let headers = response.headers_mut();
        if let Some(challenge) = challenge.and_then(|c| HeaderValue::from_str(&c).ok()) {
            headers.insert(WWW_AUTHENTICATE, challenge);
        }
        if let Some(allow) = allow {
            headers.insert(ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

/// Why a method call did not produce a result.
enum Failure {
    /// A JSON-RPC error in the response body.
    Rpc(RpcError),
    /// An HTTP-level refusal (a tool the token's scopes do not cover).
    Http(Rejection),
}

impl From<RpcError> for Failure {
    fn from(error: RpcError) -> Failure {
        Failure::Rpc(error)
    }
}

impl From<Rejection> for Failure {
    fn from(rejection: Rejection) -> Failure {
        Failure::Http(rejection)
    }
}

fn header_str(
    request: &Request<bytes::Bytes>,
    name: impl hyper::header::AsHeaderName,
) -> Option<&str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

impl<B: Backend> McpService<B> {
    /// An endpoint serving `backend` as described by `config`.
    pub fn new(backend: Arc<B>, config: McpConfig) -> McpService<B> {
        let public_url = config.public_url.trim_end_matches('/').to_owned();
        let config = McpConfig {
            public_url,
            ..config
        };
        let sessions = SessionTable::new(
            MAX_SESSIONS,
            config.max_sessions_per_token,
            SESSION_IDLE_TIMEOUT,
        );
        McpService {
            metadata_url: access::resource_metadata_url(&config.public_url),
            backend,
            config,
            sessions,
        }
    }

    /// Handles `/mcp` (POST; GET and DELETE per era) and both
    /// `/.well-known/oauth-protected-resource` and `/.well-known/oauth-protected-resource/mcp`
    /// (RFC 9728 metadata). Returns `None` for any other path so the caller routes it elsewhere.
    pub async fn handle(&self, request: Request<bytes::Bytes>) -> Option<Response<Body>> {
        match request.uri().path() {
            "/mcp" => Some(match self.handle_mcp(&request).await {
                Ok(response) => response,
                Err(rejection) => {
                    tracing::debug!(%rejection, "mcp request refused");
                    rejection.into_response(&self.metadata_url, &Spelling::for_request(&request))
                }
            }),
            "/.well-known/oauth-protected-resource" => Some(self.metadata(&request, false)),
            "/.well-known/oauth-protected-resource/mcp" => Some(self.metadata(&request, true)),
            _ => None,
        }
    }

    /// The RFC 9728 protected-resource metadata. The path-suffixed document describes
    /// `<public_url>/mcp`; the root one describes `<public_url>` (RFC 9728 §3.3: `resource` must
    /// equal the identifier the well-known URL was formed from). Public: no auth.
    fn metadata(&self, request: &Request<bytes::Bytes>, for_mcp: bool) -> Response<Body> {
        if request.method() != Method::GET {
            return Rejection::MethodNotAllowed { allow: "GET" }
                .into_response(&self.metadata_url, &Spelling::Envelope);
        }
        let resource = if for_mcp {
            format!("{}/mcp", self.config.public_url)
        } else {
            self.config.public_url.clone()
        };
        json_response(
            StatusCode::OK,
            &json!({
                "resource": resource,
                "bearer_methods_supported": ["header"],
                "scopes_supported": self.config.scopes_supported,
                "resource_name": self.config.server_name,
            }),
        )
    }

    /// The checks of a `/mcp` request that need only its headers (steps 1–3 of
    /// [`McpService::handle`]): the answer it would get if they fail. The public listener
    /// calls this before it reads the body, so a request that would be refused anyway never
    /// makes us hold its body; `handle` runs the same checks again on the whole request.
    /// A JSON-RPC request's refusal answers id `null`: its body, and so its id, is unread.
    pub async fn screen(&self, method: &Method, headers: &HeaderMap) -> Result<(), Response<Body>> {
        self.admit(headers).await.map(drop).map_err(|rejection| {
            rejection.into_response(&self.metadata_url, &Spelling::for_head(method, headers))
        })
    }

    /// The public listener's verdict on a `/mcp` request head: refused with the answer
    /// [`McpService::screen`] gives, else authenticated with a body of up to `max_body_bytes`
    /// for a POST (a GET or DELETE carries none worth more than the anonymous limit).
    pub async fn verdict(
        &self,
        head: &hyper::http::request::Parts,
        max_body_bytes: usize,
    ) -> Verdict {
        match self.screen(&head.method, &head.headers).await {
            Ok(()) if head.method == Method::POST => Verdict::Authenticated { max_body_bytes },
            Ok(()) => Verdict::Authenticated {
                max_body_bytes: MAX_ANONYMOUS_BODY_BYTES,
            },
            Err(refusal) => Verdict::Refused(refusal),
        }
    }

    /// The answer to a `/mcp` request whose body the public listener refused to read (413,
    /// 400, 408, 503): the envelope, or for a JSON-RPC request a JSON-RPC error with id `null`
    /// carrying the same code and message (`-32013` for 503, `-32600` otherwise).
    pub fn body_refusal(
        &self,
        method: &Method,
        headers: &HeaderMap,
        refusal: BodyRefusal,
    ) -> Response<Body> {
        let rpc_code = if refusal.status == StatusCode::SERVICE_UNAVAILABLE {
            code::UNAVAILABLE
        } else {
            code::INVALID_REQUEST
        };
        Spelling::for_head(method, headers).answer(
            refusal.status,
            rpc_code,
            refusal.code,
            refusal.message,
            refusal.details,
        )
    }

    /// Steps 1–3: Origin, authentication, the endpoint's scope.
    async fn admit(&self, headers: &HeaderMap) -> Result<Caller, Rejection> {
        // 1. Origin, before anything else: a page on another origin (DNS rebinding) must learn
        //    nothing, not even whether a token works.
        let origin = headers.get(ORIGIN).and_then(|v| v.to_str().ok());
        if headers.contains_key(ORIGIN)
            && !access::origin_allowed(
                Some(origin.unwrap_or("")),
                &self.config.public_url,
                &self.config.allowed_origins,
                self.config.loopback_port,
            )
        {
            return Err(Rejection::OriginForbidden(
                origin.unwrap_or("<not ASCII>").to_owned(),
            ));
        }
        // 2.–3. Authenticate every request, including initialize, discover, GET and DELETE;
        //    the backend also decides whether the caller may use the endpoint at all (a 403).
        let admitted = match bearer(headers) {
            Bearer::Absent => self.backend.authenticate(None).await,
            Bearer::Token(token) => self.backend.authenticate(Some(token)).await,
            Bearer::Malformed => Err(Admission::Unauthorized(AuthError::Invalid)),
        };
        admitted.map_err(|refused| match refused {
            Admission::Unauthorized(error) => Rejection::Unauthorized(error),
            Admission::InsufficientScope(scope) => Rejection::InsufficientScope { scope },
        })
    }

    async fn handle_mcp(
        &self,
        request: &Request<bytes::Bytes>,
    ) -> Result<Response<Body>, Rejection> {
        // 1.–3. Origin, authentication, scope.
        let caller = self.admit(request.headers()).await?;
        // 4. The HTTP method; GET offers no stream in either era (we never push).
        let modern_header = request
            .headers()
            .get(wire::HEADER_PROTOCOL_VERSION)
            .is_some_and(|v| !wire::names_handshake_era(&String::from_utf8_lossy(v.as_bytes())));
        let allow = if modern_header {
            "POST"
        } else {
            "POST, DELETE"
        };
        match *request.method() {
            Method::POST => self.post(&caller, request).await,
            Method::DELETE
                if !modern_header && request.headers().contains_key(wire::HEADER_SESSION_ID) =>
            {
                self.delete(&caller, request)
            }
            _ => Err(Rejection::MethodNotAllowed { allow }),
        }
    }

    /// The `Mcp-Session-Id` header, if one (and only one) was sent.
    fn session_header<'a>(
        &self,
        request: &'a Request<bytes::Bytes>,
    ) -> Result<Option<&'a str>, Rejection> {
        let mut values = request.headers().get_all(wire::HEADER_SESSION_ID).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(Rejection::BadSessionHeader("sent more than once"));
        }
        value
            .to_str()
            .map(Some)
            .map_err(|_| Rejection::BadSessionHeader("not visible ASCII"))
    }

    /// DELETE ends a legacy session (only its own token may).
    fn delete(
        &self,
        caller: &Caller,
        request: &Request<bytes::Bytes>,
    ) -> Result<Response<Body>, Rejection> {
        let Some(id) = self.session_header(request)? else {
            return Err(Rejection::MethodNotAllowed {
                allow: "POST, DELETE",
            });
        };
        self.sessions.close(id, &caller.token_id, Instant::now())?;
        let mut response = Response::new(Body::default());
        *response.status_mut() = StatusCode::NO_CONTENT;
        Ok(response)
    }

    async fn post(
        &self,
        caller: &Caller,
        request: &Request<bytes::Bytes>,
    ) -> Result<Response<Body>, Rejection> {
        if !wire::is_json_content_type(header_str(request, CONTENT_TYPE)) {
            return Err(Rejection::UnsupportedMediaType);
        }
        let framing = wire::parse_accept(header_str(request, ACCEPT))
            .framing()
            .ok_or(Rejection::NotAcceptable)?;
        let message = match wire::parse_message(request.body()) {
            Ok(message) => message,
            Err((id, error)) => {
                return Ok(wire::message_response(
                    StatusCode::BAD_REQUEST,
                    Framing::Json,
                    &wire::error_message(&id, &error),
                ));
            }
        };
        let headers = RoutingHeaders::from_headers(request.headers());
        match wire::classify_era(headers.protocol_version.as_deref(), &message) {
            Era::Modern => self.post_modern(caller, message, &headers, framing).await,
            Era::Legacy => {
                self.post_legacy(caller, request, message, &headers, framing)
                    .await
            }
        }
    }

    async fn post_modern(
        &self,
        caller: &Caller,
        message: Message,
        headers: &RoutingHeaders,
        framing: Framing,
    ) -> Result<Response<Body>, Rejection> {
        let reject = |id: &Value, error: RpcError| {
            wire::message_response(
                error.modern_status(),
                Framing::Json,
                &wire::error_message(id, &error),
            )
        };
        let (id, method, params) = match message {
            Message::Request { id, method, params } => (id, method, params),
            Message::Notification { .. } => {
                // No client-to-server notification means anything on this wire; acknowledge
                // one at a served version and drop it.
                let version = headers.protocol_version.as_deref().unwrap_or("");
                if !wire::MODERN_VERSIONS.contains(&version) {
                    let error =
                        RpcError::unsupported_version(code::UNSUPPORTED_PROTOCOL_VERSION, version);
                    return Ok(reject(&Value::Null, error));
                }
                return Ok(accepted());
            }
            Message::Reply => {
                let error = RpcError::new(
                    code::INVALID_REQUEST,
                    "Body must be a single JSON-RPC request or notification object",
                );
                return Ok(reject(&Value::Null, error));
            }
        };
        if let Err(error) = wire::check_modern_request(&method, &params, headers) {
            return Ok(reject(&id, error));
        }
        match self.dispatch(caller, Era::Modern, &method, &params).await {
            Ok(result) => Ok(wire::message_response(
                StatusCode::OK,
                framing,
                &wire::result_message(&id, result),
            )),
            Err(Failure::Rpc(error)) => Ok(reject(&id, error)),
            Err(Failure::Http(rejection)) => Err(rejection),
        }
    }

    async fn post_legacy(
        &self,
        caller: &Caller,
        request: &Request<bytes::Bytes>,
        message: Message,
        headers: &RoutingHeaders,
        framing: Framing,
    ) -> Result<Response<Body>, Rejection> {
        // The version header is optional in this era, but when present it must be one we serve.
        if let Some(version) = headers.protocol_version.as_deref()
            && !wire::HANDSHAKE_VERSIONS.contains(&version)
        {
            let error = RpcError::unsupported_version(code::INVALID_REQUEST, version);
            return Ok(wire::message_response(
                StatusCode::BAD_REQUEST,
                Framing::Json,
                &wire::error_message(&Value::Null, &error),
            ));
        }
        // A session id must name a live session of this token (else 404, as if it never existed).
        let now = Instant::now();
        if let Some(id) = self.session_header(request)? {
            self.sessions.resolve(id, &caller.token_id, now)?;
        }
        let (id, method, params) = match message {
            Message::Request { id, method, params } => (id, method, params),
            Message::Notification { .. } | Message::Reply => return Ok(accepted()),
        };
        if method == "initialize" {
            let offered = params
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            let version = if wire::HANDSHAKE_VERSIONS.contains(&offered) {
                offered
            } else {
                wire::LATEST_HANDSHAKE_VERSION
            };
            let session = self.sessions.open(&caller.token_id, version, now)?;
            let result = json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": self.config.server_name, "version": self.config.server_version},
                "instructions": self.config.instructions,
            });
            let mut response =
                wire::message_response(StatusCode::OK, framing, &wire::result_message(&id, result));
            if let Ok(value) = HeaderValue::from_str(&session) {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(wire::HEADER_SESSION_ID), value);
            }
            return Ok(response);
        }
        match self.dispatch(caller, Era::Legacy, &method, &params).await {
            Ok(result) => Ok(wire::message_response(
                StatusCode::OK,
                framing,
                &wire::result_message(&id, result),
            )),
            // Handshake-era transports carry method errors in a 200 body.
            Err(Failure::Rpc(error)) => Ok(wire::message_response(
                StatusCode::OK,
                framing,
                &wire::error_message(&id, &error),
            )),
            Err(Failure::Http(rejection)) => Err(rejection),
        }
    }

    /// Answers one MCP method for an authenticated caller.
    async fn dispatch(
        &self,
        caller: &Caller,
        era: Era,
        method: &str,
        params: &Map<String, Value>,
    ) -> Result<Value, Failure> {
        let request = RequestContext { caller, era };
        let mut result = match (method, era) {
            ("server/discover", Era::Modern) => json!({
                "supportedVersions": wire::supported_versions(),
                "capabilities": {"tools": {}},
                "instructions": self.config.instructions,
                "ttlMs": 0,
                "cacheScope": "private",
                "_meta": {wire::SERVER_INFO_META_KEY: {
                    "name": self.config.server_name,
                    "version": self.config.server_version,
                }},
            }),
            ("ping", Era::Legacy) => return Ok(json!({})),
            ("tools/list", _) => {
                let tools = self.backend.list_tools(request).await;
                let mut result = json!({ "tools": tools });
                if era == Era::Modern {
                    // The list depends on the token, so it may only be cached per token.
                    result["ttlMs"] = json!(0);
                    result["cacheScope"] = json!("private");
                }
                result
            }
            ("tools/call", _) => {
                let Some(name) = params.get("name").and_then(Value::as_str) else {
                    return Err(RpcError::new(
                        code::INVALID_PARAMS,
                        "tools/call needs a string `name`",
                    )
                    .into());
                };
                let arguments = match params.get("arguments") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(arguments)) => arguments.clone(),
                    Some(_) => {
                        return Err(RpcError::new(
                            code::INVALID_PARAMS,
                            "tools/call `arguments` must be an object",
                        )
                        .into());
                    }
                };
                match self.backend.call_tool(request, name, arguments).await {
                    Ok(result) => tool_result(result, era),
                    Err(CallError::UnknownTool(name)) => {
                        let mut error =
                            RpcError::new(code::INVALID_PARAMS, format!("Unknown tool: {name}"));
                        error.data = Some(json!({ "name": name }));
                        return Err(error.into());
                    }
                    Err(CallError::InsufficientScope(scope)) => {
                        return Err(Rejection::InsufficientScope { scope }.into());
                    }
                }
            }
            _ => {
                return Err(RpcError::new(
                    code::METHOD_NOT_FOUND,
                    format!("Method not found: {method}"),
                )
                .into());
            }
        };
        if era == Era::Modern
            && let Some(object) = result.as_object_mut()
        {
            object.insert("resultType".to_owned(), json!("complete"));
        }
        Ok(result)
    }
}

/// 202 Accepted, no body: a notification or reply was taken.
fn accepted() -> Response<Body> {
    let mut response = Response::new(Body::default());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

/// A `tools/call` result as the era spells it.
fn tool_result(result: ToolResult, era: Era) -> Value {
    let mut body = json!({
        "content": result.content,
        "isError": result.is_error,
    });
    if let Some(structured) = result.structured_content {
        // Before 2026-07-28, structured content must be an object.
        body["structuredContent"] = if era == Era::Legacy && !structured.is_object() {
            json!({ "result": structured })
        } else {
            structured
        };
    }
    body
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn legacy_structured_content_is_always_an_object() {
        let structured = |value: Value, era: Era| {
            let result = ToolResult {
                content: vec![],
                structured_content: Some(value),
                is_error: false,
            };
            tool_result(result, era)["structuredContent"].clone()
        };
        assert_eq!(structured(json!([1]), Era::Legacy), json!({"result": [1]}));
        assert_eq!(structured(json!([1]), Era::Modern), json!([1]));
        assert_eq!(structured(json!({"a": 1}), Era::Legacy), json!({"a": 1}));
    }

    #[test]
    fn json_rpc_requests_get_json_rpc_refusals_with_the_same_status_and_headers() {
        let url = "http://h/.well-known/oauth-protected-resource/mcp";
        let spelling = Spelling::JsonRpc(json!(7));
        let r = Rejection::Unauthorized(AuthError::Missing).into_response(url, &spelling);
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(
            r.headers()[WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .contains("resource_metadata")
        );
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
        let r = Rejection::InsufficientScope {
            scope: "workflows:write".to_owned(),
        }
        .into_response(url, &spelling);
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(
            r.headers()[WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .contains("insufficient_scope")
        );
        let r = Rejection::MethodNotAllowed { allow: "POST" }.into_response(url, &spelling);
        assert_eq!(r.headers()[ALLOW], "POST");
        // The spelling follows the request's head: a JSON POST is JSON-RPC, nothing else is.
        let mut headers = HeaderMap::new();
        assert_eq!(
            Spelling::for_head(&Method::POST, &headers),
            Spelling::Envelope
        );
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        assert_eq!(
            Spelling::for_head(&Method::POST, &headers),
            Spelling::JsonRpc(Value::Null)
        );
        assert_eq!(
            Spelling::for_head(&Method::GET, &headers),
            Spelling::Envelope
        );
        assert_eq!(
            Spelling::for_head(&Method::DELETE, &headers),
            Spelling::Envelope
        );
    }

    #[test]
    fn rejections_map_to_statuses_and_challenges() {
        let url = "http://h/.well-known/oauth-protected-resource/mcp";
        let r = Rejection::Unauthorized(AuthError::Expired).into_response(url, &Spelling::Envelope);
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(
            r.headers()[WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .contains("invalid_token")
        );
        let r = Rejection::InsufficientScope {
            scope: "workflows:write".to_owned(),
        }
        .into_response(url, &Spelling::Envelope);
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(
            r.headers()[WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .contains("scope=\"workflows:write\"")
        );
        let r =
            Rejection::MethodNotAllowed { allow: "POST" }.into_response(url, &Spelling::Envelope);
        assert_eq!(r.headers()[ALLOW], "POST");
        assert_eq!(
            Rejection::Session(SessionError::NotFound)
                .into_response(url, &Spelling::Envelope)
                .status(),
            StatusCode::NOT_FOUND
        );
    }
}
