//! agentd's OAuth 2.1 authorization server for MCP clients: the HTTP endpoints.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /.well-known/oauth-authorization-server` | RFC 8414 metadata |
//! | `POST /register` (JSON) | RFC 7591: 201 with `client_id` (and `client_secret` for a confidential client) |
//! | `GET /oauth/authorize?…` | 303 to the consent page; errors per RFC 6749 §4.1.2.1 |
//! | `GET /oauth/consent?request=…` | the consent page (console HTML; its API is [`crate::console::oauth_consent`]) |
//! | `POST /oauth/token` (form) | `authorization_code` and `refresh_token` grants |
//! | `POST /oauth/revoke` (form) | RFC 7009: 200 whatever the token was |
//!
//! The authorization endpoint checks the client and the redirect URI first: while either is
//! unknown nothing is redirected (the error is a page here, so agentd is never an open
//! redirector). Then `response_type=code`, a PKCE S256 `code_challenge`, `state` and
//! `resource` (this server's `/mcp`, RFC 8707) are required; their errors go back to the
//! client's redirect URI with `state` and `iss` (RFC 9207). The request waits in the identity
//! store ([`PENDING_TTL_MS`]; `identity::authorization_requests`, so in a cluster any host
//! shows and decides it) for the person's decision on the consent page. The endpoint is
//! anonymous, so what waits is bounded per client ([`MAX_PENDING_PER_CLIENT`]) and per source
//! address ([`MAX_PENDING_PER_ADDRESS`]), with [`MAX_PENDING`] in all only as the last resort:
//! one address flooding it fills its own share and no one else's.
//!
//! A `client_id` that is an https URL is a Client ID Metadata Document, fetched through the
//! [`GuardedClient`] (no loopback, private, link-local or metadata address, no proxy, no
//! redirect), at most [`MAX_METADATA_FETCHES_PER_ADDRESS`] times per source address in 15
//! minutes. Whatever the fetch came to, the page says only that the document could not be
//! used (the details go to agentd's log): agentd never tells an anonymous client what an
//! address it chose answered. Any other `client_id` must be a live registration.

use crate::identity::IdentityStore;
use crate::identity::authority::Scope;
use crate::identity::authorization_requests::{Decision, PendingLimits, PendingRefusal};
use crate::identity::oauth::{IssuedTokens, RegisteredClient};
use crate::identity::store::now_ms;
use crate::oauth::client_metadata::{self, TokenEndpointAuthMethod};
use crate::oauth::metadata::AuthorizationServerMetadata;
use crate::oauth::{OAuthError, pkce, redirect, scopes};
use agentworks_daemon::ipc::envelope::{Body, full, json_response};
use agentworks_support::outbound::GuardedClient;
use base64::Engine;
use hyper::header::{
    ALLOW, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, HeaderValue, LOCATION, PRAGMA,
    WWW_AUTHENTICATE,
};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

/// The paths served here.
pub const METADATA_PATH: &str = "/.well-known/oauth-authorization-server";
pub const REGISTER_PATH: &str = "/register";
pub const AUTHORIZE_PATH: &str = "/oauth/authorize";
pub const CONSENT_PATH: &str = "/oauth/consent";
pub const TOKEN_PATH: &str = "/oauth/token";
pub const REVOKE_PATH: &str = "/oauth/revoke";

/// Authorization requests waiting at once in all, decided ones included: the last resort,
/// after the per-client and per-address bounds.
pub const MAX_PENDING: i64 = 1_000;
/// Undecided authorization requests one client may have waiting.
pub const MAX_PENDING_PER_CLIENT: i64 = 100;
/// Undecided authorization requests one source address (its bucket: an IPv4 address, an IPv6
/// /64) may have waiting.
pub const MAX_PENDING_PER_ADDRESS: i64 = 20;
/// Client metadata documents fetched for one source address in the failure window (15
/// minutes); each authorization request naming one fetches it.
pub const MAX_METADATA_FETCHES_PER_ADDRESS: usize = 30;
/// How long a person has to decide: 10 minutes.
pub const PENDING_TTL_MS: i64 = 10 * 60_000;
/// Registrations per client address in the failure window (15 minutes).
pub const MAX_REGISTRATIONS_PER_ADDRESS: usize = 10;
/// Registrations no grant has used yet, at most; more wait until unused ones expire.
pub const MAX_UNUSED_REGISTRATIONS: usize = 1_000;
/// The scope an authorization request without `scope` asks for: the least one.
pub const DEFAULT_SCOPE: Scope = Scope::WorkflowsRead;

