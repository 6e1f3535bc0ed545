//! The model gateway: the only way a sandboxed coding CLI reaches its model, and the only place
//! the operator's API key is used (DESIGN.md, "Secrets stay out").
//!
//! A loopback HTTP/1.1 server (`127.0.0.1`, a port the kernel picks). Each turn opens a
//! [`TurnCapability`]: a fresh random string the CLI gets as its "API key", with
//! [`ModelGateway::base_url`] as its base URL. A request that names an open capability
//! (`Authorization: Bearer`, `x-api-key` or `x-goog-api-key`) and a path under `/v1/` is
//! forwarded to that turn's [`Upstream`] with the real key in its place; the answer streams
//! back as it comes, scanned for the token counts the upstream reports ([`Usage`]), which the
//! turn reads for the Costs tab. An upstream 401 or 403 is recorded, so the turn can say
//! `upstream_refused`.
//!
//! Owns: the capabilities (only their SHA-256 digests are looked up, so the comparison leaks
//! nothing useful through timing), the forwarding (which headers go on, which are dropped), the
//! counting, and the redaction of the key from everything sent back.
//!
//! Must never: forward a request without an open capability (a dropped or closed one is
//! refused at once, and an answer still streaming for it is cut), send the client's own
//! credentials or cookies upstream, send the key over plain http to anything but loopback, or
//! let the key reach the client (an upstream that echoes it, in a body or a header, has it
//! replaced by `[redacted]`; no error message of ours names it).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::loopback::{digest, lock};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The largest request body forwarded (a long conversation with images fits; a flood does not
/// grow runnerd's heap beyond it per connection).
pub const MAX_REQUEST_BODY_BYTES: usize = 32 * 1024 * 1024;
/// How long connecting to the upstream (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the upstream may take to send its answer's head: a non-streamed answer of a large
/// model can take minutes. The turn's own timeout bounds the whole.
const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// The largest server-sent event, or non-streamed JSON answer, scanned for usage (a Responses
/// API `response.completed` event repeats the whole answer). A larger one is still forwarded,
/// only not counted.
const MAX_SCANNED_BYTES: usize = 16 * 1024 * 1024;
/// The most tokens one reported count is taken as (as agentd's model client does): no real
/// request comes near it, and it keeps a broken upstream's numbers from overflowing the sums.
const MAX_REPORTED_TOKENS: u64 = 1 << 40;
/// Upstream answer chunks waiting for a slow client, per request.
const FORWARD_QUEUE: usize = 16;
/// What every capability starts with, so a leaked one is recognisable in logs and scanners.
const CAPABILITY_PREFIX: &str = "awcap_";
/// What replaces the key wherever an upstream echoed it.
const REDACTED: &[u8] = b"[redacted]";

/// Request headers never forwarded: the client's credentials (the capability) and cookies, the
/// host (the upstream's is set), hop-by-hop headers (RFC 9110 7.6.1), the framing (the body is
/// re-sent whole) and the encodings (the gateway asks for identity, to read the usage).
const DROPPED_REQUEST_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "x-goog-api-key",
    "cookie",
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "accept-encoding",
    "expect",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
];

/// Response headers never passed back: hop-by-hop ones, the length (the body may change when
/// the key is redacted; hyper frames it again) and cookies (the CLI has no business with the
/// upstream's sessions).
const DROPPED_RESPONSE_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "set-cookie",
];

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot listen on 127.0.0.1 for the model gateway: {0}")]
    Bind(#[source] std::io::Error),
    #[error("cannot read the model gateway's listening address: {0}")]
    Address(#[source] std::io::Error),
    #[error("cannot set up TLS for the model gateway's upstreams: {0}")]
    Tls(#[source] rustls::Error),
}

/// Where a turn's requests go, and with which key.
#[derive(Clone)]
pub struct Upstream {
    /// The API's base URL, e.g. `https://api.openai.com/v1` (`http://` to loopback only).
    pub base_url: String,
    /// The operator's real key; `None` sends none.
    pub key: Option<String>,
    /// The header the key goes in.
    pub auth: KeyHeader,
}

/// Never prints the key.
impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .field("key", &self.key.as_ref().map(|_| "[hidden]"))
            .field("auth", &self.auth)
            .finish()
    }
}

/// How an upstream wants its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader {
    /// `Authorization: Bearer <key>` (OpenAI and most compatible APIs).
    Bearer,
    /// `x-api-key: <key>` (Anthropic).
    XApiKey,
    /// `x-goog-api-key: <key>` (Gemini).
    XGoogApiKey,
}

/// Tokens the upstream reported for a turn's answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The running gateway: a cheap handle to clone.
#[derive(Clone)]
pub struct ModelGateway {
    gateway: Arc<Gateway>,
}

impl std::fmt::Debug for ModelGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGateway")
            .field("address", &self.gateway.address)
            .finish_non_exhaustive()
    }
}

/// What the server and the capabilities share.
struct Gateway {
    address: SocketAddr,
    /// The open turns by the SHA-256 digest of their capability.
    turns: Mutex<HashMap<[u8; 32], Arc<Turn>>>,
    /// For `https://` upstreams (the webpki roots), built once.
    tls: Arc<rustls::ClientConfig>,
    shutdown: CancellationToken,
}

/// One open turn, as its requests see it.
struct Turn {
    upstream: Upstream,
    usage: Mutex<Usage>,
    /// The last 401 or 403 the upstream answered; 0 for none.
    refusal: AtomicU16,
    /// Cancelled when the capability is closed: requests in flight stop.
    ended: CancellationToken,
}

impl ModelGateway {
    /// Binds `127.0.0.1:0` and serves until `shutdown` is cancelled.
    pub async fn start(shutdown: CancellationToken) -> Result<ModelGateway, GatewayError> {
        let tls = agentworks_support::tls::client_config().map_err(GatewayError::Tls)?;
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(GatewayError::Bind)?;
        let address = listener.local_addr().map_err(GatewayError::Address)?;
        let gateway = Arc::new(Gateway {
            address,
            turns: Mutex::new(HashMap::new()),
            tls,
            shutdown,
        });
        tokio::spawn(crate::loopback::serve(
            listener,
            gateway.clone(),
            gateway.shutdown.clone(),
            "the model gateway",
            handle,
        ));
        Ok(ModelGateway { gateway })
    }

    /// What a CLI's config names as its base URL, e.g. `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.gateway.address)
    }

    /// Opens a turn: a fresh capability (256 random bits, hex, prefixed `awcap_`) whose
    /// requests go to `upstream`. Dropping or closing the capability revokes it at once.
    pub fn open_turn(&self, upstream: Upstream) -> TurnCapability {
        let secret = format!(
            "{CAPABILITY_PREFIX}{}",
            hex::encode(rand::random::<[u8; 32]>())
        );
        let digest = digest(secret.as_bytes());
        let turn = Arc::new(Turn {
            upstream,
            usage: Mutex::new(Usage::default()),
            refusal: AtomicU16::new(0),
            ended: CancellationToken::new(),
        });
        lock(&self.gateway.turns).insert(digest, turn.clone());
        TurnCapability {
            secret,
            digest,
            turn,
            gateway: self.gateway.clone(),
        }
    }
}

