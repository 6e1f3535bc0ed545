//! Signing a project's MCP connection in to its server: agentd as an OAuth 2.1 client, as the
//! MCP authorization spec describes it, every request through the guarded outbound client.
//!
//! [`begin`]: ask the MCP URL without a token and read the 401's `resource_metadata` (else the
//! RFC 9728 well-known address), fetch the protected-resource metadata (whose `resource` must
//! be this URL), then the authorization server's RFC 8414 metadata (whose `issuer` must be the
//! one named, and which must offer PKCE S256), register by RFC 7591 dynamic registration, and
//! answer the authorization URL (https only: a person opens it) with PKCE, `state` and
//! `resource`. A server without registration answers [`SignInError::NeedsClientId`].
//! [`finish`]: the code from the callback, checked against the `state` it was issued for and,
//! when the server sends it, `iss` (RFC 9207), exchanged at the token endpoint.
//! [`refresh`]: a refresh grant; a new refresh token replaces the old one when the server
//! rotates it.
//!
//! An operator's sign-in app ([`ClientApp`], chosen by the provider's domain) is pinned to its
//! provider's issuer: [`begin`] uses it only when the issuer the server's metadata names (and
//! whose own metadata confirms it) is exactly the pinned one, and [`refresh`] checks the pin
//! again and sends the app's secret only to the token endpoint the pinned issuer's metadata
//! names then. A server under the provider's domain that is not the provider gets nothing.
//!
//! What a sign-in leaves ([`Credentials`]) is sealed before it is stored (see
//! [`crate::connections::tools`]). A sign-in waiting for its callback ([`Pending`], with its
//! PKCE verifier and client secret) is sealed too and kept in the connection store under the
//! SHA-256 of its `state` for [`PENDING_LIFETIME`], so in a cluster the callback may reach
//! another agentd host than the one that started it; it is taken once.
//!
//! Must never: send a token to any URL but the token endpoint and the connection's own URL, send
//! an operator app's secret to a token endpoint its pinned issuer did not name, show
//! a person a non-https authorization URL, or accept a code for a `state` it did not issue or
//! for another person than the one who started the sign-in.

use crate::connections::sealed::{Place, SealError, SealingKey};
use crate::connections::store::{ConnectionStore, McpConnection, SignInTakeRefusal};
use crate::mcp::ToolError;
use agentworks_support::outbound::{GuardedClient, OutboundError, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// Where a connection's OAuth sign-in comes back to, on agentd's public listener.
pub const CALLBACK_PATH: &str = "/v1/mcp-connections/callback";

/// How long a started sign-in waits for its callback.
pub const PENDING_LIFETIME: Duration = Duration::from_secs(10 * 60);
/// Pending sign-ins kept at most (the oldest are dropped first).
const MAX_PENDING: i64 = 256;

#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    #[error("{0}")]
    Outbound(#[from] OutboundError),
    #[error("the server did not ask for a sign-in (it answered {0} without a token)")]
    NotNeeded(StatusCode),
    #[error("the server's OAuth metadata is unusable: {0}")]
    Metadata(String),
    #[error(
        "the server offers no dynamic registration; an operator must configure a sign-in app for it with this callback URL: {callback}"
    )]
    NeedsClientId { callback: String },
    #[error("the server refused: {0}")]
    Refused(String),
    #[error("this sign-in is unknown or has expired; start it again from the project's settings")]
    UnknownState,
    #[error("this sign-in was started by another person")]
    NotYours,
    #[error("sign-ins in progress cannot be kept or read now: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Seal(#[from] SealError),
    #[error(
        "the authorization response names the issuer {got:?}, not {expected:?}: refused (RFC 9207)"
    )]
    WrongIssuer { expected: String, got: String },
    #[error(
        "the operator's sign-in app {key:?} is pinned to no issuer, so it is not used (it was set before apps were pinned); an operator sets it again with `agentworksctl mcp-app set {key} --client-id … --issuer <the provider's issuer URL>`"
    )]
    AppNotPinned { key: String },
    #[error(
        "the operator's sign-in app {key:?} is for the issuer {pinned:?}, and this server's authorization server is {found:?}: the app is not used with it (its secret is never sent there), and the server offers no registration of its own"
    )]
    AppForAnotherIssuer {
        key: String,
        pinned: String,
        found: String,
    },
    #[error(
        "the operator's sign-in app {key:?} this sign-in was made with is gone, changed its client or is pinned to another issuer now; sign in again"
    )]
    AppChanged { key: String },
    #[error(
        "this sign-in was made with a client secret before sign-in apps were pinned to an issuer, so it is not refreshed (the secret might go to an unpinned server); sign in again"
    )]
    MadeBeforePinning,
}

