//! The client side of a daemon socket: what agentd, agentworksctl, tests and benchmarks use to
//! call another daemon.
//!
//! Owns HTTP/1.1 exchanges over Unix-socket connections (kept alive and reused between calls
//! from a small idle pool), JSON in and out, and turning the error envelope back into
//! [`ClientError::Remote`]. A streamed answer (newline-delimited JSON, such as runnerd's turn)
//! is read line by line on a connection of its own ([`UnixClient::post_lines`], [`LineStream`]).
//!
//! Must never retry a request the server may have seen (a write is not idempotent unless the
//! caller says so): the only retry is on a fresh connection when a pooled one turned out to be
//! closed before the request was sent. Never hides the remote error code: callers match on it.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use agentworks_contract::envelope::{ErrorBody, ErrorEnvelope};

/// A client for one daemon socket. Cheap to clone; clones share the idle connections.
#[derive(Debug, Clone)]
pub struct UnixClient {
    socket: PathBuf,
    idle: std::sync::Arc<std::sync::Mutex<Vec<Sender>>>,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Idle connections kept per client: about as many as a busy agentd has calls in flight to
/// workspaced, so a burst does not close and reopen a connection per call (each is one small
/// task on either side; workspaced accepts 256).
const MAX_IDLE: usize = 64;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be connected (daemon not running, wrong path, no permission).
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The daemon answered with an error envelope.
    #[error("{status} {}: {}", body.code, body.message)]
    Remote { status: u16, body: ErrorBody },
    /// The HTTP exchange itself failed (connection reset, malformed response).
    #[error("HTTP exchange with {socket} for {endpoint} failed: {source}")]
    Http {
        socket: PathBuf,
        endpoint: String,
        source: hyper::Error,
    },
    /// The request could not be built (e.g. `endpoint` is not a valid path).
    #[error("invalid request to {endpoint}: {source}")]
    Request {
        endpoint: String,
        source: hyper::http::Error,
    },
    /// The request body could not be serialized to JSON.
    #[error("cannot encode the request body for {endpoint} as JSON: {source}")]
    Encode {
        endpoint: String,
        source: serde_json::Error,
    },
    /// A 2xx response whose body is not the JSON the caller expected.
    #[error("{status} response from {endpoint} is not the expected JSON: {source}")]
    Decode {
        endpoint: String,
        status: u16,
        source: serde_json::Error,
    },
    /// The call went another way than a socket (over NATS to another host) and got no
    /// answer; whether it ran there is not known.
    #[error("{endpoint}: {reason}")]
    Elsewhere { endpoint: String, reason: String },
    /// A non-2xx response without an error envelope (e.g. from something that is not an
    /// agentworks daemon).
    #[error("{status} response from {endpoint} without an error envelope: {body}")]
    Unexpected {
        endpoint: String,
        status: u16,
        body: String,
    },
}

impl ClientError {
    /// The remote error code, if the daemon answered with an envelope.
    pub fn remote_code(&self) -> Option<&str> {
        match self {
            ClientError::Remote { body, .. } => Some(&body.code),
            _ => None,
        }
    }
}

/// How much of an unexpected body is kept in [`ClientError::Unexpected`].
const UNEXPECTED_BODY_SNIPPET: usize = 512;

/// A request body as JSON.
fn encode<Req: serde::Serialize>(path: &str, body: &Req) -> Result<Bytes, ClientError> {
    serde_json::to_vec(body)
        .map(Bytes::from)
        .map_err(|source| ClientError::Encode {
            endpoint: path.to_owned(),
            source,
        })
}

