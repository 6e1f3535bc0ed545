//! The bridge's two requests to runnerd's loopback bridge endpoint, each HTTP/1.1 on a fresh
//! connection with `Authorization: Bearer <the turn's bridge capability>`: its tool list
//! (`GET <url>/tools`, once when it starts) and a tool call (`POST <url>/call`).
//!
//! Owns: reading the URL and the capability from the environment ([`Forwarder::from_env`]),
//! refusing any URL that is not plain `http://` to a loopback address (the capability must not
//! leave the machine), and turning every failure into a sentence for a tool error.
//!
//! Must never: send the capability anywhere but loopback, or follow a redirect.

use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

use super::{BridgeCall, BridgeReply, MAX_REPLY_BYTES, TOKEN_ENV, ToolList, URL_ENV};

/// How long the bridge waits for its tool list before it offers the built-ins alone.
const TOOL_LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the bridge cannot start or forward.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(
        "{name} is not set: the bridge runs only as a coding CLI's tool server, started by agentworks-runnerd"
    )]
    MissingEnv { name: &'static str },
    #[error("{URL_ENV} {url:?} is not http:// to a loopback address and port")]
    Url { url: String },
}

/// Where the bridge forwards calls, and with which capability.
#[derive(Clone)]
pub struct Forwarder {
    address: SocketAddr,
    /// The path prefix, e.g. `/v1/bridge` (no trailing slash).
    path: String,
    token: String,
}

/// Never prints the capability.
impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("address", &self.address)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// From [`URL_ENV`] and [`TOKEN_ENV`].
    pub fn from_env() -> Result<Forwarder, ForwardError> {
        let read = |name: &'static str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or(ForwardError::MissingEnv { name })
        };
        Forwarder::new(&read(URL_ENV)?, read(TOKEN_ENV)?)
    }

    /// `url` must be `http://<loopback IP>:<port>[/path]`.
    pub fn new(url: &str, token: String) -> Result<Forwarder, ForwardError> {
        let refused = || ForwardError::Url {
            url: url.to_owned(),
        };
        let rest = url.strip_prefix("http://").ok_or_else(refused)?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let address: SocketAddr = authority.parse().map_err(|_| refused())?;
        let loopback = match address.ip() {
            IpAddr::V4(ip) => ip.is_loopback(),
            IpAddr::V6(ip) => ip.is_loopback(),
        };
        if !loopback || address.port() == 0 || path.contains(['?', '#', ' ']) {
            return Err(refused());
        }
        Ok(Forwarder {
            address,
            path: path.to_owned(),
            token,
        })
    }

    /// Posts `call` and returns runnerd's reply; any failure is a tool error with a sentence.
    pub async fn call(&self, call: &BridgeCall) -> BridgeReply {
        let exchanged = match serde_json::to_vec(call) {
            Ok(body) => self.exchange(Method::POST, "call", body).await,
            Err(e) => Err(format!("cannot encode the call: {e}")),
        };
        match exchanged.and_then(|bytes| {
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("runnerd's answer is not a bridge reply: {e}"))
        }) {
            Ok(reply) => reply,
            Err(why) => BridgeReply::error(format!("the agentworks bridge failed: {why}")),
        }
    }

    /// The tools runnerd says the turn's bridge offers (the built-ins and the turn's extra
    /// tools, as MCP describes them), or why there is no list ([`TOOL_LIST_TIMEOUT`] at most).
    pub async fn tools(&self) -> Result<ToolList, String> {
        let bytes = tokio::time::timeout(
            TOOL_LIST_TIMEOUT,
            self.exchange(Method::GET, "tools", Vec::new()),
        )
        .await
        .map_err(|_| format!("runnerd did not answer within {TOOL_LIST_TIMEOUT:?}"))??;
        serde_json::from_slice::<ToolList>(&bytes)
            .map_err(|e| format!("runnerd's answer is not a tool list: {e}"))
    }

    /// One request to `<path>/<leaf>`; the body of a success, or a sentence.
    async fn exchange(&self, method: Method, leaf: &str, body: Vec<u8>) -> Result<Bytes, String> {
        let stream = tokio::net::TcpStream::connect(self.address)
            .await
            .map_err(|e| format!("cannot reach runnerd at {}: {e}", self.address))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("cannot talk to runnerd: {e}"))?;
        let connection = tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}/{leaf}", self.path))
            .header(HOST, self.address.to_string())
            .header(AUTHORIZATION, format!("Bearer {}", self.token));
        if !body.is_empty() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("runnerd did not answer: {e}"))?;
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_REPLY_BYTES)
            .collect()
            .await
            .map_err(|e| format!("runnerd's answer was cut or too long: {e}"))?
            .to_bytes();
        connection.abort();
        if status.is_success() {
            return Ok(bytes);
        }
        // The error envelope's sentence, when there is one.
        let message = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(300).collect());
        Err(format!(
            "runnerd refused the request (HTTP {status}): {message}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_to_loopback_is_accepted() {
        let ok = Forwarder::new("http://127.0.0.1:4000/v1/bridge/", "t".into()).expect("ok");
        assert_eq!(ok.path, "/v1/bridge");
        assert!(Forwarder::new("http://[::1]:4000", "t".into()).is_ok());
        for bad in [
            "https://127.0.0.1:4000/v1/bridge",
            "http://10.0.0.1:4000/v1/bridge",
            "http://example.com:80/v1/bridge",
            "http://localhost:4000/v1/bridge",
            "http://127.0.0.1:0/v1/bridge",
            "http://127.0.0.1/v1/bridge",
            "http://127.0.0.1:4000/v1/bridge?x=1",
        ] {
            assert!(
                matches!(
                    Forwarder::new(bad, "t".into()),
                    Err(ForwardError::Url { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn debug_never_shows_the_capability() {
        let f =
            Forwarder::new("http://127.0.0.1:4000/v1/bridge", "awbr_secret".into()).expect("valid");
        assert!(!format!("{f:?}").contains("awbr_secret"));
    }
}