impl SignInError {
    pub fn code(&self) -> &'static str {
        match self {
            SignInError::Outbound(OutboundError::RefusedHost { .. })
            | SignInError::Outbound(OutboundError::RefusedAddress { .. }) => "address_refused",
            SignInError::Outbound(OutboundError::Redirect { .. }) => "redirect_refused",
            SignInError::Outbound(_) => "server_unreachable",
            SignInError::NotNeeded(_) => "no_sign_in_needed",
            SignInError::Metadata(_) => "server_error",
            SignInError::NeedsClientId { .. } => "needs_client_id",
            SignInError::Refused(_) => "server_refused",
            SignInError::UnknownState => "unknown_sign_in",
            SignInError::NotYours => "forbidden",
            SignInError::Unavailable(_) | SignInError::Seal(_) => "unavailable",
            SignInError::WrongIssuer { .. } => "wrong_issuer",
            SignInError::AppNotPinned { .. } => "app_not_pinned",
            SignInError::AppForAnotherIssuer { .. } => "app_issuer_mismatch",
            SignInError::AppChanged { .. } | SignInError::MadeBeforePinning => "sign_in_required",
        }
    }
}

/// What a sign-in leaves: sealed at rest, never shown.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Credentials {
    pub client_id: String,
    pub client_secret: Option<String>,
    pub token_endpoint: String,
    pub resource: String,
    pub access_token: String,
    pub refresh_token: Option<String>,
    pub expires_at_ms: Option<i64>,
    /// The user id of the person who signed in: the connection acts as them on the server, so
    /// the sign-in goes when they leave the project or their account is disabled.
    #[serde(default)]
    pub signed_in_by: String,
    /// The authorization server's issuer the sign-in was made with (`None`: a sign-in from
    /// before it was recorded).
    #[serde(default)]
    pub issuer: Option<String>,
    /// The operator's sign-in app it was made with, if any: every refresh checks the app is
    /// still pinned to [`Credentials::issuer`] before its secret is sent.
    #[serde(default)]
    pub app_key: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("client_id", &self.client_id)
            .field("token_endpoint", &self.token_endpoint)
            .field("signed_in_by", &self.signed_in_by)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The place a connection's sign-in is sealed for: this store, the connection's internal
    /// name.
    fn place(connection_id: &str) -> Place<'_> {
        Place {
            store: "mcp_credentials",
            path: connection_id,
        }
    }

    pub fn seal(&self, key: &SealingKey, connection_id: &str) -> Result<Vec<u8>, SealError> {
        let plain = serde_json::to_vec(self).map_err(|_| SealError::Random)?;
        key.seal(Self::place(connection_id), &plain)
    }

    /// The sign-in sealed for `connection_id`; `None` when it does not open or parse (it is
    /// then as if there were none: the person signs in again).
    pub fn unseal(key: &SealingKey, connection_id: &str, blob: &[u8]) -> Option<Credentials> {
        let plain = key.open(Self::place(connection_id), blob).ok()?;
        serde_json::from_slice(&plain).ok()
    }

    /// Whether the access token has expired or will within a minute.
    pub fn expiring(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_some_and(|at| at - 60_000 <= now_ms)
    }
}

/// A sign-in waiting for its callback (sealed at rest: it holds the PKCE verifier and the
/// client secret).
#[derive(Clone, Serialize, Deserialize)]
pub struct Pending {
    pub connection_id: String,
    pub project_id: String,
    pub user_id: String,
    verifier: String,
    redirect_uri: String,
    issuer: String,
    client_id: String,
    client_secret: Option<String>,
    token_endpoint: String,
    resource: String,
    /// The operator's sign-in app used, if any.
    #[serde(default)]
    app_key: Option<String>,
}