impl UnixClient {
    /// A client for the daemon listening on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> UnixClient {
        UnixClient {
            socket: socket.into(),
            idle: Default::default(),
        }
    }

    /// The socket path this client calls.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// POSTs `body` as JSON to `path` (e.g. `/v1/read`).
    ///
    /// 2xx → the body deserialized as `Resp`; non-2xx with an envelope → [`ClientError::Remote`];
    /// connection errors → [`ClientError::Connect`].
    pub async fn post<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, ClientError> {
        self.call(Method::POST, path, Some(encode(path, body)?))
            .await
    }

    /// GETs `path`; same result rules as [`UnixClient::post`].
    pub async fn get<Resp: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<Resp, ClientError> {
        self.call(Method::GET, path, None).await
    }

    /// PUTs `body` as JSON to `path`; same result rules as [`UnixClient::post`].
    pub async fn put<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, ClientError> {
        self.call(Method::PUT, path, Some(encode(path, body)?))
            .await
    }

    /// DELETEs `path`; same result rules as [`UnixClient::post`].
    pub async fn delete<Resp: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<Resp, ClientError> {
        self.call(Method::DELETE, path, None).await
    }

    /// POSTs `body` as JSON to `path` and answers the response's body as a stream of lines
    /// (each at most `max_line` bytes), on a fresh connection that is never pooled: the stream
    /// owns it until dropped. A non-2xx answer is read whole and is the error, with the same
    /// rules as [`UnixClient::post`].
    pub async fn post_lines<Req: serde::Serialize>(
        &self,
        path: &str,
        body: &Req,
        max_line: usize,
    ) -> Result<LineStream, ClientError> {
        let http_error = |source| ClientError::Http {
            socket: self.socket.clone(),
            endpoint: path.to_owned(),
            source,
        };
        let request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(HOST, HeaderValue::from_static("localhost"))
            .header(ACCEPT, HeaderValue::from_static("application/x-ndjson"))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(Full::new(encode(path, body)?))
            .map_err(|source| ClientError::Request {
                endpoint: path.to_owned(),
                source,
            })?;
        let mut sender = self.connect(path).await?;
        let response = sender.send_request(request).await.map_err(http_error)?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(http_error)?
                .to_bytes();
            return Err(decode_response::<serde_json::Value>(path, status, &bytes)
                .err()
                .unwrap_or_else(|| ClientError::Unexpected {
                    endpoint: path.to_owned(),
                    status: status.as_u16(),
                    body: String::new(),
                }));
        }
        Ok(LineStream {
            body: response.into_body(),
            buffer: Vec::new(),
            max_line,
            socket: self.socket.clone(),
            endpoint: path.to_owned(),
            ended: false,
            _sender: sender,
        })
    }

    fn take_idle(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn put_idle(&self, sender: Sender) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if !sender.is_closed() && idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }

    /// A fresh connection; its driver task ends when the server or the last sender closes it.
    async fn connect(&self, path: &str) -> Result<Sender, ClientError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ClientError::Connect {
                path: self.socket.clone(),
                source,
            })?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| ClientError::Http {
                socket: self.socket.clone(),
                endpoint: path.to_owned(),
                source,
            })?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "client connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// One request, on an idle connection if there is one.
    async fn call<Resp: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Resp, ClientError> {
        let http_error = |source| ClientError::Http {
            socket: self.socket.clone(),
            endpoint: path.to_owned(),
            source,
        };
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            // HTTP/1.1 requires a Host; the name is meaningless on a Unix socket.
            .header(HOST, HeaderValue::from_static("localhost"))
            .header(ACCEPT, HeaderValue::from_static("application/json"));
        if body.is_some() {
            builder = builder.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let request = builder
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|source| ClientError::Request {
                endpoint: path.to_owned(),
                source,
            })?;

        let pooled = self.take_idle();
        let reused = pooled.is_some();
        let mut sender = match pooled {
            Some(sender) => sender,
            None => self.connect(path).await?,
        };
        let (request, retry) = match sender.try_send_request(request).await {
            Ok(response) => (Ok(response), None),
            // A pooled connection closed before the request went out: safe to send it again,
            // once, on a fresh connection. Anything else may have reached the server.
            Err(mut failed) if reused => match failed.take_message() {
                Some(request) if failed.error().is_canceled() || failed.error().is_closed() => {
                    (Err(http_error(failed.into_error())), Some(request))
                }
                _ => (Err(http_error(failed.into_error())), None),
            },
            Err(failed) => (Err(http_error(failed.into_error())), None),
        };
        let response = match (request, retry) {
            (Ok(response), _) => response,
            (Err(_), Some(request)) => {
                sender = self.connect(path).await?;
                sender.send_request(request).await.map_err(http_error)?
            }
            (Err(error), None) => return Err(error),
        };
        let status = response.status();
        let result = response
            .into_body()
            .collect()
            .await
            .map_err(http_error)
            .map(|collected| (status, collected.to_bytes()));
        if result.is_ok() {
            self.put_idle(sender);
        }
        let (status, bytes) = result?;
        decode_response(path, status, &bytes)
    }
}

