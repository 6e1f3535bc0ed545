//! The public MCP endpoint: the Model Context Protocol over streamable HTTP at `/mcp`, for both
//! protocol eras, with agentworks bearer auth and the one error envelope.
//!
//! Owns the wire protocol (JSON-RPC framing, era detection, header validation, legacy sessions)
//! and the HTTP answers for authentication and scope failures. Must never decide *what* is
//! offered or to whom: the tools, the token scopes they need, roles, folder caps and policy all
//! belong to the [`Backend`] (agentd's is `crate::catalog`), which this module only asks. Must
//! never read or write files itself, and never answer a tool failure with an HTTP 5xx or a
//! JSON-RPC crash.
//!
//! The eras, both on the one endpoint (as the backward-compatibility sections of the
//! specification ask):
//!
//! - **2026-07-28** (current, stateless): no `initialize`, no sessions; every request carries its
//!   protocol version and client capabilities in `params._meta`, mirrored by the
//!   `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers, and a `tools/call` of a tool
//!   whose `inputSchema` annotates arguments with `x-mcp-header` by one `Mcp-Param-{Name}`
//!   header each (SEP-2243; checked against this caller's `tools/list`, so a backend declaring
//!   none, as agentd's, is unaffected); `server/discover` advertises
//!   us; results carry `resultType`; a backend needing client input answers
//!   `resultType: "input_required"` and the client retries; GET and DELETE answer 405.
//! - **2025-06-18 / 2025-11-25** (handshake era): `initialize` negotiates the version and mints an
//!   optional `Mcp-Session-Id`, bound to the token that created it (it also keeps the client's
//!   capabilities and its `logging/setLevel`); DELETE ends it; GET answers 405 because we
//!   never push outside a request: a backend's input requests go to the client on the POST's
//!   own stream, and the client's replies come back as POSTs on the session.
//!
//! In both eras a request with a `progressToken` or a log level is answered as a stream of
//! server-sent events once the backend sends its first notification (plain JSON until then).
//! What a backend serves besides tools ([`Features`]) is what is declared and routed; agentd's
//! serves tools only.
//!
//! May call: nothing else in agentd (its unit tests run it over the catalog). Everything it needs
//! to know about a caller comes through the [`Backend`].
//!
//! **Refusals.** A request refused at the HTTP layer keeps its status and headers
//! (`WWW-Authenticate`, `Allow`) in every case; what the body says depends on whether the request
//! was JSON-RPC, decided from its head alone so that a refusal before the body is read (the
//! public listener's screening, its body limits) is spelled the same way: a `POST /mcp` with an
//! `application/json` content type is a JSON-RPC request. It gets a JSON-RPC error answering its
//! id when the body has been read and carries a valid one, else `null` (JSON-RPC 2.0 §5):
//! `{"jsonrpc":"2.0","id":…,"error":{"code":C,"message":M,"data":{"code":S,"message":M,…details}}}`,
//! with `M` our message and `S` our stable code (the same pair the envelope carries), so SDKs
//! that surface a non-2xx JSON-RPC error body (the Python SDK raises `MCPError(M)`) show it.
//! The JSON-RPC codes `C` (ours are in the implementation-defined band -32000..-32019, above
//! the Python SDK's -32000/-32001 and clear of the retired -32002):
//!
//! | HTTP | `data.code` | `C` |
//! |------|-------------|-----|
//! | 401 | `missing_token`, `invalid_token`, `token_expired`, `token_revoked`, `user_disabled` | -32010 |
//! | 403 | `origin_forbidden`, `insufficient_scope` | -32011 |
//! | 404 | `session_not_found` | -32012 |
//! | 503 | `too_many_sessions`, `busy` (the listener's body budget) | -32013 |
//! | 400 | `bad_session_header`, `bad_request` (an unreadable body) | -32600 |
//! | 406 | `not_acceptable` | -32600 |
//! | 408 | `body_timeout` | -32600 |
//! | 413 | `too_large` | -32600 |
//!
//! (405 and 415 cannot happen to a JSON-RPC request: it is a POST with a JSON body.) Anything
//! else (GET, DELETE, another content type) keeps the agentworks error envelope
//! `{"error":{"code","message",…}}`, as do paths other than `/mcp`. A body that is not JSON is a
//! JSON-RPC parse error (-32700, HTTP 400) whose message says what was wrong: `invalid UTF-8 at
//! byte N` (`data.byte`) or serde_json's reason with line and column (`data.line`,
//! `data.column`).
//!
//! Files:
//!
//! - `wire`: JSON-RPC parsing, era classification, the 2026-07-28 header ladder (the routing
//!   headers and the `Mcp-Param-*` custom headers), error codes and response bodies (JSON or
//!   one SSE event). Pure.
//! - `stream`: the [`Notifier`] (progress and log messages) and the bounded server-sent-event
//!   body a request streams them on before its result.
//! - `request_state`: the sealed `requestState` of input-required results (HMAC-SHA256).
//! - `client_requests`: the 2025 era's server-to-client requests waiting for their replies
//!   (the same input-required results, asked on the POST's stream).
//! - `access`: Origin validation, bearer extraction, scope checks and the `WWW-Authenticate`
//!   challenges. Pure.
//! - `session`: the legacy session table (bounded, idle-expiring, owner-bound).
//! - `answer`: what answering a request produced, and how a refusal is spelled (the envelope,
//!   or a JSON-RPC error).
//! - `service`: [`McpService`], routing a request through the checks above to the backend.
//!
//! **Why hand-written and not `rmcp`.** The official Rust SDK brings its own tower/axum service
//! and session manager; its 2026-07-28 work (3.1) is metadata validation on its own stack. We need
//! one hyper handler that serves both eras on `/mcp`, authenticates *every* request (including
//! `initialize` and `server/discover`) with 401/403 answers carrying RFC 9728 challenges, turns a
//! missing tool scope into an HTTP 403 mid-`tools/call`, binds legacy sessions to the token that
//! opened them, and speaks our error envelope. Bending rmcp to that costs more than the JSON-RPC
//! layer, which is a few hundred lines of pure, unit-tested code; the real Python SDK (`mcp`
//! 2.3.0) checks the result end to end in `tests.rs`.

