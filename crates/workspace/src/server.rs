//! workspaced's socket API: routes `/v1/...` to [`Workspace`] operations on blocking threads
//! (writes and patches to their project's batch), after checking the peer.
//!
//! Only root, workspaced's own user and the configured callers (agentd's user) are served;
//! anyone else who can open the socket gets `peer_forbidden`. Every answer is JSON; every
//! failure is the one error envelope.

use crate::error::WorkspaceError;
use crate::ops::Workspace;
use agentworks_contract::workspaced::Health;
use agentworks_daemon::ipc::envelope::{Body, error_response, json_response};
use agentworks_daemon::ipc::server::{Peer, PeerPolicy, ServerLimits, refuse_peer, serve};
use bytes::Bytes;
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Largest request body: the biggest allowed file, JSON-escaped, plus room for the context.
pub fn max_body_bytes(max_file_bytes: u64) -> usize {
    (max_file_bytes as usize)
        .saturating_mul(6)
        .saturating_add(64 * 1024)
}

/// Serve `workspace` on `listener` until `shutdown` is cancelled and in-flight requests finish.
pub async fn run(
    listener: tokio::net::UnixListener,
    workspace: Arc<Workspace>,
    policy: PeerPolicy,
    limits: ServerLimits,
    shutdown: CancellationToken,
) {
    let policy = Arc::new(policy);
    let handler = move |peer: Peer, parts: Parts, body: Bytes| {
        let workspace = workspace.clone();
        let policy = policy.clone();
        async move {
            if !policy.allows(&peer) {
                let why = "not an allowed user";
                return refuse_peer(&peer, "workspaced.sock", parts.uri.path(), why);
            }
            route(workspace, parts, body).await
        }
    };
    serve(listener, handler, shutdown, limits).await;
}

pub(crate) async fn route(workspace: Arc<Workspace>, parts: Parts, body: Bytes) -> Response<Body> {
    let path = parts.uri.path().to_owned();
    match (&parts.method, path.as_str()) {
        (&Method::GET, "/v1/health") => json_response(
            StatusCode::OK,
            &Health {
                status: "ok".into(),
                daemon: "agentworks-workspaced".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
        ),
        (&Method::POST, "/v1/read") => call(workspace, body, |w, r| w.read(&r)).await,
        (&Method::POST, "/v1/stat") => call(workspace, body, |w, r| w.stat(&r)).await,
        (&Method::POST, "/v1/list") => call(workspace, body, |w, r| w.list(&r)).await,
        (&Method::POST, "/v1/search") => call(workspace, body, |w, r| w.search(&r)).await,
        // Writes and patches wait for their project's batch without holding a thread.
        (&Method::POST, "/v1/write") => match parse_body(&body) {
            Ok(request) => respond(workspace.write(&request).await),
            Err(error) => error.to_response(),
        },
        (&Method::POST, "/v1/patch") => match parse_body(&body) {
            Ok(request) => respond(workspace.patch(&request).await),
            Err(error) => error.to_response(),
        },
        (&Method::POST, "/v1/patch_set") => call(workspace, body, |w, r| w.patch_set(&r)).await,
        (&Method::POST, "/v1/edit") => call(workspace, body, |w, r| w.edit(&r)).await,
        (&Method::POST, "/v1/move") => call(workspace, body, |w, r| w.move_file(&r)).await,
        (&Method::POST, "/v1/delete") => call(workspace, body, |w, r| w.delete(&r)).await,
        (&Method::POST, "/v1/receipt") => call(workspace, body, |w, r| w.receipt(&r)).await,
        (&Method::POST, "/v1/history") => call(workspace, body, |w, r| w.history(&r)).await,
        (&Method::POST, "/v1/restore") => call(workspace, body, |w, r| w.restore(&r)).await,
        (&Method::POST, "/v1/projects/ensure") => {
            call(workspace, body, |w, r| w.ensure_project(&r)).await
        }
        (_, p) if p.starts_with("/v1/") => error_response(
            StatusCode::NOT_FOUND,
            "unknown_endpoint",
            format!("{} {} is not an endpoint of workspaced", parts.method, p),
            Default::default(),
        ),
        _ => error_response(
            StatusCode::NOT_FOUND,
            "unknown_endpoint",
            "workspaced serves /v1/... only",
            Default::default(),
        ),
    }
}

/// A request body as the endpoint's request type, or the `invalid_request` refusal saying why
/// not. Pure; every `/v1/...` POST body goes through here before its operation sees it.
pub fn parse_body<Req: DeserializeOwned>(body: &[u8]) -> Result<Req, WorkspaceError> {
    serde_json::from_slice(body)
        .map_err(|e| WorkspaceError::InvalidRequest(format!("the request body is not valid: {e}")))
}

/// Decode the body, run the operation on a blocking thread, encode the answer.
async fn call<Req, Resp, F>(workspace: Arc<Workspace>, body: Bytes, op: F) -> Response<Body>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: FnOnce(&Workspace, Req) -> Result<Resp, WorkspaceError> + Send + 'static,
{
    let request: Req = match parse_body(&body) {
        Ok(r) => r,
        Err(error) => return error.to_response(),
    };
    match tokio::task::spawn_blocking(move || op(&workspace, request)).await {
        Ok(answer) => respond(answer),
        Err(join) => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the operation did not finish: {join}"),
            Default::default(),
        ),
    }
}

/// An operation's answer as the response: its JSON, or its error's envelope (logged when the
/// fault is workspaced's).
fn respond<Resp: Serialize>(answer: Result<Resp, WorkspaceError>) -> Response<Body> {
    match answer {
        Ok(answer) => json_response(StatusCode::OK, &answer),
        Err(error) => {
            if error.status().is_server_error() {
                tracing::warn!(code = error.code(), %error, "workspaced request failed");
            }
            error.to_response()
        }
    }
}
