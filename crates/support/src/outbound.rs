//! The one guarded outbound HTTP client: every request to an address a user or a client chose
//! (an OAuth client's metadata document, an MCP server) goes through [`GuardedClient`].
//!
//! What it guards against is server-side request forgery: a URL that points the daemon at
//! itself, at the private network it sits in, or at a cloud metadata service. So:
//!
//! - `https://` only; plain `http://` only when the caller opted in, and even then the same
//!   address rules apply (there is no knob that allows loopback or private addresses);
//! - the host is read by the WHATWG URL parser (`url`), the way browsers read it, so
//!   `0x7f.1`, `2130706433` and `[::ffff:127.0.0.1]` are the addresses they are;
//! - names such as `localhost` and `*.internal` are refused before DNS; a name is resolved once
//!   (the system resolver, through [`tokio::net::lookup_host`]), *every* resolved address is
//!   checked with [`check_ip`], and the connection goes to one of those checked
//!   [`SocketAddr`]s, never re-resolved, so DNS rebinding between check and connect cannot
//!   win; after connecting, the peer address is verified to be the checked one;
//! - no proxy (the environment's `HTTP_PROXY` and friends are never read);
//! - no redirect followed, unless the caller asked for same-origin ones (at most
//!   [`MAX_REDIRECTS`], each checked again);
//! - bounded: connect, TLS handshake and whole-request timeouts, and a maximum body size.
//!
//! It is hand-written on hyper because no maintained client crate checks the address actually
//! dialled with these rules: a check made outside a client (resolve, check, then hand the URL
//! over) checks a different resolution from the one the client dials, and general clients
//! read the proxy environment and follow redirects by default. Here resolution, the check and
//! the dial are one step, and there is nothing to configure wrongly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use url::{Host, Position, Url};

/// The default limit on a response body: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// The default limit on establishing the TCP connection to one address.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default limit on the TLS handshake.
pub const DEFAULT_TLS_TIMEOUT: Duration = Duration::from_secs(10);
/// The default limit on the whole request: resolution, connection, redirects and body.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Same-origin redirects followed at most, when the caller asked for them.
pub const MAX_REDIRECTS: usize = 3;

/// Why an address or host is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub struct Refusal {
    /// What the address is, for a person: "loopback (127.0.0.0/8)".
    pub reason: &'static str,
    /// The IPv4 address an IPv6 address embeds (mapped, compatible, 6to4), when that is what
    /// was refused.
    pub embedded_ipv4: Option<Ipv4Addr>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.embedded_ipv4 {
            Some(v4) => write!(f, "an IPv6 form of {v4}, which is {}", self.reason),
            None => f.write_str(self.reason),
        }
    }
}

fn refuse(reason: &'static str) -> Refusal {
    Refusal {
        reason,
        embedded_ipv4: None,
    }
}

/// Refused IPv4 ranges: network, prefix length, what it is.
const REFUSED_V4: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 8, "\"this network\" (0.0.0.0/8)"),
    ([10, 0, 0, 0], 8, "private (10.0.0.0/8)"),
    (
        [100, 64, 0, 0],
        10,
        "shared address space (100.64.0.0/10), where cloud metadata services such as 100.100.100.200 live",
    ),
    ([127, 0, 0, 0], 8, "loopback (127.0.0.0/8)"),
    (
        [169, 254, 0, 0],
        16,
        "link-local (169.254.0.0/16), where cloud metadata services such as 169.254.169.254 live",
    ),
    ([172, 16, 0, 0], 12, "private (172.16.0.0/12)"),
    (
        [192, 0, 0, 0],
        24,
        "IETF protocol assignments (192.0.0.0/24)",
    ),
    ([192, 0, 2, 0], 24, "documentation (192.0.2.0/24)"),
    ([192, 168, 0, 0], 16, "private (192.168.0.0/16)"),
    ([198, 18, 0, 0], 15, "benchmarking (198.18.0.0/15)"),
    ([198, 51, 100, 0], 24, "documentation (198.51.100.0/24)"),
    ([203, 0, 113, 0], 24, "documentation (203.0.113.0/24)"),
    (
        [224, 0, 0, 0],
        3,
        "multicast, reserved or broadcast (224.0.0.0 and above)",
    ),
];

