//! The OAuth error answer (RFC 6749 §5.2): `{"error": code, "error_description": text}`, which
//! OAuth clients expect instead of agentworks' error envelope. Every OAuth endpoint (the
//! authorization server, the device authorization grant) and the console's OAuth pages (device
//! login approval, consent) refuse with it. Pure: it only builds the response.

use agentworks_daemon::ipc::envelope::{Body, json_response};
use hyper::{Response, StatusCode};

/// The store could not answer: 503 `temporarily_unavailable`.
pub fn store_unavailable(error: impl std::fmt::Display) -> Response<Body> {
    oauth_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        &error.to_string(),
    )
}

/// The blocking task that reads the store failed: 500 `server_error`.
pub fn server_error(error: impl std::fmt::Display) -> Response<Body> {
    oauth_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        &error.to_string(),
    )
}

/// The OAuth error answer, `{error, error_description}` with `status`.
pub fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response<Body> {
    json_response(
        status,
        &serde_json::json!({"error": error, "error_description": description}),
    )
}