/// One turn's access to its upstream, for as long as this value lives.
pub struct TurnCapability {
    secret: String,
    digest: [u8; 32],
    turn: Arc<Turn>,
    gateway: Arc<Gateway>,
}

/// Never prints the capability.
impl std::fmt::Debug for TurnCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnCapability")
            .field("upstream", &self.turn.upstream)
            .finish_non_exhaustive()
    }
}

impl TurnCapability {
    /// The string the CLI gets as its API key.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Tokens counted so far.
    pub fn usage(&self) -> Usage {
        *lock(&self.turn.usage)
    }

    /// The last 401 or 403 the upstream answered this turn's requests, if any.
    pub fn upstream_refusal(&self) -> Option<u16> {
        match self.turn.refusal.load(Ordering::Relaxed) {
            0 => None,
            status => Some(status),
        }
    }

    /// Revokes the capability (as dropping it does).
    pub fn close(self) {}
}

impl Drop for TurnCapability {
    fn drop(&mut self) {
        // Removed first, so no new request finds it; then the requests in flight stop.
        lock(&self.gateway.turns).remove(&self.digest);
        self.turn.ended.cancel();
    }
}

// ----- the server -----

/// The body of every answer: a whole refusal, or an upstream answer streaming through.
type GatewayBody = UnsyncBoxBody<Bytes, AnswerCut>;

/// An answer streaming back was cut before its end (the upstream broke off, the turn ended, the
/// gateway stops): hyper then closes the connection without the body's end, so the client
/// cannot take a cut answer for a whole one.
#[derive(Debug, thiserror::Error)]
#[error("the answer was cut before its end")]
struct AnswerCut;

/// A request the gateway does not forward: an HTTP status and a JSON error whose shape OpenAI
/// and Anthropic clients both read (`error.type`, `error.message`).
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code,
            message: message.into(),
        }
    }

    fn response(self) -> Response<GatewayBody> {
        let body = serde_json::json!({
            "type": "error",
            "error": {"type": self.code, "code": self.code, "message": self.message},
        });
        let mut response = Response::new(full(body.to_string()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // The request's body may be unread: the connection must not be reused after it.
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        if self.status == StatusCode::METHOD_NOT_ALLOWED {
            headers.insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
        }
        response
    }
}

fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// One request: its capability first (nothing else is looked at without one), then the
/// forwarding, which stops as soon as the turn ends or the gateway stops.
async fn handle(request: Request<Incoming>, gateway: Arc<Gateway>) -> Response<GatewayBody> {
    let turn = match authorize(&gateway, request.headers()) {
        Ok(turn) => turn,
        Err(refusal) => return refusal.response(),
    };
    let ended = turn.ended.clone();
    let shutdown = gateway.shutdown.clone();
    let refusal = tokio::select! {
        answer = forward(request, &gateway, turn) => match answer {
            Ok(response) => return response,
            Err(refusal) => refusal,
        },
        _ = ended.cancelled() => turn_ended(),
        _ = shutdown.cancelled() => Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "gateway_stopping",
            "the model gateway is stopping",
        ),
    };
    refusal.response()
}

fn turn_ended() -> Refusal {
    Refusal::new(
        StatusCode::UNAUTHORIZED,
        "invalid_api_key",
        "this API key is not valid (its turn has ended)",
    )
}

/// The open turn every capability the request presents names: at least one, and all the same.
fn authorize(gateway: &Gateway, headers: &HeaderMap) -> Result<Arc<Turn>, Refusal> {
    let mut presented: Vec<&[u8]> = Vec::new();
    for value in headers.get_all(header::AUTHORIZATION) {
        let value = value.as_bytes();
        // The scheme is case-insensitive; anything but Bearer is presented whole (and fails).
        let token = match value.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &value[7..],
            _ => value,
        };
        presented.push(token.trim_ascii());
    }
    for name in ["x-api-key", "x-goog-api-key"] {
        for value in headers.get_all(name) {
            presented.push(value.as_bytes().trim_ascii());
        }
    }
    if presented.is_empty() {
        return Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "missing_api_key",
            "no API key: send the turn's key as Authorization: Bearer, x-api-key or x-goog-api-key",
        ));
    }
    let invalid = || {
        Refusal::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "this API key is not valid (it belongs to no open turn)",
        )
    };
    let turns = lock(&gateway.turns);
    let mut found: Option<&Arc<Turn>> = None;
    for secret in presented {
        let turn = turns.get(&digest(secret)).ok_or_else(invalid)?;
        match found {
            Some(other) if !Arc::ptr_eq(other, turn) => return Err(invalid()),
            _ => found = Some(turn),
        }
    }
    let turn = found.ok_or_else(invalid)?.clone();
    drop(turns);
    if turn.ended.is_cancelled() {
        return Err(turn_ended());
    }
    Ok(turn)
}

/// The part of `path` after `/v1/`, if it is one the gateway forwards: non-empty segments, no
/// `.` or `..`, no percent-encoding (an encoded slash or dot would mean another path to a
/// server that decodes it; model APIs need none) and no backslash.
fn forwarded_path(path: &str) -> Result<&str, &'static str> {
    let rest = path
        .strip_prefix("/v1/")
        .ok_or("only paths under /v1/ are forwarded")?;
    if rest
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return Err("a path with an empty, . or .. segment is not forwarded");
    }
    if rest.contains(['%', '\\']) {
        return Err("a path with percent-encoding or a backslash is not forwarded");
    }
    Ok(rest)
}

/// An upstream base URL, checked and taken apart.
struct Endpoint {
    https: bool,
    host: String,
    port: u16,
    /// The base path without a trailing slash, e.g. `/v1` (empty for none).
    path: String,
    /// The `Host` header: the host (bracketed if IPv6) and a port other than the scheme's.
    host_header: String,
}

impl Endpoint {
    /// Why the provider's upstream cannot be used, as a sentence without the URL itself (it
    /// could carry a credential in its user-info part).
    fn parse(base_url: &str) -> Result<Endpoint, String> {
        if let Some(problem) = agentworks_support::url::http_base_url_problem(base_url) {
            return Err(format!("the provider's upstream URL is refused: {problem}"));
        }
        let uri: hyper::Uri = base_url
            .parse()
            .map_err(|_| "the provider's upstream URL does not parse".to_owned())?;
        if uri.query().is_some() {
            return Err("the provider's upstream URL has a query string".to_owned());
        }
        let https = uri
            .scheme_str()
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https"));
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let default_port = if https { 443 } else { 80 };
        let port = uri.port_u16().unwrap_or(default_port);
        let mut host_header = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        if port != default_port {
            host_header.push_str(&format!(":{port}"));
        }
        Ok(Endpoint {
            https,
            host,
            port,
            path: uri.path().trim_end_matches('/').to_owned(),
            host_header,
        })
    }
}