/// Refused IPv6 ranges, checked after the ones that embed an IPv4 address.
const REFUSED_V6: &[(u128, u8, &str)] = &[
    (
        0x0064_ff9b_0000_0000_0000_0000_0000_0000,
        96,
        "NAT64 (64:ff9b::/96), which reaches IPv4 addresses through a translator",
    ),
    (
        0x0064_ff9b_0001_0000_0000_0000_0000_0000,
        48,
        "local-use NAT64 (64:ff9b:1::/48), which reaches the network's own IPv4 addresses through a translator",
    ),
    (
        0x0000_0000_0000_0000_ffff_0000_0000_0000,
        96,
        "IPv4-translated (::ffff:0:0:0/96), which a translator turns into an IPv4 address",
    ),
    (
        0x2001_0db8_0000_0000_0000_0000_0000_0000,
        32,
        "documentation (2001:db8::/32)",
    ),
    (
        0xfc00_0000_0000_0000_0000_0000_0000_0000,
        7,
        "unique local (fc00::/7), where cloud metadata services such as fd00:ec2::254 live",
    ),
    (
        0xfe80_0000_0000_0000_0000_0000_0000_0000,
        10,
        "link-local (fe80::/10)",
    ),
    (
        0xfec0_0000_0000_0000_0000_0000_0000_0000,
        10,
        "site-local (fec0::/10)",
    ),
    (
        0xff00_0000_0000_0000_0000_0000_0000_0000,
        8,
        "multicast (ff00::/8)",
    ),
];

fn in_prefix(address: u128, network: u128, prefix: u8, bits: u32) -> bool {
    let shift = bits - u32::from(prefix);
    (address >> shift) == (network >> shift)
}

/// Whether the client may connect to `ip`: refuses loopback, private, link-local, shared,
/// documentation, benchmarking, multicast and reserved ranges, and IPv6 forms embedding a
/// refused IPv4 address.
pub fn check_ip(ip: IpAddr) -> Result<(), Refusal> {
    match ip {
        IpAddr::V4(v4) => check_ipv4(v4),
        IpAddr::V6(v6) => check_ipv6(v6),
    }
}

fn check_ipv4(ip: Ipv4Addr) -> Result<(), Refusal> {
    let address = u128::from(u32::from(ip));
    for &(network, prefix, reason) in REFUSED_V4 {
        let network = u128::from(u32::from(Ipv4Addr::from(network)));
        if in_prefix(address, network, prefix, 32) {
            return Err(refuse(reason));
        }
    }
    Ok(())
}

fn check_ipv6(ip: Ipv6Addr) -> Result<(), Refusal> {
    let address = u128::from(ip);
    if ip.is_unspecified() {
        return Err(refuse("unspecified (::)"));
    }
    if ip.is_loopback() {
        return Err(refuse("loopback (::1)"));
    }
    let embedded = |v4: Ipv4Addr| {
        check_ipv4(v4).map_err(|r| Refusal {
            embedded_ipv4: Some(v4),
            ..r
        })
    };
    // IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible (::a.b.c.d): the IPv4 address decides.
    if address >> 32 == 0xffff || address >> 32 == 0 {
        return embedded(Ipv4Addr::from(address as u32));
    }
    // 6to4 (2002:aabb:ccdd::/48) tunnels to the IPv4 address aa.bb.cc.dd.
    if address >> 112 == 0x2002 {
        embedded(Ipv4Addr::from((address >> 80) as u32))?;
    }
    for &(network, prefix, reason) in REFUSED_V6 {
        if in_prefix(address, network, prefix, 128) {
            return Err(refuse(reason));
        }
    }
    Ok(())
}

/// Whether the client may connect to `host` as written in a URL (a name, an IPv4 address in
/// any form the URL parser reads, or an IPv6 address with or without brackets). Names are
/// checked without DNS; their addresses are checked when they are resolved.
pub fn check_host(host: &str) -> Result<(), Refusal> {
    if let Ok(v6) = host.parse::<Ipv6Addr>() {
        return check_ipv6(v6);
    }
    match Host::parse(host) {
        Ok(Host::Domain(name)) => check_name(&name),
        Ok(Host::Ipv4(v4)) => check_ipv4(v4),
        Ok(Host::Ipv6(v6)) => check_ipv6(v6),
        Err(_) => Err(refuse("not a valid host name")),
    }
}