/// An authorization request waiting on the consent page.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Pending {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uri: String,
    pub scopes: Vec<Scope>,
    pub state: String,
    pub code_challenge: String,
    pub resource: String,
    pub created_at_ms: i64,
}

/// Why a pending request cannot be decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeError {
    NotFound,
    AlreadyDecided,
    /// The identity store could not be read or written.
    Unavailable(String),
}

impl Pending {
    /// The redirect URI's `host[:port]`, as the consent page shows it.
    pub fn redirect_host(&self) -> String {
        url::Url::parse(&self.redirect_uri)
            .ok()
            .and_then(|u| {
                let host = u.host_str()?.to_owned();
                Some(match u.port() {
                    Some(port) => format!("{host}:{port}"),
                    None => host,
                })
            })
            .unwrap_or_default()
    }
}

/// The authorization server. Cheap to clone.
#[derive(Clone)]
pub struct AuthorizationServer {
    inner: Arc<Inner>,
}

struct Inner {
    identity: IdentityStore,
    issuer: String,
    /// The port of a loopback listener, whose `localhost`, `127.0.0.1` and `[::1]` names
    /// all name `/mcp` (as they name its origin).
    loopback_port: Option<u16>,
    outbound: Option<GuardedClient>,
    registrations: crate::identity::attempt_limits::FailureLimits,
}

impl AuthorizationServer {
    /// The server whose issuer is `public_url`; `outbound` fetches client metadata documents
    /// (`None`: such clients are refused, say because TLS roots could not be loaded).
    pub fn new(
        identity: IdentityStore,
        public_url: &str,
        loopback_port: Option<u16>,
        outbound: Option<GuardedClient>,
    ) -> AuthorizationServer {
        AuthorizationServer {
            inner: Arc::new(Inner {
                registrations: crate::identity::attempt_limits::FailureLimits::new(
                    identity.clone(),
                ),
                identity,
                issuer: public_url.trim_end_matches('/').to_owned(),
                loopback_port,
                outbound,
            }),
        }
    }

    pub fn issuer(&self) -> &str {
        &self.inner.issuer
    }

    /// The resource tokens are issued for: `/mcp`.
    pub fn resource(&self) -> String {
        format!("{}/mcp", self.inner.issuer)
    }

    /// Whether a `resource` parameter names `/mcp`: its URL exactly, or on a loopback
    /// listener the same port under another loopback name.
    pub fn is_this_resource(&self, asked: &str) -> bool {
        if asked == self.resource() {
            return true;
        }
        let Some(port) = self.inner.loopback_port else {
            return false;
        };
        let own_scheme = self.inner.issuer.split("://").next().unwrap_or("http");
        ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .any(|host| asked == format!("{own_scheme}://{host}:{port}/mcp"))
    }

    pub fn identity(&self) -> &IdentityStore {
        &self.inner.identity
    }