pub(crate) mod access;
mod answer;
mod client_requests;
mod request_state;
mod service;
mod session;
mod stream;
/// Public (and hidden) only so the fuzz targets in `fuzz/` and their stable regression test
/// can reach the pure JSON-RPC parser; not an API of this crate.
#[doc(hidden)]
pub mod wire;

#[cfg(test)]
mod tests;

pub use service::McpService;
pub use stream::Notifier;
pub use wire::{Era, LogLevel};

/// Who is calling: the token that authenticated the request and its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's id (not its secret); legacy sessions are bound to it.
    pub token_id: String,
    /// The user the token belongs to.
    pub user_id: String,
    /// The user's name, for messages and audit.
    pub user_name: String,
    /// The token's scopes, e.g. `workflows:read`.
    pub scopes: Vec<String>,
    /// What the user's roles reach through this token, read in the same read as the token
    /// itself (the MCP endpoint's check); `None` for callers made elsewhere (the chats), which
    /// the catalog allows nothing.
    pub reach: Option<Reach>,
}

/// Whether a caller is a member, and an author (owner, co-owner or editor), of some project
/// its token reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub member: bool,
    pub author: bool,
}

/// Why a bearer token was not accepted. Every variant answers HTTP 401 with a
/// `WWW-Authenticate: Bearer resource_metadata="…"` challenge; all but [`AuthError::Missing`]
/// add `error="invalid_token"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    Missing,
    /// Unknown or malformed token.
    Invalid,
    /// The token has expired.
    Expired,
    /// The token was revoked.
    Revoked,
    /// The token's user is disabled.
    Disabled,
}

/// A tool failure, reported to the client as a tool result with `isError: true` and
/// `structuredContent: {"error": {"code", "message", ...details}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolError {
    /// Stable, snake_case, e.g. `revision_conflict`.
    pub code: String,
    /// What happened and, where possible, what to do about it.
    pub message: String,
    /// Extra fields (e.g. `current_revision`), flattened beside `code` and `message`.
    pub details: serde_json::Map<String, serde_json::Value>,
}

impl ToolError {
    /// A tool error without details.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ToolError {
        ToolError {
            code: code.into(),
            message: message.into(),
            details: serde_json::Map::new(),
        }
    }
}

