//! The OAuth 2.0 device authorization grant (RFC 8628) that `agentworks login` uses to get a
//! `devices:connect` token.
//!
//! The CLI asks for a device code (`POST /v1/device/code`), shows the person the user code and
//! the verification URL, and polls `POST /v1/device/token`. Approving the code is an
//! account-level act: an operator approves it for the person through the operator socket
//! (`agentworksctl login approve CODE --user NAME`), or (until the web console's signed-in
//! session exists) the person approves it with a bearer token that carries the exclusive
//! `devices:approve` scope (`POST /v1/device/approve`); any other token gets 403
//! `insufficient_scope`, so a leaked `workflows:*` or `devices:connect` token cannot mint itself
//! a laptop credential. Only then is a token minted, with the exclusive `devices:connect` scope
//! and nothing else.
//!
//! The laptop then asks whose account its new token serves (`GET /v1/device/account`, the
//! token as bearer) and shows it to the person before keeping the token: a code anyone else
//! approved with their own account would otherwise make the laptop serve that account's
//! agent unnoticed. The device name a login starts with is shown beside its code on the
//! approval page, so it is refused unless it is a name a person can read
//! ([`agentworks_contract::executor::check_device_name`]: no control or bidirectional
//! formatting character).
//!
//! Logins in progress are rows of the identity store (`identity::device_logins`), so in a
//! cluster the code, the polls and the approval may each reach a different agentd host. A
//! device code is a 256-bit secret; a user code is short, typed by a person, and useless
//! without the device code that polls for it.

use crate::identity::device_logins::{
    DEVICE_LOGIN_TTL_MS, DEVICE_POLL_INTERVAL_MS, DecideError, DevicePoll,
    MAX_WAITING_DEVICE_LOGINS, MAX_WAITING_DEVICE_LOGINS_PER_ADDRESS, WaitingRefusal,
};
use crate::identity::store::now_ms;
use crate::identity::{IdentityStore, Scope, TokenCheckError};
use serde::Deserialize;

pub use agentworks_contract::public_api::DeviceCode;
use agentworks_contract::public_api::{DEVICE_ACCOUNT_PATH, DeviceAccount};

/// The answer to `POST /v1/device/code` for a login just started.
fn device_code_answer(public_url: &str, device_code: String, user_code: String) -> DeviceCode {
    let verification_uri = format!("{public_url}{APPROVE_PATH}");
    DeviceCode {
        verification_uri_complete: Some(format!("{verification_uri}?user_code={user_code}")),
        verification_uri,
        device_code,
        user_code,
        expires_in: (DEVICE_LOGIN_TTL_MS / 1000) as u64,
        interval: (DEVICE_POLL_INTERVAL_MS / 1000) as u64,
    }
}

// ----- HTTP glue (public listener) -----

use crate::oauth::answer::{oauth_error, server_error, store_unavailable};
use agentworks_daemon::ipc::bearer::{Bearer, bearer};
use agentworks_daemon::ipc::envelope::{Body, json_response};
use hyper::{Response, StatusCode};

#[derive(Debug, Deserialize)]
struct CodeRequest {
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    device_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct TokenRequestBody {
    grant_type: String,
    device_code: String,
    #[serde(default)]
    #[allow(dead_code)]
    client_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ApproveBody {
    user_code: String,
    #[serde(default = "yes")]
    approve: bool,
}

fn yes() -> bool {
    true
}

/// RFC 8628 requests are form-encoded; JSON is accepted too.
/// A form (RFC 8628 clients send `application/x-www-form-urlencoded`) or JSON body as `T`, or
/// the OAuth `invalid_request` answer.
// The error side is the ready answer; boxing it would only add an allocation per refusal.
#[allow(clippy::result_large_err)]
fn decode<T: serde::de::DeserializeOwned>(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<T, Response<Body>> {
    let decoded = if content_type.is_some_and(|c| c.starts_with("application/json")) {
        serde_json::from_slice(body).ok()
    } else {
        serde_urlencoded::from_bytes(body).ok()
    };
    decoded.ok_or_else(|| {
        oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the body does not parse",
        )
    })
}

/// The verification URI: the approval page on GET, the bearer approval on POST.
pub const APPROVE_PATH: &str = "/v1/device/approve";

/// Route `/v1/device/*`; `None` for other paths. `GET /v1/device/approve` is the approval page
/// (HTML, the console's security headers); `POST` there takes a `devices:approve` bearer.
pub async fn handle_public(
    identity: &IdentityStore,
    public_url: &str,
    parts: &hyper::http::request::Parts,
    body: &[u8],
) -> Option<Response<Body>> {
    let path = parts.uri.path();
    if !path.starts_with("/v1/device/") {
        return None;
    }
    if path == APPROVE_PATH && matches!(parts.method, hyper::Method::GET | hyper::Method::HEAD) {
        // The page itself (its script reads `user_code` and calls the console's API).
        return Some(crate::console::assets::page(
            crate::console::assets::DEVICE_APPROVE_HTML,
        ));
    }
    if path == DEVICE_ACCOUNT_PATH && parts.method == hyper::Method::GET {
        return Some(device_account(identity, parts).await);
    }
    if parts.method != hyper::Method::POST {
        let mut refused = oauth_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request",
            "use POST",
        );
        let allow = if path == APPROVE_PATH {
            "GET, HEAD, POST"
        } else if path == DEVICE_ACCOUNT_PATH {
            "GET"
        } else {
            "POST"
        };
        refused.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static(allow),
        );
        if path == APPROVE_PATH {
            crate::console::assets::add_security_headers(&mut refused);
        }
        return Some(refused);
    }
    let content_type = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    Some(match path {
        "/v1/device/code" => {
            let address = crate::identity::attempt_limits::client_bucket(parts);
            device_code(identity, public_url, content_type, body, address).await
        }
        "/v1/device/token" => device_token(identity, content_type, body).await,
        // `agentworks logout`: a token revokes itself (RFC 7009 in spirit; only its own).
        "/v1/device/revoke" => device_revoke(identity, parts).await,
        APPROVE_PATH => device_approve(identity, parts, content_type, body).await,
        _ => oauth_error(
            StatusCode::NOT_FOUND,
            "invalid_request",
            "unknown device endpoint",
        ),
    })
}

