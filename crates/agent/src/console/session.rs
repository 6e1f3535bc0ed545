//! Signed-in sessions of the web console.
//!
//! The interface the console's pages and the REST API (chats, MCP connections) use; the REST
//! API's caller is [`Sessions::person`]. A session is a cookie (a 256-bit
//! secret; the store keeps its SHA-256, see [`crate::identity::accounts`]), read only from a
//! request without an `Authorization` header: a bearer token is never mixed up with a session.
//! A state-changing request (any method but GET and HEAD) made with a session must also come
//! from the console's origin (`Origin` present and allowed by the same rule as `/mcp`'s) and
//! carry the session's CSRF token in [`CSRF_HEADER`]; a browser adds the cookie to a
//! cross-site request by itself, but only the console's own pages can read the CSRF token.
//!
//! The cookie is `__Host-aw_session` on a console served over https ([`SECURE_SESSION_COOKIE`]:
//! the browser then takes it only with `Secure`, `Path=/` and no `Domain`, so a sibling host
//! or another path cannot plant one), and `aw_session` on plain http (a loopback console,
//! where browsers refuse `Secure` cookies). Only the name in use is read, and a request that
//! carries it twice (one planted beside the real one) is refused rather than guessed at.

use crate::catalog::backend::caller_of;
use crate::identity::accounts::{self, SessionPolicy};
use crate::identity::attempt_limits::FailureLimits;
use crate::identity::token::hashes_equal;
use crate::identity::{IdentityStore, TokenCheckError, TokenInfo, User};
use crate::mcp::Caller;
use agentworks_daemon::ipc::bearer::{Bearer, bearer};
use agentworks_daemon::ipc::envelope::Refusal;
use hyper::header::{AUTHORIZATION, COOKIE, HeaderMap, ORIGIN};
use hyper::http::request::Parts;
use hyper::{Method, StatusCode};
use std::sync::Arc;

/// The session cookie's name on a console served over plain http.
pub const SESSION_COOKIE: &str = "aw_session";
/// The session cookie's name on a console served over https.
pub const SECURE_SESSION_COOKIE: &str = "__Host-aw_session";
/// The header a state-changing request made with a session carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The signed-in person of a page API that takes only a session (the device-login approval
/// page's, the OAuth consent page's): a request with an `Authorization` header is refused
/// (401 `session_required`, `what` saying what needs the session), as is one without a live
/// session (401) or, on a state-changing method, without the Origin and CSRF checks (403).
/// Refusals are `{error, error_description}`.
// The error side is the ready answer; boxing it would only add an allocation per refusal.
#[allow(clippy::result_large_err)]
pub async fn session_only(
    sessions: &Sessions,
    parts: &Parts,
    what: &str,
) -> Result<SignedIn, hyper::Response<agentworks_daemon::ipc::envelope::Body>> {
    use crate::oauth::answer::oauth_error;
    if parts.headers.contains_key(AUTHORIZATION) {
        return Err(oauth_error(
            hyper::StatusCode::UNAUTHORIZED,
            "session_required",
            &format!("{what} needs the console's signed-in session, not a bearer token"),
        ));
    }
    match sessions.check(parts).await {
        Some(Ok(signed_in)) => Ok(signed_in),
        Some(Err(refusal)) => Err(oauth_error(refusal.status, &refusal.code, &refusal.message)),
        None => Err(oauth_error(
            hyper::StatusCode::UNAUTHORIZED,
            "not_signed_in",
            "sign in to the console first",
        )),
    }
}

/// The person a request's session belongs to.
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub user: User,
    /// The session's own token row: what file operations re-check, revoked at sign-out.
    pub token: TokenInfo,
    pub csrf_token: String,
}

/// Password checks (Argon2 runs) agentd does at once for sign-in and invites.
const MAX_CONCURRENT_PASSWORD_CHECKS: usize = 4;

/// The signed-in sessions. Cheap to clone. [`Sessions::default`] knows no sessions (every
/// check answers `None`); agentd builds its own with [`Sessions::new`].
#[derive(Clone, Default)]
pub struct Sessions {
    inner: Option<Arc<Inner>>,
}

