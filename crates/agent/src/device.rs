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
//! Pending grants live in memory for ten minutes: a restarted agentd forgets them and the CLI
//! simply asks again. A device code is a 256-bit secret; a user code is short, typed by a
//! person, and useless without the device code that polls for it.

use crate::identity::store::TokenRequest;
use crate::identity::{IdentityError, IdentityStore, Scope, TokenCheckError};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a device code stays valid.
pub const GRANT_LIFETIME: Duration = Duration::from_secs(600);
/// The polling interval the CLI is told to keep (RFC 8628 §3.2).
pub const POLL_INTERVAL_SECS: u64 = 2;
/// User codes: 8 characters from an alphabet without look-alikes, shown as XXXX-XXXX.
const USER_CODE_ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";

pub use agentworks_contract::public_api::DeviceCode;

/// Why a decision on a user code was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("no pending login has that code (it may have expired)")]
    NotFound,
    #[error("that login was already approved or denied")]
    AlreadyDecided,
}

/// A live, undecided grant as the approval page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingLogin {
    pub user_code: String,
    /// The device's name as the CLI reported it (untrusted text).
    pub label: String,
    pub expires_in: Duration,
}

/// RFC 8628 §3.5 token answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenPoll {
    Granted {
        access_token: String,
        token_id: String,
    },
    Pending,
    SlowDown,
    Denied,
    Expired,
    Invalid,
}

#[derive(Debug)]
struct Grant {
    user_code: String,
    label: String,
    created: Instant,
    last_poll: Option<Instant>,
    /// Set once approved: the user it was approved for.
    approved_for: Option<String>,
    denied: bool,
    /// Set once the token was handed out: a device code is redeemed once.
    redeemed: bool,
}

impl Grant {
    /// Not expired and not yet redeemed.
    fn live(&self) -> bool {
        self.created.elapsed() < GRANT_LIFETIME && !self.redeemed
    }

    fn decided(&self) -> bool {
        self.approved_for.is_some() || self.denied
    }
}

/// The pending grants, shared by the HTTP handlers.
#[derive(Clone, Default)]
pub struct DeviceGrants {
    inner: Arc<Mutex<HashMap<String, Grant>>>,
}

fn random_user_code() -> String {
    let bytes: [u8; 8] = rand::random();
    let chars: String = bytes
        .iter()
        .map(|b| USER_CODE_ALPHABET[*b as usize % USER_CODE_ALPHABET.len()] as char)
        .collect();
    format!("{}-{}", &chars[..4], &chars[4..])
}

/// Normalise what a person typed: case and the dash do not matter.
pub fn normalise_user_code(raw: &str) -> String {
    let letters: String = raw
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect();
    if letters.len() == 8 {
        format!("{}-{}", &letters[..4], &letters[4..])
    } else {
        letters
    }
}

