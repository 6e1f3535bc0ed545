//! agentd on the cluster's NATS server (issue 16): announces every token revoked here on
//! [`REVOKED_SUBJECT`] (`{"token_id": "…"}`), so every gatewayd re-checks that token with agentd
//! at once and closes its connections within a second.
//!
//! Rows are the truth; the message only wakes. It is published *after* the revocation is
//! committed (the identity store hands the id over only then), from a task of its own: a
//! revocation never waits for NATS, and a message that cannot be published is logged and left
//! to gatewayd's periodic re-check (`gatewayd.token_recheck_ms`). At start NATS must answer
//! (agentd refuses to start otherwise, before READY); later the client reconnects by itself.
//! Must never log the credentials, only their path.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentworks_daemon::config::ClusterConfig;
pub use agentworks_daemon::nats::NatsError;

pub use agentworks_contract::cluster::REVOKED_SUBJECT;
use agentworks_contract::cluster::TokenRevoked;
/// How long one publication (with its flush) may take before it is logged as failed.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// agentd's NATS connection, which publishes revocations.
pub struct RevocationBus {
    client: async_nats::Client,
}

impl RevocationBus {
    /// Connects to `cluster.nats_url` (with `cluster.nats_credentials` if set), named after
    /// this host.
    pub async fn join(cluster: &ClusterConfig) -> Result<RevocationBus, NatsError> {
        let client = agentworks_daemon::nats::connect(cluster, "agentworks-agentd").await?;
        Ok(RevocationBus { client })
    }

    /// The connection, for agentd's other uses of NATS (a workspaced on another host).
    pub fn client(&self) -> async_nats::Client {
        self.client.clone()
    }
}

/// The message announcing `token_id`'s revocation.
pub fn message(token_id: &str) -> Vec<u8> {
    let message = TokenRevoked {
        token_id: token_id.to_owned(),
    };
    // A struct of one string always serializes.
    serde_json::to_vec(&message).unwrap_or_default()
}

/// Publishes every token id received on `revoked` until `shutdown` (or until every sender is
/// gone); a failure is logged and the next id is published as usual.
pub async fn publish_revocations(
    bus: RevocationBus,
    mut revoked: mpsc::UnboundedReceiver<String>,
    shutdown: CancellationToken,
) {
    loop {
        let token_id = tokio::select! {
            _ = shutdown.cancelled() => return,
            token_id = revoked.recv() => match token_id {
                Some(token_id) => token_id,
                None => return,
            },
        };
        let client = &bus.client;
        let published = tokio::time::timeout(PUBLISH_TIMEOUT, async {
            client
                .publish(REVOKED_SUBJECT, message(&token_id).into())
                .await
                .map_err(|e| e.to_string())?;
            client.flush().await.map_err(|e| e.to_string())
        })
        .await;
        match published {
            Ok(Ok(())) => tracing::info!(
                token_id,
                subject = REVOKED_SUBJECT,
                "announced a revoked token"
            ),
            Ok(Err(error)) => tracing::warn!(
                token_id,
                error,
                "cannot announce a revoked token on NATS; gatewayd's periodic re-check closes its connections"
            ),
            Err(_) => tracing::warn!(
                token_id,
                "announcing a revoked token on NATS timed out; gatewayd's periodic re-check closes its connections"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_what_gatewayd_reads() {
        assert_eq!(message("tok_1"), br#"{"token_id":"tok_1"}"#);
    }
}