/// Forwards one authorized request and starts streaming the answer back.
async fn forward(
    request: Request<Incoming>,
    gateway: &Gateway,
    turn: Arc<Turn>,
) -> Result<Response<GatewayBody>, Refusal> {
    if request.method() != Method::GET && request.method() != Method::POST {
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "only GET and POST requests are forwarded",
        ));
    }
    let rest = forwarded_path(request.uri().path())
        .map_err(|why| Refusal::new(StatusCode::NOT_FOUND, "not_found", why))?;
    let upstream = &turn.upstream;
    let endpoint = Endpoint::parse(&upstream.base_url)
        .map_err(|why| Refusal::new(StatusCode::BAD_GATEWAY, "upstream_misconfigured", why))?;
    let query = request
        .uri()
        .query()
        .map(|query| format!("?{query}"))
        .unwrap_or_default();
    let target: hyper::Uri = format!("{}/{rest}{query}", endpoint.path)
        .parse()
        .map_err(|_| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the request's path and query cannot be forwarded",
            )
        })?;
    let headers = upstream_headers(request.headers(), &endpoint, upstream)?;

    let (parts, body) = request.into_parts();
    let body = read_body(&parts.headers, body).await?;
    let mut outgoing = Request::new(Full::new(body));
    *outgoing.method_mut() = parts.method;
    *outgoing.uri_mut() = target;
    *outgoing.headers_mut() = headers;

    let key = upstream.key.as_deref();
    let response = match tokio::time::timeout(
        RESPONSE_HEAD_TIMEOUT,
        send(&endpoint, &gateway.tls, outgoing),
    )
    .await
    {
        Ok(Ok(response)) => response,
        Ok(Err(why)) => {
            tracing::debug!(reason = %redact_text(&why, key), "model upstream unreachable");
            return Err(Refusal::new(
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                format!(
                    "the model gateway could not reach the upstream: {}",
                    redact_text(&why, key)
                ),
            ));
        }
        Err(_) => {
            return Err(Refusal::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                format!(
                    "the upstream sent no answer within {} s",
                    RESPONSE_HEAD_TIMEOUT.as_secs()
                ),
            ));
        }
    };

    let (head, body) = response.into_parts();
    if head.status == StatusCode::UNAUTHORIZED || head.status == StatusCode::FORBIDDEN {
        tracing::info!(
            status = head.status.as_u16(),
            "the model upstream refused the key"
        );
        turn.refusal.store(head.status.as_u16(), Ordering::Relaxed);
    }
    let events = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
    let (sender, receiver) = mpsc::channel(FORWARD_QUEUE);
    let pump = Pump {
        sender,
        scanner: UsageScanner::new(events),
        redactor: Redactor::new(key),
        events,
        turn: turn.clone(),
        shutdown: gateway.shutdown.clone(),
    };
    tokio::spawn(pump.run(body));

    let body = ChannelBody {
        receiver,
        ended: false,
    };
    let mut response = Response::new(body.boxed_unsync());
    *response.status_mut() = head.status;
    *response.headers_mut() = answer_headers(&head.headers, key);
    Ok(response)
}

/// The client's request headers as the upstream gets them: without its credentials and the
/// headers in [`DROPPED_REQUEST_HEADERS`] (or named by its `Connection`), with the upstream's
/// host, `accept-encoding: identity` and the real key.
fn upstream_headers(
    client: &HeaderMap,
    endpoint: &Endpoint,
    upstream: &Upstream,
) -> Result<HeaderMap, Refusal> {
    let named_by_connection = connection_listed(client);
    let mut headers = HeaderMap::new();
    for (name, value) in client {
        if DROPPED_REQUEST_HEADERS.contains(&name.as_str())
            || name.as_str().starts_with("proxy-")
            || named_by_connection.contains(name)
        {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    let misconfigured = |why: &str| {
        Refusal::new(
            StatusCode::BAD_GATEWAY,
            "upstream_misconfigured",
            why.to_owned(),
        )
    };
    headers.insert(
        header::HOST,
        HeaderValue::from_str(&endpoint.host_header)
            .map_err(|_| misconfigured("the provider's upstream host is not a valid header"))?,
    );
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    if let Some(key) = upstream.key.as_deref().filter(|key| !key.is_empty()) {
        let (name, value) = match upstream.auth {
            KeyHeader::Bearer => (header::AUTHORIZATION, format!("Bearer {key}")),
            KeyHeader::XApiKey => (HeaderName::from_static("x-api-key"), key.to_owned()),
            KeyHeader::XGoogApiKey => (HeaderName::from_static("x-goog-api-key"), key.to_owned()),
        };
        // The error names neither the key nor what is wrong with it.
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            misconfigured("the provider's API key has characters a header cannot carry")
        })?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    Ok(headers)
}

/// The upstream's answer headers as the client gets them: without [`DROPPED_RESPONSE_HEADERS`],
/// `proxy-*`, the ones its `Connection` names, and any whose value contains the key.
fn answer_headers(upstream: &HeaderMap, key: Option<&str>) -> HeaderMap {
    let named_by_connection = connection_listed(upstream);
    let key = key.filter(|key| !key.is_empty()).map(str::as_bytes);
    let mut headers = HeaderMap::new();
    for (name, value) in upstream {
        let echoes_key = key.is_some_and(|key| {
            value
                .as_bytes()
                .windows(key.len())
                .any(|window| window == key)
        });
        if DROPPED_RESPONSE_HEADERS.contains(&name.as_str())
            || name.as_str().starts_with("proxy-")
            || named_by_connection.contains(name)
            || echoes_key
        {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    headers
}

/// The header names a `Connection` header lists (hop-by-hop for this connection only).
fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// The whole request body, at most [`MAX_REQUEST_BODY_BYTES`].
async fn read_body(headers: &HeaderMap, body: Incoming) -> Result<Bytes, Refusal> {
    let too_large = || {
        Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("the request body is larger than {MAX_REQUEST_BODY_BYTES} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_REQUEST_BODY_BYTES as u64) {
        return Err(too_large());
    }
    match Limited::new(body, MAX_REQUEST_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(error) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("cannot read the request body: {error}"),
        )),
    }
}

/// One request on a new connection to the upstream (`https://` through rustls with the webpki
/// roots); the error is a sentence without the request's headers.
async fn send(
    endpoint: &Endpoint,
    tls: &Arc<rustls::ClientConfig>,
    request: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, String> {
    let connect = async {
        let tcp = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|e| format!("connecting to {}: {e}", endpoint.host_header))?;
        let _ = tcp.set_nodelay(true);
        if !endpoint.https {
            return Ok(Connected::Plain(tcp));
        }
        let name = rustls::pki_types::ServerName::try_from(endpoint.host.clone())
            .map_err(|e| format!("the upstream host {:?}: {e}", endpoint.host))?;
        let stream = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {}: {e}", endpoint.host_header))?;
        Ok::<_, String>(Connected::Tls(Box::new(stream)))
    };
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| {
            format!(
                "connecting to {} took longer than {} s",
                endpoint.host_header,
                CONNECT_TIMEOUT.as_secs()
            )
        })??;
    match connected {
        Connected::Plain(tcp) => exchange(TokioIo::new(tcp), request).await,
        Connected::Tls(stream) => exchange(TokioIo::new(*stream), request).await,
    }
}

enum Connected {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

/// The response head; its body is read later (the connection's task drives it, and ends when
/// the body is dropped).
async fn exchange<IO>(io: IO, request: Request<Full<Bytes>>) -> Result<Response<Incoming>, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP with the upstream: {e}"))?;
    tokio::spawn(connection);
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("sending the request upstream: {e}"))
}

// ----- the answer, streaming back -----

/// What the [`Pump`] hands the client's body.
enum Piece {
    Chunk(Bytes),
    /// The answer is whole. A channel that closes without it was cut.
    End,
}

