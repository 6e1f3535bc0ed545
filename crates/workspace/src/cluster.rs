//! workspaced serving agentd hosts over NATS (issue 16, `[workspaced] serve_cluster`): so the
//! documents can live on a storage host that runs no agentd. Each call on this host's
//! [`workspaced_subject`] is a `workspaced.sock` endpoint and body, run by the very code that
//! serves the socket ([`crate::server::route`]) and answered with its status and body.
//!
//! The socket's peer check (agentd's uid) has no meaning across hosts; here the caller is
//! proved by the MAC instead ([`agentworks_daemon::bus`]): calls sealed under the cluster's
//! workspaced key, which only hosts that can read the shared database have. A call without a
//! valid one, a stale one, or one for an endpoint that is not a document operation is dropped
//! and logged, and runs nothing. NATS permissions (README "Securing the cluster") add that only
//! agentd's NATS user may publish here.
//!
//! Must never run a call whose MAC does not verify, and never log a call's body (it holds
//! document content).

use std::sync::Arc;

use bytes::Bytes;
use hyper::Method;
use tokio_util::sync::CancellationToken;

use agentworks_contract::cluster::workspaced_subject;
use agentworks_daemon::bus::{self, BusKey, OpenedCall};
use agentworks_support::clock::now_ms;

use crate::ops::Workspace;

/// Why this host cannot serve the cluster (workspaced then refuses to start).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot join the cluster's NATS server")]
    Nats(#[source] agentworks_daemon::nats::NatsError),
    #[error("cannot read the cluster's workspaced key from the cluster database")]
    Key(#[source] bus::KeyError),
    #[error("cannot subscribe to {subject}: {reason}")]
    Subscribe { subject: String, reason: String },
}

/// What a call may ask: the document operations of the socket, never its health probe.
fn accept(call: &agentworks_contract::cluster::PeerCall) -> Result<(), &'static str> {
    match call.path.as_str() {
        "/v1/health" => Err("not an endpoint agentd calls over NATS"),
        path if path.starts_with("/v1/") => Ok(()),
        _ => Err("not a workspaced endpoint"),
    }
}

/// Joins NATS and subscribes to this host's subject; the calls are then served by [`serve`].
pub async fn join(
    config: &agentworks_daemon::config::Config,
) -> Result<(async_nats::Client, BusKey, async_nats::Subscriber, String), ClusterError> {
    let client = agentworks_daemon::nats::connect(&config.cluster, "agentworks-workspaced")
        .await
        .map_err(ClusterError::Nats)?;
    let key = bus::cluster_key(
        &config.cluster,
        "agentworks-workspaced",
        agentworks_contract::cluster::WORKSPACED_KEY,
    )
    .await
    .map_err(ClusterError::Key)?;
    let host = config.cluster.host_id.clone().unwrap_or_default();
    let subject = workspaced_subject(&host);
    let calls = client
        .subscribe(subject.clone())
        .await
        .map_err(|e| ClusterError::Subscribe {
            subject: subject.clone(),
            reason: e.to_string(),
        })?;
    Ok((client, key, calls, subject))
}

/// Answers the calls on this host's subject until `shutdown`, each in its own task; the tasks
/// in flight are awaited before it returns.
pub async fn serve(
    workspace: Arc<Workspace>,
    client: async_nats::Client,
    key: BusKey,
    calls: async_nats::Subscriber,
    max_body_bytes: usize,
    shutdown: CancellationToken,
) {
    // The call's envelope around a body of at most `max_body_bytes`, JSON-escaped again.
    let max_message = max_body_bytes.saturating_mul(2).saturating_add(4096);
    bus::serve_calls(
        calls,
        shutdown,
        "a call to workspaced",
        "the NATS subscription for agentd's calls ended",
        |message| bus::open_call(&key, message, now_ms(), max_message, accept),
        |opened| answer(workspace.clone(), client.clone(), key.clone(), opened),
    )
    .await;
}

/// Runs one call as the socket would and publishes its answer, sealed for the caller's inbox.
async fn answer(
    workspace: Arc<Workspace>,
    client: async_nats::Client,
    key: BusKey,
    opened: OpenedCall,
) {
    let OpenedCall { call, reply } = opened;
    tracing::debug!(origin = %call.origin, path = %call.path, "a call from agentd over NATS");
    let Ok(request) = hyper::Request::builder()
        .method(Method::POST)
        .uri(call.path.as_str())
        .body(())
    else {
        tracing::warn!(origin = %call.origin, "dropped a call to workspaced: not a path");
        return;
    };
    let (parts, ()) = request.into_parts();
    let response = crate::server::route(workspace, parts, Bytes::from(call.body)).await;
    if let Err(error) = bus::answer_response(&client, &key, reply, response).await {
        tracing::warn!(%error, origin = %call.origin, "cannot answer agentd's call");
    }
}