/// What the transport knows about one request when it asks the backend.
#[derive(Debug, Clone, Copy)]
pub struct RequestContext<'a> {
    /// Who is calling (as [`Backend::authenticate`] resolved them).
    pub caller: &'a Caller,
    /// The era the request speaks.
    pub era: Era,
    /// The capabilities the client declared: 2026-07-28 per request (`_meta`), before that at
    /// `initialize` (kept on the session; empty without one). A backend needing one the client
    /// lacks answers [`CallError::MissingCapability`], never assumes it.
    pub client_capabilities: &'a serde_json::Map<String, serde_json::Value>,
    /// Progress and log notifications for this request; a no-op unless the client asked for
    /// them (a `progressToken`, a log level) and accepts a streamed answer.
    pub notifier: &'a Notifier,
    /// On a retried request (2026-07-28 input-required): the client's answers, keyed as the
    /// backend's [`InputRequired::requests`] were. Checked to be an object of objects.
    pub input_responses: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// On a retried request: the [`InputRequired::state`] the backend returned, after the
    /// transport verified its seal (a tampered or expired one never reaches the backend).
    pub request_state: Option<&'a serde_json::Value>,
}

/// Why a request was not admitted: a 401 (the token) or a 403 (a scope the endpoint needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// No usable token: HTTP 401 with a challenge.
    Unauthorized(AuthError),
    /// The token is good but lacks a scope the endpoint needs at all: HTTP 403 naming it.
    InsufficientScope(String),
}

impl From<AuthError> for Admission {
    fn from(error: AuthError) -> Admission {
        Admission::Unauthorized(error)
    }
}

/// A `tools/call` result as the backend made it; the transport adds what the era requires
/// (`resultType`, and before 2026-07-28 an object around non-object structured content).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The content items (`{"type":"text",…}`, `image`, `audio`, `resource`, …), verbatim.
    pub content: Vec<serde_json::Value>,
    /// `structuredContent`, if the tool has one.
    pub structured_content: Option<serde_json::Value>,
    /// The tool ran and failed (`isError: true`): a result the model reads, not a protocol error.
    pub is_error: bool,
}

/// Why a request (`tools/call`, `prompts/get`, `resources/read`, a list, a completion)
/// produced no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No tool of that name: JSON-RPC -32602 (invalid params), as the specification asks.
    UnknownTool(String),
    /// The token lacks a scope this tool needs: HTTP 403 with a challenge naming it, so the
    /// client can ask for a better token.
    InsufficientScope(String),
    /// No prompt of that name: -32602 with `data.name`.
    UnknownPrompt(String),
    /// No resource at that URI: -32602 with `data.uri` (SEP-2164).
    UnknownResource(String),
    /// The parameters are wrong in a way the transport could not see (a bad cursor, say): -32602.
    InvalidParams(String),
    /// Answering needs client capabilities the client did not declare (e.g. `{"sampling":{}}`):
    /// -32021 with `data.requiredCapabilities` (HTTP 400 on 2026-07-28).
    MissingCapability(serde_json::Map<String, serde_json::Value>),
    /// The backend needs input from the client first. 2026-07-28 (SEP-2322): the transport
    /// answers `resultType: "input_required"` and the client retries with the answers. 2025:
    /// the transport sends each request to the client on the POST's stream (a session and a
    /// client accepting `text/event-stream` needed), waits for its reply, and calls the
    /// backend again with the replies as [`RequestContext::input_responses`] and the state
    /// (kept in process, not sealed) as [`RequestContext::request_state`].
    InputRequired(InputRequired),
    /// The backend does not serve this method (what the default methods answer): -32601.
    NotServed,
}

/// A request for client input instead of a result: `inputRequests` and an optional state the
/// backend gets back, sealed by the transport, on the retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRequired {
    /// Key → `{"method": "elicitation/create" | "sampling/createMessage" | "roots/list",
    /// "params": {…}}`. The transport refuses (-32021) a request for a capability the client
    /// did not declare.
    pub requests: serde_json::Map<String, serde_json::Value>,
    /// What the backend wants back on the retry ([`RequestContext::request_state`]); the client
    /// sees it sealed (HMAC-SHA256, bound to the token, method and name, expiring).
    pub state: Option<serde_json::Value>,
}