/// A response body fed by the [`Pump`]: each chunk goes out as soon as it is received.
struct ChannelBody {
    receiver: mpsc::Receiver<Piece>,
    ended: bool,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = AnswerCut;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, AnswerCut>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match self.receiver.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Piece::Chunk(chunk))) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            Poll::Ready(Some(Piece::End)) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(None) => Poll::Ready(Some(Err(AnswerCut))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// Reads the upstream's answer and hands it to the client: each chunk is scanned for usage
/// first (so the turn has counted an answer by the time its client has it), then sent with the
/// key redacted. Stops when the client goes away, the turn ends or the gateway stops; the
/// client's answer is then cut (the sender dropped without [`Piece::End`]).
struct Pump {
    sender: mpsc::Sender<Piece>,
    scanner: UsageScanner,
    redactor: Redactor,
    /// Server-sent events go out at once; any other body is one chunk behind, so its last
    /// chunk is sent only after the whole body was counted.
    events: bool,
    turn: Arc<Turn>,
    shutdown: CancellationToken,
}

impl Pump {
    async fn run(mut self, mut body: Incoming) {
        let mut held: Option<Bytes> = None;
        loop {
            let frame = tokio::select! {
                _ = self.turn.ended.cancelled() => return,
                _ = self.shutdown.cancelled() => return,
                _ = self.sender.closed() => return,
                frame = body.frame() => frame,
            };
            match frame {
                None => break,
                Some(Err(error)) => {
                    tracing::debug!(%error, "the model upstream's answer broke off");
                    return;
                }
                Some(Ok(frame)) => {
                    // Trailers are not passed on.
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    self.scanner.push(&data, &self.turn.usage);
                    let out = self.redactor.push(data);
                    let out = if self.events {
                        Some(out)
                    } else {
                        held.replace(out)
                    };
                    if let Some(out) = out.filter(|out| !out.is_empty())
                        && !self.deliver(Piece::Chunk(out)).await
                    {
                        return;
                    }
                }
            }
        }
        self.scanner.finish(&self.turn.usage);
        let tail = self.redactor.finish();
        for out in [held, Some(tail)].into_iter().flatten() {
            if !out.is_empty() && !self.deliver(Piece::Chunk(out)).await {
                return;
            }
        }
        self.deliver(Piece::End).await;
    }

    /// Sends one piece; false when the answer must stop.
    async fn deliver(&mut self, piece: Piece) -> bool {
        tokio::select! {
            sent = self.sender.send(piece) => sent.is_ok(),
            _ = self.turn.ended.cancelled() => false,
            _ = self.shutdown.cancelled() => false,
        }
    }
}

/// What the answer pump makes of one upstream body arriving in `chunks`, without I/O: each
/// chunk scanned for usage, then redacted, as [`Pump::run`] does (`events`: the answer is
/// `text/event-stream`), returning the tokens counted and the bytes the client would get.
/// Public (and hidden) only so the fuzz target `gateway_usage` (`fuzz/`) can reach the scanner
/// and the redactor; not an API.
#[doc(hidden)]
pub fn scan_answer<'c>(
    chunks: impl IntoIterator<Item = &'c [u8]>,
    events: bool,
    key: Option<&str>,
) -> (Usage, Vec<u8>) {
    let usage = Mutex::new(Usage::default());
    let mut scanner = UsageScanner::new(events);
    let mut redactor = Redactor::new(key);
    let mut out = Vec::new();
    for chunk in chunks {
        scanner.push(chunk, &usage);
        out.extend_from_slice(&redactor.push(Bytes::copy_from_slice(chunk)));
    }
    scanner.finish(&usage);
    out.extend_from_slice(&redactor.finish());
    let counted = *lock(&usage);
    (counted, out)
}

/// Replaces every occurrence of the key in a byte stream with [`REDACTED`], even one split
/// across chunks: a chunk's tail that could be the start of the key waits for the next chunk
/// (an SSE event ends with a blank line, never a key's prefix, so events are not delayed).
struct Redactor {
    key: Option<Vec<u8>>,
    held: Vec<u8>,
}

impl Redactor {
    fn new(key: Option<&str>) -> Redactor {
        Redactor {
            key: key
                .filter(|key| !key.is_empty())
                .map(|key| key.as_bytes().to_vec()),
            held: Vec::new(),
        }
    }

    fn push(&mut self, chunk: Bytes) -> Bytes {
        let Some(key) = &self.key else {
            return chunk;
        };
        let mut buffer = std::mem::take(&mut self.held);
        buffer.extend_from_slice(&chunk);
        let mut out = Vec::with_capacity(buffer.len());
        let mut at = 0;
        while at < buffer.len() {
            let rest = &buffer[at..];
            if rest.starts_with(key) {
                out.extend_from_slice(REDACTED);
                at += key.len();
            } else if rest.len() < key.len() && key.starts_with(rest) {
                self.held = rest.to_vec();
                break;
            } else {
                out.push(buffer[at]);
                at += 1;
            }
        }
        Bytes::from(out)
    }

    /// What is still held at the end of the body (a partial key that never completed).
    fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.held))
    }
}

/// Reads the token counts out of an answer as it passes: server-sent events one by one, any
/// other body whole (up to [`MAX_SCANNED_BYTES`]) at its end. Within one answer a count is
/// reported once (OpenAI) or cumulatively (Anthropic's `message_delta`), so the answer's count
/// is the largest seen; what it grows by is added to the turn at once.
struct UsageScanner {
    format: ScanFormat,
    /// What this answer has added to the turn so far.
    counted: Usage,
}

enum ScanFormat {
    Events(EventLines),
    Json { bytes: Vec<u8>, too_large: bool },
}

impl UsageScanner {
    fn new(events: bool) -> UsageScanner {
        let format = if events {
            ScanFormat::Events(EventLines::default())
        } else {
            ScanFormat::Json {
                bytes: Vec::new(),
                too_large: false,
            }
        };
        UsageScanner {
            format,
            counted: Usage::default(),
        }
    }

    fn push(&mut self, chunk: &[u8], usage: &Mutex<Usage>) {
        match &mut self.format {
            ScanFormat::Events(lines) => {
                for data in lines.push(chunk) {
                    count(&data, &mut self.counted, usage);
                }
            }
            ScanFormat::Json { bytes, too_large } => {
                if bytes.len() + chunk.len() > MAX_SCANNED_BYTES {
                    *too_large = true;
                    bytes.clear();
                }
                if !*too_large {
                    bytes.extend_from_slice(chunk);
                }
            }
        }
    }

    fn finish(&mut self, usage: &Mutex<Usage>) {
        match &mut self.format {
            // An event without its blank line at the very end is an event too.
            ScanFormat::Events(lines) => {
                if let Some(data) = lines.push(b"\n\n").pop() {
                    count(&data, &mut self.counted, usage);
                }
            }
            ScanFormat::Json { bytes, too_large } => {
                if !*too_large {
                    count(bytes, &mut self.counted, usage);
                }
            }
        }
    }
}

