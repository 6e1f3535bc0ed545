//! runnerd serving agentd hosts over NATS (`[runnerd] serve_cluster`): the host that stores a
//! project runs its coding CLIs, and agentd on another host reaches it here as it would reach
//! `runnerd.sock`. Each call on this host's [`runnerd_subject`] is a socket endpoint and body,
//! run by the very code that serves the socket ([`crate::server::route`]): the providers, a
//! turn's cancel, agentd's answer to a bridge call. A turn ([`RUNNERD_TURNS`], a [`TurnCall`])
//! is started as the socket starts one, and its stream goes to the inbox the caller named, as
//! sealed [`TurnFrame`]s numbered in order, with a heartbeat every [`TURN_HEARTBEAT_SECS`]
//! while it runs (agentd ends a turn whose frames stop as `runnerd_unreachable`).
//!
//! The socket's peer check has no meaning across hosts; here the caller is proved by the MAC
//! ([`agentworks_daemon::bus`], the cluster's runnerd key): a call without a valid one, a stale
//! one, an oversized one or one for an endpoint agentd does not call is dropped and logged, and
//! runs nothing. A turn's frames go only to an `_INBOX.` subject, never to another daemon's.
//!
//! Must never run a call whose MAC does not verify, publish a turn's events unsealed, or log a
//! call's body (it holds the person's prompt).

use std::sync::Arc;
use std::time::Duration;

use agentworks_contract::cluster::{
    PeerCall, RUNNERD_KEY, RUNNERD_TURNS, TURN_HEARTBEAT_SECS, TurnCall, TurnFrame, inbox_problem,
    runnerd_subject,
};
use agentworks_contract::runnerd::{MAX_BRIDGE_ANSWER_BYTES, MAX_TURN_REQUEST_BYTES};
use agentworks_daemon::bus::{self, BusKey, OpenedCall};
use agentworks_daemon::ipc::envelope::{Body, decode_json, error_response, json_response};
use agentworks_support::clock::now_ms;
use bytes::Bytes;
use hyper::{Method, Response, StatusCode};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::turn::Runner;

/// Why this host cannot serve the cluster (runnerd then refuses to start).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot join the cluster's NATS server")]
    Nats(#[source] agentworks_daemon::nats::NatsError),
    #[error("cannot read the cluster's runnerd key from the cluster database")]
    Key(#[source] bus::KeyError),
    #[error("cannot subscribe to {subject}: {reason}")]
    Subscribe { subject: String, reason: String },
}

/// What NATS brings this host once it joined: the connection, the key, the subscription to
/// its subject and the subject's name.
pub struct Joined {
    pub client: async_nats::Client,
    pub key: BusKey,
    pub calls: async_nats::Subscriber,
    pub subject: String,
}

/// The most bytes of a call's body on `path`: what the socket takes, plus a turn's inbox.
fn max_body(path: &str) -> usize {
    if path == RUNNERD_TURNS {
        MAX_TURN_REQUEST_BYTES + 1024
    } else if path.contains("/bridge/") {
        MAX_BRIDGE_ANSWER_BYTES
    } else {
        4096
    }
}

/// What a call may ask: the endpoints agentd calls, never the health probe, each body within
/// its bound.
fn accept(call: &PeerCall) -> Result<(), &'static str> {
    let path = call.path.as_str();
    let known = path == "/v1/providers"
        || path == RUNNERD_TURNS
        || (path.starts_with("/v1/turns/")
            && (path.ends_with("/cancel") || path.contains("/bridge/")));
    if !known {
        return Err("not an endpoint agentd calls over NATS");
    }
    if call.body.len() > max_body(path) {
        return Err("its body is too large");
    }
    Ok(())
}

/// Joins NATS and subscribes to this host's subject; the calls are then served by [`serve`].
pub async fn join(config: &agentworks_daemon::config::Config) -> Result<Joined, ClusterError> {
    let client = agentworks_daemon::nats::connect(&config.cluster, "agentworks-runnerd")
        .await
        .map_err(ClusterError::Nats)?;
    let key = bus::cluster_key(&config.cluster, "agentworks-runnerd", RUNNERD_KEY)
        .await
        .map_err(ClusterError::Key)?;
    let host = config.cluster.host_id.clone().unwrap_or_default();
    let subject = runnerd_subject(&host);
    let calls = client
        .subscribe(subject.clone())
        .await
        .map_err(|e| ClusterError::Subscribe {
            subject: subject.clone(),
            reason: e.to_string(),
        })?;
    Ok(Joined {
        client,
        key,
        calls,
        subject,
    })
}

/// Answers the calls on this host's subject until `shutdown`, each in its own task.
pub async fn serve(runner: Arc<Runner>, joined: Joined, shutdown: CancellationToken) {
    let Joined {
        client, key, calls, ..
    } = joined;
    // The call's envelope around the largest body, JSON-escaped again.
    let max_message = MAX_TURN_REQUEST_BYTES
        .max(MAX_BRIDGE_ANSWER_BYTES)
        .saturating_mul(2)
        .saturating_add(4096);
    bus::serve_calls(
        calls,
        shutdown,
        "a call to runnerd",
        "the NATS subscription for agentd's calls ended",
        |message| bus::open_call(&key, message, now_ms(), max_message, accept),
        |opened| answer(runner.clone(), client.clone(), key.clone(), opened),
    )
    .await;
}

