//! [`McpService`]: one HTTP request in, one response out. Routes `/mcp` and the RFC 9728
//! metadata paths, runs the checks in a fixed order (Origin, authentication, endpoint scope,
//! HTTP method, media types, JSON-RPC framing, era, era rules), then answers the MCP method,
//! asking the [`Backend`] for the caller's live operations and for the operation itself.
//!
//! Owns the mapping of every rejection to its HTTP answer, once ([`Rejection`]), written as the
//! request needs ([`Spelling`]: a JSON-RPC error for a JSON-RPC request, else the envelope),
//! and the shape of results per era: the method table per era and [`Features`], capabilities,
//! cache hints, `resultType`, input-required results (sealed state on 2026-07-28, server-to-
//! client requests on the POST's stream in 2025), and answers that stream notifications.
//! Must never call the backend before the caller is authenticated, never let a tool failure
//! become a JSON-RPC error or an HTTP 5xx, never route a method the backend did not declare,
//! and never hold the session lock across an `.await`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::header::{
    ACCEPT, CACHE_CONTROL, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, ORIGIN,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value, json};

use super::access;
use super::answer::{Answer, Failure, Rejection, Spelling};
use super::client_requests::ClientRequests;
use super::request_state::{self, Binding, Sealer};
use super::session::SessionTable;
use super::stream::{self, Notifier};
use super::wire::{self, Era, Framing, LogLevel, Message, RoutingHeaders, RpcError, code};
use super::{
    Admission, AuthError, Backend, Body, CacheHint, CallError, Caller, Completion, CompletionRef,
    Features, InputRequired, McpConfig, PromptResult, RequestContext, ToolResult,
};
use agentworks_daemon::ipc::bearer::{Bearer, bearer};
use agentworks_daemon::ipc::envelope::json_response;
use agentworks_daemon::ipc::server::{BodyRefusal, MAX_ANONYMOUS_BODY_BYTES, Verdict};
use tokio::sync::mpsc;

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
    challenge: access::Challenge,
    /// Seals the `requestState` of input-required results.
    sealer: Arc<Sealer>,
    /// 2025-era requests to clients waiting for their replies.
    client_requests: Arc<ClientRequests>,
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
            challenge: access::Challenge {
                metadata_url: access::resource_metadata_url(&config.public_url),
                scope: config.scopes_supported.join(" "),
            },
            backend,
            config,
            sessions,
            sealer: Arc::new(Sealer::new()),
            client_requests: Arc::new(ClientRequests::default()),
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
                    rejection.into_response(&self.challenge, &Spelling::for_request(&request))
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
                .into_response(&self.challenge, &Spelling::Envelope);
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
                "authorization_servers": self.config.authorization_servers,
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
            rejection.into_response(&self.challenge, &Spelling::for_head(method, headers))
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
        let accept = wire::parse_accept(header_str(request, ACCEPT));
        let framing = accept.framing().ok_or(Rejection::NotAcceptable)?;
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
        let reply = Reply {
            framing,
            streams: accept.sse,
        };
        match wire::classify_era(headers.protocol_version.as_deref(), &message) {
            Era::Modern => self.post_modern(caller, message, &headers, reply).await,
            Era::Legacy => {
                self.post_legacy(caller, request, message, &headers, reply)
                    .await
            }
        }
    }

    async fn post_modern(
        &self,
        caller: &Caller,
        message: Message,
        headers: &RoutingHeaders,
        reply: Reply,
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
            Message::Reply { .. } => {
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
        let meta = params.get("_meta").and_then(Value::as_object);
        let Some(client_capabilities) = meta
            .and_then(|meta| meta.get(wire::CLIENT_CAPABILITIES_META_KEY))
            .and_then(Value::as_object)
            .cloned()
        else {
            let error = RpcError::new(
                code::INVALID_PARAMS,
                format!(
                    "params._meta[{:?}] must be an object",
                    wire::CLIENT_CAPABILITIES_META_KEY
                ),
            );
            return Ok(reject(&id, error));
        };
        // Log messages only when this request asks for them, and only from a backend that logs.
        let log_level = match meta.and_then(|meta| meta.get(wire::LOG_LEVEL_META_KEY)) {
            Some(level) if self.backend.features().logging => {
                match level.as_str().and_then(LogLevel::parse) {
                    Some(level) => Some(level),
                    None => {
                        let error = RpcError::new(
                            code::INVALID_PARAMS,
                            format!(
                                "params._meta[{:?}] must be a log level (debug, info, notice, warning, error, critical, alert, emergency)",
                                wire::LOG_LEVEL_META_KEY
                            ),
                        );
                        return Ok(reject(&id, error));
                    }
                }
            }
            _ => None,
        };
        let progress_token = match progress_token(&params) {
            Ok(token) => token,
            Err(error) => return Ok(reject(&id, error)),
        };
        let call = Call {
            session: None,
            caller: caller.clone(),
            era: Era::Modern,
            method,
            params,
            client_capabilities,
            progress_token,
            log_level,
        };
        if call.method == "tools/call"
            && let Err(error) = self.check_param_headers(&call, headers).await
        {
            return Ok(reject(&id, error));
        }
        self.answer(call, id, reply).await
    }

    /// SEP-2243 custom headers: the called tool's `x-mcp-header` arguments, as this caller's
    /// `tools/list` declares them, against the request's `Mcp-Param-*` headers
    /// ([`wire::check_param_headers`]). A call without a string name or with non-object
    /// arguments passes here and is refused by `invoke` as invalid params; a tool the caller
    /// does not have passes here and is refused as unknown.
    async fn check_param_headers(
        &self,
        call: &Call,
        headers: &RoutingHeaders,
    ) -> Result<(), RpcError> {
        let Some(name) = call.params.get("name").and_then(Value::as_str) else {
            return Ok(());
        };
        let no_arguments = Map::new();
        let arguments = match call.params.get("arguments") {
            None | Some(Value::Null) => &no_arguments,
            Some(Value::Object(arguments)) => arguments,
            Some(_) => return Ok(()),
        };
        let notifier = Notifier::silent();
        let request = RequestContext {
            caller: &call.caller,
            era: call.era,
            client_capabilities: &call.client_capabilities,
            notifier: &notifier,
            input_responses: None,
            request_state: None,
        };
        let Some(schema) = self.backend.tool_input_schema(request, name).await else {
            return Ok(());
        };
        wire::check_param_headers(name, &schema, arguments, headers)
    }

    async fn post_legacy(
        &self,
        caller: &Caller,
        request: &Request<bytes::Bytes>,
        message: Message,
        headers: &RoutingHeaders,
        reply: Reply,
    ) -> Result<Response<Body>, Rejection> {
        let framing = reply.framing;
        // The version header is optional in this era, but when present it must be one we serve.
        if let Some(version) = headers.protocol_version.as_deref()
            && !wire::HANDSHAKE_VERSIONS.contains(&version)
        {
            let error = RpcError::unsupported_version(code::INVALID_REQUEST, version);
            // A request's error answers its id (JSON-RPC 2.0 §5); only what has none gets null.
            let id = match &message {
                Message::Request { id, .. } => id.clone(),
                Message::Notification { .. } | Message::Reply { .. } => Value::Null,
            };
            return Ok(wire::message_response(
                StatusCode::BAD_REQUEST,
                Framing::Json,
                &wire::error_message(&id, &error),
            ));
        }
        // A session id must name a live session of this token (else 404, as if it never existed).
        let now = Instant::now();
        let session_id = self.session_header(request)?;
        let session = match session_id {
            Some(id) => Some(self.sessions.resolve(id, &caller.token_id, now)?),
            None => None,
        };
        let (id, method, params) = match message {
            Message::Request { id, method, params } => (id, method, params),
            Message::Notification { .. } => return Ok(accepted()),
            Message::Reply { id, outcome } => {
                // A reply to one of our requests on this session; any other is dropped.
                if let Some(session) = session_id
                    && !self.client_requests.answer(session, &id, outcome)
                {
                    tracing::debug!(%id, "mcp reply matches no waiting request; dropped");
                }
                return Ok(accepted());
            }
        };
        let features = self.backend.features();
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
            let client_capabilities = params
                .get("capabilities")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let session =
                self.sessions
                    .open(&caller.token_id, version, &client_capabilities, now)?;
            let result = json!({
                "protocolVersion": version,
                "capabilities": capabilities(features, Era::Legacy),
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
        if method == "logging/setLevel" && features.logging {
            let answer = match (
                params
                    .get("level")
                    .and_then(Value::as_str)
                    .and_then(LogLevel::parse),
                session_id,
            ) {
                (None, _) => Err(RpcError::new(
                    code::INVALID_PARAMS,
                    "logging/setLevel needs a `level`: debug, info, notice, warning, error, critical, alert or emergency",
                )),
                (Some(_), None) => Err(RpcError::new(
                    code::INVALID_REQUEST,
                    "logging/setLevel needs a session (Mcp-Session-Id) to remember the level on",
                )),
                (Some(level), Some(session_id)) => {
                    self.sessions
                        .set_log_level(session_id, &caller.token_id, level, now)?;
                    Ok(json!({}))
                }
            };
            let message = match answer {
                Ok(result) => wire::result_message(&id, result),
                Err(error) => wire::error_message(&id, &error),
            };
            return Ok(wire::message_response(StatusCode::OK, framing, &message));
        }
        let progress_token = match progress_token(&params) {
            Ok(token) => token,
            Err(error) => {
                return Ok(wire::message_response(
                    StatusCode::OK,
                    framing,
                    &wire::error_message(&id, &error),
                ));
            }
        };
        let (client_capabilities, log_level) = match session {
            Some(session) => (
                session.client_capabilities,
                session.log_level.filter(|_| features.logging),
            ),
            None => (Map::new(), None),
        };
        let call = Call {
            session: session_id.map(str::to_owned),
            caller: caller.clone(),
            era: Era::Legacy,
            method,
            params,
            client_capabilities,
            progress_token,
            log_level,
        };
        self.answer(call, id, reply).await
    }

    /// Answers one request: inline, or, when it may send notifications (it carries a
    /// `progressToken` or a log level, and the client accepts a stream), on a task whose
    /// notifications turn the answer into a stream of server-sent events. The answer stays
    /// plain JSON until the first notification actually arrives, so a request that sends none
    /// (or is refused, say 403 for a missing scope) is answered exactly as without streaming.
    async fn answer(
        &self,
        call: Call,
        id: Value,
        reply: Reply,
    ) -> Result<Response<Body>, Rejection> {
        let era = call.era;
        // A 2025 call on a session may also ask the client for input on its stream.
        let may_stream = reply.streams
            && CALL_LIKE_METHODS.contains(&call.method.as_str())
            && (call.progress_token.is_some()
                || call.log_level.is_some()
                || (era == Era::Legacy && call.session.is_some()));
        if !may_stream {
            let answer = self.dispatch(&call, &Notifier::silent()).await;
            return respond(era, &id, reply.framing, answer);
        }
        let (sender, mut queue) = mpsc::channel(stream::QUEUE_EVENTS);
        let backend = self.backend.clone();
        let sealer = self.sealer.clone();
        let client_requests = self.client_requests.clone();
        // The task owns everything it uses, so it runs to its end even if the client goes away
        // (a write is never cut in half); its notifications are then dropped.
        tokio::spawn(async move {
            let notifier =
                Notifier::new(sender.clone(), call.progress_token.clone(), call.log_level);
            let answer = invoke(&*backend, &sealer, &client_requests, &call, &notifier).await;
            drop(notifier);
            let _ = sender.send(stream::Item::Done(answer)).await;
        });
        match queue.recv().await {
            Some(stream::Item::Done(answer)) => respond(era, &id, reply.framing, answer),
            None => respond(era, &id, reply.framing, Err(ended_without_answer().into())),
            Some(stream::Item::Notification(first)) => {
                let finish = move |answer: Option<Answer>| {
                    let answer = answer.unwrap_or_else(|| Err(ended_without_answer().into()));
                    stream::sse_event(&final_message(&id, answer))
                };
                let body = stream::StreamBody::new(first, queue, finish).boxed_unsync();
                let mut response = Response::new(body);
                let headers = response.headers_mut();
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
                headers.insert(
                    CACHE_CONTROL,
                    HeaderValue::from_static("no-cache, no-transform"),
                );
                Ok(response)
            }
        }
    }

    /// Answers one MCP method for an authenticated caller.
    async fn dispatch(&self, call: &Call, notifier: &Notifier) -> Answer {
        let era = call.era;
        let features = self.backend.features();
        let params = &call.params;
        let request = RequestContext {
            caller: &call.caller,
            era,
            client_capabilities: &call.client_capabilities,
            notifier,
            input_responses: None,
            request_state: None,
        };
        let not_found = || {
            RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("Method not found: {}", call.method),
            )
        };
        let mut result = match (call.method.as_str(), era) {
            (method, _) if CALL_LIKE_METHODS.contains(&method) => {
                let served = match method {
                    "tools/call" => true,
                    "prompts/get" => features.prompts,
                    _ => features.resources,
                };
                if !served {
                    return Err(not_found().into());
                }
                return invoke(
                    &*self.backend,
                    &self.sealer,
                    &self.client_requests,
                    call,
                    notifier,
                )
                .await;
            }
            ("server/discover", Era::Modern) => json!({
                "supportedVersions": wire::supported_versions(),
                "capabilities": capabilities(features, era),
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
            (list @ ("resources/list" | "resources/templates/list" | "prompts/list"), _) => {
                let (served, key) = match list {
                    "resources/list" => (features.resources, "resources"),
                    "resources/templates/list" => (features.resources, "resourceTemplates"),
                    _ => (features.prompts, "prompts"),
                };
                if !served {
                    return Err(not_found().into());
                }
                let cursor = match params.get("cursor") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(cursor)) => Some(cursor.as_str()),
                    Some(_) => {
                        return Err(invalid_params(format!("{list} `cursor` must be a string")));
                    }
                };
                let page = match list {
                    "resources/list" => self.backend.list_resources(request, cursor).await,
                    "resources/templates/list" => {
                        self.backend.list_resource_templates(request, cursor).await
                    }
                    _ => self.backend.list_prompts(request, cursor).await,
                }
                .map_err(|error| call_error(error, era))?;
                let mut result = json!({ key: page.items });
                if let Some(next) = page.next_cursor {
                    result["nextCursor"] = json!(next);
                }
                with_cache_hint(&mut result, page.cache, era);
                result
            }
            (subscription @ ("resources/subscribe" | "resources/unsubscribe"), Era::Legacy)
                if features.resource_subscriptions =>
            {
                let Some(uri) = params.get("uri").and_then(Value::as_str) else {
                    return Err(invalid_params(format!(
                        "{subscription} needs a string `uri`"
                    )));
                };
                let subscribe = subscription == "resources/subscribe";
                self.backend
                    .subscribe_resource(request, uri, subscribe)
                    .await
                    .map_err(|error| call_error(error, era))?;
                json!({})
            }
            ("completion/complete", _) if features.completions => {
                let (reference, argument, context) = completion_request(params)?;
                let completion = self
                    .backend
                    .complete(request, &reference, (&argument.0, &argument.1), &context)
                    .await
                    .map_err(|error| call_error(error, era))?;
                completion_result(completion)
            }
            _ => return Err(not_found().into()),
        };
        mark_complete(&mut result, era);
        Ok(result)
    }
}

/// The methods that run something (a tool, a prompt, a read): they may stream notifications
/// and ask for input (SEP-2322 names exactly these, besides tasks).
const CALL_LIKE_METHODS: [&str; 3] = ["tools/call", "prompts/get", "resources/read"];
/// The most answers one retried request may carry.
const MAX_INPUT_RESPONSES: usize = 64;
/// Rounds of 2025-era input requests one call may ask before it is cut off.
const MAX_INPUT_ROUNDS: usize = 8;
/// How long a 2025-era input request waits for the client's reply (a person may answer an
/// elicitation).
const CLIENT_REPLY_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// The most completion values sent (the specification's limit).
const MAX_COMPLETION_VALUES: usize = 100;

/// What the request's answer may be written as.
#[derive(Debug, Clone, Copy)]
struct Reply {
    /// A single answer's framing.
    framing: Framing,
    /// The client accepts `text/event-stream`, so notifications may precede the answer.
    streams: bool,
}

/// One admitted request, owned (a streaming request's task outlives the handler's borrow).
pub(super) struct Call {
    /// The legacy session the request came on (server-to-client requests need one).
    session: Option<String>,
    caller: Caller,
    era: Era,
    method: String,
    params: Map<String, Value>,
    client_capabilities: Map<String, Value>,
    progress_token: Option<Value>,
    log_level: Option<LogLevel>,
}

/// A tool call, prompt or read: checks the retry parameters (2026-07-28), asks the backend,
/// and spells its answer, a complete result or an input-required one (2026-07-28), or asks
/// the client on the stream and the backend again (2025).
async fn invoke<B: Backend>(
    backend: &B,
    sealer: &Sealer,
    client_requests: &ClientRequests,
    call: &Call,
    notifier: &Notifier,
) -> Answer {
    let era = call.era;
    let method = call.method.as_str();
    let key = if method == "resources/read" {
        "uri"
    } else {
        "name"
    };
    let Some(name) = call.params.get(key).and_then(Value::as_str) else {
        return Err(invalid_params(format!("{method} needs a string `{key}`")));
    };
    let binding = Binding {
        token_id: &call.caller.token_id,
        method,
        name,
    };
    // Only the stateless era retries with answers; earlier clients never send these.
    let (input_responses, request_state) = if era == Era::Modern {
        let responses = match call.params.get("inputResponses") {
            None => None,
            Some(Value::Object(responses))
                if responses.len() <= MAX_INPUT_RESPONSES
                    && responses.values().all(Value::is_object) =>
            {
                Some(responses)
            }
            Some(_) => {
                return Err(invalid_params(format!(
                    "inputResponses must be an object of at most {MAX_INPUT_RESPONSES} objects, each the result of one input request"
                )));
            }
        };
        let state = match call.params.get("requestState") {
            None => None,
            Some(Value::String(sealed)) => {
                match sealer.open(sealed, &binding, request_state::unix_now()) {
                    Some(state) => Some(state),
                    None => {
                        return Err(invalid_params(
                            "requestState integrity check failed: it was altered, has expired, or was issued for another request",
                        ));
                    }
                }
            }
            Some(_) => {
                return Err(invalid_params(
                    "requestState must be the string a previous result returned",
                ));
            }
        };
        (responses, state)
    } else {
        (None, None)
    };
    let mut outcome = call_backend(
        backend,
        call,
        name,
        RequestContext {
            caller: &call.caller,
            era,
            client_capabilities: &call.client_capabilities,
            notifier,
            input_responses,
            request_state: request_state.as_ref(),
        },
    )
    .await;
    // The handshake era plays input requests as server-to-client requests on this stream,
    // then asks the backend again with the replies, for a bounded number of rounds.
    let mut rounds = 0;
    while era == Era::Legacy
        && let Err(CallError::InputRequired(input)) = &outcome
    {
        rounds += 1;
        if rounds > MAX_INPUT_ROUNDS {
            return Err(RpcError::new(
                code::INTERNAL_ERROR,
                format!("the server asked for input more than {MAX_INPUT_ROUNDS} times"),
            )
            .into());
        }
        let (Some(session), true) = (call.session.as_deref(), notifier.can_ask()) else {
            break;
        };
        let input = input.clone();
        let missing = missing_capabilities(&input, &call.client_capabilities)?;
        if !missing.is_empty() {
            return Err(call_error(CallError::MissingCapability(missing), era));
        }
        let replies = ask_client(
            client_requests,
            &call.caller.token_id,
            session,
            &input,
            notifier,
        )
        .await?;
        outcome = call_backend(
            backend,
            call,
            name,
            RequestContext {
                caller: &call.caller,
                era,
                client_capabilities: &call.client_capabilities,
                notifier,
                input_responses: Some(&replies),
                request_state: input.state.as_ref(),
            },
        )
        .await;
    }
    match outcome {
        Ok(mut result) => {
            mark_complete(&mut result, era);
            Ok(result)
        }
        Err(CallError::InputRequired(input)) if era == Era::Modern => {
            input_required(input, &call.client_capabilities, sealer, &binding)
        }
        Err(error) => Err(call_error(error, era)),
    }
}

/// Asks the backend once, and spells a complete result.
async fn call_backend<B: Backend>(
    backend: &B,
    call: &Call,
    name: &str,
    request: RequestContext<'_>,
) -> Result<Value, CallError> {
    let era = call.era;
    match call.method.as_str() {
        "tools/call" => {
            let arguments = match call.params.get("arguments") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(arguments)) => arguments.clone(),
                Some(_) => {
                    return Err(CallError::InvalidParams(
                        "tools/call `arguments` must be an object".into(),
                    ));
                }
            };
            backend
                .call_tool(request, name, arguments)
                .await
                .map(|result| tool_result(result, era))
        }
        "prompts/get" => {
            let arguments = string_map(call.params.get("arguments")).ok_or_else(|| {
                CallError::InvalidParams("prompts/get `arguments` must map names to strings".into())
            })?;
            backend
                .get_prompt(request, name, &arguments)
                .await
                .map(prompt_result)
        }
        _ => match backend.read_resource(request, name).await {
            // SEP-2164: a read that found nothing is an unknown resource, not an empty result.
            Ok(read) if read.contents.is_empty() => {
                Err(CallError::UnknownResource(name.to_owned()))
            }
            Ok(read) => {
                let mut result = json!({ "contents": read.contents });
                with_cache_hint(&mut result, read.cache, era);
                Ok(result)
            }
            Err(error) => Err(error),
        },
    }
}