/// A sign-in just started: where the person goes, and what waits for the callback there.
#[derive(Clone)]
pub struct Started {
    pub authorization_url: String,
    pub state: String,
    pub pending: Pending,
}

/// The sign-ins waiting for their callback: rows of the connection store, sealed, by the
/// SHA-256 of their `state`. Cheap to clone; calls block.
#[derive(Clone)]
pub struct PendingSignIns {
    store: ConnectionStore,
}

impl PendingSignIns {
    pub fn new(store: ConnectionStore) -> PendingSignIns {
        PendingSignIns { store }
    }

    fn place(state_hash: &str) -> Place<'_> {
        Place {
            store: "mcp_sign_ins",
            path: state_hash,
        }
    }

    fn live_since(now_ms: i64) -> i64 {
        now_ms - PENDING_LIFETIME.as_millis() as i64
    }

    /// Keep `started` until its callback (or [`PENDING_LIFETIME`]).
    pub fn insert(&self, key: &SealingKey, started: &Started) -> Result<(), SignInError> {
        let hash = crate::identity::token::hash_secret(&started.state);
        let plain = serde_json::to_vec(&started.pending).map_err(|_| SealError::Random)?;
        let sealed = key.seal(Self::place(&hash), &plain)?;
        let now = agentworks_support::clock::now_ms();
        self.store
            .put_sign_in(
                &hash,
                &started.pending.user_id,
                &sealed,
                now,
                Self::live_since(now),
                MAX_PENDING,
            )
            .map_err(|e| SignInError::Unavailable(e.to_string()))
    }

    /// Take the sign-in `state` names, once, if it is `user_id`'s and not expired.
    pub fn take(
        &self,
        key: &SealingKey,
        state: &str,
        user_id: &str,
    ) -> Result<Pending, SignInError> {
        let hash = crate::identity::token::hash_secret(state);
        let now = agentworks_support::clock::now_ms();
        let sealed = self
            .store
            .take_sign_in(&hash, user_id, Self::live_since(now))
            .map_err(|e| SignInError::Unavailable(e.to_string()))?
            .map_err(|refusal| match refusal {
                SignInTakeRefusal::Unknown => SignInError::UnknownState,
                SignInTakeRefusal::NotYours => SignInError::NotYours,
            })?;
        // A blob that does not open (another key, another row's) is no sign-in of ours.
        let plain = key
            .open(Self::place(&hash), &sealed)
            .map_err(|_| SignInError::UnknownState)?;
        serde_json::from_slice(&plain).map_err(|_| SignInError::UnknownState)
    }
}

fn random_token() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// `url` without query or fragment: the resource a server's metadata must name.
fn resource_of(url: &str) -> Result<String, SignInError> {
    let mut parsed = Url::parse(url).map_err(|e| SignInError::Metadata(e.to_string()))?;
    parsed.set_query(None);
    parsed.set_fragment(None);
    Ok(parsed.to_string())
}

/// One `name="value"` (or `name=token`) parameter of a `WWW-Authenticate: Bearer …` header.
pub fn challenge_parameter(header: &str, name: &str) -> Option<String> {
    let rest = header.trim_start();
    let rest = rest
        .get(..6)
        .filter(|scheme| scheme.eq_ignore_ascii_case("bearer"))
        .map(|_| &rest[6..])?;
    let mut chars = rest.char_indices().peekable();
    loop {
        // Skip separators, read a name up to '='.
        while chars.peek().is_some_and(|(_, c)| *c == ' ' || *c == ',') {
            chars.next();
        }
        let (start, _) = *chars.peek()?;
        let mut end = start;
        while let Some(&(i, c)) = chars.peek() {
            if c == '=' {
                break;
            }
            end = i + c.len_utf8();
            chars.next();
        }
        let key = rest[start..end].trim();
        chars.next()?; // '='
        let mut value = String::new();
        if chars.peek().is_some_and(|(_, c)| *c == '"') {
            chars.next();
            let mut escaped = false;
            for (_, c) in chars.by_ref() {
                match (escaped, c) {
                    (false, '\\') => escaped = true,
                    (false, '"') => break,
                    _ => {
                        value.push(c);
                        escaped = false;
                    }
                }
            }
        } else {
            while let Some(&(_, c)) = chars.peek() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
            value = value.trim().to_owned();
        }
        if key.eq_ignore_ascii_case(name) {
            return Some(value);
        }
    }
}