/// Counts what one JSON text (an event's data or a whole answer) reports.
fn count(data: &[u8], counted: &mut Usage, usage: &Mutex<Usage>) {
    // Most events are text deltas: only those that can carry a count are parsed.
    if !data.windows(5).any(|window| window == b"usage") {
        return;
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let reported = reported_usage(&value);
    let mut turn = lock(usage);
    if let Some(input) = reported.input_tokens
        && input > counted.input_tokens
    {
        turn.input_tokens = turn
            .input_tokens
            .saturating_add(input - counted.input_tokens);
        counted.input_tokens = input;
    }
    if let Some(output) = reported.output_tokens
        && output > counted.output_tokens
    {
        turn.output_tokens = turn
            .output_tokens
            .saturating_add(output - counted.output_tokens);
        counted.output_tokens = output;
    }
}

/// The counts one JSON text reports, in any of the dialects:
/// - Responses API: `usage.{input,output}_tokens` (a non-streamed answer), or
///   `response.usage` (the `response.completed`, `.incomplete` and `.failed` events);
/// - chat completions: `usage.{prompt,completion}_tokens` (the last chunk when streamed);
/// - Messages API: `usage` (a non-streamed answer, and `message_delta`'s cumulative counts),
///   `message.usage` (`message_start`); its cache reads and writes are input tokens too;
/// - Gemini: `usageMetadata.{promptTokenCount,candidatesTokenCount}`.
fn reported_usage(value: &Value) -> ReportedUsage {
    let tokens = |object: &Value, name: &str| {
        object
            .get(name)
            .and_then(Value::as_u64)
            .map(|n| n.min(MAX_REPORTED_TOKENS))
    };
    let mut reported = ReportedUsage::default();
    for usage in [
        &value["usage"],
        &value["response"]["usage"],
        &value["message"]["usage"],
    ] {
        if !usage.is_object() {
            continue;
        }
        let input = tokens(usage, "input_tokens")
            .map(|input| {
                input
                    + tokens(usage, "cache_creation_input_tokens").unwrap_or(0)
                    + tokens(usage, "cache_read_input_tokens").unwrap_or(0)
            })
            .or_else(|| tokens(usage, "prompt_tokens"));
        let output = tokens(usage, "output_tokens").or_else(|| tokens(usage, "completion_tokens"));
        reported.raise(input, output);
    }
    let gemini = &value["usageMetadata"];
    if gemini.is_object() {
        let output = tokens(gemini, "candidatesTokenCount")
            .map(|output| output + tokens(gemini, "thoughtsTokenCount").unwrap_or(0));
        reported.raise(tokens(gemini, "promptTokenCount"), output);
    }
    reported
}

#[derive(Debug, Default, PartialEq, Eq)]
struct ReportedUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

impl ReportedUsage {
    fn raise(&mut self, input: Option<u64>, output: Option<u64>) {
        self.input_tokens = self.input_tokens.max(input);
        self.output_tokens = self.output_tokens.max(output);
    }
}

/// Server-sent events, as the `data` of each event: lines end with LF, CRLF or CR (even split
/// across chunks), `data:` lines are joined with LF, a blank line ends an event, other fields
/// are skipped. An event larger than [`MAX_SCANNED_BYTES`] is dropped (not counted).
#[derive(Default)]
struct EventLines {
    line: Vec<u8>,
    line_too_long: bool,
    data: Option<Vec<u8>>,
    data_too_long: bool,
    /// The last byte was a CR: an LF right after it ends nothing more.
    after_cr: bool,
}

impl EventLines {
    fn push(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        let mut events = Vec::new();
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => events.extend(self.end_line()),
                _ if self.line.len() < MAX_SCANNED_BYTES => self.line.push(byte),
                _ => self.line_too_long = true,
            }
        }
        events
    }

    /// Ends the current line; a blank one ends the event, whose data is returned.
    fn end_line(&mut self) -> Option<Vec<u8>> {
        let line = std::mem::take(&mut self.line);
        let line_too_long = std::mem::take(&mut self.line_too_long);
        if line.is_empty() && !line_too_long {
            let too_long = std::mem::take(&mut self.data_too_long);
            return self.data.take().filter(|_| !too_long);
        }
        let value = line.strip_prefix(b"data:")?;
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let first = self.data.is_none();
        let data = self.data.get_or_insert_with(Vec::new);
        if line_too_long || data.len() + value.len() + 1 > MAX_SCANNED_BYTES {
            self.data_too_long = true;
            data.clear();
        } else if !self.data_too_long {
            if !first {
                data.push(b'\n');
            }
            data.extend_from_slice(value);
        }
        None
    }
}