/// Sends each of `input`'s requests to the client on this request's stream, one at a time,
/// and collects the replies by key (2025 era).
async fn ask_client(
    client_requests: &ClientRequests,
    token_id: &str,
    session: &str,
    input: &InputRequired,
    notifier: &Notifier,
) -> Result<Map<String, Value>, Failure> {
    let mut replies = Map::new();
    for (key, request) in &input.requests {
        let id = format!("agentworks-{}", hex::encode(rand::random::<[u8; 12]>()));
        let mut waiting = client_requests
            .wait(token_id, session, &id)
            .map_err(|error| Failure::Rpc(RpcError::new(code::UNAVAILABLE, error.to_string())))?;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": request["method"],
            "params": request.get("params").cloned().unwrap_or_else(|| json!({}))});
        if !notifier.ask(&message).await {
            return Err(RpcError::new(code::INTERNAL_ERROR, "the client went away").into());
        }
        let reply = tokio::time::timeout(CLIENT_REPLY_TIMEOUT, waiting.reply()).await;
        match reply {
            Ok(Some(Ok(result))) => {
                replies.insert(key.clone(), result);
            }
            Ok(Some(Err(error))) => {
                let mut failure = RpcError::new(
                    code::INTERNAL_ERROR,
                    format!("the client refused the input request {key:?}"),
                );
                failure.data = Some(json!({ "clientError": error }));
                return Err(failure.into());
            }
            Ok(None) | Err(_) => {
                return Err(RpcError::new(
                    code::INTERNAL_ERROR,
                    format!(
                        "the client did not answer the input request {key:?} within {} s",
                        CLIENT_REPLY_TIMEOUT.as_secs()
                    ),
                )
                .into());
            }
        }
    }
    Ok(replies)
}