async fn json_of(response: Response, what: &str) -> Result<Value, SignInError> {
    if !response.status.is_success() {
        return Err(SignInError::Metadata(format!(
            "{what} answered {}",
            response.status
        )));
    }
    serde_json::from_slice(&response.body)
        .map_err(|e| SignInError::Metadata(format!("{what} is not JSON: {e}")))
}

fn https_url(value: &Value, what: &str) -> Result<String, SignInError> {
    let text = value
        .as_str()
        .ok_or_else(|| SignInError::Metadata(format!("no {what}")))?;
    let url = Url::parse(text).map_err(|e| SignInError::Metadata(format!("{what}: {e}")))?;
    if url.scheme() != "https" {
        return Err(SignInError::Metadata(format!(
            "{what} {text:?} is not https"
        )));
    }
    Ok(url.to_string())
}

/// The RFC 8414 metadata address of `issuer` (the well-known segment before the issuer's path).
fn metadata_url(issuer: &Url, well_known: &str) -> String {
    let path = issuer.path().trim_end_matches('/');
    let mut url = issuer.clone();
    url.set_path(&format!("/.well-known/{well_known}{path}"));
    url.set_query(None);
    url.to_string()
}

/// An operator-configured client for a provider (see [`crate::connections::store::provider_key`]),
/// pinned to its provider's issuer: it is used only with an authorization server whose
/// discovered metadata names exactly that issuer, at every sign-in and every refresh.
#[derive(Clone)]
pub struct ClientApp {
    /// Its key (`slack`, `google`, a host name).
    pub key: String,
    pub client_id: String,
    pub client_secret: Option<String>,
    /// The issuer it is pinned to; `None` (an app set before apps were pinned) is never used.
    pub issuer: Option<String>,
}

impl ClientApp {
    /// Whether the app is pinned to `issuer` (compared as URLs, so `https://as.example` and
    /// `https://as.example/` are one issuer).
    fn pinned_to(&self, issuer: &str) -> bool {
        let parse = |text: &str| Url::parse(text).ok();
        match (self.issuer.as_deref().and_then(parse), parse(issuer)) {
            (Some(pinned), Some(found)) => pinned == found,
            _ => false,
        }
    }
}

/// The RFC 8414 metadata (else OpenID Connect discovery) of the authorization server
/// `issuer`, read from the issuer's own address; its `issuer` must be `issuer` exactly.
async fn authorization_server(client: &GuardedClient, issuer: &str) -> Result<Value, SignInError> {
    let url = Url::parse(&https_url(&json!(issuer), "authorization server")?)
        .map_err(|e| SignInError::Metadata(e.to_string()))?;
    let mut server = None;
    for well_known in ["oauth-authorization-server", "openid-configuration"] {
        let response = client.get(&metadata_url(&url, well_known)).await?;
        if response.status.is_success() {
            server = Some(json_of(response, "the authorization server's metadata").await?);
            break;
        }
    }
    let server = server.ok_or_else(|| {
        SignInError::Metadata(format!("{issuer} serves no authorization server metadata"))
    })?;
    if server["issuer"].as_str() != Some(issuer) {
        return Err(SignInError::Metadata(format!(
            "the authorization server's metadata names the issuer {}, not {issuer:?}",
            server["issuer"]
        )));
    }
    Ok(server)
}