/// `POST /v1/device/code`: a new pending login (RFC 8628 §3.1), only for `devices:connect`,
/// asked from `address` (its bucket), which may have a few waiting at once.
async fn device_code(
    identity: &IdentityStore,
    public_url: &str,
    content_type: Option<&str>,
    body: &[u8],
    address: String,
) -> Response<Body> {
    let request = match decode::<CodeRequest>(content_type, body) {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    if request
        .scope
        .as_deref()
        .is_some_and(|s| s != Scope::DevicesConnect.as_str())
    {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_scope",
            "only devices:connect can be granted this way",
        );
    }
    let label = request
        .device_name
        .or(request.client_id)
        .unwrap_or_default();
    // Shown beside the code on the approval page: only a name a person reads as it is.
    if !label.is_empty()
        && let Err(why) = agentworks_contract::executor::check_device_name(&label)
    {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_request", &why);
    }
    let identity = identity.clone();
    let started = tokio::task::spawn_blocking(move || {
        identity.start_device_login(
            &label,
            &address,
            now_ms(),
            MAX_WAITING_DEVICE_LOGINS_PER_ADDRESS,
            MAX_WAITING_DEVICE_LOGINS,
        )
    })
    .await;
    match started {
        Ok(Ok(Ok(login))) => json_response(
            StatusCode::OK,
            &device_code_answer(public_url, login.device_code, login.user_code),
        ),
        Ok(Ok(Err(WaitingRefusal::Address))) => oauth_error(
            StatusCode::TOO_MANY_REQUESTS,
            "temporarily_unavailable",
            "too many logins from this address are waiting to be approved; approve or let them expire (10 minutes) first",
        ),
        Ok(Ok(Err(WaitingRefusal::Total))) => oauth_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "too many logins are waiting to be approved; try again in a few minutes",
        ),
        Ok(Err(e)) => store_unavailable(e),
        Err(e) => server_error(e),
    }
}

/// `POST /v1/device/token`: the laptop polls until the login is approved (RFC 8628 §3.4).
async fn device_token(
    identity: &IdentityStore,
    content_type: Option<&str>,
    body: &[u8],
) -> Response<Body> {
    let request = match decode::<TokenRequestBody>(content_type, body) {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    if request.grant_type != "urn:ietf:params:oauth:grant-type:device_code" {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "use the device_code grant",
        );
    }
    let identity = identity.clone();
    let polled = tokio::task::spawn_blocking(move || {
        identity.poll_device_login(&request.device_code, now_ms())
    })
    .await;
    match polled {
        Ok(Ok(DevicePoll::Granted { access_token, .. })) => json_response(
            StatusCode::OK,
            &serde_json::json!({"access_token": access_token, "token_type": "Bearer", "scope": "devices:connect"}),
        ),
        Ok(Ok(DevicePoll::Pending)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "authorization_pending",
            "waiting for approval",
        ),
        Ok(Ok(DevicePoll::SlowDown)) => {
            oauth_error(StatusCode::BAD_REQUEST, "slow_down", "poll less often")
        }
        Ok(Ok(DevicePoll::Denied)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "access_denied",
            "the request was denied",
        ),
        Ok(Ok(DevicePoll::Expired)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "expired_token",
            "the code expired; log in again",
        ),
        Ok(Ok(DevicePoll::Invalid)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "unknown or already used device code",
        ),
        Ok(Err(e)) => store_unavailable(e),
        Err(e) => server_error(e),
    }
}

