//! The MCP connections API on agentd's public listener (a console session, or a person's
//! bearer token with a `workflows:*` scope, as for the chats):
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/projects/{id}/mcp-connections` | `{connections: [{connection_id, name, url, transport, headers, created_by, created_at_ms}]}` (anyone who can see the project) |
//! | `POST /v1/projects/{id}/mcp-connections {name, url, transport?, headers?}` | 201 the connection (owner or co-owner, a `workflows:write` token, a `code` project) |
//! | `DELETE /v1/projects/{id}/mcp-connections/{connection_id}` | `{removed: connection_id}` (owner or co-owner, a `workflows:write` token) |
//! | `POST /v1/projects/{id}/mcp-connections/{connection}/sign-in` | `{authorization_url}` to open (owner or co-owner): OAuth with the server ([`crate::connections::sign_in`]); 400 `needs_client_id` with the callback URL when the server has no dynamic registration, `no_sign_in_needed` when it asks for none |
//! | `GET /v1/mcp-connections/callback?code&state[&iss]` | where the server sends the person back: the sign-in is finished and sealed, then 303 to the project's settings page (`?signed_in=` or `?sign_in_error=`); only the person who started it can finish it |
//! | `GET /v1/projects/{id}/secrets` | `{secrets: [{name, updated_by, updated_at_ms}]}`: names only, never a value (owner or co-owner) |
//! | `PUT /v1/projects/{id}/secrets/{NAME} {value}` | the secret as listed (owner or co-owner, a `workflows:write` token); sealed before it is stored |
//! | `DELETE /v1/projects/{id}/secrets/{NAME}` | `{removed: NAME}` (owner or co-owner, a `workflows:write` token) |
//!
//! Who may manage is decided from the live role at every request, never from the token alone:
//! an editor sees the connections (to use them in chats) but cannot add or remove one, and a
//! person removed from the project can do nothing. The URL shown has no query string; a header
//! shows the secret it names, never a value.

use crate::catalog::files::from_tool;
use crate::connections::Connections;
use crate::connections::secrets::{SecretRuleError, SecretStore, SecretStoreError};
use crate::connections::sign_in::CALLBACK_PATH;
use crate::connections::store::{self, ConnectionRuleError, ConnectionStoreError, NewConnection};
use crate::identity::ProjectKind;
use crate::mcp::Caller;
use agentworks_contract::agentd::Role;
use agentworks_daemon::ipc::envelope::{Body, Refusal, decode_json, json_response, run_blocking};
use bytes::Bytes;
use hyper::Method;
use hyper::http::request::Parts;
use hyper::{Response, StatusCode};
use serde_json::json;

impl From<ConnectionStoreError> for Refusal {
    fn from(error: ConnectionStoreError) -> Refusal {
        tracing::error!(%error, "MCP connection store failed");
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("{error}; try again shortly"),
        )
    }
}

impl From<ConnectionRuleError> for Refusal {
    fn from(error: ConnectionRuleError) -> Refusal {
        let status = match error {
            ConnectionRuleError::TooMany => StatusCode::CONFLICT,
            _ => StatusCode::BAD_REQUEST,
        };
        Refusal::new(status, error.code(), error.to_string())
    }
}

impl From<SecretStoreError> for Refusal {
    fn from(error: SecretStoreError) -> Refusal {
        tracing::error!(%error, "project secret store failed");
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the project secret store failed; see agentd's log",
        )
    }
}

impl From<SecretRuleError> for Refusal {
    fn from(error: SecretRuleError) -> Refusal {
        let code = match error {
            SecretRuleError::Name(_) => "invalid_name",
            SecretRuleError::Value => "invalid_value",
        };
        Refusal::new(StatusCode::BAD_REQUEST, code, error.to_string())
    }
}

/// What a query value or path segment keeps as it is: RFC 3986's unreserved characters.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Largest body of a connections endpoint (a connection, a secret).
pub const MAX_REQUEST_BODY_BYTES: usize = 64 * 1024;

impl Connections {
    /// What the public listener may do with a request's body before the handler runs, from
    /// the head alone: `None` if it is not an endpoint here (or not with this method, which
    /// [`Connections::handle`] answers 405 without authenticating); else the largest body the
    /// endpoint takes once the caller checks out, or the 401/403 the request gets anyway.
    pub async fn screen(&self, parts: &Parts) -> Option<Result<usize, Response<Body>>> {
        let Ok(_) = route(parts)? else {
            return None;
        };
        Some(match self.sessions.person(&self.identity, parts).await {
            Ok(_) => Ok(MAX_REQUEST_BODY_BYTES),
            Err(error) => Err(error.into_response()),
        })
    }

    /// Serves a connections endpoint, or `None` if the path is not one.
    pub async fn handle(&self, parts: &Parts, body: &Bytes) -> Option<Response<Body>> {
        let route = match route(parts)? {
            Ok(route) => route,
            Err(refusal) => return Some(refusal.into_response()),
        };
        let result = async {
            let caller = self.sessions.person(&self.identity, parts).await?;
            match route {
                Route::Connections(project) => self.list_connections(&caller, &project).await,
                Route::AddConnection(project) => self.add_connection(&caller, &project, body).await,
                Route::RemoveConnection(project, connection) => {
                    self.remove_connection(&caller, &project, &connection).await
                }
                Route::SignIn(project, connection) => {
                    self.sign_in_connection(&caller, &project, &connection)
                        .await
                }
                Route::SignInCallback => self.sign_in_callback(&caller, parts.uri.query()).await,
                Route::Secrets(project) => self.list_secrets(&caller, &project).await,
                Route::SetSecret(project, name) => {
                    self.set_secret(&caller, &project, &name, body).await
                }
                Route::RemoveSecret(project, name) => {
                    self.remove_secret(&caller, &project, &name).await
                }
            }
        }
        .await;
        Some(result.unwrap_or_else(Refusal::into_response))
    }
}

/// The connections endpoint a request names: `None` for another path, `Err` (405) for a path
/// of this API with a method it does not serve.
fn route(parts: &Parts) -> Option<Result<Route, Refusal>> {
    let path = parts.uri.path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Some(Ok(match (segments.as_slice(), &parts.method) {
        (["v1", "projects", project, "mcp-connections"], m) if *m == Method::GET => {
            Route::Connections(project.to_string())
        }
        (["v1", "projects", project, "mcp-connections"], m) if *m == Method::POST => {
            Route::AddConnection(project.to_string())
        }
        (["v1", "projects", project, "mcp-connections", connection], m) if *m == Method::DELETE => {
            Route::RemoveConnection(project.to_string(), connection.to_string())
        }
        (
            [
                "v1",
                "projects",
                project,
                "mcp-connections",
                connection,
                "sign-in",
            ],
            m,
        ) if *m == Method::POST => Route::SignIn(project.to_string(), connection.to_string()),
        (["v1", "mcp-connections", "callback"], m) if *m == Method::GET => Route::SignInCallback,
        (["v1", "projects", project, "secrets"], m) if *m == Method::GET => {
            Route::Secrets(project.to_string())
        }
        (["v1", "projects", project, "secrets", name], m) if *m == Method::PUT => {
            Route::SetSecret(project.to_string(), name.to_string())
        }
        (["v1", "projects", project, "secrets", name], m) if *m == Method::DELETE => {
            Route::RemoveSecret(project.to_string(), name.to_string())
        }
        (["v1", "projects", _, "mcp-connections" | "secrets", ..], _) => {
            return Some(Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} is not served on {path}", parts.method),
            )));
        }
        _ => return None,
    }))
}

enum Route {
    Connections(String),
    AddConnection(String),
    RemoveConnection(String, String),
    SignIn(String, String),
    SignInCallback,
    Secrets(String),
    SetSecret(String, String),
    RemoveSecret(String, String),
}

impl Connections {
    /// `GET …/mcp-connections`: the project's connections, for anyone who can see it.
    async fn list_connections(
        &self,
        caller: &Caller,
        project: &str,
    ) -> Result<Response<Body>, Refusal> {
        let (project, _) = self
            .files
            .access(caller, project)
            .await
            .map_err(from_tool)?;
        let store = self.store.clone();
        let (listed, signed_in) = run_blocking(
            move || {
                Ok::<_, ConnectionStoreError>((
                    store.list(&project.id)?,
                    store.signed_in(&project.id)?,
                ))
            },
            Refusal::from,
        )
        .await?;
        let shown: Vec<_> = listed
            .iter()
            .map(|c| {
                let mut shown = c.shown();
                shown["signed_in"] = json!(signed_in.contains(&c.id));
                shown
            })
            .collect();
        Ok(json_response(
            StatusCode::OK,
            &json!({"connections": shown}),
        ))
    }

    /// `POST …/mcp-connections`: add one, after the role check and every rule.
    async fn add_connection(
        &self,
        caller: &Caller,
        project: &str,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        let project = self.managed_project(caller, project).await?;
        if project.kind != ProjectKind::Code {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "not_a_code_project",
                format!(
                    "MCP connections are for code projects (their chats use them); {:?} is a {} project",
                    project.name,
                    project.kind.as_str()
                ),
            ));
        }
        let request: NewConnection = decode_json(body)?;
        let checked = store::check(request)?;
        let store = self.store.clone();
        let user = caller.user_id.clone();
        let added = run_blocking(
            move || store.add(&project.id, &user, checked),
            Refusal::from,
        )
        .await??;
        tracing::info!(
            connection = %added.id,
            project = %added.project_id,
            user = %caller.user_id,
            url = %store::shown_url(&added.url),
            "MCP connection added"
        );
        Ok(json_response(StatusCode::CREATED, &added.shown()))
    }

    /// `DELETE …/mcp-connections/{id}`.
    async fn remove_connection(
        &self,
        caller: &Caller,
        project: &str,
        connection: &str,
    ) -> Result<Response<Body>, Refusal> {
        let project = self.managed_project(caller, project).await?;
        let store = self.store.clone();
        let id = connection.to_owned();
        let project_id = project.id.clone();
        if !run_blocking(move || store.remove(&project_id, &id), Refusal::from).await? {
            return Err(no_connection(&project.name, connection));
        }
        tracing::info!(connection, project = %project.id, user = %caller.user_id, "MCP connection removed");
        Ok(json_response(
            StatusCode::OK,
            &json!({"removed": connection}),
        ))
    }

    /// The project, if the caller may manage its connections: it can see the project, its
    /// live role is owner or co-owner, and its token may author (`workflows:write`).
    async fn managed_project(
        &self,
        caller: &Caller,
        project: &str,
    ) -> Result<crate::identity::Project, Refusal> {
        let (project, access) = self
            .files
            .access(caller, project)
            .await
            .map_err(from_tool)?;
        if !matches!(access.role, Some(Role::Owner | Role::CoOwner)) {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "only the project's owner or a co-owner adds or removes MCP connections; your role on {:?} is {}",
                    project.name,
                    access.role.map_or("none", Role::as_str)
                ),
            ));
        }
        if !caller.scopes.iter().any(|s| s == "workflows:write") {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                "adding or removing an MCP connection needs a workflows:write token (or the console)",
            ));
        }
        Ok(project)
    }

    fn secret_store(&self) -> Result<SecretStore, Refusal> {
        self.secrets.clone().ok_or_else(|| {
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "project secrets are unavailable: agentd's sealing key is unusable (see its log)",
            )
        })
    }

    /// `GET …/secrets`: the names, for the people who manage the project's connections.
    async fn list_secrets(
        &self,
        caller: &Caller,
        project: &str,
    ) -> Result<Response<Body>, Refusal> {
        let project = self.managed_project(caller, project).await?;
        let store = self.secret_store()?;
        let listed = run_blocking(move || store.list(&project.id), Refusal::from).await?;
        Ok(json_response(StatusCode::OK, &json!({"secrets": listed})))
    }

    /// `PUT …/secrets/{NAME} {value}`: set or replace one; the answer never holds the value.
    async fn set_secret(
        &self,
        caller: &Caller,
        project: &str,
        name: &str,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct SetSecret {
            value: String,
        }
        let project = self.managed_project(caller, project).await?;
        let store = self.secret_store()?;
        // Not `decode_json`: its message may quote the body, and the body is a secret.
        let request: SetSecret = serde_json::from_slice(body).map_err(|_| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the body must be {\"value\": \"…\"} and nothing else",
            )
        })?;
        let (name, user) = (name.to_owned(), caller.user_id.clone());
        let project_id = project.id.clone();
        let info = run_blocking(
            move || store.set(&project_id, &name, &request.value, &user),
            Refusal::from,
        )
        .await??;
        tracing::info!(project = %project.id, secret = %info.name, user = %caller.user_id, "project secret set");
        Ok(json_response(StatusCode::OK, &info))
    }

    /// `DELETE …/secrets/{NAME}`.
    async fn remove_secret(
        &self,
        caller: &Caller,
        project: &str,
        name: &str,
    ) -> Result<Response<Body>, Refusal> {
        let project = self.managed_project(caller, project).await?;
        let store = self.secret_store()?;
        let (id, secret) = (project.id.clone(), name.to_owned());
        if !run_blocking(move || store.remove(&id, &secret), Refusal::from).await? {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("project {:?} has no secret {name:?}", project.name),
            ));
        }
        tracing::info!(project = %project.id, secret = name, user = %caller.user_id, "project secret removed");
        Ok(json_response(StatusCode::OK, &json!({"removed": name})))
    }

    /// `POST …/mcp-connections/{id}/sign-in`: start an OAuth sign-in with the server.
    async fn sign_in_connection(
        &self,
        caller: &Caller,
        project: &str,
        connection: &str,
    ) -> Result<Response<Body>, Refusal> {
        let project = self.managed_project(caller, project).await?;
        let store = self.store.clone();
        let (project_id, id) = (project.id.clone(), connection.to_owned());
        let Some(connection) =
            run_blocking(move || store.get(&project_id, &id), Refusal::from).await?
        else {
            return Err(no_connection(&project.name, connection));
        };
        if connection.headers.contains_key("authorization") {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "this connection sends its own Authorization header (a project secret); remove it, or the connection, to sign in with OAuth instead",
            ));
        }
        let (Some(client), Some(key)) = (&self.client, &self.sealing) else {
            return Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "sign-ins are unavailable: the outbound client or the sealing key is unusable (see agentd's log)",
            ));
        };
        let callback = format!("{}{CALLBACK_PATH}", self.public_url);
        let app_key = store::provider_key(&connection.url);
        let app = self.sign_in_app(&app_key).await?;
        let started = crate::connections::sign_in::begin(
            client,
            &connection,
            &caller.user_id,
            &callback,
            app,
        )
        .await;
        let started = match started {
            Ok(started) => {
                let (sign_ins, key) = (self.sign_ins.clone(), key.clone());
                run_blocking(
                    move || Ok::<_, Refusal>(sign_ins.insert(&key, &started).map(|()| started)),
                    Refusal::from,
                )
                .await?
            }
            Err(error) => Err(error),
        };
        match started {
            Ok(started) => Ok(json_response(
                StatusCode::OK,
                &json!({"authorization_url": started.authorization_url}),
            )),
            Err(error) => {
                let mut refusal =
                    Refusal::new(StatusCode::BAD_REQUEST, error.code(), error.to_string());
                if let crate::connections::sign_in::SignInError::NeedsClientId { callback } = &error
                {
                    refusal
                        .details
                        .insert("callback_url".into(), json!(callback));
                    refusal.details.insert("app_key".into(), json!(app_key));
                }
                Err(refusal)
            }
        }
    }

    /// The operator's sign-in app for `key`, its secret unsealed; a secret that does not open is
    /// an error (never a sign-in without it).
    async fn sign_in_app(
        &self,
        key: &str,
    ) -> Result<Option<crate::connections::sign_in::ClientApp>, Refusal> {
        let (store, sealing, key) = (self.store.clone(), self.sealing.clone(), key.to_owned());
        run_blocking(
            move || {
                crate::connections::apps::load_app(&store, sealing.as_deref(), &key).map_err(
                    |error| match error {
                        crate::connections::apps::AppError::Store(error) => Refusal::from(error),
                        other => Refusal::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "unavailable",
                            other.to_string(),
                        ),
                    },
                )
            },
            Refusal::from,
        )
        .await
    }

    /// `GET /v1/mcp-connections/callback`: finish the sign-in `state` names, for the person who
    /// started it, then send the browser back to the project's settings.
    async fn sign_in_callback(
        &self,
        caller: &Caller,
        query: Option<&str>,
    ) -> Result<Response<Body>, Refusal> {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(query.unwrap_or("")).unwrap_or_default();
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let refused = |error: crate::connections::sign_in::SignInError| {
            let status = match error {
                crate::connections::sign_in::SignInError::NotYours => StatusCode::FORBIDDEN,
                crate::connections::sign_in::SignInError::Unavailable(_)
                | crate::connections::sign_in::SignInError::Seal(_) => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                _ => StatusCode::BAD_REQUEST,
            };
            Refusal::new(status, error.code(), error.to_string())
        };
        let state = get("state").ok_or_else(|| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the callback has no state",
            )
        })?;
        let Some(key) = self.sealing.clone() else {
            return Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "sign-ins are unavailable: the sealing key is unusable (see agentd's log)",
            ));
        };
        let (sign_ins, state, user_id) = (
            self.sign_ins.clone(),
            state.to_owned(),
            caller.user_id.clone(),
        );
        let pending = run_blocking(
            move || Ok::<_, Refusal>(sign_ins.take(&key, &state, &user_id)),
            Refusal::from,
        )
        .await?
        .map_err(refused)?;
        let back = |outcome: &str| {
            let location = format!(
                "/console/projects/{}/settings?{outcome}",
                percent_encoding::utf8_percent_encode(&pending.project_id, UNRESERVED)
            );
            let mut response = json_response(StatusCode::SEE_OTHER, &json!({"location": location}));
            if let Ok(value) = hyper::header::HeaderValue::from_str(&location) {
                response
                    .headers_mut()
                    .insert(hyper::header::LOCATION, value);
            }
            response
        };
        // The person is still allowed to manage the project's connections.
        self.managed_project(caller, &pending.project_id).await?;
        let encode = |s: &str| percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string();
        if let Some(error) = get("error") {
            return Ok(back(&format!("sign_in_error={}", encode(error))));
        }
        let Some(code) = get("code") else {
            return Ok(back("sign_in_error=no_code"));
        };
        let Some(client) = &self.client else {
            return Ok(back("sign_in_error=unavailable"));
        };
        let connection_id = pending.connection_id.clone();
        match crate::connections::sign_in::finish(client, pending.clone(), code, get("iss")).await {
            Ok(credentials) => {
                super::sign_in::store_credentials(
                    self.sealing.as_ref(),
                    &self.store,
                    &connection_id,
                    &credentials,
                )
                .await
                .map_err(from_tool)?;
                tracing::info!(connection = %connection_id, user = %caller.user_id, "MCP connection signed in");
                Ok(back(&format!("signed_in={}", encode(&connection_id))))
            }
            Err(error) => {
                tracing::info!(connection = %connection_id, %error, "MCP connection sign-in failed");
                Ok(back(&format!("sign_in_error={}", encode(error.code()))))
            }
        }
    }
}

fn no_connection(project: &str, connection: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("project {project:?} has no MCP connection {connection:?}"),
    )
}