/// Start a sign-in for `connection` by `user_id`: the authorization URL to open. With `app`, its
/// client is used; else agentd registers by dynamic registration.
pub async fn begin(
    client: &GuardedClient,
    connection: &McpConnection,
    user_id: &str,
    redirect_uri: &str,
    app: Option<ClientApp>,
) -> Result<Started, SignInError> {
    let resource = resource_of(&connection.url)?;
    // 1. The server says where its metadata is, in the 401 to a request without a token.
    let probe = Request::builder()
        .method(Method::POST)
        .uri(&connection.url)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json, text/event-stream")
        .body(Bytes::from(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": crate::connections::remote::PROTOCOL_VERSION, "capabilities": {},
                "clientInfo": {"name": "agentworks-agentd", "version": env!("CARGO_PKG_VERSION")}}})
            .to_string(),
        ))
        .map_err(|e| SignInError::Metadata(e.to_string()))?;
    let answer = client.send(probe).await?;
    if answer.status != StatusCode::UNAUTHORIZED {
        return Err(SignInError::NotNeeded(answer.status));
    }
    let challenge = answer
        .headers
        .get(WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let parsed = Url::parse(&resource).map_err(|e| SignInError::Metadata(e.to_string()))?;
    let metadata_address = match challenge_parameter(&challenge, "resource_metadata") {
        Some(address) => address,
        None => metadata_url(&parsed, "oauth-protected-resource"),
    };
    // 2. The protected resource's metadata: it must be about this URL.
    let resource_metadata = json_of(
        client.get(&metadata_address).await?,
        "the protected-resource metadata",
    )
    .await?;
    let named = resource_metadata["resource"].as_str().unwrap_or_default();
    if resource_of(named).ok().as_deref() != Some(resource.as_str()) {
        return Err(SignInError::Metadata(format!(
            "the protected-resource metadata is about {named:?}, not {resource:?}"
        )));
    }
    let issuer_text = resource_metadata["authorization_servers"][0]
        .as_str()
        .ok_or_else(|| SignInError::Metadata("it names no authorization server".into()))?
        .to_owned();
    let scope = challenge_parameter(&challenge, "scope").or_else(|| {
        resource_metadata["scopes_supported"].as_array().map(|s| {
            s.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
    });
    // 3. The authorization server's metadata (RFC 8414, else OpenID Connect discovery).
    let server = authorization_server(client, &issuer_text).await?;
    let s256 = server["code_challenge_methods_supported"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m == "S256"));
    if !s256 {
        return Err(SignInError::Metadata(
            "the authorization server does not offer PKCE with S256".into(),
        ));
    }
    let authorization_endpoint =
        https_url(&server["authorization_endpoint"], "authorization_endpoint")?;
    let token_endpoint = https_url(&server["token_endpoint"], "token_endpoint")?;
    // 4. The operator's app for this provider, only if it is pinned to exactly this issuer:
    //    a server under the provider's domain that names another authorization server (its
    //    own) never gets the app, nor its secret at the token endpoint it names. Else dynamic
    //    registration with the server itself.
    let (client_id, client_secret, app_key) = match app {
        Some(app) if app.issuer.is_none() => {
            return Err(SignInError::AppNotPinned { key: app.key });
        }
        Some(app) if app.pinned_to(&issuer_text) => {
            (app.client_id, app.client_secret, Some(app.key))
        }
        Some(app) => match register(client, &server, redirect_uri).await {
            Ok((id, secret)) => (id, secret, None),
            Err(SignInError::NeedsClientId { .. }) => {
                return Err(SignInError::AppForAnotherIssuer {
                    pinned: app.issuer.unwrap_or_default(),
                    key: app.key,
                    found: issuer_text,
                });
            }
            Err(error) => return Err(error),
        },
        None => {
            let (id, secret) = register(client, &server, redirect_uri).await?;
            (id, secret, None)
        }
    };
    // 5. The authorization URL, with PKCE and a fresh state.
    let verifier = random_token();
    let state = random_token();
    let mut url =
        Url::parse(&authorization_endpoint).map_err(|e| SignInError::Metadata(e.to_string()))?;
    {
        let mut query = url.query_pairs_mut();
        query
            .append_pair("response_type", "code")
            .append_pair("client_id", &client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair(
                "code_challenge",
                &crate::oauth::pkce::challenge_of(&verifier),
            )
            .append_pair("code_challenge_method", "S256")
            .append_pair("state", &state)
            .append_pair("resource", &resource);
        if let Some(scope) = scope.as_deref().filter(|s| !s.is_empty()) {
            query.append_pair("scope", scope);
        }
    }
    Ok(Started {
        authorization_url: url.to_string(),
        state,
        pending: Pending {
            connection_id: connection.id.clone(),
            project_id: connection.project_id.clone(),
            user_id: user_id.to_owned(),
            verifier,
            redirect_uri: redirect_uri.to_owned(),
            issuer: issuer_text,
            client_id,
            client_secret,
            token_endpoint,
            resource,
            app_key,
        },
    })
}

/// RFC 7591 dynamic registration of agentd as a public client with `redirect_uri`.
async fn register(
    client: &GuardedClient,
    server: &Value,
    redirect_uri: &str,
) -> Result<(String, Option<String>), SignInError> {
    let Some(registration) = server["registration_endpoint"].as_str() else {
        return Err(SignInError::NeedsClientId {
            callback: redirect_uri.to_owned(),
        });
    };
    let registration = https_url(&json!(registration), "registration_endpoint")?;
    let request = json!({
        "client_name": "agentworks",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    });
    let registered = client
        .post(&registration, "application/json", request.to_string())
        .await?;
    if !registered.status.is_success() {
        return Err(SignInError::Refused(format!(
            "registration answered {}: {}",
            registered.status,
            excerpt(&registered.body)
        )));
    }
    let registered = json_of(registered, "the registration").await?;
    let client_id = registered["client_id"]
        .as_str()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| SignInError::Metadata("the registration has no client_id".into()))?
        .to_owned();
    Ok((
        client_id,
        registered["client_secret"].as_str().map(str::to_owned),
    ))
}

fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(300)])
        .chars()
        .filter(|c| !c.is_control())
        .collect()
}

