//! runnerd's socket API (`runnerd.sock`, `agentworks_contract::runnerd`): health, the providers,
//! a turn as a stream of JSON lines, cancel, and agentd's answers to bridge calls; after
//! checking the peer.
//!
//! Only root, runnerd's own user and the configured callers (agentd's user) are served; anyone
//! else who can open the socket gets `peer_forbidden`. Every failure is the one error envelope.

use std::sync::Arc;

use agentworks_contract::envelope::Health;
use agentworks_contract::runnerd::{
    BridgeAnswer, MAX_BRIDGE_ANSWER_BYTES, MAX_TURN_REQUEST_BYTES, ProvidersAnswer, TurnRequest,
};
use agentworks_daemon::ipc::envelope::{
    Body, decode_json, error_response, json_response, streaming,
};
use agentworks_daemon::ipc::server::{Peer, PeerPolicy, ServerLimits, refuse_peer, serve};
use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use tokio_util::sync::CancellationToken;

use crate::bridge::endpoint::AnswerError;
use crate::turn::Runner;

/// Serve `runner` on `listener` until `shutdown` is cancelled.
pub async fn run(
    listener: tokio::net::UnixListener,
    runner: Arc<Runner>,
    policy: PeerPolicy,
    shutdown: CancellationToken,
) {
    let policy = Arc::new(policy);
    let handler = move |peer: Peer, parts: Parts, body: Bytes| {
        let runner = runner.clone();
        let policy = policy.clone();
        async move {
            if !policy.allows(&peer) {
                return refuse_peer(
                    &peer,
                    "runnerd.sock",
                    parts.uri.path(),
                    "not an allowed user",
                );
            }
            route(&runner, &parts, &body)
        }
    };
    let limits = ServerLimits {
        max_connections: 256,
        max_body_bytes: MAX_TURN_REQUEST_BYTES.max(MAX_BRIDGE_ANSWER_BYTES),
    };
    serve(listener, handler, shutdown, limits).await;
}

/// One call of the socket's API, after the peer check; also what a call over NATS runs
/// ([`crate::cluster`]).
pub(crate) fn route(runner: &Arc<Runner>, parts: &Parts, body: &[u8]) -> Response<Body> {
    let path = parts.uri.path();
    match (&parts.method, path) {
        (&Method::GET, "/v1/health") => json_response(
            StatusCode::OK,
            &Health {
                status: "ok".into(),
                daemon: "agentworks-runnerd".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
        ),
        (&Method::GET, "/v1/providers") => json_response(
            StatusCode::OK,
            &ProvidersAnswer {
                providers: runner.providers.info(),
                bridge_unavailable: runner.bridge.binary.as_ref().err().cloned(),
            },
        ),
        (&Method::POST, "/v1/turns") => {
            let request: TurnRequest = match decode_json(body) {
                Ok(request) => request,
                Err(refusal) => return refusal.into_response(),
            };
            let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
            runner.start_turn(request, sender);
            let mut response = Response::new(streaming(receiver));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            );
            response
        }
        (&Method::POST, p) if p.starts_with("/v1/turns/") && p.ends_with("/cancel") => {
            let id = &p["/v1/turns/".len()..p.len() - "/cancel".len()];
            if runner.cancel(id) {
                json_response(StatusCode::OK, &serde_json::json!({"cancelled": id}))
            } else {
                error_response(
                    StatusCode::NOT_FOUND,
                    "unknown_turn",
                    format!("no turn {id:?} is running"),
                    Default::default(),
                )
            }
        }
        (&Method::POST, p) if p.starts_with("/v1/turns/") && p.contains("/bridge/") => {
            let rest = &p["/v1/turns/".len()..];
            let Some((turn_id, call_id)) = rest.split_once("/bridge/") else {
                return unknown_endpoint(parts);
            };
            let answer: BridgeAnswer = match decode_json(body) {
                Ok(answer) => answer,
                Err(refusal) => return refusal.into_response(),
            };
            match runner.bridge.endpoint.answer(turn_id, call_id, answer) {
                Ok(()) => json_response(StatusCode::OK, &serde_json::json!({"answered": call_id})),
                Err(e @ AnswerError::Malformed) => error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    e.to_string(),
                    Default::default(),
                ),
                Err(e) => error_response(
                    StatusCode::NOT_FOUND,
                    "unknown_bridge_call",
                    e.to_string(),
                    Default::default(),
                ),
            }
        }
        _ => unknown_endpoint(parts),
    }
}

fn unknown_endpoint(parts: &Parts) -> Response<Body> {
    error_response(
        StatusCode::NOT_FOUND,
        "unknown_endpoint",
        format!(
            "{} {} is not an endpoint of runnerd",
            parts.method,
            parts.uri.path()
        ),
        Default::default(),
    )
}