/// What a backend serves besides tools. Capabilities are declared from this, in both eras, and
/// a method outside it answers -32601 without asking the backend. Agentd's backend serves
/// only tools: the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// `resources/list`, `resources/templates/list`, `resources/read`.
    pub resources: bool,
    /// `resources/subscribe` and `resources/unsubscribe` (2025 era only; the transport has no
    /// push channel, so only a backend whose resources never change may declare this).
    pub resource_subscriptions: bool,
    /// `prompts/list`, `prompts/get`.
    pub prompts: bool,
    /// `completion/complete`.
    pub completions: bool,
    /// The backend sends log messages through [`Notifier::log`] (`logging` capability;
    /// `logging/setLevel` in the 2025 era).
    pub logging: bool,
}

/// How long a list or read result may be cached, and by whom (2026-07-28 SEP-2549; the
/// transport writes `ttlMs` and `cacheScope` on that wire only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheHint {
    /// Milliseconds the result stays fresh.
    pub ttl_ms: u64,
    /// `true`: the same for every caller (`public`); `false`: per token (`private`).
    pub public: bool,
}

impl Default for CacheHint {
    /// Not cacheable beyond this caller: what anything depending on the token must say.
    fn default() -> CacheHint {
        CacheHint {
            ttl_ms: 0,
            public: false,
        }
    }
}

/// One page of a list (`resources`, `resourceTemplates`, `prompts`): MCP objects sent
/// verbatim, and the opaque cursor of the next page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// The items of this page.
    pub items: Vec<serde_json::Value>,
    /// `nextCursor`, when there is another page.
    pub next_cursor: Option<String>,
    /// Cacheability of this page.
    pub cache: CacheHint,
}

/// A `resources/read` result: the contents (`{uri, mimeType, text | blob}` each, verbatim).
/// Empty contents are answered as an unknown resource (SEP-2164 forbids an empty result).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceContents {
    /// The contents items.
    pub contents: Vec<serde_json::Value>,
    /// Cacheability of this read.
    pub cache: CacheHint,
}

/// A `prompts/get` result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptResult {
    /// `description`, if any.
    pub description: Option<String>,
    /// The messages (`{role, content}` each), verbatim.
    pub messages: Vec<serde_json::Value>,
}

/// What `completion/complete` completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionRef {
    /// An argument of the prompt of this name (`ref/prompt`).
    Prompt(String),
    /// A variable of the resource template with this URI template (`ref/resource`).
    Resource(String),
}

/// A `completion/complete` answer; the transport keeps at most 100 values (and then says
/// `hasMore`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    /// The suggested values.
    pub values: Vec<String>,
    /// How many there are in all, if known.
    pub total: Option<u64>,
    /// More exist than were sent.
    pub has_more: bool,
}