impl DeviceGrants {
    fn grants(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grant>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start a grant. `label` (the device's name as the CLI reported it) ends up on the token.
    pub fn start(&self, public_url: &str, label: &str) -> DeviceCode {
        let device_code = hex::encode(rand::random::<[u8; 32]>());
        let mut grants = self.grants();
        grants.retain(|_, g| g.created.elapsed() < GRANT_LIFETIME);
        let mut user_code = random_user_code();
        while grants.values().any(|g| g.user_code == user_code) {
            user_code = random_user_code();
        }
        grants.insert(
            device_code.clone(),
            Grant {
                user_code: user_code.clone(),
                label: label.chars().take(64).collect(),
                created: Instant::now(),
                last_poll: None,
                approved_for: None,
                denied: false,
                redeemed: false,
            },
        );
        let verification_uri = format!("{public_url}{APPROVE_PATH}");
        DeviceCode {
            verification_uri_complete: Some(format!("{verification_uri}?user_code={user_code}")),
            verification_uri,
            device_code,
            user_code,
            expires_in: GRANT_LIFETIME.as_secs(),
            interval: POLL_INTERVAL_SECS,
        }
    }

    /// The live grant with this user code that nobody decided yet, if any.
    pub fn lookup(&self, user_code: &str) -> Option<PendingLogin> {
        let code = normalise_user_code(user_code);
        let grants = self.grants();
        let grant = grants.values().find(|g| g.user_code == code && g.live())?;
        if grant.decided() {
            return None;
        }
        Some(PendingLogin {
            user_code: grant.user_code.clone(),
            label: grant.label.clone(),
            expires_in: GRANT_LIFETIME.saturating_sub(grant.created.elapsed()),
        })
    }

    /// Approve (or deny) the grant with this user code for `user`, once: the device's label on
    /// success. A second decision fails, so a denial cannot be turned into an approval (nor the
    /// approving user swapped) afterwards.
    pub fn decide(
        &self,
        user_code: &str,
        user: &str,
        approve: bool,
    ) -> Result<String, DecideError> {
        let code = normalise_user_code(user_code);
        let mut grants = self.grants();
        let grant = grants
            .values_mut()
            .find(|g| g.user_code == code && g.live())
            .ok_or(DecideError::NotFound)?;
        if grant.decided() {
            return Err(DecideError::AlreadyDecided);
        }
        if approve {
            grant.approved_for = Some(user.to_owned());
        } else {
            grant.denied = true;
        }
        Ok(grant.label.clone())
    }

    /// Makes every grant `by` older (tests of expiry).
    #[cfg(test)]
    fn age(&self, by: Duration) {
        for grant in self.grants().values_mut() {
            grant.created = grant.created.checked_sub(by).expect("an earlier instant");
        }
    }

    /// One poll by the CLI. Mints the token (once) when the grant was approved.
    pub fn poll(
        &self,
        device_code: &str,
        identity: &IdentityStore,
    ) -> Result<TokenPoll, IdentityError> {
        let (user, label) = {
            let mut grants = self.grants();
            let Some(grant) = grants.get_mut(device_code) else {
                return Ok(TokenPoll::Invalid);
            };
            if grant.created.elapsed() >= GRANT_LIFETIME {
                grants.remove(device_code);
                return Ok(TokenPoll::Expired);
            }
            if grant.denied {
                grants.remove(device_code);
                return Ok(TokenPoll::Denied);
            }
            let too_fast = grant
                .last_poll
                .is_some_and(|t| t.elapsed() < Duration::from_secs(POLL_INTERVAL_SECS) / 2);
            grant.last_poll = Some(Instant::now());
            let Some(user) = grant.approved_for.clone() else {
                return Ok(if too_fast {
                    TokenPoll::SlowDown
                } else {
                    TokenPoll::Pending
                });
            };
            if grant.redeemed {
                return Ok(TokenPoll::Invalid);
            }
            grant.redeemed = true;
            (user, grant.label.clone())
        };
        let minted = identity.create_token(&TokenRequest {
            user,
            label: if label.is_empty() {
                "agentworks login".into()
            } else {
                format!("agentworks login: {label}")
            },
            scopes: vec![Scope::DevicesConnect],
            ..TokenRequest::default()
        });
        self.grants().remove(device_code);
        let (info, token) = minted?;
        Ok(TokenPoll::Granted {
            access_token: token,
            token_id: info.id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_is_granted_once_after_approval_only() {
        let dir = tempfile::tempdir().unwrap();
        let identity = IdentityStore::open(&dir.path().join("a.db")).unwrap();
        identity.add_user("alice").unwrap();
        let grants = DeviceGrants::default();
        let start = grants.start("http://x", "laptop");
        assert_eq!(start.user_code.len(), 9);
        assert_eq!(
            grants.poll(&start.device_code, &identity).unwrap(),
            TokenPoll::Pending
        );
        assert_eq!(
            grants.poll(&start.device_code, &identity).unwrap(),
            TokenPoll::SlowDown
        );
        assert_eq!(
            grants.decide("WRONG-CODE", "alice", true),
            Err(DecideError::NotFound)
        );
        assert_eq!(
            grants.decide(
                &start.user_code.to_lowercase().replace('-', ""),
                "alice",
                true
            ),
            Ok("laptop".to_owned())
        );
        let TokenPoll::Granted { access_token, .. } =
            grants.poll(&start.device_code, &identity).unwrap()
        else {
            panic!("expected a token");
        };
        let (info, _) = identity.authenticate(&access_token).unwrap().unwrap();
        assert_eq!(info.scopes, vec![Scope::DevicesConnect]);
        assert_eq!(
            grants.poll(&start.device_code, &identity).unwrap(),
            TokenPoll::Invalid,
            "redeemed once"
        );
        assert_eq!(grants.poll("nope", &identity).unwrap(), TokenPoll::Invalid);
    }

    #[test]
    fn a_denied_code_never_grants() {
        let dir = tempfile::tempdir().unwrap();
        let identity = IdentityStore::open(&dir.path().join("a.db")).unwrap();
        let grants = DeviceGrants::default();
        let start = grants.start("http://x", "");
        assert_eq!(
            grants.decide(&start.user_code, "alice", false),
            Ok(String::new())
        );
        assert_eq!(
            grants.decide(&start.user_code, "alice", true),
            Err(DecideError::AlreadyDecided),
            "a denial is final"
        );
        assert_eq!(
            grants.poll(&start.device_code, &identity).unwrap(),
            TokenPoll::Denied
        );
    }

    #[test]
    fn a_pending_code_is_looked_up_until_it_is_decided() {
        let grants = DeviceGrants::default();
        let start = grants.start("http://x", "<b>laptop</b>");
        let found = grants
            .lookup(&start.user_code.to_lowercase())
            .expect("pending");
        assert_eq!(found.user_code, start.user_code);
        assert_eq!(found.label, "<b>laptop</b>", "the label is kept as given");
        assert!(found.expires_in <= GRANT_LIFETIME);
        assert!(found.expires_in > GRANT_LIFETIME - Duration::from_secs(60));
        // Vowels are not in the alphabet: no grant can have this code.
        assert_eq!(grants.lookup("AAAA-AAAA"), None);
        assert_eq!(
            grants.decide(&start.user_code, "alice", true),
            Ok("<b>laptop</b>".into())
        );
        assert_eq!(grants.lookup(&start.user_code), None, "decided");
        assert_eq!(
            grants.decide(&start.user_code, "mallory", true),
            Err(DecideError::AlreadyDecided),
            "the approving user cannot be swapped"
        );
        assert_eq!(
            grants.decide(&start.user_code, "alice", false),
            Err(DecideError::AlreadyDecided),
            "nor the approval turned into a denial"
        );
    }

    #[test]
    fn an_expired_code_is_neither_found_nor_decided() {
        let dir = tempfile::tempdir().unwrap();
        let identity = IdentityStore::open(&dir.path().join("a.db")).unwrap();
        let grants = DeviceGrants::default();
        let start = grants.start("http://x", "laptop");
        grants.age(GRANT_LIFETIME);
        assert_eq!(grants.lookup(&start.user_code), None);
        assert_eq!(
            grants.decide(&start.user_code, "alice", true),
            Err(DecideError::NotFound)
        );
        assert_eq!(
            grants.poll(&start.device_code, &identity).unwrap(),
            TokenPoll::Expired
        );
    }
}

// ----- HTTP glue (public listener) -----

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

/// RFC 6749 §5.2 error answers (what OAuth clients expect here, not our envelope).
/// The store could not answer: 503 `temporarily_unavailable`.
fn store_unavailable(error: impl std::fmt::Display) -> Response<Body> {
    oauth_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        &error.to_string(),
    )
}

/// The blocking task that reads the store failed: 500 `server_error`.
fn server_error(error: impl std::fmt::Display) -> Response<Body> {
    oauth_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        &error.to_string(),
    )
}

pub(crate) fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response<Body> {
    json_response(
        status,
        &serde_json::json!({"error": error, "error_description": description}),
    )
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
    grants: &DeviceGrants,
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
    if parts.method != hyper::Method::POST {
        let mut refused = oauth_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request",
            "use POST",
        );
        let allow = if path == APPROVE_PATH {
            "GET, HEAD, POST"
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
        "/v1/device/code" => device_code(grants, public_url, content_type, body),
        "/v1/device/token" => device_token(grants, identity, content_type, body).await,
        // `agentworks logout`: a token revokes itself (RFC 7009 in spirit; only its own).
        "/v1/device/revoke" => device_revoke(identity, parts).await,
        APPROVE_PATH => device_approve(grants, identity, parts, content_type, body).await,
        _ => oauth_error(
            StatusCode::NOT_FOUND,
            "invalid_request",
            "unknown device endpoint",
        ),
    })
}

/// `POST /v1/device/code`: a new pending login (RFC 8628 §3.1), only for `devices:connect`.
fn device_code(
    grants: &DeviceGrants,
    public_url: &str,
    content_type: Option<&str>,
    body: &[u8],
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
    json_response(StatusCode::OK, &grants.start(public_url, &label))
}

/// `POST /v1/device/token`: the laptop polls until the login is approved (RFC 8628 §3.4).
async fn device_token(
    grants: &DeviceGrants,
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
    let grants = grants.clone();
    let identity = identity.clone();
    let polled =
        tokio::task::spawn_blocking(move || grants.poll(&request.device_code, &identity)).await;
    match polled {
        Ok(Ok(TokenPoll::Granted { access_token, .. })) => json_response(
            StatusCode::OK,
            &serde_json::json!({"access_token": access_token, "token_type": "Bearer", "scope": "devices:connect"}),
        ),
        Ok(Ok(TokenPoll::Pending)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "authorization_pending",
            "waiting for approval",
        ),
        Ok(Ok(TokenPoll::SlowDown)) => {
            oauth_error(StatusCode::BAD_REQUEST, "slow_down", "poll less often")
        }
        Ok(Ok(TokenPoll::Denied)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "access_denied",
            "the request was denied",
        ),
        Ok(Ok(TokenPoll::Expired)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "expired_token",
            "the code expired; log in again",
        ),
        Ok(Ok(TokenPoll::Invalid)) => oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "unknown or already used device code",
        ),
        Ok(Err(e)) => store_unavailable(e),
        Err(e) => server_error(e),
    }
}

/// `POST /v1/device/revoke`: `agentworks logout`; a token revokes itself, and only itself.
async fn device_revoke(
    identity: &IdentityStore,
    parts: &hyper::http::request::Parts,
) -> Response<Body> {
    let Bearer::Token(presented) = bearer(&parts.headers) else {
        return oauth_error(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "send the token to revoke as Authorization: Bearer …",
        );
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
    grants: &DeviceGrants,
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
    match grants.decide(&request.user_code, &user.name, request.approve) {
        Ok(_) => json_response(
            StatusCode::OK,
            &serde_json::json!({"user": user.name, "approved": request.approve}),
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