/// The request's bearer token, or the 401 `invalid_token` answer saying to send `what`.
// The error side is the ready answer, as in `decode`.
#[allow(clippy::result_large_err)]
fn bearer_token<'a>(
    parts: &'a hyper::http::request::Parts,
    what: &str,
) -> Result<&'a str, Response<Body>> {
    match bearer(&parts.headers) {
        Bearer::Token(presented) => Ok(presented),
        Bearer::Absent | Bearer::Malformed => Err(oauth_error(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            &format!("send {what} as Authorization: Bearer …"),
        )),
    }
}

/// `GET /v1/device/account`: the account a live `devices:connect` token belongs to. Any other
/// token is 403 `insufficient_scope` (it is not a laptop's credential), an unknown, revoked or
/// expired one 401.
async fn device_account(
    identity: &IdentityStore,
    parts: &hyper::http::request::Parts,
) -> Response<Body> {
    let presented = match bearer_token(parts, "the laptop's token") {
        Ok(presented) => presented,
        Err(refused) => return refused,
    };
    match identity.check_bearer(presented).await {
        Ok((token, user)) if token.scopes == [Scope::DevicesConnect] => {
            json_response(StatusCode::OK, &DeviceAccount { account: user.name })
        }
        Ok(_) => oauth_error(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            "this token is not a laptop's devices:connect credential",
        ),
        Err(TokenCheckError::Refused(_)) => oauth_error(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "the token is unknown, expired or revoked",
        ),
        Err(TokenCheckError::Store(e)) => store_unavailable(e),
        Err(TokenCheckError::Task(e)) => server_error(e),
    }
}

/// `POST /v1/device/revoke`: `agentworks logout`; a token revokes itself, and only itself.
async fn device_revoke(
    identity: &IdentityStore,
    parts: &hyper::http::request::Parts,
) -> Response<Body> {
    let presented = match bearer_token(parts, "the token to revoke") {
        Ok(presented) => presented,
        Err(refused) => return refused,
    };
    let token = match identity.check_bearer(presented).await {
        Ok((token, _)) => token,
        // An invalid token is as good as revoked (RFC 7009 §2.2 answers 200 too).
        Err(TokenCheckError::Refused(_)) => {
            return json_response(StatusCode::OK, &serde_json::json!({"revoked": null}));
        }
        Err(TokenCheckError::Store(e)) => return store_unavailable(e),
        Err(TokenCheckError::Task(e)) => return server_error(e),
    };
    let identity = identity.clone();
    match tokio::task::spawn_blocking(move || identity.revoke_token(&token.id)).await {
        Ok(Ok(revoked)) => {
            json_response(StatusCode::OK, &serde_json::json!({"revoked": revoked.id}))
        }
        Ok(Err(e)) => store_unavailable(e),
        Err(e) => server_error(e),
    }
}

/// `POST /v1/device/approve`: the person approves (or denies) a pending login with a
/// `devices:approve` token of their own.
async fn device_approve(
    identity: &IdentityStore,
    parts: &hyper::http::request::Parts,
    content_type: Option<&str>,
    body: &[u8],
) -> Response<Body> {
    let Bearer::Token(presented) = bearer(&parts.headers) else {
        return oauth_error(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "approve with one of your tokens: Authorization: Bearer …",
        );
    };
    let request = match decode::<ApproveBody>(content_type, body) {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    let (token, user) = match identity.check_bearer(presented).await {
        Ok(found) => found,
        Err(_) => {
            return oauth_error(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "the token is not valid",
            );
        }
    };
    // An account-level act: only a token made for it (RFC 6750 §3.1).
    if !token.scopes.contains(&Scope::DevicesApprove) {
        let mut refused = oauth_error(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            "approving a device login needs a token with the devices:approve scope (or an operator: agentworksctl login approve CODE --user NAME)",
        );
        refused.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static(
                "Bearer error=\"insufficient_scope\", scope=\"devices:approve\"",
            ),
        );
        tracing::warn!(user = %user.name, token = %token.id, "refused a device login approval: the token lacks devices:approve");
        return refused;
    }
    let (store, name, approve) = (identity.clone(), user.name.clone(), request.approve);
    let decided = tokio::task::spawn_blocking(move || {
        store.decide_device_login(&request.user_code, &name, approve, now_ms())
    })
    .await;
    let decided = match decided {
        Ok(Ok(decided)) => decided,
        Ok(Err(e)) => return store_unavailable(e),
        Err(e) => return server_error(e),
    };
    match decided {
        Ok(_) => json_response(
            StatusCode::OK,
            &serde_json::json!({"user": user.name, "approved": approve}),
        ),
        Err(DecideError::NotFound) => oauth_error(
            StatusCode::NOT_FOUND,
            "invalid_grant",
            "no pending login has that code (it may have expired)",
        ),
        Err(DecideError::AlreadyDecided) => oauth_error(
            StatusCode::CONFLICT,
            "already_decided",
            "that login was already approved or denied",
        ),
    }
}