/// One token request: the grant's fields, and the client's own.
async fn token_request(
    client: &GuardedClient,
    token_endpoint: &str,
    client_id: &str,
    client_secret: Option<&str>,
    mut fields: Vec<(&str, &str)>,
) -> Result<Value, SignInError> {
    fields.push(("client_id", client_id));
    if let Some(secret) = client_secret {
        fields.push(("client_secret", secret));
    }
    let body =
        serde_urlencoded::to_string(&fields).map_err(|e| SignInError::Metadata(e.to_string()))?;
    let response = client
        .post(token_endpoint, "application/x-www-form-urlencoded", body)
        .await?;
    if !response.status.is_success() {
        return Err(SignInError::Refused(format!(
            "the token endpoint answered {}: {}",
            response.status,
            excerpt(&response.body)
        )));
    }
    let token: Value = serde_json::from_slice(&response.body)
        .map_err(|e| SignInError::Metadata(format!("the token response is not JSON: {e}")))?;
    let bearer = token["token_type"]
        .as_str()
        .is_some_and(|t| t.eq_ignore_ascii_case("bearer"));
    if !bearer || token["access_token"].as_str().is_none_or(str::is_empty) {
        return Err(SignInError::Metadata(
            "the token response has no Bearer access_token".into(),
        ));
    }
    Ok(token)
}

fn expiry(token: &Value, now_ms: i64) -> Option<i64> {
    token["expires_in"]
        .as_i64()
        .filter(|s| *s > 0)
        .map(|s| now_ms + s.saturating_mul(1000))
}

/// Finish `pending` with the callback's `code` (and `iss`, when sent).
pub async fn finish(
    client: &GuardedClient,
    pending: Pending,
    code: &str,
    iss: Option<&str>,
) -> Result<Credentials, SignInError> {
    if let Some(iss) = iss
        && iss != pending.issuer
    {
        return Err(SignInError::WrongIssuer {
            expected: pending.issuer,
            got: iss.to_owned(),
        });
    }
    let token = token_request(
        client,
        &pending.token_endpoint,
        &pending.client_id,
        pending.client_secret.as_deref(),
        vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &pending.redirect_uri),
            ("code_verifier", &pending.verifier),
            ("resource", &pending.resource),
        ],
    )
    .await?;
    let now = agentworks_support::clock::now_ms();
    Ok(Credentials {
        client_id: pending.client_id,
        client_secret: pending.client_secret,
        token_endpoint: pending.token_endpoint,
        resource: pending.resource,
        access_token: token["access_token"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        refresh_token: token["refresh_token"].as_str().map(str::to_owned),
        expires_at_ms: expiry(&token, now),
        signed_in_by: pending.user_id,
        issuer: Some(pending.issuer),
        app_key: pending.app_key,
    })
}

