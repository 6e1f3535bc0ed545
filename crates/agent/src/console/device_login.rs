//! The API of the device-login approval page (`GET /v1/device/approve`, see [`crate::device`]):
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/console/device-login?user_code=…` | 200 `{user_code, device_name, scopes: ["devices:connect"], expires_in}`, or 404 `not_found` |
//! | `POST /v1/console/device-login {user_code, approve}` (+ `Origin`, `X-CSRF-Token`) | 200 `{approved, device_name, user}`; 409 `already_decided`; 404 `not_found` |
//!
//! Session only: a request with an `Authorization` header is refused (401), so a bearer token
//! without `devices:approve` cannot approve a login here. Answers are `{error,
//! error_description}` like the other device endpoints. A user code is short, so guesses are
//! limited: a lookup or decision that finds no pending login counts as a failure per user
//! and per client address in the sign-in limiter ([`super::accounts`]), and past
//! [`MAX_FAILURES_PER_USER`] (or the address limit) in the window the answer is 429
//! `too_many_attempts` with `Retry-After`. Successful ones (and already-decided codes, which
//! are not guesses) do not count.

use crate::console::accounts::MAX_FAILURES_PER_ADDRESS;
use crate::console::session::Sessions;
use crate::identity::Scope;
use crate::identity::attempt_limits::{FAILURE_WINDOW_MS, Limited, address_key};
use crate::identity::device_logins::DecideError;
use crate::identity::store::now_ms;
use crate::oauth::answer::{oauth_error, server_error, store_unavailable};
use agentworks_daemon::ipc::envelope::{Body, json_response};
use hyper::header::{ALLOW, CACHE_CONTROL, HeaderValue, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde_json::json;

/// The endpoint's path.
pub const PATH: &str = "/v1/console/device-login";
/// Failed lookups or decisions per user within the window before further ones are refused.
pub const MAX_FAILURES_PER_USER: usize = 10;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    user_code: String,
    approve: bool,
}

#[derive(serde::Deserialize)]
struct Lookup {
    #[serde(default)]
    user_code: String,
}

/// Serves the endpoint, or `None` if the path is not it.
pub async fn handle(sessions: &Sessions, parts: &Parts, body: &[u8]) -> Option<Response<Body>> {
    if parts.uri.path() != PATH {
        return None;
    }
    let mut response = answer(sessions, parts, body).await;
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(response)
}

async fn answer(sessions: &Sessions, parts: &Parts, body: &[u8]) -> Response<Body> {
    if !matches!(parts.method, Method::GET | Method::POST) {
        let mut refused = oauth_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use GET or POST",
        );
        refused
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, POST"));
        return refused;
    }
    let signed_in = match crate::console::session::session_only(
        sessions,
        parts,
        "approving a device login here",
    )
    .await
    {
        Ok(signed_in) => signed_in,
        Err(refused) => return refused,
    };
    let Some(inner) = sessions.inner() else {
        return oauth_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "console sessions are not available",
        );
    };
    let user = signed_in.user.name;
    let (user_code, approve) = if parts.method == Method::GET {
        match serde_urlencoded::from_str::<Lookup>(parts.uri.query().unwrap_or("")) {
            Ok(lookup) => (lookup.user_code, None),
            Err(_) => return invalid_request("the query does not parse; send ?user_code=…"),
        }
    } else {
        match serde_json::from_slice::<Decision>(body) {
            Ok(decision) => (decision.user_code, Some(decision.approve)),
            Err(_) => {
                return invalid_request("send {\"user_code\": \"…\", \"approve\": true|false}");
            }
        }
    };
    let user_key = format!("device-login-user:{user}");
    let address_key = format!("device-login-{}", address_key(parts));
    let limits = [
        (user_key.as_str(), MAX_FAILURES_PER_USER),
        (address_key.as_str(), MAX_FAILURES_PER_ADDRESS),
    ];
    let now = now_ms();
    let attempt = match inner.failures.begin(&limits, now).await {
        Ok(attempt) => attempt,
        Err(Limited::Wait(seconds)) => return too_many_attempts(seconds),
        Err(Limited::Unavailable(error)) => {
            tracing::warn!(%error, "cannot count a device-login lookup; refused");
            return oauth_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "the identity store is unavailable; try again shortly",
            );
        }
    };
    // The store's answer: the pending login looked up, or the decision taken.
    enum Found {
        Pending(Option<crate::identity::device_logins::PendingDeviceLogin>),
        Decided(Result<String, DecideError>),
    }
    let identity = inner.identity.clone();
    let decider = user.clone();
    let found = tokio::task::spawn_blocking(move || {
        Ok::<_, crate::identity::IdentityError>(match approve {
            None => Found::Pending(identity.pending_device_login(&user_code, now)?),
            Some(approve) => {
                Found::Decided(identity.decide_device_login(&user_code, &decider, approve, now)?)
            }
        })
    })
    .await;
    let found = match found {
        Ok(Ok(found)) => found,
        Ok(Err(error)) => return store_unavailable(error),
        Err(error) => return server_error(error),
    };
    let (response, guess_failed) = match found {
        Found::Pending(Some(pending)) => (
            json_response(
                StatusCode::OK,
                &json!({
                    "user_code": pending.user_code,
                    "device_name": pending.label,
                    "scopes": [Scope::DevicesConnect.as_str()],
                    "expires_in": pending.expires_in_ms / 1000,
                }),
            ),
            false,
        ),
        Found::Pending(None) => (not_found(), true),
        Found::Decided(Ok(device_name)) => {
            tracing::info!(%user, approve = ?approve, device = %device_name, "a device login was decided in the console");
            (
                json_response(
                    StatusCode::OK,
                    &json!({"approved": approve, "device_name": device_name, "user": user}),
                ),
                false,
            )
        }
        Found::Decided(Err(DecideError::AlreadyDecided)) => (
            oauth_error(
                StatusCode::CONFLICT,
                "already_decided",
                &DecideError::AlreadyDecided.to_string(),
            ),
            false,
        ),
        Found::Decided(Err(DecideError::NotFound)) => (not_found(), true),
    };
    if !guess_failed {
        inner.failures.succeeded(&attempt).await;
    }
    response
}

fn not_found() -> Response<Body> {
    oauth_error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no pending login has that code: it is unknown, expired or already decided",
    )
}

fn invalid_request(description: &str) -> Response<Body> {
    oauth_error(StatusCode::BAD_REQUEST, "invalid_request", description)
}

/// 429 with `Retry-After` (seconds).
fn too_many_attempts(seconds: i64) -> Response<Body> {
    let mut response = oauth_error(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_attempts",
        &format!(
            "too many wrong codes (at most {MAX_FAILURES_PER_USER} in {} min); try again in {seconds} s",
            FAILURE_WINDOW_MS / 60_000
        ),
    );
    if let Ok(value) = HeaderValue::from_str(&seconds.max(1).to_string()) {
        response.headers_mut().insert(RETRY_AFTER, value);
    }
    response
}