    /// A pending request that has not expired or been decided; `None` too when the store
    /// cannot be read (logged).
    pub async fn pending(&self, id: &str, now: i64) -> Option<Pending> {
        let (identity, id) = (self.inner.identity.clone(), id.to_owned());
        let found = tokio::task::spawn_blocking(move || {
            identity.authorization_request(&id, now, PENDING_TTL_MS)
        })
        .await;
        match found {
            Ok(Ok(found)) => found.and_then(|request| serde_json::from_str(&request).ok()),
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot read an authorization request");
                None
            }
            Err(_) => None,
        }
    }

    /// Take a pending request to decide it: it can be decided once, on any host.
    pub async fn take_pending(&self, id: &str, now: i64) -> Result<Pending, TakeError> {
        let (identity, id) = (self.inner.identity.clone(), id.to_owned());
        let decided = tokio::task::spawn_blocking(move || {
            identity.decide_authorization_request(&id, now, PENDING_TTL_MS)
        })
        .await
        .map_err(|error| TakeError::Unavailable(error.to_string()))?
        .map_err(|error| TakeError::Unavailable(error.to_string()))?;
        match decided {
            Decision::Taken(request) => serde_json::from_str(&request)
                .map_err(|error| TakeError::Unavailable(error.to_string())),
            Decision::AlreadyDecided => Err(TakeError::AlreadyDecided),
            Decision::NotFound => Err(TakeError::NotFound),
        }
    }

    /// The redirect that ends an authorization: `params` and `state` and `iss` (RFC 9207)
    /// added to the client's redirect URI, its own query kept.
    pub fn redirect_url(&self, pending: &Pending, params: &[(&str, &str)]) -> String {
        finish_redirect(&pending.redirect_uri, params, &pending.state, self.issuer())
    }

    /// Serves the paths above, or `None` for any other path.
    pub async fn handle(
        &self,
        parts: &Parts,
        body: &[u8],
        client_address: Option<std::net::IpAddr>,
    ) -> Option<Response<Body>> {
        let path = parts.uri.path();
        let expect = |method: Method, allow: &'static str| {
            (parts.method != method && !(method == Method::GET && parts.method == Method::HEAD))
                .then(|| method_not_allowed(allow))
        };
        Some(match path {
            METADATA_PATH => expect(Method::GET, "GET, HEAD").unwrap_or_else(|| {
                let mut response = json_response(
                    StatusCode::OK,
                    &AuthorizationServerMetadata::new(self.issuer()),
                );
                response
                    .headers_mut()
                    .insert(CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
                response
            }),
            REGISTER_PATH => match expect(Method::POST, "POST") {
                Some(refused) => refused,
                None => self.register(body, client_address).await,
            },
            AUTHORIZE_PATH => match expect(Method::GET, "GET, HEAD") {
                Some(refused) => refused,
                None => {
                    self.authorize(parts.uri.query().unwrap_or(""), client_address)
                        .await
                }
            },
            CONSENT_PATH => expect(Method::GET, "GET, HEAD").unwrap_or_else(|| {
                crate::console::assets::page(crate::console::assets::OAUTH_CONSENT_HTML)
            }),
            TOKEN_PATH => match expect(Method::POST, "POST") {
                Some(refused) => refused,
                None => no_store(self.token(parts, body).await),
            },
            REVOKE_PATH => match expect(Method::POST, "POST") {
                Some(refused) => refused,
                None => no_store(self.revoke(parts, body).await),
            },
            _ => return None,
        })
    }

    // ----- /register -----

    async fn register(&self, body: &[u8], address: Option<std::net::IpAddr>) -> Response<Body> {
        let metadata = match client_metadata::parse_registration(body) {
            Ok(metadata) => metadata,
            Err(error) => return oauth_error(StatusCode::BAD_REQUEST, &error),
        };
        let now = now_ms();
        let key = format!("register:{}", bucket(address));
        match self
            .inner
            .registrations
            .begin(&[(&key, MAX_REGISTRATIONS_PER_ADDRESS)], now)
            .await
        {
            // A registration counts whether or not it is stored: it is never uncounted.
            Ok(_) => {}
            Err(crate::identity::attempt_limits::Limited::Wait(wait_s)) => {
                return too_many(wait_s, "too many registrations from this address");
            }
            Err(crate::identity::attempt_limits::Limited::Unavailable(error)) => {
                tracing::warn!(%error, "cannot count a registration; refused");
                return server_error();
            }
        }
        let identity = self.inner.identity.clone();
        let stored = tokio::task::spawn_blocking(move || {
            if identity.sweep_clients(now)? >= MAX_UNUSED_REGISTRATIONS {
                return Ok(None);
            }
            identity.register_client(&metadata, now).map(Some)
        })
        .await;
        let (client, secret) = match stored {
            Ok(Ok(Some(registered))) => registered,
            Ok(Ok(None)) => {
                return too_many(
                    3600,
                    "too many registrations are waiting to be used; try again later",
                );
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot store a client registration");
                return server_error();
            }
            Err(_) => return server_error(),
        };
        let mut answer = json!({
            "client_id": client.id,
            "client_id_issued_at": client.created_at_ms / 1000,
            "redirect_uris": client.redirect_uris,
            "token_endpoint_auth_method": client.auth_method.as_str(),
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        });
        if let Some(name) = &client.name {
            answer["client_name"] = json!(name);
        }
        if let Some(secret) = secret {
            answer["client_secret"] = json!(secret);
            answer["client_secret_expires_at"] = json!(0);
        }
        no_store(json_response(StatusCode::CREATED, &answer))
    }

    // ----- /oauth/authorize -----

    async fn authorize(&self, query: &str, address: Option<std::net::IpAddr>) -> Response<Body> {
        let address = bucket(address);
        let params = match single_params(query.as_bytes()) {
            Ok(params) => params,
            Err(error) => return error_page(&error),
        };
        let get = |name: &str| params.get(name).map(String::as_str);
        let Some(client_id) = get("client_id").filter(|id| !id.is_empty()) else {
            return error_page(&OAuthError::InvalidRequest("client_id is missing".into()));
        };
        let client = match self.client(client_id, &address).await {
            Ok(client) => client,
            Err(ClientRefusal::Refused(error)) => return error_page(&error),
            Err(ClientRefusal::TooMany(wait_s)) => {
                return too_many_page(
                    wait_s,
                    "too many client metadata documents were fetched for this address",
                );
            }
        };
        let redirect_uri = match get("redirect_uri") {
            Some(uri) => match redirect::find_match(uri, &client.redirect_uris) {
                // The requested spelling (with its loopback port) is where the code goes.
                Ok(_) => uri.to_owned(),
                Err(error) => return error_page(&error),
            },
            None if client.redirect_uris.len() == 1 => client.redirect_uris[0].clone(),
            None => {
                return error_page(&OAuthError::InvalidRequest(
                    "redirect_uri is missing and the client registered more than one".into(),
                ));
            }
        };
        let state = get("state").unwrap_or("");
        let back = |error: OAuthError| {
            see_other(&finish_redirect(
                &redirect_uri,
                &[
                    ("error", error.code()),
                    ("error_description", error.description()),
                ],
                state,
                self.issuer(),
            ))
        };
        match get("response_type") {
            Some("code") => {}
            Some(other) => {
                return back(OAuthError::UnsupportedResponseType(format!(
                    "response_type {other:?} is not supported; use code"
                )));
            }
            None => {
                return back(OAuthError::InvalidRequest(
                    "response_type is missing".into(),
                ));
            }
        }
        if state.is_empty() {
            return back(OAuthError::InvalidRequest(
                "state is missing; this server requires it".into(),
            ));
        }
        if let Err(error) = pkce::check_method(get("code_challenge_method")) {
            return back(error);
        }
        let Some(challenge) = get("code_challenge") else {
            return back(OAuthError::InvalidRequest(
                "code_challenge is missing; PKCE with S256 is required".into(),
            ));
        };
        if let Err(error) = pkce::check_challenge(challenge) {
            return back(error);
        }
        let resource = self.resource();
        match get("resource") {
            Some(asked) if self.is_this_resource(asked) => {}
            Some(asked) => {
                return back(OAuthError::InvalidTarget(format!(
                    "resource {asked:?} is not served here; use {resource}"
                )));
            }
            None => {
                return back(OAuthError::InvalidRequest(format!(
                    "resource is missing; send resource={resource} (RFC 8707)"
                )));
            }
        }
        let asked = match get("scope") {
            Some(raw) => match scopes::parse(raw) {
                Ok(asked) => asked,
                Err(error) => return back(error),
            },
            None => vec![DEFAULT_SCOPE],
        };
        let now = now_ms();
        let pending = Pending {
            client_id: client_id.to_owned(),
            client_name: client.name.clone().unwrap_or_else(|| client_id.to_owned()),
            redirect_uri: redirect_uri.clone(),
            scopes: asked,
            state: state.to_owned(),
            code_challenge: challenge.to_owned(),
            resource,
            created_at_ms: now,
        };
        let id = hex::encode(rand::random::<[u8; 16]>());
        let (identity, kept_id) = (self.inner.identity.clone(), id.clone());
        let client_key = client_id.to_owned();
        let kept = tokio::task::spawn_blocking(move || {
            let request = serde_json::to_string(&pending).map_err(|e| e.to_string())?;
            let limits = PendingLimits {
                per_client: MAX_PENDING_PER_CLIENT,
                per_address: MAX_PENDING_PER_ADDRESS,
                total: MAX_PENDING,
            };
            identity
                .put_authorization_request(
                    &kept_id,
                    &request,
                    &client_key,
                    &address,
                    now,
                    PENDING_TTL_MS,
                    limits,
                )
                .map_err(|e| e.to_string())
        })
        .await;
        match kept {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(refused))) => {
                let who = match refused {
                    PendingRefusal::Address => "from this address",
                    PendingRefusal::Client => "for this app",
                    PendingRefusal::Total => "on this server",
                };
                return back(OAuthError::TemporarilyUnavailable(format!(
                    "too many authorization requests {who} are waiting; finish or abandon them, or try again in a few minutes"
                )));
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot keep an authorization request");
                return back(OAuthError::TemporarilyUnavailable(
                    "the authorization request cannot be kept now; try again shortly".into(),
                ));
            }
            Err(_) => return server_error(),
        }
        see_other(&format!("{CONSENT_PATH}?request={id}"))
    }

    /// The client a `client_id` names: a metadata document (https URL, fetched at most
    /// [`MAX_METADATA_FETCHES_PER_ADDRESS`] times for `address`) or a registration.
    async fn client(&self, client_id: &str, address: &str) -> Result<ClientInfo, ClientRefusal> {
        if client_id.starts_with("https:") {
            client_metadata::check_client_id_url(client_id)?;
            let Some(outbound) = &self.inner.outbound else {
                return Err(OAuthError::InvalidClient(
                    "client metadata documents cannot be fetched by this server".into(),
                )
                .into());
            };
            // Every fetch counts (it is never uncounted): an address cannot make agentd
            // fetch documents without end.
            let key = format!("client-metadata:{address}");
            let limit = [(key.as_str(), MAX_METADATA_FETCHES_PER_ADDRESS)];
            match self.inner.registrations.begin(&limit, now_ms()).await {
                Ok(_) => {}
                Err(crate::identity::attempt_limits::Limited::Wait(wait_s)) => {
                    return Err(ClientRefusal::TooMany(wait_s));
                }
                Err(crate::identity::attempt_limits::Limited::Unavailable(error)) => {
                    tracing::warn!(%error, "cannot count a client metadata fetch; refused");
                    return Err(OAuthError::TemporarilyUnavailable(
                        "the authorization server cannot fetch client metadata now".into(),
                    )
                    .into());
                }
            }
            // What the address answered (a status, an error, a body) stays in the log: the
            // page only says the document could not be used.
            let unusable = |why: String| {
                tracing::info!(client_id, %why, "a client metadata document could not be used");
                ClientRefusal::Refused(OAuthError::InvalidClient(format!(
                    "the client metadata document at {client_id} could not be used"
                )))
            };
            let fetched = outbound
                .get(client_id)
                .await
                .map_err(|error| unusable(error.to_string()))?;
            if fetched.status != StatusCode::OK {
                return Err(unusable(format!("it answered {}", fetched.status)));
            }
            let document = client_metadata::parse_document(&fetched.body, client_id)
                .map_err(|error| unusable(error.to_string()))?;
            return Ok(ClientInfo {
                name: document.client_name,
                redirect_uris: document.redirect_uris,
            });
        }
        let registered = self.registered(client_id).await?;
        Ok(ClientInfo {
            name: registered.name,
            redirect_uris: registered.redirect_uris,
        })
    }

    async fn registered(&self, client_id: &str) -> Result<RegisteredClient, OAuthError> {
        let identity = self.inner.identity.clone();
        let id = client_id.to_owned();
        match tokio::task::spawn_blocking(move || identity.registered_client(&id, now_ms())).await {
            Ok(Ok(Some(client))) => Ok(client),
            Ok(Ok(None)) => Err(OAuthError::InvalidClient(format!(
                "client_id {client_id:?} is not registered here (or its registration expired unused)"
            ))),
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot read a client registration");
                Err(OAuthError::ServerError(
                    "the client store is unavailable".into(),
                ))
            }
            Err(_) => Err(OAuthError::ServerError("the client lookup failed".into())),
        }
    }

    // ----- /oauth/token -----

    async fn token(&self, parts: &Parts, body: &[u8]) -> Response<Body> {
        let params = match single_params(body) {
            Ok(params) => params,
            Err(error) => return oauth_error(StatusCode::BAD_REQUEST, &error),
        };
        let client_id = match self.authenticate_client(parts, &params).await {
            Ok(client_id) => client_id,
            Err(refused) => return refused,
        };
        let get = |name: &str| params.get(name).map(String::as_str);
        if let Some(asked) = get("resource")
            && !self.is_this_resource(asked)
        {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                &OAuthError::InvalidTarget(format!(
                    "resource {asked:?} is not served here; use {}",
                    self.resource()
                )),
            );
        }
        let identity = self.inner.identity.clone();
        let outcome: Result<IssuedTokens, OAuthError> = match get("grant_type") {
            Some("authorization_code") => {
                let (Some(code), Some(verifier)) = (get("code"), get("code_verifier")) else {
                    return oauth_error(
                        StatusCode::BAD_REQUEST,
                        &OAuthError::InvalidRequest("code and code_verifier are required".into()),
                    );
                };
                let Some(redirect_uri) = get("redirect_uri") else {
                    return oauth_error(
                        StatusCode::BAD_REQUEST,
                        &OAuthError::InvalidRequest("redirect_uri is required".into()),
                    );
                };
                if let Err(error) = pkce::check_verifier(verifier) {
                    return oauth_error(StatusCode::BAD_REQUEST, &error);
                }
                let (code, verifier, redirect_uri) = (
                    code.to_owned(),
                    verifier.to_owned(),
                    redirect_uri.to_owned(),
                );
                run(move || {
                    identity.exchange_code(&code, &client_id, &redirect_uri, &verifier, now_ms())
                })
                .await
            }
            Some("refresh_token") => {
                let Some(refresh) = get("refresh_token") else {
                    return oauth_error(
                        StatusCode::BAD_REQUEST,
                        &OAuthError::InvalidRequest("refresh_token is required".into()),
                    );
                };
                let asked = match get("scope").map(scopes::parse).transpose() {
                    Ok(asked) => asked,
                    Err(error) => return oauth_error(StatusCode::BAD_REQUEST, &error),
                };
                let refresh = refresh.to_owned();
                run(move || identity.refresh(&refresh, &client_id, asked.as_deref(), now_ms()))
                    .await
            }
            Some(other) => Err(OAuthError::UnsupportedGrantType(format!(
                "grant_type {other:?} is not supported; use authorization_code or refresh_token"
            ))),
            None => Err(OAuthError::InvalidRequest("grant_type is missing".into())),
        };
        match outcome {
            Ok(issued) => json_response(
                StatusCode::OK,
                &json!({
                    "access_token": issued.access_token,
                    "token_type": "Bearer",
                    "expires_in": issued.expires_in_s,
                    "refresh_token": issued.refresh_token,
                    "scope": scopes::format(&issued.scopes),
                }),
            ),
            Err(error @ OAuthError::ServerError(_)) => {
                oauth_error(StatusCode::INTERNAL_SERVER_ERROR, &error)
            }
            Err(error) => oauth_error(StatusCode::BAD_REQUEST, &error),
        }
    }

    /// Who is calling the token or revocation endpoint (RFC 6749 §2.3): a confidential
    /// client by its secret (`client_secret_basic` or `_post`), a public one by its
    /// `client_id` alone. The refusal is the 401 `invalid_client` answer.
    async fn authenticate_client(
        &self,
        parts: &Parts,
        params: &HashMap<String, String>,
    ) -> Result<String, Response<Body>> {
        let basic = match parts.headers.get(AUTHORIZATION) {
            Some(value) => match basic_credentials(value) {
                Some(credentials) => Some(credentials),
                None => {
                    return Err(invalid_client(
                        "the Authorization header is not HTTP Basic client credentials",
                        true,
                    ));
                }
            },
            None => None,
        };
        let form_id = params.get("client_id").cloned();
        let form_secret = params.get("client_secret").cloned();
        let (client_id, secret, used_basic) = match (basic, form_id) {
            (Some((id, _)), Some(form)) if form != id => {
                return Err(invalid_client(
                    "client_id differs from the Authorization header's",
                    true,
                ));
            }
            (Some(_), _) if form_secret.is_some() => {
                return Err(invalid_client(
                    "use one client authentication method, not two",
                    true,
                ));
            }
            (Some((id, secret)), _) => (id, Some(secret), true),
            (None, Some(id)) => (id, form_secret, false),
            (None, None) => {
                return Err(invalid_client("client_id is missing", false));
            }
        };
        if client_id.starts_with("https:") {
            // A metadata-document client is public: it has no secret to present.
            if secret.is_some() {
                return Err(invalid_client(
                    "a client metadata document client is public and has no secret",
                    used_basic,
                ));
            }
            return Ok(client_id);
        }
        let client = self
            .registered(&client_id)
            .await
            .map_err(|error| invalid_client(error.description(), used_basic))?;
        match (client.auth_method, secret) {
            (TokenEndpointAuthMethod::None, None) => Ok(client_id),
            (TokenEndpointAuthMethod::None, Some(_)) => Err(invalid_client(
                "this client registered as public (none) and has no secret",
                used_basic,
            )),
            (_, Some(secret)) if client.secret_matches(&secret) => Ok(client_id),
            (_, Some(_)) => Err(invalid_client("the client secret is wrong", used_basic)),
            (_, None) => Err(invalid_client(
                "this client is confidential: authenticate with its client_secret",
                used_basic,
            )),
        }
    }

    // ----- /oauth/revoke -----

    async fn revoke(&self, parts: &Parts, body: &[u8]) -> Response<Body> {
        let params = match single_params(body) {
            Ok(params) => params,
            Err(error) => return oauth_error(StatusCode::BAD_REQUEST, &error),
        };
        let client_id = match self.authenticate_client(parts, &params).await {
            Ok(client_id) => client_id,
            Err(refused) => return refused,
        };
        let Some(token) = params.get("token").cloned() else {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                &OAuthError::InvalidRequest("token is required".into()),
            );
        };
        let identity = self.inner.identity.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            identity.revoke_presented(&token, &client_id, now_ms())
        })
        .await;
        match outcome {
            Ok(Ok(())) => {
                let mut response = Response::new(full(""));
                *response.status_mut() = StatusCode::OK;
                response
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot revoke a token");
                server_error()
            }
            Err(_) => server_error(),
        }
    }
}

