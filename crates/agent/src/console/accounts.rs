//! The console's sign-in endpoints on agentd's public listener:
//!
//! | request | answer |
//! | --- | --- |
//! | `POST /v1/console/sign-in {username, password}` or `{link_code}` | 200 `{user: {id, name}, csrf_token, expires_at_ms}` + the session cookie |
//! | `GET /v1/console/session` | 200 the same (no cookie set), or 401 `not_signed_in` |
//! | `POST /v1/console/sign-out` (session + CSRF) | 204, the cookie cleared, the session's token revoked |
//! | `POST /v1/console/invite {code, password}` | sets the password from a one-time invite, then as sign-in |
//!
//! A wrong name or password is one answer, 401 `invalid_credentials`. Failed attempts are
//! counted per user name *and* client address, and per client address
//! ([`FailureLimits`](crate::identity::attempt_limits::FailureLimits), in the identity store, so
//! every host of a cluster counts the same), each with a backoff: a few failures are free, then
//! the next attempt waits 30 s after the last failure, twice as long after each further one (at
//! most the 15-minute window). Meanwhile the answer is 429
//! `too_many_attempts` with `Retry-After`, before any password is checked. Nothing counts per
//! user name alone: an attacker guessing alice's password from one address slows down only
//! there, and alice signing in from another address is not locked out. An IPv6 client counts
//! by its /64 (one host usually holds a whole /64). Sign-in and invite need an `Origin` that is
//! the console's, or, without one, `Sec-Fetch-Site: same-origin` (a login CSRF from another
//! site would sign the victim's browser into the attacker's account). The session cookie is
//! [`crate::console::session`]'s: `__Host-aw_session` over https.

use crate::console::session::{self, Sessions, not_signed_in, store_unavailable};
use crate::identity::IdentityError;
use crate::identity::accounts::{NewSession, Session};
use crate::identity::attempt_limits::{AttemptLimit, Limited, address_key, client_bucket};
use crate::identity::store::now_ms;
use crate::identity::store::validate_name;
use agentworks_daemon::ipc::envelope::{
    Body, Refusal, decode_json, full, json_response, run_blocking,
};
use agentworks_daemon::ipc::server::Verdict;
use bytes::Bytes;
use hyper::header::{CACHE_CONTROL, HeaderValue, RETRY_AFTER, SET_COOKIE};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde_json::json;

/// The first wait once a key's free failures are spent: 30 seconds, doubled after each
/// further failure.
pub const FIRST_BACKOFF_MS: i64 = 30_000;
/// Failed sign-ins per user name from one client address let through before the backoff.
pub const MAX_FAILURES_PER_USER: usize = 5;
/// Failed attempts per client address (whatever the name) let through before the backoff.
pub const MAX_FAILURES_PER_ADDRESS: usize = 20;

/// The backoff after `free` failures.
fn backoff(free: usize) -> AttemptLimit {
    AttemptLimit::Backoff {
        free,
        first_wait_ms: FIRST_BACKOFF_MS,
    }
}

const SIGN_IN: &str = "/v1/console/sign-in";
const SESSION: &str = "/v1/console/session";
const SIGN_OUT: &str = "/v1/console/sign-out";
const INVITE: &str = "/v1/console/invite";

/// The largest body these endpoints read (a name and a 1024-character password fit).
const MAX_BODY_BYTES: usize = 16 * 1024;

/// The answer to an attempt
/// [`FailureLimits::begin`](crate::identity::attempt_limits::FailureLimits::begin) did not
/// let through.
fn limited(limited: Limited) -> Response<Body> {
    match limited {
        Limited::Wait(seconds) => too_many_attempts(seconds),
        Limited::Unavailable(error) => {
            tracing::warn!(%error, "cannot count an attempt; refused");
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the identity store is unavailable; try again shortly",
            )
            .into_response()
        }
    }
}

/// Whether this is one of the endpoints here (any method).
fn is_console_account_path(path: &str) -> bool {
    matches!(path, SIGN_IN | SESSION | SIGN_OUT | INVITE)
}

/// What the public listener decides from the head: sign-out needs a live session (and the
/// CSRF check), refused without reading the body; the others are anonymous (`None`).
pub async fn screen(sessions: &Sessions, head: &Parts) -> Option<Verdict> {
    if head.method != Method::POST || head.uri.path() != SIGN_OUT {
        return None;
    }
    Some(match sessions.check(head).await {
        Some(Ok(_)) => Verdict::Authenticated {
            max_body_bytes: MAX_BODY_BYTES,
        },
        Some(Err(refusal)) => Verdict::Refused(refusal.into_response()),
        None => Verdict::Refused(not_signed_in().into_response()),
    })
}