/// The capabilities `input`'s requests need that the client did not declare (an input
/// request with a method no client answers is the backend's bug: an internal error).
fn missing_capabilities(
    input: &InputRequired,
    client_capabilities: &Map<String, Value>,
) -> Result<Map<String, Value>, Failure> {
    if input.requests.is_empty() {
        return Err(RpcError::new(
            code::INTERNAL_ERROR,
            "the server asked for input but named none",
        )
        .into());
    }
    let mut missing = Map::new();
    for (key, request) in &input.requests {
        let capability = request
            .get("method")
            .and_then(Value::as_str)
            .and_then(capability_for);
        let Some(capability) = capability else {
            tracing::warn!(key, "mcp backend asked for input with an unknown method");
            return Err(RpcError::new(
                code::INTERNAL_ERROR,
                format!("the server asked for input {key:?} with a method clients cannot answer"),
            )
            .into());
        };
        if !client_capabilities.contains_key(capability) {
            missing.insert(capability.to_owned(), json!({}));
        }
    }
    Ok(missing)
}

/// The client capability each input request needs.
fn capability_for(method: &str) -> Option<&'static str> {
    match method {
        "elicitation/create" => Some("elicitation"),
        "sampling/createMessage" => Some("sampling"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

/// An input-required result: every request names a method the client declared (else -32021:
/// a backend must not ask for what the client cannot answer), the state sealed.
fn input_required(
    input: InputRequired,
    client_capabilities: &Map<String, Value>,
    sealer: &Sealer,
    binding: &Binding<'_>,
) -> Answer {
    let missing = missing_capabilities(&input, client_capabilities)?;
    if !missing.is_empty() {
        return Err(call_error(
            CallError::MissingCapability(missing),
            Era::Modern,
        ));
    }
    let mut result = json!({
        "resultType": "input_required",
        "inputRequests": input.requests,
    });
    if let Some(state) = &input.state {
        result["requestState"] = json!(sealer.seal(state, binding, request_state::unix_now()));
    }
    Ok(result)
}

/// `params._meta.progressToken`: a string or an integer, if present.
fn progress_token(params: &Map<String, Value>) -> Result<Option<Value>, RpcError> {
    match params
        .get("_meta")
        .and_then(Value::as_object)
        .and_then(|meta| meta.get("progressToken"))
    {
        None | Some(Value::Null) => Ok(None),
        Some(token @ Value::String(_)) => Ok(Some(token.clone())),
        Some(token @ Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(Some(token.clone())),
        Some(_) => Err(RpcError::new(
            code::INVALID_PARAMS,
            "params._meta.progressToken must be a string or an integer",
        )),
    }
}

/// A map of strings (prompt and completion arguments); absent or `null` is empty.
fn string_map(value: Option<&Value>) -> Option<BTreeMap<String, String>> {
    match value {
        None | Some(Value::Null) => Some(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
            .collect(),
        Some(_) => None,
    }
}

/// A completion request's reference, argument (name, value) and context arguments.
#[allow(clippy::type_complexity)]
fn completion_request(
    params: &Map<String, Value>,
) -> Result<(CompletionRef, (String, String), BTreeMap<String, String>), Failure> {
    let reference = params.get("ref");
    let field = |key: &str| {
        reference
            .and_then(|r| r.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let reference = match reference.and_then(|r| r.get("type")).and_then(Value::as_str) {
        Some("ref/prompt") => field("name").map(CompletionRef::Prompt),
        Some("ref/resource") => field("uri").map(CompletionRef::Resource),
        _ => None,
    }
    .ok_or_else(|| {
        invalid_params(
            "completion/complete `ref` must be {\"type\":\"ref/prompt\",\"name\"} or {\"type\":\"ref/resource\",\"uri\"}",
        )
    })?;
    let argument = params.get("argument");
    let text = |key: &str| argument.and_then(|a| a.get(key)).and_then(Value::as_str);
    let (Some(name), Some(value)) = (text("name"), text("value")) else {
        return Err(invalid_params(
            "completion/complete `argument` must be {\"name\": string, \"value\": string}",
        ));
    };
    let context =
        string_map(params.get("context").and_then(|c| c.get("arguments"))).ok_or_else(|| {
            invalid_params("completion/complete `context.arguments` must map names to strings")
        })?;
    Ok((reference, (name.to_owned(), value.to_owned()), context))
}

fn completion_result(completion: Completion) -> Value {
    let mut values = completion.values;
    let truncated = values.len() > MAX_COMPLETION_VALUES;
    values.truncate(MAX_COMPLETION_VALUES);
    let mut body = json!({"values": values, "hasMore": completion.has_more || truncated});
    if let Some(total) = completion.total {
        body["total"] = json!(total);
    }
    json!({ "completion": body })
}

fn prompt_result(prompt: PromptResult) -> Value {
    let mut result = json!({ "messages": prompt.messages });
    if let Some(description) = prompt.description {
        result["description"] = json!(description);
    }
    result
}

/// The capabilities we declare: tools, and what the backend serves besides (honestly: no
/// `listChanged` or `subscribe` on 2026-07-28, which has no `subscriptions/listen` here).
fn capabilities(features: Features, era: Era) -> Value {
    let legacy = era == Era::Legacy;
    let mut capabilities = Map::new();
    let tools = if legacy {
        json!({"listChanged": false})
    } else {
        json!({})
    };
    capabilities.insert("tools".to_owned(), tools);
    if features.resources {
        let resources = if legacy {
            json!({"subscribe": features.resource_subscriptions, "listChanged": false})
        } else {
            json!({})
        };
        capabilities.insert("resources".to_owned(), resources);
    }
    if features.prompts {
        let prompts = if legacy {
            json!({"listChanged": false})
        } else {
            json!({})
        };
        capabilities.insert("prompts".to_owned(), prompts);
    }
    if features.completions {
        capabilities.insert("completions".to_owned(), json!({}));
    }
    if features.logging {
        capabilities.insert("logging".to_owned(), json!({}));
    }
    Value::Object(capabilities)
}

/// `ttlMs` and `cacheScope` (2026-07-28 only).
fn with_cache_hint(result: &mut Value, cache: CacheHint, era: Era) {
    if era == Era::Modern {
        result["ttlMs"] = json!(cache.ttl_ms);
        result["cacheScope"] = json!(if cache.public { "public" } else { "private" });
    }
}

/// `resultType: "complete"` on a 2026-07-28 result that has no result type yet.
fn mark_complete(result: &mut Value, era: Era) {
    if era == Era::Modern
        && let Some(object) = result.as_object_mut()
    {
        object
            .entry("resultType")
            .or_insert_with(|| json!("complete"));
    }
}

fn invalid_params(message: impl Into<String>) -> Failure {
    RpcError::new(code::INVALID_PARAMS, message).into()
}

fn ended_without_answer() -> RpcError {
    RpcError::new(code::INTERNAL_ERROR, "the request ended without an answer")
}

/// A backend's [`CallError`] as the protocol answers it.
fn call_error(error: CallError, era: Era) -> Failure {
    let with_data = |code, message: String, data: Value| {
        Failure::Rpc(RpcError {
            code,
            message,
            data: Some(data),
        })
    };
    match error {
        CallError::UnknownTool(name) => with_data(
            code::INVALID_PARAMS,
            format!("Unknown tool: {name}"),
            json!({ "name": name }),
        ),
        CallError::UnknownPrompt(name) => with_data(
            code::INVALID_PARAMS,
            format!("Unknown prompt: {name}"),
            json!({ "name": name }),
        ),
        CallError::UnknownResource(uri) => with_data(
            code::INVALID_PARAMS,
            format!("Resource not found: {uri}"),
            json!({ "uri": uri }),
        ),
        CallError::InvalidParams(message) => invalid_params(message),
        CallError::MissingCapability(required) => {
            let names: Vec<&str> = required.keys().map(String::as_str).collect();
            with_data(
                code::MISSING_CLIENT_CAPABILITY,
                format!("Missing required client capability: {}", names.join(", ")),
                json!({ "requiredCapabilities": required }),
            )
        }
        CallError::InsufficientScope(scope) => {
            Failure::Http(Rejection::InsufficientScope { scope })
        }
        CallError::InputRequired(_) => {
            // A 2025 connection is asked on the response stream, which needs a session and a
            // client accepting text/event-stream.
            let message = if era == Era::Legacy {
                "this request needs input from the client, which can only be asked on a session whose client accepts text/event-stream"
            } else {
                "this request cannot ask for input"
            };
            RpcError::new(code::INTERNAL_ERROR, message).into()
        }
        CallError::NotServed => RpcError::new(code::METHOD_NOT_FOUND, "Method not found").into(),
    }
}

/// The HTTP answer to a request whose answer is complete.
fn respond(
    era: Era,
    id: &Value,
    framing: Framing,
    answer: Answer,
) -> Result<Response<Body>, Rejection> {
    match answer {
        Ok(result) => Ok(wire::message_response(
            StatusCode::OK,
            framing,
            &wire::result_message(id, result),
        )),
        // 2026-07-28 errors carry their status; handshake-era ones travel in a 200 body.
        Err(Failure::Rpc(error)) if era == Era::Modern => Ok(wire::message_response(
            error.modern_status(),
            Framing::Json,
            &wire::error_message(id, &error),
        )),
        Err(Failure::Rpc(error)) => Ok(wire::message_response(
            StatusCode::OK,
            framing,
            &wire::error_message(id, &error),
        )),
        Err(Failure::Http(rejection)) => Err(rejection),
    }
}

/// The last event of a streamed answer. The status is already 200, so a refusal that would
/// have been an HTTP one is a JSON-RPC error carrying its code.
fn final_message(id: &Value, answer: Answer) -> Value {
    match answer {
        Ok(result) => wire::result_message(id, result),
        Err(Failure::Rpc(error)) => wire::error_message(id, &error),
        Err(Failure::Http(rejection)) => {
            let (rpc_code, data) = match &rejection {
                Rejection::InsufficientScope { scope } => (
                    code::FORBIDDEN,
                    json!({"code": "insufficient_scope", "scope": scope}),
                ),
                other => (
                    code::INTERNAL_ERROR,
                    json!({"code": "internal", "reason": other.to_string()}),
                ),
            };
            let error = RpcError {
                code: rpc_code,
                message: rejection.to_string(),
                data: Some(data),
            };
            wire::error_message(id, &error)
        }
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
}