/// What the authorization endpoint needs of a client.
struct ClientInfo {
    name: Option<String>,
    redirect_uris: Vec<String>,
}

/// Why the authorization endpoint has no client to go on.
enum ClientRefusal {
    /// The client is unknown or unusable: the error page says why.
    Refused(OAuthError),
    /// This address fetched too many metadata documents: wait this many seconds.
    TooMany(i64),
}

impl From<OAuthError> for ClientRefusal {
    fn from(error: OAuthError) -> ClientRefusal {
        ClientRefusal::Refused(error)
    }
}

/// The bucket limits count a client address under ([`crate::identity::attempt_limits::ClientAddress`]).
fn bucket(address: Option<std::net::IpAddr>) -> String {
    address.map_or_else(
        || "unknown".into(),
        |ip| crate::identity::attempt_limits::ClientAddress(ip).bucket(),
    )
}

async fn run<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, OAuthError> + Send + 'static,
) -> Result<T, OAuthError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|_| Err(OAuthError::ServerError("the token request failed".into())))
}

/// Form or query parameters, each at most once (RFC 6749 §3.1, §3.2: "MUST NOT be included
/// more than once"); an empty value counts as absent.
fn single_params(raw: &[u8]) -> Result<HashMap<String, String>, OAuthError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(raw)
        .map_err(|_| OAuthError::InvalidRequest("the parameters do not parse".into()))?;
    let mut params = HashMap::new();
    for (name, value) in pairs {
        if params.contains_key(&name) {
            return Err(OAuthError::InvalidRequest(format!(
                "the parameter {name} is sent more than once"
            )));
        }
        if !value.is_empty() {
            params.insert(name, value);
        }
    }
    Ok(params)
}