/// The name rules: names that mean this machine or a cloud's internal network.
fn check_name(name: &str) -> Result<(), Refusal> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() {
        return Err(refuse("an empty host name"));
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return Err(refuse("a localhost name, which means this machine"));
    }
    if name == "metadata" || name == "metadata.google.internal" {
        return Err(refuse("a cloud metadata service name"));
    }
    if name == "internal" || name.ends_with(".internal") {
        return Err(refuse("an .internal name, private to a cloud network"));
    }
    Ok(())
}

/// Why an outbound request failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("{url:?} is not a usable absolute URL: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("{url} is not https://; outbound requests must use https")]
    NotHttps { url: String },
    #[error("refused to connect to {host}: {reason}")]
    RefusedHost { host: String, reason: Refusal },
    #[error("refused to connect to {host} at {address}: the address is {reason}")]
    RefusedAddress {
        host: String,
        address: IpAddr,
        reason: Refusal,
    },
    #[error("could not resolve {host}: {source}")]
    Dns {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("could not connect to {host} at {address}: {source}")]
    Connect {
        host: String,
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("connected to {host} at {expected} but the peer is {actual}")]
    PeerMismatch {
        host: String,
        expected: SocketAddr,
        actual: SocketAddr,
    },
    #[error("{stage} timed out after {after:?}")]
    Timeout {
        stage: &'static str,
        after: Duration,
    },
    #[error("TLS with {host} failed: {source}")]
    Tls {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the TLS client configuration is unusable: {0}")]
    TlsConfig(String),
    #[error("HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("the request could not be built: {0}")]
    Request(String),
    #[error(
        "the server answered {status} redirecting to {location:?}; redirects to another origin, \
         or more than {MAX_REDIRECTS}, are not followed"
    )]
    Redirect {
        status: StatusCode,
        location: String,
    },
    #[error("the response body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
}

/// A response: status, headers and the whole body (at most the client's limit).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A response whose body is read as it arrives (a server-sent event stream): the head, then
/// the body's chunks from [`Streaming::chunk`], at most the limit it was opened with in all.
/// Dropping it closes the connection.
pub struct Streaming {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: hyper::body::Incoming,
    read: usize,
    limit: usize,
    _connection: AbortOnDrop,
}

impl std::fmt::Debug for Streaming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming")
            .field("status", &self.status)
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

impl Streaming {
    /// The next chunk of the body; `None` at its end. Past the limit: [`OutboundError::TooLarge`].
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, OutboundError> {
        while let Some(frame) = self.body.frame().await {
            if let Ok(data) = frame?.into_data() {
                self.read += data.len();
                if self.read > self.limit {
                    return Err(OutboundError::TooLarge { limit: self.limit });
                }
                if !data.is_empty() {
                    return Ok(Some(data));
                }
            }
        }
        Ok(None)
    }
}

/// Settings for a [`GuardedClient`]; start from [`GuardedClient::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    max_body: usize,
    connect_timeout: Duration,
    tls_timeout: Duration,
    request_timeout: Duration,
    allow_http: bool,
    same_origin_redirects: bool,
    extra_roots: Vec<CertificateDer<'static>>,
}