/// `text` with the key (if any) replaced, for messages built from upstream errors.
fn redact_text(text: &str, key: Option<&str>) -> String {
    match key.filter(|key| !key.is_empty()) {
        Some(key) => text.replace(key, "[redacted]"),
        None => text.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const KEY: &str = "sk-real-0123456789abcdef";
    /// Long enough for a slow machine, short enough that a hang fails the test.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// One request as the scripted upstream received it.
    #[derive(Debug, Clone)]
    struct Seen {
        method: Method,
        target: String,
        headers: HeaderMap,
        body: Bytes,
    }

    impl Seen {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers.get(name).map(|value| value.to_str().unwrap())
        }
    }

    /// What the scripted upstream answers.
    struct Answer {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: GatewayBody,
    }

    fn json_answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: full(body.to_owned()),
        }
    }

    /// A streamed answer whose chunks the test sends itself.
    fn streamed_answer() -> (Answer, mpsc::Sender<Piece>) {
        let (sender, receiver) = mpsc::channel(16);
        let body = ChannelBody {
            receiver,
            ended: false,
        };
        let answer = Answer {
            status: 200,
            headers: vec![("content-type", "text/event-stream".into())],
            body: body.boxed_unsync(),
        };
        (answer, sender)
    }

    /// A model server on loopback that records every request and answers from its script.
    struct ScriptedUpstream {
        base_url: String,
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    impl ScriptedUpstream {
        async fn start(script: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Self {
            let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .unwrap();
            let address = listener.local_addr().unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let script = Arc::new(script);
            let recorded = seen.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let seen = recorded.clone();
                    let script = script.clone();
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let seen = seen.clone();
                        let script = script.clone();
                        async move {
                            let (parts, body) = request.into_parts();
                            let request = Seen {
                                method: parts.method,
                                target: parts.uri.to_string(),
                                headers: parts.headers,
                                body: body.collect().await.unwrap().to_bytes(),
                            };
                            lock(&seen).push(request.clone());
                            let answer = script(&request);
                            let mut response = Response::new(answer.body);
                            *response.status_mut() = StatusCode::from_u16(answer.status).unwrap();
                            for (name, value) in answer.headers {
                                response
                                    .headers_mut()
                                    .append(name, HeaderValue::from_str(&value).unwrap());
                            }
                            Ok::<_, Infallible>(response)
                        }
                    });
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service),
                    );
                }
            });
            ScriptedUpstream {
                base_url: format!("http://{address}/v1"),
                seen,
            }
        }

        fn seen(&self) -> Vec<Seen> {
            lock(&self.seen).clone()
        }

        fn upstream(&self, key: &str, auth: KeyHeader) -> Upstream {
            Upstream {
                base_url: self.base_url.clone(),
                key: Some(key.to_owned()),
                auth,
            }
        }
    }

    async fn gateway() -> ModelGateway {
        ModelGateway::start(CancellationToken::new()).await.unwrap()
    }

    /// One request to the gateway, as a CLI sends it; the answer's body still to be read.
    async fn call(
        gateway: &ModelGateway,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Response<Incoming> {
        let tcp = tokio::net::TcpStream::connect(gateway.gateway.address)
            .await
            .unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(target)
            .header("host", gateway.gateway.address.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        tokio::time::timeout(PATIENCE, sender.send_request(request))
            .await
            .unwrap()
            .unwrap()
    }

    async fn text(response: Response<Incoming>) -> String {
        let bytes = tokio::time::timeout(PATIENCE, response.into_body().collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn bearer(capability: &TurnCapability) -> String {
        format!("Bearer {}", capability.secret())
    }

    #[tokio::test]
    async fn the_upstream_gets_the_real_key_and_never_the_capability() {
        let upstream = ScriptedUpstream::start(|_| json_answer(200, r#"{"ok":true}"#)).await;
        let gateway = gateway().await;
        let turn = gateway.open_turn(upstream.upstream(KEY, KeyHeader::Bearer));
        let auth = bearer(&turn);
        let response = call(
            &gateway,
            "POST",
            "/v1/responses?stream=true",
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
                ("openai-beta", "responses=experimental"),
                ("cookie", "session=the-clis"),
                ("accept-encoding", "gzip"),
                ("connection", "keep-alive, x-hop"),
                ("x-hop", "hop-by-hop"),
                ("proxy-authorization", "Basic abc"),
            ],
            r#"{"model":"gpt-5","input":"hi"}"#,
        )
        .await;
        assert_eq!(response.status(), 200);
        assert_eq!(text(response).await, r#"{"ok":true}"#);

        let seen = upstream.seen();
        assert_eq!(seen.len(), 1);
        let request = &seen[0];
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.target, "/v1/responses?stream=true");
        assert_eq!(
            request.header("authorization"),
            Some(&*format!("Bearer {KEY}"))
        );
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(
            request.header("openai-beta"),
            Some("responses=experimental")
        );
        assert_eq!(request.header("accept-encoding"), Some("identity"));
        let upstream_host = upstream.base_url.trim_start_matches("http://");
        assert_eq!(request.header("host"), upstream_host.strip_suffix("/v1"));
        for absent in ["cookie", "x-hop", "proxy-authorization", "x-api-key"] {
            assert_eq!(request.header(absent), None, "{absent} was forwarded");
        }
        assert_eq!(&request.body[..], br#"{"model":"gpt-5","input":"hi"}"#);
        for (name, value) in &request.headers {
            let value = String::from_utf8_lossy(value.as_bytes());
            assert!(
                !value.contains(turn.secret()),
                "{name} carried the capability"
            );
        }

        // Anthropic's way: the capability as x-api-key, the key sent the same way.
        let turn = gateway.open_turn(upstream.upstream(KEY, KeyHeader::XApiKey));
        let response = call(
            &gateway,
            "POST",
            "/v1/messages",
            &[
                ("x-api-key", turn.secret()),
                ("anthropic-version", "2023-06-01"),
            ],
            "{}",
        )
        .await;
        assert_eq!(response.status(), 200);
        let request = &upstream.seen()[1];
        assert_eq!(request.header("x-api-key"), Some(KEY));
        assert_eq!(request.header("authorization"), None);
        assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));

        // Gemini's header, and an upstream that wants no key at all.
        let turn = gateway.open_turn(Upstream {
            key: None,
            ..upstream.upstream(KEY, KeyHeader::Bearer)
        });
        let response = call(
            &gateway,
            "GET",
            "/v1/models",
            &[("x-goog-api-key", turn.secret())],
            "",
        )
        .await;
        assert_eq!(response.status(), 200);
        let request = &upstream.seen()[2];
        assert_eq!(request.method, Method::GET);
        assert_eq!(request.target, "/v1/models");
        for absent in ["authorization", "x-api-key", "x-goog-api-key"] {
            assert_eq!(request.header(absent), None, "{absent} was sent");
        }
    }

    #[tokio::test]
    async fn a_streamed_answer_arrives_as_it_comes_whole_and_is_counted() {
        let (answer, events) = streamed_answer();
        let answer = Mutex::new(Some(answer));
        let upstream = ScriptedUpstream::start(move |request| match lock(&answer).take() {
            Some(answer) => answer,
            // The second request: a non-streamed chat completion.
            None => {
                assert_eq!(request.target, "/v1/chat/completions");
                json_answer(
                    200,
                    r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#,
                )
            }
        })
        .await;
        let gateway = gateway().await;
        let turn = gateway.open_turn(upstream.upstream(KEY, KeyHeader::Bearer));
        let auth = bearer(&turn);

        let first = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n\
                     event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hel\"}\n\n";
        let completed = "event: response.completed\r\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\
                         \"usage\":{\"input_tokens\":120,\"input_tokens_details\":{\"cached_tokens\":100},\"output_tokens\":34,\"total_tokens\":154}}}\r\n\r\n";
        events.send(Piece::Chunk(Bytes::from(first))).await.unwrap();

        let response = call(
            &gateway,
            "POST",
            "/v1/responses",
            &[("authorization", &auth), ("accept", "text/event-stream")],
            r#"{"stream":true}"#,
        )
        .await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            HeaderValue::from_static("text/event-stream")
        );
        let mut body = response.into_body();
        // The first events reach the client while the upstream has not sent the rest: nothing
        // waits for the whole answer.
        let mut received = Vec::new();
        while received.len() < first.len() {
            let frame = tokio::time::timeout(PATIENCE, body.frame())
                .await
                .expect("the first events were held back")
                .unwrap()
                .unwrap();
            received.extend_from_slice(&frame.into_data().unwrap());
        }
        assert_eq!(received, first.as_bytes());
        assert_eq!(turn.usage(), Usage::default());

        // The completed event split inside its JSON, then the end.
        let (head, tail) = completed.split_at(70);
        events.send(Piece::Chunk(Bytes::from(head))).await.unwrap();
        events.send(Piece::Chunk(Bytes::from(tail))).await.unwrap();
        events
            .send(Piece::Chunk(Bytes::from("data: [DONE]\n\n")))
            .await
            .unwrap();
        events.send(Piece::End).await.unwrap();
        drop(events);
        let rest = tokio::time::timeout(PATIENCE, body.collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes();
        received.extend_from_slice(&rest);
        assert_eq!(
            String::from_utf8(received).unwrap(),
            format!("{first}{completed}data: [DONE]\n\n")
        );
        assert_eq!(
            turn.usage(),
            Usage {
                input_tokens: 120,
                output_tokens: 34
            }
        );

        // A second answer of the same turn, not streamed, adds to it.
        let response = call(
            &gateway,
            "POST",
            "/v1/chat/completions",
            &[("authorization", &auth)],
            "{}",
        )
        .await;
        assert_eq!(response.status(), 200);
        text(response).await;
        assert_eq!(
            turn.usage(),
            Usage {
                input_tokens: 130,
                output_tokens: 39
            }
        );
    }

    #[tokio::test]
    async fn each_capability_reaches_only_its_own_upstream() {
        let first = ScriptedUpstream::start(|_| json_answer(200, r#"{"from":"first"}"#)).await;
        let second = ScriptedUpstream::start(|_| json_answer(200, r#"{"from":"second"}"#)).await;
        let gateway = gateway().await;
        let one = gateway.open_turn(first.upstream("sk-first", KeyHeader::Bearer));
        let two = gateway.open_turn(second.upstream("sk-second", KeyHeader::Bearer));
        assert_ne!(one.secret(), two.secret());

        let answer = call(
            &gateway,
            "POST",
            "/v1/responses",
            &[("authorization", &bearer(&two))],
            "{}",
        )
        .await;
        assert_eq!(text(answer).await, r#"{"from":"second"}"#);
        let answer = call(
            &gateway,
            "POST",
            "/v1/responses",
            &[("authorization", &bearer(&one))],
            "{}",
        )
        .await;
        assert_eq!(text(answer).await, r#"{"from":"first"}"#);
        assert_eq!(first.seen().len(), 1);
        assert_eq!(
            first.seen()[0].header("authorization"),
            Some("Bearer sk-first")
        );
        assert_eq!(second.seen().len(), 1);
        assert_eq!(
            second.seen()[0].header("authorization"),
            Some("Bearer sk-second")
        );

        // Two capabilities in one request name two turns: neither is used.
        let answer = call(
            &gateway,
            "POST",
            "/v1/responses",
            &[
                ("authorization", &bearer(&one)),
                ("x-api-key", two.secret()),
            ],
            "{}",
        )
        .await;
        assert_eq!(answer.status(), 401);
        // One capability and a made-up one: refused too.
        let answer = call(
            &gateway,
            "POST",
            "/v1/responses",
            &[
                ("authorization", &bearer(&one)),
                ("x-goog-api-key", "awcap_guess"),
            ],
            "{}",
        )
        .await;
        assert_eq!(answer.status(), 401);
        assert_eq!(first.seen().len() + second.seen().len(), 2);
    }

    #[tokio::test]
    async fn closed_dropped_unknown_and_missing_capabilities_are_refused_before_anything_is_forwarded()
     {
        let upstream = ScriptedUpstream::start(|_| json_answer(200, "{}")).await;
        let gateway = gateway().await;
        let closed = gateway.open_turn(upstream.upstream(KEY, KeyHeader::Bearer));
        let closed_secret = closed.secret().to_owned();
        closed.close();
        let dropped = gateway.open_turn(upstream.upstream(KEY, KeyHeader::Bearer));
        let dropped_secret = dropped.secret().to_owned();
        drop(dropped);
        let unknown = format!("awcap_{}", "0".repeat(64));

        for headers in [
            vec![("authorization", format!("Bearer {closed_secret}"))],
            vec![("x-api-key", dropped_secret.clone())],
            vec![("authorization", format!("Bearer {unknown}"))],
            vec![("authorization", format!("Basic {dropped_secret}"))],
            vec![("authorization", "Bearer".to_owned())],
            vec![],
        ] {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let answer = call(&gateway, "POST", "/v1/responses", &headers, "{}").await;
            assert_eq!(answer.status(), 401, "{headers:?}");
            let body: Value = serde_json::from_str(&text(answer).await).unwrap();
            assert!(
                body["error"]["message"].as_str().unwrap().contains("key"),
                "{body}"
            );
        }
        assert!(upstream.seen().is_empty());
    }

    #[tokio::test]
    async fn an_answer_in_flight_is_cut_when_its_turn_ends() {
        let (answer, events) = streamed_answer();
        let answer = Mutex::new(Some(answer));
        let upstream = ScriptedUpstream::start(move |_| lock(&answer).take().unwrap()).await;
        let gateway = gateway().await;
        let turn = gateway.open_turn(upstream.upstream(KEY, KeyHeader::Bearer));
        events
            .send(Piece::Chunk(Bytes::from("data: {}\n\n")))
            .await
            .unwrap();
        let response = call(
            &gateway,
            "POST",
            "/v1/responses",
            &[("authorization", &bearer(&turn))],
            "{}",
        )
        .await;
        let mut body = response.into_body();
        let frame = tokio::time::timeout(PATIENCE, body.frame()).await.unwrap();
        assert_eq!(frame.unwrap().unwrap().into_data().unwrap(), "data: {}\n\n");

        turn.close();
        // The upstream is still sending; the client's answer ends as cut, not as whole.
        let _ = events.try_send(Piece::Chunk(Bytes::from("data: {\"more\":1}\n\n")));
        let rest = tokio::time::timeout(PATIENCE, body.collect())
            .await
            .unwrap();
        assert!(rest.is_err(), "the cut answer looked whole");
    }

    #[tokio::test]
    async fn only_get_and_post_under_v1_are_forwarded() {
        let upstream = ScriptedUpstream::start(|_| json_answer(200, "{}")).await;
        let gateway = gateway().await;
        let turn = gateway.open_turn(upstream.upstream(KEY, KeyHeader::Bearer));
        let auth = bearer(&turn);
        for (method, target, status) in [
            ("PUT", "/v1/responses", 405),
            ("DELETE", "/v1/responses/resp_1", 405),
            ("PATCH", "/v1/responses", 405),
            ("GET", "/v2/models", 404),
            ("GET", "/v1", 404),
            ("GET", "/v1/", 404),
            ("GET", "/models", 404),
            ("GET", "/v1/../admin", 404),
            ("GET", "/v1/models/../../admin", 404),
            ("GET", "/v1/./models", 404),
            ("GET", "/v1//models", 404),
            ("GET", "/v1/models/", 404),
            ("GET", "/v1/a%2Fb", 404),
            ("GET", "/v1/%2e%2e/admin", 404),
            ("GET", "/v1/a%5cb", 404),
        ] {
            let answer = call(&gateway, method, target, &[("authorization", &auth)], "").await;
            assert_eq!(answer.status(), status, "{method} {target}");
            let body: Value = serde_json::from_str(&text(answer).await).unwrap();
            assert!(body["error"]["message"].is_string(), "{body}");
        }
        assert!(upstream.seen().is_empty());

        // And one that is.
        let answer = call(
            &gateway,
            "GET",
            "/v1/models/gpt-5",
            &[("authorization", &auth)],
            "",
        )
        .await;
        assert_eq!(answer.status(), 200);
        assert_eq!(upstream.seen()[0].target, "/v1/models/gpt-5");
    }

    #[tokio::test]
    async fn an_upstream_refusal_is_recorded_and_passed_back_without_the_key() {
        let upstream = ScriptedUpstream::start(|request| {
            let sent = request.header("authorization").unwrap().to_owned();
            Answer {
                status: 401,
                headers: vec![
                    ("content-type", "application/json".into()),
                    ("x-echo", sent.clone()),
                    ("x-request-id", "req_1".into()),
                ],
                body: full(format!(
                    r#"{{"error":{{"message":"Incorrect API key provided: {sent} ({KEY})"}}}}"#
                )),
            }
        })
        .await;
        let gateway = gateway().await;
        let turn = gateway.open_turn(upstream.upstream(KEY, KeyHeader::Bearer));
        assert_eq!(turn.upstream_refusal(), None);
        let answer = call(
            &gateway,
            "POST",
            "/v1/responses",
            &[("authorization", &bearer(&turn))],
            "{}",
        )
        .await;
        assert_eq!(answer.status(), 401);
        assert_eq!(answer.headers()["x-request-id"], "req_1");
        assert!(answer.headers().get("x-echo").is_none());
        for (name, value) in answer.headers() {
            assert!(
                !String::from_utf8_lossy(value.as_bytes()).contains(KEY),
                "{name}"
            );
        }
        let body = text(answer).await;
        assert!(!body.contains(KEY), "{body}");
        assert_eq!(
            body,
            r#"{"error":{"message":"Incorrect API key provided: Bearer [redacted] ([redacted])"}}"#
        );
        assert_eq!(turn.upstream_refusal(), Some(401));
    }

    #[tokio::test]
    async fn an_upstream_that_cannot_be_used_gets_a_sentence_without_the_key() {
        let gateway = gateway().await;
        // A port nobody listens on any more.
        let closed = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let closed_url = format!("http://{}/v1", closed.local_addr().unwrap());
        drop(closed);
        for (base_url, key, status, code) in [
            (closed_url.as_str(), KEY, 502, "upstream_unreachable"),
            ("http://192.0.2.1/v1", KEY, 502, "upstream_misconfigured"),
            ("ftp://example.com/v1", KEY, 502, "upstream_misconfigured"),
            (
                closed_url.as_str(),
                "sk-bad\nkey",
                502,
                "upstream_misconfigured",
            ),
        ] {
            let turn = gateway.open_turn(Upstream {
                base_url: base_url.to_owned(),
                key: Some(key.to_owned()),
                auth: KeyHeader::Bearer,
            });
            let answer = call(
                &gateway,
                "POST",
                "/v1/responses",
                &[("authorization", &bearer(&turn))],
                "{}",
            )
            .await;
            assert_eq!(answer.status(), status, "{base_url}");
            let body = text(answer).await;
            assert!(!body.contains(key), "{body}");
            let body: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(body["error"]["code"], code, "{body}");
            assert!(
                body["error"]["message"].as_str().unwrap().len() > 20,
                "{body}"
            );
            assert_eq!(turn.upstream_refusal(), None);
        }
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_before_it_is_read() {
        let upstream = ScriptedUpstream::start(|_| json_answer(200, "{}")).await;
        let gateway = gateway().await;
        let turn = gateway.open_turn(upstream.upstream(KEY, KeyHeader::Bearer));
        let mut tcp = tokio::net::TcpStream::connect(gateway.gateway.address)
            .await
            .unwrap();
        let head = format!(
            "POST /v1/responses HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n",
            turn.secret(),
            MAX_REQUEST_BODY_BYTES + 1
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tokio::time::timeout(PATIENCE, tcp.read_to_string(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
        assert!(upstream.seen().is_empty());
    }

    #[tokio::test]
    async fn capabilities_are_fresh_and_the_gateway_stops_with_its_token() {
        let shutdown = CancellationToken::new();
        let gateway = ModelGateway::start(shutdown.clone()).await.unwrap();
        assert!(gateway.base_url().starts_with("http://127.0.0.1:"));
        assert!(gateway.base_url().ends_with("/v1"));
        let upstream = Upstream {
            base_url: "https://api.example.com/v1".into(),
            key: Some(KEY.into()),
            auth: KeyHeader::Bearer,
        };
        let one = gateway.open_turn(upstream.clone());
        let two = gateway.open_turn(upstream.clone());
        for turn in [&one, &two] {
            let random = turn.secret().strip_prefix("awcap_").unwrap();
            assert_eq!(random.len(), 64);
            assert!(random.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(!format!("{turn:?}").contains(turn.secret()));
        }
        assert_ne!(one.secret(), two.secret());
        assert!(!format!("{upstream:?}").contains(KEY));

        shutdown.cancel();
        let stopped = async {
            while tokio::net::TcpStream::connect(gateway.gateway.address)
                .await
                .is_ok()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, stopped)
            .await
            .expect("the gateway still accepts after shutdown");
    }

    #[test]
    fn the_key_is_redacted_wherever_a_chunk_splits_it() {
        let text = format!("a{KEY}b{KEY}{KEY}c sk-real-0123 end");
        let expected = "a[redacted]b[redacted][redacted]c sk-real-0123 end";
        for split in 0..=text.len() {
            for second in split..=text.len() {
                let mut redactor = Redactor::new(Some(KEY));
                let mut out = Vec::new();
                for piece in [&text[..split], &text[split..second], &text[second..]] {
                    out.extend_from_slice(&redactor.push(Bytes::copy_from_slice(piece.as_bytes())));
                }
                out.extend_from_slice(&redactor.finish());
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    expected,
                    "{split} {second}"
                );
            }
        }
        // An event's end is never held back waiting for a key that may follow.
        let mut redactor = Redactor::new(Some(KEY));
        assert_eq!(redactor.push(Bytes::from("data: {}\n\n")), "data: {}\n\n");
        assert_eq!(Redactor::new(None).push(Bytes::from("x")), "x");
    }

    /// Feeds `body` to a scanner in pieces of `step` bytes and returns what it counted.
    fn scanned(events: bool, body: &str, step: usize) -> Usage {
        let usage = Mutex::new(Usage::default());
        let mut scanner = UsageScanner::new(events);
        for piece in body.as_bytes().chunks(step) {
            scanner.push(piece, &usage);
        }
        scanner.finish(&usage);
        usage.into_inner().unwrap()
    }

    #[test]
    fn usage_is_read_from_each_dialect_however_the_stream_is_cut() {
        let usage = |input_tokens, output_tokens| Usage {
            input_tokens,
            output_tokens,
        };
        let messages = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\r\n\r\n\
                        event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"usage\"}}\r\n\r\n\
                        event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":12}}\r\n\r\n\
                        event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\r\n\r\n\
                        event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";
        let chat = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
                    data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
        let responses = "data: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\r\r\
                         data: {\"type\":\"response.completed\",\r\
                         data: \"response\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":4}}}";
        for step in [1, 2, 3, 7, 64, 100_000] {
            assert_eq!(scanned(true, messages, step), usage(25, 40), "{step}");
            assert_eq!(scanned(true, chat, step), usage(7, 3), "{step}");
            // CR line ends, an event's data over two lines, no blank line at the very end.
            assert_eq!(scanned(true, responses, step), usage(9, 4), "{step}");
        }
        let whole_messages = r#"{"type":"message","usage":{"input_tokens":11,"output_tokens":22}}"#;
        let whole_responses =
            r#"{"object":"response","usage":{"input_tokens":5,"output_tokens":6}}"#;
        let gemini = r#"{"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":2,"thoughtsTokenCount":1}}"#;
        assert_eq!(scanned(false, whole_messages, 5), usage(11, 22));
        assert_eq!(scanned(false, whole_responses, 5), usage(5, 6));
        assert_eq!(scanned(false, gemini, 5), usage(8, 3));
        // Odd values count nothing, and never fail.
        assert_eq!(
            scanned(
                false,
                r#"{"usage":{"prompt_tokens":-1,"completion_tokens":"3"}}"#,
                5
            ),
            usage(0, 0)
        );
        assert_eq!(scanned(false, "not json, but usage", 5), usage(0, 0));
        assert_eq!(
            scanned(
                false,
                r#"{"usage":{"input_tokens":18446744073709551615}}"#,
                5
            ),
            usage(MAX_REPORTED_TOKENS, 0)
        );
    }
}