/// Serves a console account endpoint, or `None` if the path is not one.
pub async fn handle(sessions: &Sessions, parts: &Parts, body: &Bytes) -> Option<Response<Body>> {
    let path = parts.uri.path();
    if !is_console_account_path(path) {
        return None;
    }
    let result = match (&parts.method, path) {
        (&Method::POST, SIGN_IN) => sign_in(sessions, parts, body).await,
        (&Method::GET, SESSION) => current(sessions, parts).await,
        (&Method::POST, SIGN_OUT) => sign_out(sessions, parts).await,
        (&Method::POST, INVITE) => invite(sessions, parts, body).await,
        _ => Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} {path} is not served", parts.method),
        )),
    };
    let mut response = result.unwrap_or_else(Refusal::into_response);
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(response)
}

fn inner(sessions: &Sessions) -> Result<&session::Inner, Refusal> {
    sessions.inner().ok_or_else(|| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "console sign-in is not available",
        )
    })
}

fn invalid_credentials() -> Refusal {
    Refusal::new(
        StatusCode::UNAUTHORIZED,
        "invalid_credentials",
        "the user name or password is wrong, or the link is unknown, expired or used",
    )
}

/// 429 with `Retry-After` (seconds).
fn too_many_attempts(seconds: i64) -> Response<Body> {
    let mut response = Refusal::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_attempts",
        format!("too many failed attempts; try again in {seconds} s"),
    )
    .with_detail("retry_after_s", seconds)
    .into_response();
    if let Ok(value) = HeaderValue::from_str(&seconds.max(1).to_string()) {
        response.headers_mut().insert(RETRY_AFTER, value);
    }
    response
}

/// Sign-in and invite come from the console's own pages: an `Origin` the console's, or, from
/// a browser that sent none, `Sec-Fetch-Site: same-origin`. Anything else (another site's
/// form, a request that says where it comes from in neither header) is refused: a login CSRF
/// would sign the victim's browser into the attacker's account.
fn check_origin(inner: &session::Inner, parts: &Parts) -> Result<(), Refusal> {
    let same_site_fetch = || {
        parts
            .headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"same-origin"))
    };
    let from_console = if parts.headers.contains_key(hyper::header::ORIGIN) {
        inner.origin_allowed(&parts.headers, false)
    } else {
        same_site_fetch()
    };
    if from_console {
        Ok(())
    } else {
        Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "csrf_refused",
            "signing in is only possible from the console's own pages (an Origin header of the console, or Sec-Fetch-Site: same-origin)",
        ))
    }
}

/// A store call on a blocking thread; a store failure is a 503.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, IdentityError> + Send + 'static,
) -> Result<T, Refusal> {
    run_blocking(f, |e| match e {
        IdentityError::Invalid(message) => {
            Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", message)
        }
        other => store_unavailable(other),
    })
    .await
}

/// The answer to a sign-in: the session's shape.
fn session_body(session: &Session) -> serde_json::Value {
    json!({
        "user": {"id": session.user.id, "name": session.user.name},
        "csrf_token": session.csrf_token,
        "expires_at_ms": session.expires_at_ms,
    })
}

/// The session cookie: `__Host-aw_session` with `Secure` over https (the prefix makes the
/// browser insist on `Secure`, `Path=/` and no `Domain`), `aw_session` on plain http.
fn cookie(inner: &session::Inner, value: &str, max_age_s: i64) -> Option<HeaderValue> {
    let secure = if inner.secure_cookie() {
        "; Secure"
    } else {
        ""
    };
    let name = inner.cookie_name();
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/; HttpOnly; SameSite=Lax{secure}; Max-Age={max_age_s}"
    ))
    .ok()
}

fn signed_in(inner: &session::Inner, new: &NewSession) -> Response<Body> {
    let mut response = json_response(StatusCode::OK, &session_body(&new.session));
    let max_age = ((new.session.expires_at_ms - now_ms()) / 1000).max(0);
    if let Some(value) = cookie(inner, &new.secret, max_age) {
        response.headers_mut().insert(SET_COOKIE, value);
    }
    response
}

async fn start_session(
    inner: &session::Inner,
    user: crate::identity::User,
) -> Result<Response<Body>, Refusal> {
    let identity = inner.identity.clone();
    let policy = inner.policy;
    let new = blocking(move || identity.create_session(&user, policy, now_ms())).await?;
    Ok(signed_in(inner, &new))
}

