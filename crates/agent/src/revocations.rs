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

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentworks_daemon::config::{ClusterConfig, redact_url};

pub use agentworks_contract::cluster::REVOKED_SUBJECT;
use agentworks_contract::cluster::TokenRevoked;
/// How long the first connection may take before NATS counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one publication (with its flush) may take before it is logged as failed.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why agentd could not join the NATS server.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// `cluster.nats_url` is not set (the config loader refuses that for a cluster).
    #[error("cluster.nats_url is not set")]
    NoUrl,
    /// The credentials file could not be read or is not a NATS credentials file.
    #[error("cannot use the NATS credentials file {path}: {source}")]
    Credentials {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The NATS server did not accept a connection.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
}

/// agentd's NATS connection, which publishes revocations.
pub struct RevocationBus {
    client: async_nats::Client,
}

impl RevocationBus {
    /// Connects to `cluster.nats_url` (with `cluster.nats_credentials` if set), named after
    /// this host.
    pub async fn join(cluster: &ClusterConfig) -> Result<RevocationBus, NatsError> {
        let url = cluster.nats_url.as_deref().ok_or(NatsError::NoUrl)?;
        let host = cluster.host_id.as_deref().unwrap_or("-");
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("agentworks-agentd {host}"))
            .connection_timeout(CONNECT_TIMEOUT);
        if let Some(path) = &cluster.nats_credentials {
            options =
                options
                    .credentials_file(path)
                    .await
                    .map_err(|source| NatsError::Credentials {
                        path: path.clone(),
                        source,
                    })?;
        }
        let client = options
            .connect(url)
            .await
            .map_err(|source| NatsError::Connect {
                url: redact_url(url),
                source,
            })?;
        Ok(RevocationBus { client })
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