/// `client_secret_basic` credentials: both parts form-urlencoded (RFC 6749 §2.3.1).
fn basic_credentials(value: &HeaderValue) -> Option<(String, String)> {
    let encoded = value.to_str().ok()?.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    let unescape = |s: &str| {
        url::form_urlencoded::parse(format!("v={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
    };
    Some((unescape(id)?, unescape(secret)?))
}

/// `redirect_uri` with `params`, `state` (when there is one) and `iss` added to its query.
fn finish_redirect(redirect_uri: &str, params: &[(&str, &str)], state: &str, iss: &str) -> String {
    let Ok(mut url) = url::Url::parse(redirect_uri) else {
        return redirect_uri.to_owned();
    };
    {
        let mut query = url.query_pairs_mut();
        for (name, value) in params {
            query.append_pair(name, value);
        }
        if !state.is_empty() {
            query.append_pair("state", state);
        }
        query.append_pair("iss", iss);
    }
    url.into()
}

fn see_other(location: &str) -> Response<Body> {
    let mut response = Response::new(full(""));
    *response.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(LOCATION, value);
    }
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    crate::console::assets::add_security_headers(&mut response);
    response
}

/// The OAuth error answer: `{error, error_description}`.
pub fn oauth_error(status: StatusCode, error: &OAuthError) -> Response<Body> {
    super::answer::oauth_error(status, error.code(), error.description())
}

fn invalid_client(description: &str, used_basic: bool) -> Response<Body> {
    let mut response = oauth_error(
        StatusCode::UNAUTHORIZED,
        &OAuthError::InvalidClient(description.into()),
    );
    let challenge = if used_basic {
        "Basic realm=\"agentworks\""
    } else {
        "Bearer realm=\"agentworks\""
    };
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    no_store(response)
}

fn server_error() -> Response<Body> {
    oauth_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        &OAuthError::ServerError("the authorization server failed; see agentd's log".into()),
    )
}