/// The server side of the endpoint: who the caller is, which tools they have, and running one.
/// The transport ([`McpService`]) owns everything of the protocol (eras, headers, sessions,
/// framing, errors); a backend owns what is offered and to whom. agentd's backend is the
/// workflow-file catalog (`crate::catalog`); the conformance fixture serves the suite's tools.
pub trait Backend: Send + Sync + 'static {
    /// Resolves the bearer token (`None` when the request carried none) and decides whether
    /// the caller may use the endpoint at all.
    fn authenticate(
        &self,
        bearer: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Caller, Admission>> + Send;
    /// The tools this caller may use now, each a complete MCP `Tool` object (`name`,
    /// `description`, `inputSchema`, …), sent verbatim.
    fn list_tools(
        &self,
        request: RequestContext<'_>,
    ) -> impl std::future::Future<Output = Vec<serde_json::Value>> + Send;
    /// Runs the tool `name`. A failure of the tool itself is a [`ToolResult`] with `is_error`.
    fn call_tool(
        &self,
        request: RequestContext<'_>,
        name: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> impl std::future::Future<Output = Result<ToolResult, CallError>> + Send;

    // Everything below is optional: the defaults serve nothing, and the transport neither
    // declares nor routes what [`Backend::features`] does not name.

    /// The `inputSchema` of the tool `name` as this caller's `tools/list` has it, or `None`
    /// when the caller has no such tool: read for each 2026-07-28 `tools/call` to check its
    /// `x-mcp-header` arguments against the `Mcp-Param-*` headers. The default lists the
    /// tools; a backend whose schemas do not depend on the caller answers it without that.
    fn tool_input_schema(
        &self,
        request: RequestContext<'_>,
        name: &str,
    ) -> impl std::future::Future<Output = Option<std::borrow::Cow<'static, serde_json::Value>>> + Send
    {
        async move {
            self.list_tools(request)
                .await
                .into_iter()
                .find(|tool| tool.get("name").and_then(serde_json::Value::as_str) == Some(name))
                .and_then(|mut tool| tool.get_mut("inputSchema").map(serde_json::Value::take))
                .map(std::borrow::Cow::Owned)
        }
    }

    /// What this backend serves besides tools.
    fn features(&self) -> Features {
        Features::default()
    }
    /// A page of the resources (`cursor`: the previous page's `next_cursor`).
    fn list_resources(
        &self,
        _request: RequestContext<'_>,
        _cursor: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Page, CallError>> + Send {
        std::future::ready(Err(CallError::NotServed))
    }
    /// A page of the resource templates.
    fn list_resource_templates(
        &self,
        _request: RequestContext<'_>,
        _cursor: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Page, CallError>> + Send {
        std::future::ready(Err(CallError::NotServed))
    }
    /// Reads the resource at `uri` ([`CallError::UnknownResource`] when there is none).
    fn read_resource(
        &self,
        _request: RequestContext<'_>,
        _uri: &str,
    ) -> impl std::future::Future<Output = Result<ResourceContents, CallError>> + Send {
        std::future::ready(Err(CallError::NotServed))
    }
    /// Subscribes to (`subscribe`) or unsubscribes from updates of `uri` (2025 era).
    fn subscribe_resource(
        &self,
        _request: RequestContext<'_>,
        _uri: &str,
        _subscribe: bool,
    ) -> impl std::future::Future<Output = Result<(), CallError>> + Send {
        std::future::ready(Err(CallError::NotServed))
    }
    /// A page of the prompts.
    fn list_prompts(
        &self,
        _request: RequestContext<'_>,
        _cursor: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Page, CallError>> + Send {
        std::future::ready(Err(CallError::NotServed))
    }
    /// The prompt `name` with its (string) arguments.
    fn get_prompt(
        &self,
        _request: RequestContext<'_>,
        _name: &str,
        _arguments: &std::collections::BTreeMap<String, String>,
    ) -> impl std::future::Future<Output = Result<PromptResult, CallError>> + Send {
        std::future::ready(Err(CallError::NotServed))
    }
    /// Completions for the argument `argument` (name, partial value) of `reference`, given the
    /// arguments already filled in (`context`).
    fn complete(
        &self,
        _request: RequestContext<'_>,
        _reference: &CompletionRef,
        _argument: (&str, &str),
        _context: &std::collections::BTreeMap<String, String>,
    ) -> impl std::future::Future<Output = Result<Completion, CallError>> + Send {
        std::future::ready(Err(CallError::NotServed))
    }
}

/// How the endpoint presents itself.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// The public base URL, e.g. `http://127.0.0.1:8470`, without a trailing slash. The resource
    /// is `<public_url>/mcp`; requests from this origin are always allowed.
    pub public_url: String,
    /// What a model reading the server's `instructions` should know first.
    pub instructions: String,
    /// The token scopes the protected-resource metadata lists (RFC 9728 `scopes_supported`).
    pub scopes_supported: Vec<String>,
    /// The authorization servers the metadata names (RFC 9728 `authorization_servers`);
    /// empty when tokens are only ever issued by hand.
    pub authorization_servers: Vec<String>,
    /// Browser origins (e.g. `https://app.example.com`) allowed besides `public_url`'s own.
    pub allowed_origins: Vec<String>,
    /// The port of the listener when it is bound to a loopback address: a page on this
    /// machine names it `http://localhost:PORT`, `http://127.0.0.1:PORT` or
    /// `http://[::1]:PORT`, and all three are its own origin. `None` for any other listener.
    pub loopback_port: Option<u16>,
    /// `serverInfo.name` and the metadata's `resource_name`.
    pub server_name: String,
    /// `serverInfo.version`.
    pub server_version: String,
    /// Legacy-era sessions one token may hold; opening one more ends its least recently used.
    pub max_sessions_per_token: usize,
}

/// A response body: one complete buffer, or (a request streaming progress or log
/// notifications before its result) a stream of server-sent events.
pub type Body = agentworks_daemon::ipc::envelope::Body;
