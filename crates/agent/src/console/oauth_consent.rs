//! The API of the OAuth consent page (`GET /oauth/consent`, see [`crate::oauth::server`]) and
//! of the console's Connected apps page:
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/console/oauth/requests/{id}` | 200 the client (its name, never verified: `client_name_verified` false; `client_registered`, or the `client_host` of its metadata document's client id), its redirect host, the scopes asked and the person's projects |
//! | `POST /v1/console/oauth/requests/{id} {allow, projects, write_folders, read_only_folders}` | 200 `{redirect}`; 409 `already_decided`; 404 `not_found` |
//! | `GET /v1/console/oauth/apps` | 200 `{apps: [...]}`: the person's live grants |
//! | `DELETE /v1/console/oauth/apps/{grant}` | 200 `{revoked}`; 404 `not_found` |
//!
//! Session only, like the device-login page's API: a request with an `Authorization` header
//! is refused (401), and a POST or DELETE needs the console's Origin and CSRF checks.
//!
//! What the person chooses becomes the grant: its projects (each one they are a member of),
//! and, for `workflows:write`, folder caps stored as a [`FileGuard`] exactly as on a
//! personal token. `write_folders: null` keeps the projects' authoring paths (the policy's
//! `write_paths`); a list narrows to those folders, each of which must lie within a chosen
//! project's authoring paths. A client that did not ask for `workflows:write` gets
//! `write_folders: []`: its tokens can never write, whatever a later request asks.

use crate::console::session::Sessions;
use crate::identity::authority::{FileGuard, Scope};
use crate::identity::oauth::NewGrant;
use crate::identity::store::now_ms;
use crate::identity::{IdentityError, Project, Role};
use crate::oauth::answer::oauth_error;
use crate::oauth::server::{AuthorizationServer, Pending, TakeError};
use agentworks_core::guard::{Guard, RelPath};
use agentworks_daemon::ipc::envelope::{Body, json_response};
use hyper::header::{ALLOW, CACHE_CONTROL, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

/// The paths' common prefix.
pub const PREFIX: &str = "/v1/console/oauth/";
const REQUESTS: &str = "/v1/console/oauth/requests/";
const APPS: &str = "/v1/console/oauth/apps";

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    allow: bool,
    #[serde(default)]
    projects: Vec<String>,
    #[serde(default)]
    write_folders: Option<Vec<String>>,
    #[serde(default)]
    read_only_folders: Vec<String>,
}

/// Serves the endpoints, or `None` if the path is not one of them.
pub async fn handle(
    sessions: &Sessions,
    server: &AuthorizationServer,
    parts: &Parts,
    body: &[u8],
) -> Option<Response<Body>> {
    let path = parts.uri.path();
    if !path.starts_with(PREFIX) {
        return None;
    }
    let mut response = answer(sessions, server, parts, body).await;
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(response)
}

async fn answer(
    sessions: &Sessions,
    server: &AuthorizationServer,
    parts: &Parts,
    body: &[u8],
) -> Response<Body> {
    let path = parts.uri.path();
    enum Route<'a> {
        Request(&'a str),
        Apps,
        App(&'a str),
    }
    let route = if let Some(id) = path.strip_prefix(REQUESTS).filter(|id| is_id(id)) {
        Route::Request(id)
    } else if path == APPS {
        Route::Apps
    } else if let Some(grant) = path
        .strip_prefix(APPS)
        .and_then(|rest| rest.strip_prefix('/'))
        .filter(|id| is_id(id))
    {
        Route::App(grant)
    } else {
        return oauth_error(StatusCode::NOT_FOUND, "not_found", "no such endpoint");
    };
    let allowed = match route {
        Route::Request(_) => "GET, POST",
        Route::Apps => "GET",
        Route::App(_) => "DELETE",
    };
    if !allowed.split(", ").any(|m| m == parts.method.as_str()) {
        let mut refused = oauth_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            &format!("use {allowed}"),
        );
        refused
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static(allowed));
        return refused;
    }
    let signed_in = match crate::console::session::session_only(
        sessions,
        parts,
        "consenting to an app",
    )
    .await
    {
        Ok(signed_in) => signed_in,
        Err(refused) => return refused,
    };
    let user_id = signed_in.user.id.clone();
    let identity = server.identity().clone();
    match (route, parts.method.clone()) {
        (Route::Request(id), Method::GET) => {
            let Some(pending) = server.pending(id, now_ms()).await else {
                return request_not_found();
            };
            let projects = blocking(move || identity.projects_of(&user_id)).await;
            match projects {
                Ok(projects) => json_response(StatusCode::OK, &describe(id, &pending, &projects)),
                Err(refused) => refused,
            }
        }
        (Route::Request(id), _) => {
            let decision: Decision = match serde_json::from_slice(body) {
                Ok(decision) => decision,
                Err(_) => {
                    return invalid_request(
                        "send {\"allow\": true|false, \"projects\": [...], \"write_folders\": [...]|null, \"read_only_folders\": [...]}",
                    );
                }
            };
            decide(server, id, &signed_in.user.name, user_id, decision).await
        }
        (Route::Apps, _) => {
            let listed = blocking(move || {
                let grants = identity.grants_of(&user_id)?;
                let mut apps = Vec::new();
                for grant in grants {
                    let mut projects = Vec::new();
                    for id in &grant.projects {
                        if let Some(project) = identity.project_by_id(id)? {
                            projects.push(json!({"id": project.id, "name": project.name}));
                        }
                    }
                    let redirect_host = url::Url::parse(&grant.redirect_uri)
                        .ok()
                        .and_then(|u| {
                            let host = u.host_str()?.to_owned();
                            Some(u.port().map_or(host.clone(), |p| format!("{host}:{p}")))
                        })
                        .unwrap_or_default();
                    apps.push(json!({
                        "grant": grant.id,
                        "client_id": grant.client_id,
                        "client_name": grant.client_name,
                        "redirect_host": redirect_host,
                        "scopes": grant.scopes,
                        "projects": projects,
                        "write_folders": grant.file_guard.write_folders,
                        "read_only_folders": grant.file_guard.read_only_folders,
                        "created_at_ms": grant.created_at_ms,
                        "last_used_at_ms": grant.last_used_at_ms,
                    }));
                }
                Ok(apps)
            })
            .await;
            match listed {
                Ok(apps) => json_response(StatusCode::OK, &json!({ "apps": apps })),
                Err(refused) => refused,
            }
        }
        (Route::App(grant), _) => {
            let grant = grant.to_owned();
            let id = grant.clone();
            match blocking(move || identity.revoke_grant(&id, &user_id, now_ms())).await {
                Ok(true) => {
                    tracing::info!(user = %signed_in.user.name, %grant, "an OAuth grant was revoked in the console");
                    json_response(StatusCode::OK, &json!({ "revoked": grant }))
                }
                Ok(false) => oauth_error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "you have no connected app by that id",
                ),
                Err(refused) => refused,
            }
        }
    }
}

/// What the consent page shows about a pending request.
fn describe(id: &str, pending: &Pending, projects: &[(Project, Role)]) -> Value {
    let projects: Vec<Value> = projects
        .iter()
        .map(|(project, role)| {
            json!({
                "id": project.id,
                "name": project.name,
                "role": role.as_str(),
                "can_author": role.can_author(),
                "authoring_paths": authoring_paths(project),
            })
        })
        .collect();
    let expires_in =
        (pending.created_at_ms + crate::oauth::server::PENDING_TTL_MS - now_ms()).max(0) / 1000;
    // No client's name is verified: a registered client chose its own when it registered
    // (anyone can register as "Claude"), so the page marks it unverified; a metadata
    // document's client is at least named by a document on its client id's host, shown with it.
    let client_host = pending
        .client_id
        .starts_with("https:")
        .then(|| url::Url::parse(&pending.client_id).ok())
        .flatten()
        .and_then(|u| {
            let host = u.host_str()?.to_owned();
            Some(u.port().map_or(host.clone(), |p| format!("{host}:{p}")))
        });
    json!({
        "request": id,
        "client_id": pending.client_id,
        "client_name": pending.client_name,
        "client_name_verified": false,
        "client_registered": client_host.is_none(),
        "client_host": client_host,
        "redirect_host": pending.redirect_host(),
        "redirect_uri": pending.redirect_uri,
        "scopes": pending.scopes,
        "writes": pending.scopes.contains(&Scope::WorkflowsWrite),
        "projects": projects,
        "expires_in": expires_in,
    })
}

/// The project's authoring paths: its policy's `write_paths` (none if it does not parse).
fn authoring_paths(project: &Project) -> Vec<String> {
    serde_json::from_str::<Guard>(&project.policy)
        .map(|guard| guard.write_paths)
        .unwrap_or_default()
}

async fn decide(
    server: &AuthorizationServer,
    id: &str,
    user_name: &str,
    user_id: String,
    decision: Decision,
) -> Response<Body> {
    let identity = server.identity().clone();
    // Check the choices before the request is spent, so a mistake can be corrected.
    let choices = if decision.allow {
        let Some(pending) = server.pending(id, now_ms()).await else {
            return match server.take_pending(id, now_ms()).await {
                Err(TakeError::AlreadyDecided) => already_decided(),
                Err(TakeError::Unavailable(error)) => store_unavailable(&error),
                _ => request_not_found(),
            };
        };
        let lookup = identity.clone();
        let uid = user_id.clone();
        let projects = match blocking(move || lookup.projects_of(&uid)).await {
            Ok(projects) => projects,
            Err(refused) => return refused,
        };
        match check_choices(&pending, &projects, &decision) {
            Ok(choices) => Some(choices),
            Err(why) => return invalid_request(&why),
        }
    } else {
        None
    };
    let pending = match server.take_pending(id, now_ms()).await {
        Ok(pending) => pending,
        Err(TakeError::AlreadyDecided) => return already_decided(),
        Err(TakeError::NotFound) => return request_not_found(),
        Err(TakeError::Unavailable(error)) => return store_unavailable(&error),
    };
    let Some((projects, file_guard)) = choices else {
        tracing::info!(user = %user_name, client = %pending.client_id, "an OAuth request was denied");
        let redirect = server.redirect_url(
            &pending,
            &[
                ("error", "access_denied"),
                ("error_description", "the person denied the request"),
            ],
        );
        return json_response(StatusCode::OK, &json!({ "redirect": redirect }));
    };
    let new = NewGrant {
        user_id,
        client_id: pending.client_id.clone(),
        client_name: pending.client_name.clone(),
        redirect_uri: pending.redirect_uri.clone(),
        scopes: pending.scopes.clone(),
        projects,
        file_guard,
        resource: pending.resource.clone(),
        code_challenge: pending.code_challenge.clone(),
    };
    match blocking(move || identity.create_grant(&new, now_ms())).await {
        Ok((grant, code)) => {
            tracing::info!(user = %user_name, client = %pending.client_id, grant = %grant.id, "an OAuth request was allowed");
            let redirect = server.redirect_url(&pending, &[("code", &code)]);
            json_response(StatusCode::OK, &json!({ "redirect": redirect }))
        }
        Err(refused) => refused,
    }
}

/// The grant's projects and folder caps from the person's choices, or why they are refused.
fn check_choices(
    pending: &Pending,
    member_of: &[(Project, Role)],
    decision: &Decision,
) -> Result<(Vec<String>, FileGuard), String> {
    if decision.projects.is_empty() {
        return Err("choose at least one project, or deny the request".into());
    }
    let mut chosen = Vec::new();
    for id in &decision.projects {
        let Some((project, _)) = member_of.iter().find(|(p, _)| &p.id == id) else {
            return Err(format!("you are not a member of a project with id {id:?}"));
        };
        if !chosen.iter().any(|p: &&Project| p.id == project.id) {
            chosen.push(project);
        }
    }
    let folder = |raw: &String| {
        RelPath::parse_folder(raw)
            .map_err(|e| format!("the folder {raw:?} is not a folder path: {e}"))
    };
    for raw in &decision.read_only_folders {
        folder(raw)?;
    }
    let writes = pending.scopes.contains(&Scope::WorkflowsWrite);
    let write_folders = if !writes {
        if decision
            .write_folders
            .as_ref()
            .is_some_and(|f| !f.is_empty())
        {
            return Err(
                "this app asked only to read or run: it cannot be given writable folders".into(),
            );
        }
        Some(Vec::new())
    } else if let Some(folders) = &decision.write_folders {
        for raw in folders {
            let path = folder(raw)?;
            let within = chosen.iter().any(|project| {
                authoring_paths(project)
                    .iter()
                    .any(|w| match (RelPath::parse_folder(w), &path) {
                        // The authoring path is the whole project.
                        (Ok(None), _) => true,
                        (Ok(Some(w)), Some(path)) => path.is_within(&w),
                        _ => false,
                    })
            });
            if !within {
                return Err(format!(
                    "{raw:?} is not within an authoring path of the chosen projects"
                ));
            }
        }
        Some(folders.clone())
    } else {
        None
    };
    let file_guard = FileGuard {
        write_folders,
        read_only_folders: decision.read_only_folders.clone(),
    };
    Ok((chosen.iter().map(|p| p.id.clone()).collect(), file_guard))
}

fn is_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, IdentityError> + Send + 'static,
) -> Result<T, Response<Body>> {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            tracing::warn!(%error, "the consent store failed");
            Err(oauth_error(
                StatusCode::SERVICE_UNAVAILABLE,
                error.code(),
                &error.to_string(),
            ))
        }
        Err(_) => Err(oauth_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the consent request failed",
        )),
    }
}

fn request_not_found() -> Response<Body> {
    oauth_error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no sign-in request has that id: it is unknown or expired (requests last 10 minutes); start again from the app",
    )
}

/// The identity store could not keep or read the request: 503, logged.
fn store_unavailable(error: &str) -> Response<Body> {
    tracing::warn!(%error, "cannot decide an authorization request");
    oauth_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        "the sign-in request cannot be read now; try again shortly",
    )
}

fn already_decided() -> Response<Body> {
    oauth_error(
        StatusCode::CONFLICT,
        "already_decided",
        "this sign-in request was already allowed or denied",
    )
}

fn invalid_request(description: &str) -> Response<Body> {
    oauth_error(StatusCode::BAD_REQUEST, "invalid_request", description)
}