fn too_many(wait_s: i64, why: &str) -> Response<Body> {
    let mut response = oauth_error(
        StatusCode::TOO_MANY_REQUESTS,
        &OAuthError::TemporarilyUnavailable(format!("{why}; try again in {wait_s} s")),
    );
    if let Ok(value) = HeaderValue::from_str(&wait_s.to_string()) {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, value);
    }
    response
}

fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut response = oauth_error(
        StatusCode::METHOD_NOT_ALLOWED,
        &OAuthError::InvalidRequest(format!("use {allow}")),
    );
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    response
}

fn no_store(mut response: Response<Body>) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(PRAGMA, HeaderValue::from_static("no-cache"));
    response
}

/// [`error_page`] answered 429 with `Retry-After`: the client cannot be looked up now.
fn too_many_page(wait_s: i64, why: &str) -> Response<Body> {
    let mut response = error_page(&OAuthError::TemporarilyUnavailable(format!(
        "{why}; try again in {wait_s} s"
    )));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    if let Ok(value) = HeaderValue::from_str(&wait_s.max(1).to_string()) {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, value);
    }
    response
}

/// The page for an authorization error that cannot go back to the client (RFC 6749
/// §4.1.2.1: an unknown client or redirect URI), with the console's headers.
fn error_page(error: &OAuthError) -> Response<Body> {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign-in refused · agentworks</title>\
         <link rel=\"stylesheet\" href=\"/console/assets/style.css\"></head><body><main class=\"card\">\
         <h1>This app's sign-in request was refused</h1><p>{}</p><p><code>{}</code></p>\
         <p>Nothing was shared. Tell the app's maintainer, or connect it with a personal access token.</p>\
         </main></body></html>\n",
        escape_html(error.description()),
        error.code()
    );
    let mut response = Response::new(full(html));
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    crate::console::assets::add_security_headers(&mut response);
    no_store(response)
}

