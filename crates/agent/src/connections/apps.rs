//! The operator's sign-in apps for MCP servers without dynamic registration, on agentd's
//! socket (operator peers only, see [`crate::admin`]):
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/admin/mcp-apps` | `{apps: [app]}` |
//! | `GET /v1/admin/mcp-apps/{key}` | the app |
//! | `PUT /v1/admin/mcp-apps/{key} {client_id, client_secret?, issuer}` | the app, set or replaced |
//! | `DELETE /v1/admin/mcp-apps/{key}` | `{removed: key}` |
//!
//! An app is `{key, client_id, has_secret, issuer, callback_url, updated_at_ms}`: the client
//! secret is sealed ([`crate::connections::sealed`], bound to the app's key) before it is stored and never
//! answered; `callback_url` is what the operator registers with the provider. Every Google
//! server uses the `google` app, GitHub's `github`, Slack's `slack`, any other server its host
//! ([`crate::connections::store::provider_key`]); but the key only finds the app: `issuer` (the
//! provider's OAuth issuer, an https URL, required) pins it, and a sign-in or a refresh uses it
//! only with an authorization server whose metadata names exactly that issuer
//! ([`crate::connections::sign_in`]), so `evil.slack.com` never gets Slack's app. An app stored before
//! apps were pinned has no issuer and is never used until it is set again.

use crate::connections::sealed::SealingKey;
use crate::connections::sign_in::CALLBACK_PATH;
use crate::connections::sign_in::ClientApp;
use crate::connections::store::{ConnectionStore, ConnectionStoreError, StoredApp};
use agentworks_daemon::ipc::envelope::{Body, Refusal, decode_json, json_response, run_blocking};
use bytes::Bytes;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;

/// The operator's sign-in apps: the store, the key their secrets are sealed with, and the
/// callback URL every provider is told.
#[derive(Clone)]
pub struct McpApps {
    pub store: ConnectionStore,
    pub sealing: Option<Arc<SealingKey>>,
    pub public_url: String,
}

/// Where an operator sign-in app's secret is sealed: the apps store, the app's key.
pub fn app_place(key: &str) -> crate::connections::sealed::Place<'_> {
    crate::connections::sealed::Place {
        store: "mcp_apps",
        path: key,
    }
}

fn store_error(error: ConnectionStoreError) -> Refusal {
    tracing::error!(%error, "MCP connection store failed");
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("{error}; try again shortly"),
    )
}

/// An app's key: what [`crate::connections::store::provider_key`] can make (a host name, an
/// address, or a provider's name).
fn check_key(key: &str) -> Result<(), Refusal> {
    let ok = (1..=253).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.:[]".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_key",
            format!(
                "{key:?} is not an app key (google, github, slack, or a server's host name in lower case)"
            ),
        ))
    }
}

impl McpApps {
    fn shown(&self, app: &StoredApp) -> Value {
        json!({
            "key": app.key,
            "client_id": app.client_id,
            "has_secret": app.sealed_secret.is_some(),
            "issuer": app.issuer,
            "callback_url": format!("{}{CALLBACK_PATH}", self.public_url),
            "updated_at_ms": app.updated_at_ms,
        })
    }

    /// `…/mcp-apps[/{key}]` with `method`.
    pub async fn handle(
        &self,
        method: &Method,
        key: Option<&str>,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        let store = self.store.clone();
        match (method, key) {
            (&Method::GET, None) => {
                let apps = run_blocking(move || store.apps(), store_error).await?;
                let shown: Vec<Value> = apps.iter().map(|a| self.shown(a)).collect();
                Ok(json_response(StatusCode::OK, &json!({"apps": shown})))
            }
            (&Method::GET, Some(key)) => {
                check_key(key)?;
                let owned = key.to_owned();
                match run_blocking(move || store.app(&owned), store_error).await? {
                    Some(app) => Ok(json_response(StatusCode::OK, &self.shown(&app))),
                    None => Err(no_app(key)),
                }
            }
            (&Method::PUT, Some(key)) => {
                #[derive(serde::Deserialize)]
                #[serde(deny_unknown_fields)]
                struct SetApp {
                    client_id: String,
                    #[serde(default)]
                    client_secret: Option<String>,
                    #[serde(default)]
                    issuer: Option<String>,
                }
                check_key(key)?;
                let request: SetApp = decode_json(body)?;
                let issuer = check_issuer(request.issuer.as_deref())?;
                let client_id = request.client_id.trim().to_owned();
                if client_id.is_empty()
                    || client_id.len() > 512
                    || client_id.chars().any(char::is_control)
                {
                    return Err(Refusal::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_request",
                        "client_id must be 1 to 512 characters with no control characters",
                    ));
                }
                let sealed = match request.client_secret.filter(|s| !s.is_empty()) {
                    None => None,
                    Some(secret) => {
                        let key_material = self.sealing.as_ref().ok_or_else(|| {
                            Refusal::new(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "unavailable",
                                "a client secret cannot be stored: agentd's sealing key is unusable (see its log)",
                            )
                        })?;
                        Some(
                            key_material
                                .seal(app_place(key), secret.as_bytes())
                                .map_err(|e| Refusal::internal(e.to_string()))?,
                        )
                    }
                };
                let owned = key.to_owned();
                let app = run_blocking(
                    move || store.set_app(&owned, &client_id, sealed.as_deref(), &issuer),
                    store_error,
                )
                .await?;
                tracing::info!(app = key, issuer = ?app.issuer, "MCP sign-in app set");
                Ok(json_response(StatusCode::OK, &self.shown(&app)))
            }
            (&Method::DELETE, Some(key)) => {
                check_key(key)?;
                let owned = key.to_owned();
                if run_blocking(move || store.remove_app(&owned), store_error).await? {
                    tracing::info!(app = key, "MCP sign-in app removed");
                    Ok(json_response(StatusCode::OK, &json!({"removed": key})))
                } else {
                    Err(no_app(key))
                }
            }
            _ => Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "mcp-apps takes GET (the list, or one), PUT and DELETE of /v1/admin/mcp-apps/{key}",
            )),
        }
    }
}

/// The issuer an app is pinned to: an https URL with a host and no query, fragment or user
/// information, as the provider's authorization-server metadata names it.
fn check_issuer(issuer: Option<&str>) -> Result<String, Refusal> {
    let refused = |why: &str| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_issuer",
            format!(
                "{why}: give the provider's OAuth issuer, the `issuer` of its authorization-server metadata (an https URL such as https://slack.com)"
            ),
        )
    };
    let issuer = issuer
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .ok_or_else(|| refused("issuer is required"))?;
    let url =
        url::Url::parse(issuer).map_err(|e| refused(&format!("{issuer:?} is no URL ({e})")))?;
    if url.scheme() != "https"
        || url.host_str().is_none()
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(refused(&format!(
            "{issuer:?} is not an https URL with a host and no query, fragment or user"
        )));
    }
    Ok(issuer.to_owned())
}

/// Why an operator's sign-in app cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    Store(#[from] ConnectionStoreError),
    #[error(
        "the sign-in app {key:?} is unusable (its secret does not open); an operator sets it again"
    )]
    SecretUnusable { key: String },
    #[error("sign-in apps are unavailable: agentd's sealing key is unusable (see its log)")]
    NoSealingKey,
}

/// The operator's sign-in app `key`, its secret unsealed; a secret that does not open is an
/// error (never a sign-in without it). Blocks: call it off the async workers.
pub fn load_app(
    store: &ConnectionStore,
    sealing: Option<&SealingKey>,
    key: &str,
) -> Result<Option<ClientApp>, AppError> {
    let Some(stored) = store.app(key)? else {
        return Ok(None);
    };
    let client_secret = match (&stored.sealed_secret, sealing) {
        (None, _) => None,
        (Some(sealed), Some(sealing)) => Some(
            sealing
                .open(app_place(key), sealed)
                .ok()
                .and_then(|plain| String::from_utf8(plain).ok())
                .ok_or_else(|| {
                    tracing::error!(app = key, "an MCP sign-in app's secret does not open");
                    AppError::SecretUnusable {
                        key: key.to_owned(),
                    }
                })?,
        ),
        (Some(_), None) => return Err(AppError::NoSealingKey),
    };
    Ok(Some(ClientApp {
        key: stored.key,
        client_id: stored.client_id,
        client_secret,
        issuer: stored.issuer,
    }))
}

fn no_app(key: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("there is no MCP sign-in app {key:?}"),
    )
}