/// A response body read line by line ([`UnixClient::post_lines`]). Dropping it closes the
/// connection.
pub struct LineStream {
    body: hyper::body::Incoming,
    /// Bytes received after the last line answered.
    buffer: Vec<u8>,
    max_line: usize,
    socket: PathBuf,
    endpoint: String,
    ended: bool,
    /// Keeps the connection open while the body is read.
    _sender: Sender,
}

impl LineStream {
    /// The next line, without its `\n` (a last line without one is a line too); `None` once
    /// the body has ended. A line longer than the limit is an error, and the stream ends there.
    pub async fn next_line(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        use hyper::body::Body as _;
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
                line.pop();
                if line.len() > self.max_line {
                    return Err(self.too_long());
                }
                return Ok(Some(line));
            }
            if self.buffer.len() > self.max_line {
                return Err(self.too_long());
            }
            if self.ended {
                return Ok((!self.buffer.is_empty()).then(|| std::mem::take(&mut self.buffer)));
            }
            let frame =
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut self.body).poll_frame(cx)).await;
            match frame {
                None => self.ended = true,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(source)) => {
                    return Err(ClientError::Http {
                        socket: self.socket.clone(),
                        endpoint: self.endpoint.clone(),
                        source,
                    });
                }
            }
        }
    }

    fn too_long(&mut self) -> ClientError {
        // Nothing after an overlong line can be trusted to start a line.
        self.buffer.clear();
        self.ended = true;
        // Not a variant of its own: callers match the others exhaustively.
        ClientError::Unexpected {
            endpoint: self.endpoint.clone(),
            status: 200,
            body: format!(
                "a line of the streamed answer is longer than {} bytes",
                self.max_line
            ),
        }
    }
}