pub(crate) struct Inner {
    pub(crate) identity: IdentityStore,
    public_url: String,
    allowed_origins: Vec<String>,
    loopback_port: Option<u16>,
    pub(crate) policy: SessionPolicy,
    pub(crate) failures: FailureLimits,
    /// Password checks running at once: each Argon2 run holds ~19 MiB and a core, so a flood
    /// of sign-ins waits here instead of filling memory.
    pub(crate) hashing: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("enabled", &self.inner.is_some())
            .finish()
    }
}

/// The port of a loopback listener (whose `localhost` and `127.0.0.1` origins are the
/// console's too), as `/mcp` computes it.
pub fn loopback_port(listener: &tokio::net::TcpListener) -> Option<u16> {
    listener
        .local_addr()
        .ok()
        .filter(|address| address.ip().is_loopback())
        .map(|address| address.port())
}

impl Sessions {
    /// Sessions over the identity store, for a console served at `public_url` (and the
    /// `allowed_origins`, and the loopback listener's own names when `loopback_port` is set).
    pub fn new(
        identity: IdentityStore,
        public_url: String,
        allowed_origins: Vec<String>,
        loopback_port: Option<u16>,
    ) -> Sessions {
        Sessions {
            inner: Some(Arc::new(Inner {
                failures: FailureLimits::new(identity.clone()),
                identity,
                public_url,
                allowed_origins,
                loopback_port,
                policy: SessionPolicy::default(),
                hashing: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_PASSWORD_CHECKS)),
            })),
        }
    }

    pub(crate) fn inner(&self) -> Option<&Inner> {
        self.inner.as_deref()
    }

    /// `None`: the request carries no session cookie. `Some(Err)`: two session cookies (400),
    /// a session that is unknown, expired or signed out (401), or, on a state-changing method,
    /// a foreign `Origin` or a missing or wrong CSRF token (403). `Some(Ok)`: the signed-in
    /// person.
    pub async fn check(&self, parts: &Parts) -> Option<Result<SignedIn, Refusal>> {
        let inner = self.inner.as_ref()?;
        if parts.headers.contains_key(AUTHORIZATION) {
            return None;
        }
        let secret = match inner.session_cookie(&parts.headers) {
            Ok(secret) => secret?.to_owned(),
            Err(refusal) => return Some(Err(refusal)),
        };
        let session = match inner.check_secret(secret).await {
            Ok(Some(session)) => session,
            Ok(None) => return Some(Err(not_signed_in())),
            Err(refusal) => return Some(Err(refusal)),
        };
        if !matches!(parts.method, Method::GET | Method::HEAD) {
            if !inner.origin_allowed(&parts.headers, false) {
                return Some(Err(csrf_refused(
                    "a change made with a session must come from the console's own origin",
                )));
            }
            let presented = parts
                .headers
                .get(CSRF_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !hashes_equal(presented, &session.csrf_token) {
                return Some(Err(csrf_refused(
                    "a change made with a session needs the session's X-CSRF-Token header",
                )));
            }
        }
        Some(Ok(SignedIn {
            user: session.user,
            token: session.token,
            csrf_token: session.csrf_token,
        }))
    }

    /// The person a request to the public REST API (the chats, the MCP connections) comes
    /// from: the console session of a request without an `Authorization` header, else its
    /// bearer token, which must carry a `workflows:*` scope. 401 without either (or with a bad
    /// one), 403 for a token without the scope, 503 when the identity store cannot answer.
    pub async fn person(&self, identity: &IdentityStore, parts: &Parts) -> Result<Caller, Refusal> {
        let unauthorized =
            |code: &str, message: &str| Refusal::new(StatusCode::UNAUTHORIZED, code, message);
        // A console session counts only on a request without an Authorization header.
        if let Some(checked) = self.check(parts).await {
            let signed_in = checked?;
            return Ok(caller_of(signed_in.token, signed_in.user));
        }
        let presented = match bearer(&parts.headers) {
            Bearer::Token(token) => token,
            Bearer::Absent => {
                return Err(unauthorized(
                    "missing_token",
                    "this endpoint needs an `Authorization: Bearer <token>` header",
                ));
            }
            Bearer::Malformed => {
                return Err(unauthorized(
                    "invalid_token",
                    "the Authorization header is not one `Bearer <token>`",
                ));
            }
        };
        let (token, user) = match identity.check_bearer(presented).await {
            Ok(found) => found,
            Err(TokenCheckError::Refused(refusal)) => {
                return Err(unauthorized(refusal.code(), refusal.message()));
            }
            Err(error) => {
                tracing::warn!(%error, "token check failed");
                return Err(Refusal::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the identity store is unavailable; try again shortly",
                ));
            }
        };
        if !token
            .scopes
            .iter()
            .any(|s| s.as_str().starts_with("workflows:"))
        {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                "chats need a token with a workflows:* scope (a devices:connect token is only for `agentworks executor connect`)",
            ));
        }
        Ok(caller_of(token, user))
    }
}