/// Runs one call as the socket would and publishes its answer, sealed for the caller's inbox.
async fn answer(runner: Arc<Runner>, client: async_nats::Client, key: BusKey, opened: OpenedCall) {
    let OpenedCall { call, reply } = opened;
    tracing::debug!(origin = %call.origin, path = %call.path, "a call from agentd over NATS");
    let response = if call.path == RUNNERD_TURNS {
        start_turn(&runner, &client, &key, call.body.as_bytes())
    } else {
        // The socket's one GET that agentd calls; everything else it POSTs.
        let method = if call.path == "/v1/providers" {
            Method::GET
        } else {
            Method::POST
        };
        let Ok(request) = hyper::Request::builder()
            .method(method)
            .uri(call.path.as_str())
            .body(())
        else {
            tracing::warn!(origin = %call.origin, "dropped a call to runnerd: not a path");
            return;
        };
        let (parts, ()) = request.into_parts();
        crate::server::route(&runner, &parts, call.body.as_bytes())
    };
    if let Err(error) = bus::answer_response(&client, &key, reply, response).await {
        tracing::warn!(%error, origin = %call.origin, "cannot answer agentd's call");
    }
}

/// Starts the turn of a [`TurnCall`] and streams it to its inbox: 202 `{"inbox"}`, or the
/// socket's refusal of its body.
fn start_turn(
    runner: &Arc<Runner>,
    client: &async_nats::Client,
    key: &BusKey,
    body: &[u8],
) -> Response<Body> {
    let call: TurnCall = match decode_json(body) {
        Ok(call) => call,
        Err(refusal) => return refusal.into_response(),
    };
    if let Some(problem) = inbox_problem(&call.inbox) {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("the turn's inbox is refused: {problem}"),
            Default::default(),
        );
    }
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    runner.start_turn(call.turn, sender);
    let chunk = frame_chunk_bytes(client.server_info().max_payload);
    tokio::spawn(stream_turn(
        client.clone(),
        key.clone(),
        call.inbox.clone(),
        receiver,
        chunk,
    ));
    json_response(
        StatusCode::ACCEPTED,
        &serde_json::json!({"inbox": call.inbox}),
    )
}

/// The most bytes of an event line one frame carries, for a server whose messages carry at most
/// `max_payload` bytes: JSON-escaping a line at most doubles it, and the frame's fields and
/// NATS's headers take the rest.
fn frame_chunk_bytes(max_payload: usize) -> usize {
    (max_payload.saturating_sub(1024) / 2).max(1024)
}

/// `line` cut into pieces of at most `max` bytes (at least 4), never inside a character.
fn pieces(line: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while rest.len() > max {
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out.push(rest);
    out
}

/// Publishes the turn's lines from `lines` to `inbox` as numbered, sealed frames, a heartbeat
/// whenever nothing else went out for [`TURN_HEARTBEAT_SECS`], and `closed` once the turn's
/// stream ends. A frame that cannot be published is logged (agentd then sees the gap or the
/// silence and ends the turn).
async fn stream_turn(
    client: async_nats::Client,
    key: BusKey,
    inbox: String,
    mut lines: UnboundedReceiver<Bytes>,
    chunk: usize,
) {
    let every = Duration::from_secs(TURN_HEARTBEAT_SECS);
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    let mut failed = false;
    let mut send = async |frame: TurnFrame| {
        let Ok(payload) = serde_json::to_vec(&frame) else {
            return;
        };
        if let Err(error) = bus::publish_sealed(&client, &key, inbox.clone(), payload).await
            && !failed
        {
            failed = true;
            tracing::warn!(%error, inbox, "cannot publish a turn's frame to agentd");
        }
    };
    loop {
        tokio::select! {
            line = lines.recv() => {
                let Some(line) = line else {
                    send(TurnFrame::Closed { seq }).await;
                    return;
                };
                let text = String::from_utf8_lossy(&line);
                let parts = pieces(text.trim_end_matches('\n'), chunk);
                let last = parts.len() - 1;
                for (i, data) in parts.into_iter().enumerate() {
                    send(TurnFrame::Line { seq, data: data.to_owned(), more: i < last }).await;
                    seq += 1;
                }
                heartbeat.reset();
            }
            _ = heartbeat.tick() => {
                send(TurnFrame::Heartbeat { seq }).await;
                seq += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(path: &str, body: &str) -> PeerCall {
        PeerCall {
            origin: "a-1".into(),
            sent_at_ms: 0,
            path: path.into(),
            body: body.into(),
        }
    }

    #[test]
    fn only_the_endpoints_agentd_calls_are_taken_each_within_its_bound() {
        for path in [
            "/v1/providers",
            "/v1/turns",
            "/v1/turns/turn_1/cancel",
            "/v1/turns/turn_1/bridge/c1",
        ] {
            assert_eq!(accept(&call(path, "{}")), Ok(()), "{path}");
        }
        for path in ["/v1/health", "/v1/turns/x", "/v2/providers", "/"] {
            assert!(accept(&call(path, "{}")).is_err(), "{path}");
        }
        let big = "x".repeat(5000);
        assert_eq!(
            accept(&call("/v1/turns/t/cancel", &big)),
            Err("its body is too large")
        );
        assert_eq!(accept(&call("/v1/turns", &big)), Ok(()));
    }

    #[test]
    fn a_long_line_is_cut_into_frames_never_inside_a_character() {
        let line = "aé".repeat(10);
        let parts = pieces(&line, 4);
        assert!(parts.iter().all(|p| p.len() <= 4 && !p.is_empty()));
        assert_eq!(parts.concat(), line);
        assert_eq!(pieces("short", 100), ["short"]);
        assert_eq!(frame_chunk_bytes(1024 * 1024), (1024 * 1024 - 1024) / 2);
        assert_eq!(frame_chunk_bytes(10), 1024);
    }
}