/// Turns a complete response into the caller's value or a [`ClientError`]: the rules of every
/// call here, for a response that came another way (over NATS).
pub fn decode_response<Resp: serde::de::DeserializeOwned>(
    endpoint: &str,
    status: StatusCode,
    bytes: &[u8],
) -> Result<Resp, ClientError> {
    if status.is_success() {
        return serde_json::from_slice(bytes).map_err(|source| ClientError::Decode {
            endpoint: endpoint.to_owned(),
            status: status.as_u16(),
            source,
        });
    }
    match serde_json::from_slice::<ErrorEnvelope>(bytes) {
        Ok(envelope) => Err(ClientError::Remote {
            status: status.as_u16(),
            body: envelope.error,
        }),
        Err(_) => {
            let mut text = String::from_utf8_lossy(bytes).into_owned();
            if text.len() > UNEXPECTED_BODY_SNIPPET {
                let mut cut = UNEXPECTED_BODY_SNIPPET;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
                text.push('…');
            }
            Err(ClientError::Unexpected {
                endpoint: endpoint.to_owned(),
                status: status.as_u16(),
                body: text,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Thing {
        n: u32,
    }

    #[test]
    fn decode_success_and_errors() {
        let ok: Thing = decode_response("/v1/t", StatusCode::OK, br#"{"n": 3}"#).unwrap();
        assert_eq!(ok.n, 3);

        let err = decode_response::<Thing>("/v1/t", StatusCode::OK, b"not json").unwrap_err();
        assert!(
            matches!(err, ClientError::Decode { status: 200, .. }),
            "{err}"
        );

        let err = decode_response::<Thing>(
            "/v1/t",
            StatusCode::CONFLICT,
            br#"{"error":{"code":"revision_conflict","message":"changed","current_revision":"r2"}}"#,
        )
        .unwrap_err();
        assert_eq!(err.remote_code(), Some("revision_conflict"));
        assert_eq!(err.to_string(), "409 revision_conflict: changed");

        let long = "x".repeat(2000);
        let err = decode_response::<Thing>("/v1/t", StatusCode::BAD_GATEWAY, long.as_bytes())
            .unwrap_err();
        match err {
            ClientError::Unexpected { status, body, .. } => {
                assert_eq!(status, 502);
                assert!(body.len() <= UNEXPECTED_BODY_SNIPPET + '…'.len_utf8());
            }
            other => panic!("{other:?}"),
        }
    }

    /// A body sent frame by frame as the test hands its chunks over.
    struct Chunks(tokio::sync::mpsc::Receiver<Bytes>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|chunk| chunk.map(|bytes| Ok(hyper::body::Frame::data(bytes))))
        }
    }

    /// A server on a real Unix socket answering one request with `status` and `chunks` as its
    /// body, each chunk its own frame, a moment apart.
    fn streaming_server(socket: &Path, status: StatusCode, chunks: &[&'static str]) {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let chunks: Vec<&'static str> = chunks.to_vec();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(move |_request| {
                let chunks = chunks.clone();
                async move {
                    let (sender, receiver) = tokio::sync::mpsc::channel(4);
                    tokio::spawn(async move {
                        for chunk in chunks {
                            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                            if sender
                                .send(Bytes::from_static(chunk.as_bytes()))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                    });
                    let mut response = hyper::Response::new(Chunks(receiver));
                    *response.status_mut() = status;
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }

    #[tokio::test]
    async fn a_streamed_answer_is_read_line_by_line_across_frames() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("lines.sock");
        streaming_server(
            &socket,
            StatusCode::OK,
            &["{\"n\":1}\n{\"n\"", ":2}\n", "\n{\"n\":3}"],
        );
        let client = UnixClient::new(&socket);
        let mut lines = client.post_lines("/v1/turns", &"x", 64).await.unwrap();
        let mut got = Vec::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            got.push(String::from_utf8(line).unwrap());
        }
        assert_eq!(got, ["{\"n\":1}", "{\"n\":2}", "", "{\"n\":3}"]);
    }

    #[tokio::test]
    async fn a_streamed_line_over_the_limit_is_an_error_and_ends_the_stream() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("long.sock");
        streaming_server(
            &socket,
            StatusCode::OK,
            &["short\n", "0123456789", "0123456789\n"],
        );
        let client = UnixClient::new(&socket);
        let mut lines = client.post_lines("/v1/turns", &"x", 12).await.unwrap();
        assert_eq!(lines.next_line().await.unwrap().unwrap(), b"short");
        let err = lines.next_line().await.unwrap_err();
        assert!(err.to_string().contains("longer than 12 bytes"), "{err}");
        assert!(lines.next_line().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_refused_stream_is_the_remote_error() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("refused.sock");
        streaming_server(
            &socket,
            StatusCode::BAD_REQUEST,
            &[r#"{"error":{"code":"unknown_provider","message":"no provider x"}}"#],
        );
        let err = UnixClient::new(&socket)
            .post_lines("/v1/turns", &"x", 1024)
            .await
            .err()
            .unwrap();
        assert_eq!(err.remote_code(), Some("unknown_provider"), "{err}");
    }

    #[tokio::test]
    async fn connect_error_names_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("absent.sock");
        let err = UnixClient::new(&socket)
            .get::<Thing>("/v1/health")
            .await
            .unwrap_err();
        match &err {
            ClientError::Connect { path, .. } => assert_eq!(path, &socket),
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("absent.sock"));
    }

    #[tokio::test]
    async fn invalid_endpoint_is_a_request_error() {
        let err = UnixClient::new("/nonexistent.sock")
            .get::<Thing>("not a path")
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Request { .. }), "{err:?}");
    }
}
