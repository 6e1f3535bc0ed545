//! The one JSON error envelope every agentworks socket and endpoint speaks:
//! `{"error": {"code": "revision_conflict", "message": "...", ...details}}`.
//!
//! Owns building JSON responses and the [`Refusal`] handlers answer with (the envelope types are in `agentworks_contract::envelope`). Must never decide which code an error
//! gets: each domain maps its own error enum to a [`Refusal`] (or calls [`error_response`]), once.

use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};

pub use agentworks_contract::envelope::{ErrorBody, ErrorEnvelope};

/// Every response body: a complete buffer ([`full`]) or a stream of chunks ([`streaming`],
/// for server-sent events).
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// A complete body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes.into()).boxed_unsync()
}

/// A body that sends each chunk as soon as it is received and ends when every sender is
/// dropped (server-sent events).
pub fn streaming(receiver: tokio::sync::mpsc::UnboundedReceiver<Bytes>) -> Body {
    use http_body_util::BodyExt;
    let chunks = futures_util::stream::unfold(receiver, |mut receiver| async move {
        let chunk = receiver.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk)),
            receiver,
        ))
    });
    http_body_util::StreamBody::new(chunks).boxed_unsync()
}

/// Sent if a value cannot be serialized (a bug: a map with non-string keys, say), so the caller
/// still gets an envelope.
const SERIALIZE_FAILED: &str =
    r#"{"error":{"code":"internal","message":"the response could not be serialized to JSON"}}"#;

/// A response of `status` whose body is `bytes`, already JSON (a body relayed as it came).
pub fn with_json(status: StatusCode, bytes: Bytes) -> Response<Body> {
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A response with `value` as its JSON body and `Content-Type: application/json`.
///
/// If `value` cannot be serialized, the response is a 500 envelope with code `internal`.
pub fn json_response<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => with_json(status, Bytes::from(bytes)),
        Err(error) => {
            tracing::error!(%error, "cannot serialize response");
            with_json(
                StatusCode::INTERNAL_SERVER_ERROR,
                Bytes::from_static(SERIALIZE_FAILED.as_bytes()),
            )
        }
    }
}

/// An error envelope response.
pub fn error_response(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
    details: serde_json::Map<String, serde_json::Value>,
) -> Response<Body> {
    let envelope = ErrorEnvelope {
        error: ErrorBody {
            code: code.to_owned(),
            message: message.into(),
            details,
        },
    };
    json_response(status, &envelope)
}

/// A refusal: the status, code, message and details of the error envelope a handler answers
/// instead of its value. Handlers return `Result<_, Refusal>` and the router turns the refusal
/// into its response once ([`Refusal::into_response`]); each domain maps its error enum to a
/// refusal in one place (a `From` impl or one function).
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Refusal {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    /// Extra fields of the envelope's `error` object (`current_revision`, `reason`, ...).
    pub details: serde_json::Map<String, serde_json::Value>,
}

impl Refusal {
    /// A refusal without details.
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code: code.into(),
            message: message.into(),
            details: serde_json::Map::new(),
        }
    }

    /// The 500 `internal` refusal for a failure that is gatewayd's or agentd's own (a failed
    /// blocking task, a value that does not serialize).
    pub fn internal(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// A refusal from another daemon's socket, passed on as it came: its status (502 if that
    /// is not a status) and its envelope.
    pub fn relayed(status: u16, body: ErrorBody) -> Refusal {
        Refusal {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            code: body.code,
            message: body.message,
            details: body.details,
        }
    }

    /// This refusal with one more detail field.
    pub fn with_detail(mut self, key: &str, value: impl Into<serde_json::Value>) -> Refusal {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    /// The error envelope response.
    pub fn into_response(self) -> Response<Body> {
        error_response(self.status, &self.code, self.message, self.details)
    }
}

impl From<Refusal> for Response<Body> {
    fn from(refusal: Refusal) -> Response<Body> {
        refusal.into_response()
    }
}

/// A JSON request body as `T`, or the 400 `invalid_request` refusal that says why not: the
/// one decode every socket handler uses.
pub fn decode_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(body).map_err(|e| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("the request body is not valid: {e}"),
        )
    })
}

