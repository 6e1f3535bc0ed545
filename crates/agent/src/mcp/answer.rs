//! How an MCP request that produced no result is answered: the HTTP-level [`Rejection`]s (origin,
//! token, scope, method, media type, session), how each is spelled for the request it answers
//! ([`Spelling`]: the error envelope, or a JSON-RPC error for a JSON-RPC request; see the module
//! docs of [`super`], "Refusals"), and what answering one method call produced ([`Answer`]: a
//! result, a JSON-RPC error, or a rejection).
//!
//! Pure: it builds responses and never decides whether a request is refused; [`super::service`]
//! does, and the streamed body ([`super::stream`]) carries an [`Answer`] to its last event.

use hyper::header::{ALLOW, CONTENT_TYPE, HeaderMap, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value};

use super::access;
use super::session::SessionError;
use super::wire::{self, Framing, RpcError, code};
use super::{AuthError, Body};
use agentworks_daemon::ipc::envelope::error_response;

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
    pub(super) fn for_request(request: &Request<bytes::Bytes>) -> Spelling {
        match Spelling::for_head(request.method(), request.headers()) {
            Spelling::JsonRpc(_) => Spelling::JsonRpc(wire::request_id(request.body())),
            Spelling::Envelope => Spelling::Envelope,
        }
    }

    /// The answer: `status`, with our stable `code`, `message` and `details` in the envelope, or
    /// as a JSON-RPC error whose `data` is `{code, message, ...details}` (`code` and `message`
    /// written last, so a detail cannot forge them).
    pub(super) fn answer(
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
    pub(super) fn into_response(
        self,
        challenge: &access::Challenge,
        spelling: &Spelling,
    ) -> Response<Body> {
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
                Some(access::unauthorized_challenge(error, challenge)),
                None,
            ),
            Rejection::InsufficientScope { scope } => {
                details.insert("scope".to_owned(), Value::String(scope.clone()));
                (
                    StatusCode::FORBIDDEN,
                    code::FORBIDDEN,
                    "insufficient_scope",
                    Some(access::insufficient_scope_challenge(
                        &scope,
                        &challenge.metadata_url,
                    )),
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

/// What answering one request produced.
pub(super) type Answer = Result<Value, Failure>;

/// Why a method call did not produce a result.
pub(super) enum Failure {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_rpc_requests_get_json_rpc_refusals_with_the_same_status_and_headers() {
        let url = &access::Challenge {
            metadata_url: "http://h/.well-known/oauth-protected-resource/mcp".into(),
            scope: String::new(),
        };
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
        let url = &access::Challenge {
            metadata_url: "http://h/.well-known/oauth-protected-resource/mcp".into(),
            scope: String::new(),
        };
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