/// A refresh grant: the new access token, and the new refresh token when the server rotated it
/// (else the old one is kept). A sign-in made with an operator's app (`app`, its current
/// state) is refreshed only while that app is still pinned to the sign-in's issuer, at the
/// token endpoint that issuer's metadata names now, with the app's secret; one made with a
/// secret before apps were pinned is not refreshed at all.
pub async fn refresh(
    client: &GuardedClient,
    credentials: &Credentials,
    app: Option<ClientApp>,
) -> Result<Credentials, SignInError> {
    let Some(refresh_token) = credentials.refresh_token.as_deref() else {
        return Err(SignInError::Refused(
            "the sign-in has expired and the server gave no refresh token; sign in again".into(),
        ));
    };
    let (token_endpoint, client_secret) = match (&credentials.app_key, &credentials.issuer) {
        (Some(key), Some(issuer)) => {
            let changed = || SignInError::AppChanged { key: key.clone() };
            let app = app.filter(|app| &app.key == key).ok_or_else(changed)?;
            if !app.pinned_to(issuer) || app.client_id != credentials.client_id {
                return Err(changed());
            }
            let server = authorization_server(client, issuer).await?;
            let token_endpoint = https_url(&server["token_endpoint"], "token_endpoint")?;
            (token_endpoint, app.client_secret)
        }
        (Some(key), None) => return Err(SignInError::AppChanged { key: key.clone() }),
        (None, None) if credentials.client_secret.is_some() => {
            return Err(SignInError::MadeBeforePinning);
        }
        (None, _) => (
            credentials.token_endpoint.clone(),
            credentials.client_secret.clone(),
        ),
    };
    let token = token_request(
        client,
        &token_endpoint,
        &credentials.client_id,
        client_secret.as_deref(),
        vec![
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
            ("resource", &credentials.resource),
        ],
    )
    .await?;
    let now = agentworks_support::clock::now_ms();
    Ok(Credentials {
        access_token: token["access_token"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        refresh_token: token["refresh_token"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| credentials.refresh_token.clone()),
        expires_at_ms: expiry(&token, now),
        token_endpoint,
        client_secret,
        ..credentials.clone()
    })
}

/// Seal and store a connection's sign-in.
pub async fn store_credentials(
    sealing: Option<&Arc<SealingKey>>,
    store: &ConnectionStore,
    id: &str,
    credentials: &Credentials,
) -> Result<(), ToolError> {
    let key = sealing.ok_or_else(|| {
        ToolError::new(
            "unavailable",
            "sign-ins cannot be stored: agentd's sealing key is unusable (see its log)",
        )
    })?;
    let sealed = credentials
        .seal(key, id)
        .map_err(|e| ToolError::new("unavailable", e.to_string()))?;
    let (store, id) = (store.clone(), id.to_owned());
    let stored = tokio::task::spawn_blocking(move || store.put_credentials(&id, &sealed))
        .await
        .map_err(|e| ToolError::new("unavailable", e.to_string()))?
        .map_err(|e| ToolError::new("unavailable", e.to_string()))?;
    if stored {
        Ok(())
    } else {
        Err(ToolError::new(
            "connection_removed",
            "the connection was removed while signing in",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_parameters_are_read_quoted_or_not_and_by_name_only() {
        let header = r#"Bearer error="invalid_token", error_description="Authentication, \"required\"", resource_metadata="https://x.example/.well-known/oauth-protected-resource/mcp", scope=tools"#;
        assert_eq!(
            challenge_parameter(header, "resource_metadata").as_deref(),
            Some("https://x.example/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            challenge_parameter(header, "scope").as_deref(),
            Some("tools")
        );
        assert_eq!(
            challenge_parameter(header, "error_description").as_deref(),
            Some("Authentication, \"required\"")
        );
        assert_eq!(challenge_parameter(header, "realm"), None);
        assert_eq!(challenge_parameter("Basic realm=\"x\"", "realm"), None);
        assert_eq!(challenge_parameter("Bearer", "scope"), None);
        assert_eq!(challenge_parameter("Bearer scope", "scope"), None);
    }

    #[test]
    fn metadata_addresses_put_the_well_known_segment_before_the_issuers_path() {
        let issuer = Url::parse("https://auth.example/tenant/1").unwrap();
        assert_eq!(
            metadata_url(&issuer, "oauth-authorization-server"),
            "https://auth.example/.well-known/oauth-authorization-server/tenant/1"
        );
        let root = Url::parse("https://auth.example").unwrap();
        assert_eq!(
            metadata_url(&root, "openid-configuration"),
            "https://auth.example/.well-known/openid-configuration"
        );
    }

    #[test]
    fn a_pending_sign_in_is_sealed_under_its_state_and_taken_once_by_who_started_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConnectionStore::open(&dir.path().join("mcp_connections.db")).unwrap();
        let key = SealingKey::load_or_create(dir.path(), None).unwrap();
        let pending = PendingSignIns::new(store.clone());
        let started = Started {
            authorization_url: "https://as.example/authorize".into(),
            state: random_token(),
            pending: Pending {
                connection_id: "mcpc_1".into(),
                project_id: "p".into(),
                user_id: "alice".into(),
                verifier: "the-verifier-0123456789".into(),
                redirect_uri: "http://127.0.0.1/cb".into(),
                issuer: "https://as.example".into(),
                client_id: "c".into(),
                client_secret: Some("the-client-secret".into()),
                token_endpoint: "https://as.example/token".into(),
                resource: "https://mcp.example/mcp".into(),
                app_key: Some("slack".into()),
            },
        };
        pending.insert(&key, &started).unwrap();
        // Neither the state nor a secret is in the store's file in the clear.
        let mut conn = store.db.conn().unwrap();
        let rows: Vec<(String, Vec<u8>)> = crate::db::Sql::query_all(
            &mut conn,
            "SELECT state_hash, sealed FROM mcp_sign_ins",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
        drop(conn);
        assert_eq!(rows.len(), 1);
        assert_ne!(rows[0].0, started.state);
        let blob = String::from_utf8_lossy(&rows[0].1);
        assert!(!blob.contains("the-verifier") && !blob.contains("the-client-secret"));

        std::fs::create_dir(dir.path().join("other")).unwrap();
        let other_key = SealingKey::load_or_create(&dir.path().join("other"), None).unwrap();
        assert!(matches!(
            pending.take(&key, &started.state, "mallory"),
            Err(SignInError::NotYours)
        ));
        assert!(matches!(
            pending.take(&key, "nope", "alice"),
            Err(SignInError::UnknownState)
        ));
        // Sealed under another key (another cluster's): not ours, and used up.
        let again = Started {
            state: random_token(),
            ..started.clone()
        };
        pending.insert(&other_key, &again).unwrap();
        assert!(matches!(
            pending.take(&key, &again.state, "alice"),
            Err(SignInError::UnknownState)
        ));
        let taken = pending.take(&key, &started.state, "alice").unwrap();
        assert_eq!(taken.connection_id, "mcpc_1");
        assert_eq!(taken.verifier, "the-verifier-0123456789");
        assert_eq!(taken.client_secret.as_deref(), Some("the-client-secret"));
        assert!(matches!(
            pending.take(&key, &started.state, "alice"),
            Err(SignInError::UnknownState)
        ));
    }

    #[test]
    fn credentials_never_print_their_tokens() {
        let credentials = Credentials {
            client_id: "c".into(),
            client_secret: Some("secret-1".into()),
            token_endpoint: "https://as.example/token".into(),
            resource: "https://mcp.example/mcp".into(),
            access_token: "at-1".into(),
            refresh_token: Some("rt-1".into()),
            expires_at_ms: Some(1_000_000),
            signed_in_by: "u1".into(),
            issuer: Some("https://as.example".into()),
            app_key: None,
        };
        let shown = format!("{credentials:?}");
        for secret in ["secret-1", "at-1", "rt-1"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(credentials.expiring(1_000_000 - 30_000));
        let dir = tempfile::tempdir().unwrap();
        let key = SealingKey::load_or_create(dir.path(), None).unwrap();
        let blob = credentials.seal(&key, "mcpc_1").unwrap();
        assert!(!blob.windows(4).any(|w| w == b"at-1"));
        assert_eq!(
            Credentials::unseal(&key, "mcpc_1", &blob),
            Some(credentials.clone())
        );
        // Sealed for one connection, it does not open as another's.
        assert_eq!(Credentials::unseal(&key, "mcpc_2", &blob), None);
        assert!(!credentials.expiring(1_000_000 - 120_000));
    }
}