/// Text for an HTML element's content.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_single_and_empty_ones_absent() {
        let params = single_params(b"a=1&b=&c=x%20y").unwrap();
        assert_eq!(params.get("a").map(String::as_str), Some("1"));
        assert_eq!(params.get("b"), None);
        assert_eq!(params.get("c").map(String::as_str), Some("x y"));
        let twice = single_params(b"state=1&state=2").unwrap_err();
        assert_eq!(twice.code(), "invalid_request");
    }

    #[test]
    fn the_redirect_keeps_its_query_and_carries_state_and_iss() {
        let url = finish_redirect(
            "http://127.0.0.1:5000/cb?keep=1",
            &[("code", "abc")],
            "s t&",
            "http://h:1",
        );
        assert_eq!(
            url,
            "http://127.0.0.1:5000/cb?keep=1&code=abc&state=s+t%26&iss=http%3A%2F%2Fh%3A1"
        );
        let without_state = finish_redirect("https://a.example/cb", &[], "", "https://i");
        assert_eq!(without_state, "https://a.example/cb?iss=https%3A%2F%2Fi");
    }

    #[test]
    fn basic_credentials_are_form_decoded() {
        let value = HeaderValue::from_str(&format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("cli%3Aa:s%2Bb")
        ))
        .unwrap();
        assert_eq!(
            basic_credentials(&value),
            Some(("cli:a".into(), "s+b".into()))
        );
        assert_eq!(
            basic_credentials(&HeaderValue::from_static("Bearer x")),
            None
        );
    }

    #[test]
    fn the_error_page_escapes_what_it_shows() {
        assert_eq!(
            escape_html("<script>\"'&"),
            "&lt;script&gt;&quot;&#39;&amp;"
        );
    }
}