async fn sign_in(
    sessions: &Sessions,
    parts: &Parts,
    body: &Bytes,
) -> Result<Response<Body>, Refusal> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SignIn {
        username: Option<String>,
        password: Option<String>,
        link_code: Option<String>,
    }
    let inner = inner(sessions)?;
    check_origin(inner, parts)?;
    let request: SignIn = decode_json(body)?;
    let address = address_key(parts);
    let now = now_ms();
    match request {
        SignIn {
            username: Some(username),
            password: Some(password),
            link_code: None,
        } => {
            // The name counts together with the address, never alone: failures from one
            // address never slow down the same name from another. A name no account can have
            // is not tracked (it would only fill the table); the address still counts it.
            let user_key = validate_name("user", &username)
                .is_ok()
                .then(|| format!("sign-in:{username}@{}", client_bucket(parts)));
            let mut limits = vec![(address.as_str(), backoff(MAX_FAILURES_PER_ADDRESS))];
            if let Some(key) = &user_key {
                limits.push((key.as_str(), backoff(MAX_FAILURES_PER_USER)));
            }
            let attempt = match inner.failures.begin(&limits, now).await {
                Ok(attempt) => attempt,
                Err(refused) => return Ok(limited(refused)),
            };
            let identity = inner.identity.clone();
            // The permit goes with the blocking call, so a client that hangs up does not
            // free it while Argon2 still runs.
            let permit = inner.hashing.clone().acquire_owned().await;
            let user = blocking(move || {
                let _permit = permit;
                identity.verify_password(&username, &password)
            })
            .await?;
            let Some(user) = user else {
                return Err(invalid_credentials());
            };
            inner.failures.succeeded(&attempt).await;
            start_session(inner, user).await
        }
        SignIn {
            username: None,
            password: None,
            link_code: Some(code),
        } => {
            let limits = [(address.as_str(), backoff(MAX_FAILURES_PER_ADDRESS))];
            let attempt = match inner.failures.begin(&limits, now).await {
                Ok(attempt) => attempt,
                Err(refused) => return Ok(limited(refused)),
            };
            let identity = inner.identity.clone();
            let user = blocking(move || {
                identity.redeem_code(&code, crate::identity::accounts::CodeKind::SignIn, now)
            })
            .await?;
            let Some(user) = user else {
                return Err(invalid_credentials());
            };
            inner.failures.succeeded(&attempt).await;
            start_session(inner, user).await
        }
        _ => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "send {username, password} or {link_code}",
        )),
    }
}

async fn current(sessions: &Sessions, parts: &Parts) -> Result<Response<Body>, Refusal> {
    let inner = inner(sessions)?;
    let Some(secret) = inner.session_cookie(&parts.headers)? else {
        return Err(not_signed_in());
    };
    match inner.check_secret(secret.to_owned()).await? {
        Some(session) => Ok(json_response(StatusCode::OK, &session_body(&session))),
        None => Err(not_signed_in()),
    }
}

async fn sign_out(sessions: &Sessions, parts: &Parts) -> Result<Response<Body>, Refusal> {
    let inner = inner(sessions)?;
    match sessions.check(parts).await {
        Some(Ok(_)) => {}
        Some(Err(refusal)) => return Err(refusal),
        None => return Err(not_signed_in()),
    }
    let secret = inner
        .session_cookie(&parts.headers)?
        .unwrap_or("")
        .to_owned();
    let identity = inner.identity.clone();
    blocking(move || identity.end_session(&secret)).await?;
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    if let Some(value) = cookie(inner, "", 0) {
        response.headers_mut().insert(SET_COOKIE, value);
    }
    Ok(response)
}

async fn invite(
    sessions: &Sessions,
    parts: &Parts,
    body: &Bytes,
) -> Result<Response<Body>, Refusal> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Invite {
        code: String,
        password: String,
    }
    let inner = inner(sessions)?;
    check_origin(inner, parts)?;
    let request: Invite = decode_json(body)?;
    let address = address_key(parts);
    let now = now_ms();
    let limits = [(address.as_str(), backoff(MAX_FAILURES_PER_ADDRESS))];
    let attempt = match inner.failures.begin(&limits, now).await {
        Ok(attempt) => attempt,
        Err(refused) => return Ok(limited(refused)),
    };
    let identity = inner.identity.clone();
    let permit = inner.hashing.clone().acquire_owned().await;
    let accepted = blocking(move || {
        let _permit = permit;
        identity.accept_invite(&request.code, &request.password, now)
    })
    .await;
    // A password the rules refuse is the person's typo, not a guess at a code.
    if matches!(&accepted, Err(r) if r.code == "invalid_request") {
        inner.failures.succeeded(&attempt).await;
    }
    let Some(user) = accepted? else {
        return Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "invalid_code",
            "this invite is unknown, expired or already used; ask for a new one",
        ));
    };
    inner.failures.succeeded(&attempt).await;
    start_session(inner, user).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_secure_on_an_https_console() {
        let dir = tempfile::tempdir().unwrap();
        let identity = crate::identity::IdentityStore::open(&dir.path().join("agentd.db")).unwrap();
        for (url, name, secure) in [
            ("https://console.example", "__Host-aw_session", "; Secure"),
            ("http://127.0.0.1:8470", "aw_session", ""),
        ] {
            let sessions = Sessions::new(identity.clone(), url.into(), Vec::new(), None);
            let header = cookie(sessions.inner().unwrap(), "abc", 60).unwrap();
            assert_eq!(
                header.to_str().unwrap(),
                format!("{name}=abc; Path=/; HttpOnly; SameSite=Lax{secure}; Max-Age=60")
            );
        }
    }
}