/// Runs a blocking store call off the async threads: its value, its error as the refusal
/// `refusal` makes of it, or a 500 `internal` refusal if the task itself failed.
pub async fn run_blocking<T, E, F>(f: F, refusal: impl FnOnce(E) -> Refusal) -> Result<T, Refusal>
where
    T: Send + 'static,
    E: Send + 'static,
    F: FnOnce() -> Result<T, E> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(refusal(error)),
        Err(error) => Err(Refusal::internal(error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn error_response_has_the_envelope_shape() {
        let mut details = serde_json::Map::new();
        details.insert("current_revision".into(), serde_json::json!("r2"));
        let response = error_response(
            StatusCode::CONFLICT,
            "revision_conflict",
            "the file changed",
            details,
        );
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response.headers().get(CONTENT_TYPE).unwrap(),
            "application/json"
        );
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"error": {"code": "revision_conflict",
                "message": "the file changed", "current_revision": "r2"}})
        );
        let parsed: ErrorEnvelope = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(parsed.error.code, "revision_conflict");
        assert_eq!(parsed.error.details["current_revision"], "r2");
    }

    #[tokio::test]
    async fn a_refusal_is_the_same_envelope() {
        let refusal = Refusal::new(
            StatusCode::CONFLICT,
            "revision_conflict",
            "the file changed",
        )
        .with_detail("current_revision", "r2");
        assert_eq!(refusal.to_string(), "revision_conflict: the file changed");
        let response: Response<Body> = refusal.into();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"error": {"code": "revision_conflict",
                "message": "the file changed", "current_revision": "r2"}})
        );
        let relayed = Refusal::relayed(
            42,
            ErrorBody {
                code: "x".into(),
                message: "y".into(),
                details: serde_json::Map::new(),
            },
        );
        assert_eq!(relayed.status, StatusCode::BAD_GATEWAY);
        let relayed = Refusal::relayed(
            404,
            ErrorBody {
                code: "not_found".into(),
                message: "no".into(),
                details: serde_json::Map::new(),
            },
        );
        assert_eq!(
            (relayed.status, relayed.code.as_str()),
            (StatusCode::NOT_FOUND, "not_found")
        );
    }

    async fn code_of(refusal: Refusal) -> (StatusCode, String) {
        let response = refusal.into_response();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let parsed: ErrorEnvelope = serde_json::from_slice(&bytes).unwrap();
        (status, parsed.error.code)
    }

    #[tokio::test]
    async fn a_body_that_does_not_decode_is_a_400_and_a_failed_task_a_500() {
        #[derive(serde::Deserialize, Debug)]
        struct Named {
            name: String,
        }
        let refused = decode_json::<Named>(br#"{"nom": 1}"#).unwrap_err();
        assert_eq!(
            code_of(refused).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into())
        );
        assert_eq!(decode_json::<Named>(br#"{"name": "a"}"#).unwrap().name, "a");

        let refusal = |e: &'static str| Refusal::new(StatusCode::CONFLICT, e, "no");
        assert_eq!(run_blocking(|| Ok::<_, &str>(7), refusal).await.unwrap(), 7);
        let refused = run_blocking(|| Err::<u8, _>("taken"), refusal)
            .await
            .unwrap_err();
        assert_eq!(
            code_of(refused).await,
            (StatusCode::CONFLICT, "taken".into())
        );
        let panicked = run_blocking(|| -> Result<u8, &str> { panic!("store bug") }, refusal)
            .await
            .unwrap_err();
        assert_eq!(
            code_of(panicked).await,
            (StatusCode::INTERNAL_SERVER_ERROR, "internal".into())
        );
    }

    #[tokio::test]
    async fn unserializable_value_becomes_internal_error() {
        let mut bad = std::collections::HashMap::new();
        bad.insert((1, 2), 3);
        let response = json_response(StatusCode::OK, &bad);
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let parsed: ErrorEnvelope = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(parsed.error.code, "internal");
    }
}