impl Inner {
    /// The live session a cookie secret names, checked on a blocking thread.
    pub(crate) async fn check_secret(
        &self,
        secret: String,
    ) -> Result<Option<accounts::Session>, Refusal> {
        let identity = self.identity.clone();
        let policy = self.policy;
        agentworks_daemon::ipc::envelope::run_blocking(
            move || identity.check_session(&secret, policy, crate::identity::store::now_ms()),
            store_unavailable,
        )
        .await
    }

    /// Whether the request's `Origin` is the console's; a request without one passes only
    /// when `absent_ok`.
    pub(crate) fn origin_allowed(&self, headers: &HeaderMap, absent_ok: bool) -> bool {
        match headers.get(ORIGIN) {
            None => absent_ok,
            Some(value) => crate::mcp::access::origin_allowed(
                Some(value.to_str().unwrap_or("")),
                &self.public_url,
                &self.allowed_origins,
                self.loopback_port,
            ),
        }
    }

    /// Whether the cookie gets `Secure`: the console is served over https.
    pub(crate) fn secure_cookie(&self) -> bool {
        self.public_url
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
    }

    /// The session cookie's name here: `__Host-aw_session` over https, else `aw_session`.
    pub(crate) fn cookie_name(&self) -> &'static str {
        if self.secure_cookie() {
            SECURE_SESSION_COOKIE
        } else {
            SESSION_COOKIE
        }
    }

    /// The request's session cookie (`Ok(None)`: none), or the refusal of a request that
    /// carries two ([`session_cookie`]).
    pub(crate) fn session_cookie<'a>(
        &self,
        headers: &'a HeaderMap,
    ) -> Result<Option<&'a str>, Refusal> {
        session_cookie(headers, self.cookie_name())
    }
}

/// The value of the cookie `name`, from every `Cookie` header; more than one cookie of that
/// name is refused (400 `duplicate_session_cookie`): a browser sends a cookie planted for a
/// narrower path (or a parent domain, on plain http) beside the real one, and whichever was
/// picked, the request could act in the planter's session.
pub(crate) fn session_cookie<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<&'a str>, Refusal> {
    let mut found = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(cookie, _)| *cookie == name)
        .map(|(_, value)| value.trim());
    let first = found.next();
    if found.next().is_some() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "duplicate_session_cookie",
            "the request carries two session cookies; clear this site's cookies and sign in again",
        ));
    }
    Ok(first)
}

pub(crate) fn not_signed_in() -> Refusal {
    Refusal::new(
        StatusCode::UNAUTHORIZED,
        "not_signed_in",
        "not signed in: the session is unknown, expired or signed out; sign in again",
    )
}

fn csrf_refused(message: &str) -> Refusal {
    Refusal::new(StatusCode::FORBIDDEN, "csrf_refused", message)
}