impl Builder {
    /// The largest response body accepted; a larger one is [`OutboundError::TooLarge`].
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.max_body = limit;
        self
    }

    pub fn connect_timeout(mut self, limit: Duration) -> Self {
        self.connect_timeout = limit;
        self
    }

    pub fn tls_handshake_timeout(mut self, limit: Duration) -> Self {
        self.tls_timeout = limit;
        self
    }

    pub fn request_timeout(mut self, limit: Duration) -> Self {
        self.request_timeout = limit;
        self
    }

    /// Also allow plain `http://`. The address rules stay exactly the same.
    pub fn allow_plain_http(mut self) -> Self {
        self.allow_http = true;
        self
    }

    /// Follow redirects to the same scheme, host and port, at most [`MAX_REDIRECTS`].
    pub fn follow_same_origin_redirects(mut self) -> Self {
        self.same_origin_redirects = true;
        self
    }

    /// Trust one more root certificate (DER) besides the webpki roots: an internal CA the
    /// operator configured, or a test's own.
    pub fn add_root_certificate_der(mut self, der: Vec<u8>) -> Self {
        self.extra_roots.push(CertificateDer::from(der));
        self
    }

    pub fn build(self) -> Result<GuardedClient, OutboundError> {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for der in &self.extra_roots {
            roots
                .add(der.clone())
                .map_err(|e| OutboundError::TlsConfig(e.to_string()))?;
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| OutboundError::TlsConfig(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(GuardedClient {
            settings: self,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
        })
    }
}

/// The guarded client; cheap to clone. Each request uses a new connection.
#[derive(Clone)]
pub struct GuardedClient {
    settings: Builder,
    tls: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for GuardedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedClient")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Where one request goes, as the URL parser read it.
struct Target {
    url: Url,
    host: Host<String>,
    port: u16,
}

impl GuardedClient {
    pub fn builder() -> Builder {
        Builder {
            max_body: DEFAULT_MAX_BODY,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls_timeout: DEFAULT_TLS_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            allow_http: false,
            same_origin_redirects: false,
            extra_roots: Vec::new(),
        }
    }

    /// The default client: https only, no redirects, 1 MiB, 10 s / 10 s / 30 s.
    pub fn new() -> Result<Self, OutboundError> {
        Self::builder().build()
    }

    pub async fn get(&self, url: &str) -> Result<Response, OutboundError> {
        self.bounded(Method::GET, url, HeaderMap::new(), Bytes::new())
            .await
    }

    pub async fn post(
        &self,
        url: &str,
        content_type: &str,
        body: impl Into<Bytes>,
    ) -> Result<Response, OutboundError> {
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(content_type)
            .map_err(|e| OutboundError::Request(format!("content type: {e}")))?;
        headers.insert(header::CONTENT_TYPE, value);
        self.bounded(Method::POST, url, headers, body.into()).await
    }

    /// Any request: its method, URI, headers (`Host` and `Content-Length` are the client's)
    /// and body.
    pub async fn send(&self, request: Request<Bytes>) -> Result<Response, OutboundError> {
        let (parts, body) = request.into_parts();
        let url = parts.uri.to_string();
        self.bounded(parts.method, &url, parts.headers, body).await
    }

    /// A request whose answer is read as it arrives ([`Streaming`]), `limit` bytes at most:
    /// the same checks as every request; its head must come within the request timeout; a
    /// redirect is never followed (a stream that moves is refused).
    pub async fn open_stream(
        &self,
        request: Request<Bytes>,
        limit: usize,
    ) -> Result<Streaming, OutboundError> {
        let (parts, body) = request.into_parts();
        let url = parts.uri.to_string();
        let target = self.target(&url)?;
        let wait = self.settings.request_timeout;
        let (status, headers, incoming, connection) = tokio::time::timeout(
            wait,
            self.exchange(&parts.method, &target, &parts.headers, &body),
        )
        .await
        .map_err(|_| OutboundError::Timeout {
            stage: "the stream's answer",
            after: wait,
        })??;
        if is_redirect(status) {
            return Err(OutboundError::Redirect {
                status,
                location: headers
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned(),
            });
        }
        Ok(Streaming {
            status,
            headers,
            body: incoming,
            read: 0,
            limit,
            _connection: connection,
        })
    }

    async fn bounded(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response, OutboundError> {
        let limit = self.settings.request_timeout;
        tokio::time::timeout(limit, self.follow(method, url, headers, body))
            .await
            .map_err(|_| OutboundError::Timeout {
                stage: "the whole request",
                after: limit,
            })?
    }

    async fn follow(
        &self,
        mut method: Method,
        url: &str,
        mut headers: HeaderMap,
        mut body: Bytes,
    ) -> Result<Response, OutboundError> {
        let mut target = self.target(url)?;
        let mut hop = 0;
        loop {
            let (status, response_headers, incoming, _connection) =
                self.exchange(&method, &target, &headers, &body).await?;
            if !is_redirect(status) {
                let body =
                    read_bounded(&response_headers, incoming, self.settings.max_body).await?;
                return Ok(Response {
                    status,
                    headers: response_headers,
                    body,
                });
            }
            let location = response_headers
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let refused = || OutboundError::Redirect {
                status,
                location: location.clone(),
            };
            if !self.settings.same_origin_redirects || hop == MAX_REDIRECTS {
                return Err(refused());
            }
            let next = target.url.join(&location).map_err(|_| refused())?;
            if next.origin() != target.url.origin() {
                return Err(refused());
            }
            // 303, and 301/302 after a POST, mean "GET the new place" (RFC 9110 15.4).
            if status == StatusCode::SEE_OTHER
                || (method == Method::POST
                    && matches!(status, StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND))
            {
                method = Method::GET;
                body = Bytes::new();
                headers.remove(header::CONTENT_TYPE);
            }
            target = self.target(next.as_str())?;
            hop += 1;
        }
    }

    fn target(&self, raw: &str) -> Result<Target, OutboundError> {
        let invalid = |reason: &str| OutboundError::InvalidUrl {
            url: raw.to_owned(),
            reason: reason.to_owned(),
        };
        let url = Url::parse(raw).map_err(|e| invalid(&e.to_string()))?;
        match url.scheme() {
            "https" => {}
            "http" if self.settings.allow_http => {}
            _ => {
                return Err(OutboundError::NotHttps {
                    url: raw.to_owned(),
                });
            }
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid("credentials in the URL are not sent"));
        }
        let host = url.host().ok_or_else(|| invalid("no host"))?.to_owned();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| invalid("no port"))?;
        Ok(Target { url, host, port })
    }

    /// The checked addresses for `target`: every one of them allowed, or an error.
    async fn resolve(&self, target: &Target) -> Result<Vec<SocketAddr>, OutboundError> {
        let host = target.host.to_string();
        let ip = match &target.host {
            Host::Ipv4(v4) => IpAddr::V4(*v4),
            Host::Ipv6(v6) => IpAddr::V6(*v6),
            Host::Domain(name) => {
                check_name(name).map_err(|reason| OutboundError::RefusedHost {
                    host: host.clone(),
                    reason,
                })?;
                let addresses: Vec<SocketAddr> =
                    tokio::net::lookup_host((name.as_str(), target.port))
                        .await
                        .map_err(|source| OutboundError::Dns {
                            host: host.clone(),
                            source,
                        })?
                        .collect();
                if addresses.is_empty() {
                    return Err(OutboundError::NoAddress { host });
                }
                // One refused address refuses the name: the resolver's order is not ours.
                for address in &addresses {
                    check_ip(address.ip()).map_err(|reason| OutboundError::RefusedAddress {
                        host: host.clone(),
                        address: address.ip(),
                        reason,
                    })?;
                }
                return Ok(addresses);
            }
        };
        check_ip(ip).map_err(|reason| OutboundError::RefusedAddress {
            host: host.clone(),
            address: ip,
            reason,
        })?;
        Ok(vec![SocketAddr::new(ip, target.port)])
    }

    /// A connection to one of the checked addresses, tried in order.
    async fn connect(
        &self,
        host: &str,
        addresses: &[SocketAddr],
    ) -> Result<TcpStream, OutboundError> {
        let limit = self.settings.connect_timeout;
        let mut last = None;
        for &address in addresses {
            let stream = match tokio::time::timeout(limit, TcpStream::connect(address)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(source)) => {
                    last = Some(OutboundError::Connect {
                        host: host.to_owned(),
                        address,
                        source,
                    });
                    continue;
                }
                Err(_) => {
                    last = Some(OutboundError::Timeout {
                        stage: "connecting",
                        after: limit,
                    });
                    continue;
                }
            };
            let peer = stream
                .peer_addr()
                .map_err(|source| OutboundError::Connect {
                    host: host.to_owned(),
                    address,
                    source,
                })?;
            if peer != address {
                return Err(OutboundError::PeerMismatch {
                    host: host.to_owned(),
                    expected: address,
                    actual: peer,
                });
            }
            let _ = stream.set_nodelay(true);
            return Ok(stream);
        }
        Err(last.unwrap_or_else(|| OutboundError::NoAddress {
            host: host.to_owned(),
        }))
    }

    /// One request on a new connection: the response head and its body still to be read.
    async fn exchange(
        &self,
        method: &Method,
        target: &Target,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<(StatusCode, HeaderMap, hyper::body::Incoming, AbortOnDrop), OutboundError> {
        let host = target.host.to_string();
        let addresses = self.resolve(target).await?;
        let tcp = self.connect(&host, &addresses).await?;
        let request = build_request(method, target, headers, body)?;
        if target.url.scheme() == "https" {
            let name = match &target.host {
                Host::Domain(name) => ServerName::try_from(name.clone())
                    .map_err(|e| OutboundError::Request(format!("server name: {e}")))?,
                Host::Ipv4(v4) => ServerName::IpAddress(IpAddr::V4(*v4).into()),
                Host::Ipv6(v6) => ServerName::IpAddress(IpAddr::V6(*v6).into()),
            };
            let limit = self.settings.tls_timeout;
            let tls = tokio::time::timeout(limit, self.tls.connect(name, tcp))
                .await
                .map_err(|_| OutboundError::Timeout {
                    stage: "the TLS handshake",
                    after: limit,
                })?
                .map_err(|source| OutboundError::Tls { host, source })?;
            send_on(tls, request).await
        } else {
            send_on(tcp, request).await
        }
    }
}

fn build_request(
    method: &Method,
    target: &Target,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Request<Full<Bytes>>, OutboundError> {
    // `url` leaves the port out when it is the scheme's default, as Host wants it.
    let mut authority = target.url.host_str().unwrap_or_default().to_owned();
    if let Some(port) = target.url.port() {
        authority.push_str(&format!(":{port}"));
    }
    let path = &target.url[Position::BeforePath..Position::AfterQuery];
    let mut request = Request::builder()
        .method(method.clone())
        .uri(path)
        .body(Full::new(body.clone()))
        .map_err(|e| OutboundError::Request(e.to_string()))?;
    let sent = request.headers_mut();
    for (name, value) in headers {
        if name != header::HOST && name != header::CONTENT_LENGTH {
            sent.append(name, value.clone());
        }
    }
    sent.insert(
        header::HOST,
        HeaderValue::from_str(&authority).map_err(|e| OutboundError::Request(e.to_string()))?,
    );
    if !body.is_empty() || !matches!(*method, Method::GET | Method::HEAD) {
        sent.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    if !sent.contains_key(header::USER_AGENT) {
        sent.insert(header::USER_AGENT, HeaderValue::from_static("agentworks"));
    }
    Ok(request)
}

/// Aborts the connection's task when the response is done with, or the request abandoned
/// (a timeout): a stalled server must not keep a task and a socket alive.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn send_on<IO>(
    io: IO,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, HeaderMap, hyper::body::Incoming, AbortOnDrop), OutboundError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    let guard = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let response = sender.send_request(request).await?;
    let (parts, body) = response.into_parts();
    Ok((parts.status, parts.headers, body, guard))
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

async fn read_bounded(
    headers: &HeaderMap,
    mut body: hyper::body::Incoming,
    limit: usize,
) -> Result<Bytes, OutboundError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(OutboundError::TooLarge { limit });
    }
    let mut buffer = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if buffer.len() + data.len() > limit {
                return Err(OutboundError::TooLarge { limit });
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(buffer.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> IpAddr {
        IpAddr::V4(s.parse().unwrap())
    }

    /// Every IPv4 range: its first and last address refused, the neighbours either side allowed
    /// (unless a neighbour is itself refused, then `None`).
    const V4_TABLE: &[(&str, &str, Option<&str>, Option<&str>)] = &[
        ("0.0.0.0", "0.255.255.255", None, Some("1.0.0.0")),
        (
            "10.0.0.0",
            "10.255.255.255",
            Some("9.255.255.255"),
            Some("11.0.0.0"),
        ),
        (
            "100.64.0.0",
            "100.127.255.255",
            Some("100.63.255.255"),
            Some("100.128.0.0"),
        ),
        (
            "127.0.0.0",
            "127.255.255.255",
            Some("126.255.255.255"),
            Some("128.0.0.0"),
        ),
        (
            "169.254.0.0",
            "169.254.255.255",
            Some("169.253.255.255"),
            Some("169.255.0.0"),
        ),
        (
            "172.16.0.0",
            "172.31.255.255",
            Some("172.15.255.255"),
            Some("172.32.0.0"),
        ),
        (
            "192.0.0.0",
            "192.0.0.255",
            Some("191.255.255.255"),
            Some("192.0.1.0"),
        ),
        (
            "192.0.2.0",
            "192.0.2.255",
            Some("192.0.1.255"),
            Some("192.0.3.0"),
        ),
        (
            "192.168.0.0",
            "192.168.255.255",
            Some("192.167.255.255"),
            Some("192.169.0.0"),
        ),
        (
            "198.18.0.0",
            "198.19.255.255",
            Some("198.17.255.255"),
            Some("198.20.0.0"),
        ),
        (
            "198.51.100.0",
            "198.51.100.255",
            Some("198.51.99.255"),
            Some("198.51.101.0"),
        ),
        (
            "203.0.113.0",
            "203.0.113.255",
            Some("203.0.112.255"),
            Some("203.0.114.0"),
        ),
        (
            "224.0.0.0",
            "255.255.255.255",
            Some("223.255.255.255"),
            None,
        ),
    ];

    #[test]
    fn ipv4_ranges_at_their_boundaries() {
        for &(first, last, before, after) in V4_TABLE {
            for refused in [first, last] {
                assert!(check_ip(v4(refused)).is_err(), "{refused} must be refused");
            }
            for allowed in [before, after].into_iter().flatten() {
                assert_eq!(check_ip(v4(allowed)), Ok(()), "{allowed} must be allowed");
            }
        }
        for refused in [
            "100.100.100.200",
            "169.254.169.254",
            "127.0.0.1",
            "240.0.0.1",
        ] {
            assert!(check_ip(v4(refused)).is_err(), "{refused}");
        }
        for allowed in ["8.8.8.8", "1.1.1.1", "11.1.2.2", "93.184.215.14"] {
            assert_eq!(check_ip(v4(allowed)), Ok(()), "{allowed}");
        }
    }

    /// Each IPv4 address in the IPv6 forms that embed it: mapped, compatible, 6to4.
    fn embeddings(s: &str) -> [Ipv6Addr; 3] {
        let v4: Ipv4Addr = s.parse().unwrap();
        let bits = u128::from(u32::from(v4));
        [
            v4.to_ipv6_mapped(),
            Ipv6Addr::from(bits),
            Ipv6Addr::from((0x2002u128 << 112) | (bits << 80)),
        ]
    }

    #[test]
    fn ipv4_embedded_in_ipv6_is_checked_as_ipv4() {
        for &(first, last, before, after) in V4_TABLE {
            for refused in [first, last] {
                for v6 in embeddings(refused) {
                    let refusal = check_ip(IpAddr::V6(v6)).expect_err(&format!("{v6}"));
                    // :: and ::1 have their own names; every other form names the IPv4 one.
                    if !v6.is_unspecified() && !v6.is_loopback() {
                        assert_eq!(
                            refusal.embedded_ipv4,
                            Some(refused.parse().unwrap()),
                            "{v6}"
                        );
                    }
                }
            }
            for allowed in [before, after].into_iter().flatten() {
                for v6 in embeddings(allowed) {
                    assert_eq!(check_ip(IpAddr::V6(v6)), Ok(()), "{v6}");
                }
            }
        }
        let refusal = check_ip("::ffff:127.0.0.1".parse().unwrap()).unwrap_err();
        assert!(refusal.to_string().contains("127.0.0.1"), "{refusal}");
        assert!(refusal.to_string().contains("loopback"), "{refusal}");
    }

    #[test]
    fn ipv6_ranges_at_their_boundaries() {
        let refused = [
            "::",
            "::1",
            "fc00::",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fd00:ec2::254",
            "fe80::",
            "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fec0::",
            "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "ff00::",
            "ff02::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "64:ff9b::",
            "64:ff9b::ffff:ffff",
            "64:ff9b::8.8.8.8",
            "64:ff9b:1::",
            "64:ff9b:1::a00:1",
            "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
            "::ffff:0:0:0",
            "::ffff:0:7f00:1",
            "::ffff:0:808:808",
            "::ffff:0:ffff:ffff",
            "2001:db8::",
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
        ];
        for ip in refused {
            assert!(
                check_ip(ip.parse().unwrap()).is_err(),
                "{ip} must be refused"
            );
        }
        let allowed = [
            "::1:0:0",
            "::fffe:ffff:ffff",
            "::1:0:0:0",
            "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe00::",
            "fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff",
            "64:ff9b::1:0:0",
            "64:ff9b:0:ffff:ffff:ffff:ffff:ffff",
            "64:ff9b:2::",
            "::fffe:0:0:0",
            "::1:0:0:0:0",
            "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff",
            "2001:db9::",
            "2001:4860:4860::8888",
            "2002:808:808::",
            "2001::1",
            "2a00:1450::1",
        ];
        for ip in allowed {
            assert_eq!(
                check_ip(ip.parse().unwrap()),
                Ok(()),
                "{ip} must be allowed"
            );
        }
    }

    #[test]
    fn host_names_and_literals() {
        let refused = [
            "localhost",
            "LOCALHOST",
            "localhost.",
            "app.localhost",
            "a.b.localhost.",
            "metadata",
            "metadata.google.internal",
            "Metadata.Google.Internal.",
            "anything.internal",
            "internal",
            "127.0.0.1",
            "0x7f.1",
            "2130706433",
            "0177.0.0.1",
            "127.1",
            "0",
            "[::1]",
            "::1",
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]",
            "[fd00:ec2::254]",
            "169.254.169.254",
            "100.100.100.200",
            "",
            "exa mple.com",
        ];
        for host in refused {
            assert!(check_host(host).is_err(), "{host:?} must be refused");
        }
        for host in [
            "example.com",
            "localhost.example.com",
            "internal.example.com",
            "metadata.example.com",
            "8.8.8.8",
            "[2001:4860:4860::8888]",
            "11.1.2.2",
        ] {
            assert_eq!(check_host(host), Ok(()), "{host:?} must be allowed");
        }
    }

    fn client() -> GuardedClient {
        GuardedClient::new().unwrap()
    }

    #[tokio::test]
    async fn literal_forms_in_urls_are_refused_before_connecting() {
        for url in [
            "https://127.0.0.1/",
            "https://0x7f.1/",
            "https://2130706433/",
            "https://[::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://169.254.169.254/latest/meta-data/",
            "https://[fd00:ec2::254]/",
            "https://[2002:7f00:1::]/",
        ] {
            let error = client().get(url).await.unwrap_err();
            assert!(
                matches!(error, OutboundError::RefusedAddress { .. }),
                "{url}: {error}"
            );
        }
        for url in [
            "https://localhost/",
            "https://metadata.google.internal/",
            "https://x.localhost:8443/",
        ] {
            let error = client().get(url).await.unwrap_err();
            assert!(
                matches!(error, OutboundError::RefusedHost { .. }),
                "{url}: {error}"
            );
        }
    }

    #[tokio::test]
    async fn http_uri_forms_are_read_by_the_url_parser() {
        // `http::Uri` keeps `0x7f.1` as a name; the client re-reads it as the URL parser does.
        for (uri, address) in [
            ("https://0x7f.1:8443/x", "127.0.0.1"),
            ("https://2130706433/", "127.0.0.1"),
            ("https://127.1/", "127.0.0.1"),
            ("https://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
            ("https://[::ffff:a9fe:a9fe]/", "::ffff:169.254.169.254"),
        ] {
            let request = Request::get(uri).body(Bytes::new()).unwrap();
            let error = client().send(request).await.unwrap_err();
            let expected: IpAddr = address.parse().unwrap();
            assert!(
                matches!(error, OutboundError::RefusedAddress { address, .. } if address == expected),
                "{uri}: {error}"
            );
        }
    }

    #[tokio::test]
    async fn plain_http_and_other_schemes_are_refused_by_default() {
        for url in [
            "http://example.com/",
            "ftp://example.com/",
            "file:///etc/passwd",
        ] {
            let error = client().get(url).await.unwrap_err();
            assert!(
                matches!(error, OutboundError::NotHttps { .. }),
                "{url}: {error}"
            );
        }
        let error = client().get("not a url").await.unwrap_err();
        assert!(matches!(error, OutboundError::InvalidUrl { .. }), "{error}");
        let error = client()
            .get("https://user:pw@example.com/")
            .await
            .unwrap_err();
        assert!(matches!(error, OutboundError::InvalidUrl { .. }), "{error}");
        // Opting in to http changes the scheme rule, never the address rules.
        let http = GuardedClient::builder().allow_plain_http().build().unwrap();
        let error = http.get("http://127.0.0.1:1/").await.unwrap_err();
        assert!(
            matches!(error, OutboundError::RefusedAddress { .. }),
            "{error}"
        );
    }
}