pub(crate) fn store_unavailable(error: crate::identity::IdentityError) -> Refusal {
    tracing::warn!(%error, "session check failed");
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the identity store is unavailable; try again shortly",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = hyper::Request::builder().method(method).uri("/v1/chats");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[tokio::test]
    async fn a_change_needs_an_allowed_origin_and_the_csrf_token() {
        let dir = tempfile::tempdir().unwrap();
        let identity = IdentityStore::open(&dir.path().join("agentd.db")).unwrap();
        let alice = identity.add_user("alice").unwrap();
        let sessions = Sessions::new(
            identity.clone(),
            "https://console.example".into(),
            vec!["https://other.example".into()],
            Some(8470),
        );
        assert!(sessions.inner().unwrap().secure_cookie());
        let new = identity
            .create_session(
                &alice,
                SessionPolicy::default(),
                crate::identity::store::now_ms(),
            )
            .unwrap();
        // An https console: the prefixed name.
        let cookie = format!("{SECURE_SESSION_COOKIE}={}", new.secret);
        let csrf = new.session.csrf_token.as_str();
        let code = |r: Option<Result<SignedIn, Refusal>>| match r {
            None => "none".to_owned(),
            Some(Ok(_)) => "ok".to_owned(),
            Some(Err(refusal)) => refusal.code,
        };
        assert_eq!(code(sessions.check(&parts("GET", &[])).await), "none");
        assert_eq!(
            code(sessions.check(&parts("GET", &[("cookie", &cookie)])).await),
            "ok"
        );
        assert_eq!(
            code(
                sessions
                    .check(&parts(
                        "GET",
                        &[("cookie", &cookie), ("authorization", "Bearer x")]
                    ))
                    .await
            ),
            "none",
            "an Authorization header is never read as a session"
        );
        for origin in [
            "https://console.example",
            "https://other.example",
            "http://127.0.0.1:8470",
            "http://localhost:8470",
        ] {
            let with = [
                ("cookie", cookie.as_str()),
                ("origin", origin),
                (CSRF_HEADER, csrf),
            ];
            assert_eq!(
                code(sessions.check(&parts("POST", &with)).await),
                "ok",
                "{origin}"
            );
            let without = [("cookie", cookie.as_str()), ("origin", origin)];
            assert_eq!(
                code(sessions.check(&parts("DELETE", &without)).await),
                "csrf_refused",
                "{origin}"
            );
        }
        for origin in ["http://console.example", "http://127.0.0.1:8471", "null"] {
            let with = [
                ("cookie", cookie.as_str()),
                ("origin", origin),
                (CSRF_HEADER, csrf),
            ];
            assert_eq!(
                code(sessions.check(&parts("PUT", &with)).await),
                "csrf_refused",
                "{origin}"
            );
        }
        let stale = format!("{SECURE_SESSION_COOKIE}={}", "0".repeat(64));
        assert_eq!(
            code(sessions.check(&parts("GET", &[("cookie", &stale)])).await),
            "not_signed_in"
        );
        assert_eq!(
            code(
                Sessions::default()
                    .check(&parts("GET", &[("cookie", &cookie)]))
                    .await
            ),
            "none"
        );
    }

    #[test]
    fn the_session_cookie_is_found_among_others_and_two_are_refused() {
        let headers = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(COOKIE, value.parse().unwrap());
            }
            headers
        };
        let found = |values: &[&str], name: &str| {
            session_cookie(&headers(values), name)
                .map(|v| v.map(str::to_owned))
                .map_err(|r| r.code)
        };
        assert_eq!(
            found(&["a=1; aw_session=abc ; b=2"], SESSION_COOKIE),
            Ok(Some("abc".into()))
        );
        assert_eq!(found(&["x_aw_session=abc"], SESSION_COOKIE), Ok(None));
        // Over https only the prefixed name counts: an unprefixed one is no session.
        assert_eq!(found(&["aw_session=abc"], SECURE_SESSION_COOKIE), Ok(None));
        assert_eq!(
            found(&["__Host-aw_session=abc"], SECURE_SESSION_COOKIE),
            Ok(Some("abc".into()))
        );
        for twice in [
            &["aw_session=planted; aw_session=real"][..],
            &["aw_session=planted", "aw_session=real"][..],
        ] {
            assert_eq!(
                found(twice, SESSION_COOKIE),
                Err("duplicate_session_cookie".into())
            );
        }
    }
}
