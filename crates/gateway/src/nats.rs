//! gatewayd on the cluster's NATS server (issue 16): the connection, with this daemon's
//! credentials file, the revocation subject [`REVOKED_SUBJECT`], and the subjects agentd calls
//! gatewayd on ([`crate::agentd_calls`]): this host's [`gateway_subject`], for devices connected here,
//! and [`GATEWAY_ANY_SUBJECT`] in the queue group [`GATEWAY_QUEUE`].
//!
//! Messages only wake; rows are the truth. A message on [`REVOKED_SUBJECT`] names a token id
//! (`{"token_id": "…"}`, at most [`MAX_MESSAGE_BYTES`]). gatewayd does not take the message's
//! word for it: if the token has connections here, it asks agentd about that token at once (as
//! its periodic pass does for every connected token) and closes those connections (4001) only
//! if agentd no longer accepts it. A forged or replayed message therefore closes nothing that is
//! still valid, a malformed one is dropped and logged, and a lost one is caught by the periodic
//! pass (`gatewayd.token_recheck_ms`), which never depends on NATS.
//!
//! At start, NATS must answer (gatewayd refuses to start otherwise, before READY); later the
//! client reconnects by itself and the periodic pass covers the gap. Must never log the
//! credentials, only their path.

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use agentworks_daemon::config::ClusterConfig;

use crate::{Gateway, revoke};

pub use agentworks_contract::cluster::{
    GATEWAY_ANY_SUBJECT, GATEWAY_QUEUE, REVOKED_SUBJECT, TokenRevoked as Revoked, gateway_subject,
};
/// The largest revocation message read; a bigger one is dropped.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Why gatewayd could not join the NATS server.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// Connecting failed (no URL, the credentials file, the server).
    #[error(transparent)]
    Join(#[from] agentworks_daemon::nats::NatsError),
    /// The revocation subject could not be subscribed to.
    #[error("cannot subscribe to NATS subject {subject}: {source}")]
    Subscribe {
        subject: String,
        source: async_nats::SubscribeError,
    },
    /// `cluster.host_id` is not set (the config loader settles one for every cluster).
    #[error("cluster.host_id is not set; set cluster.host_id")]
    NoHostId,
}

/// gatewayd's connection to NATS and its subscriptions: [`REVOKED_SUBJECT`], this host's
/// [`gateway_subject`] and [`GATEWAY_ANY_SUBJECT`].
pub struct Bus {
    pub(crate) client: async_nats::Client,
    pub(crate) revocations: async_nats::Subscriber,
    pub(crate) host_calls: async_nats::Subscriber,
    pub(crate) any_calls: async_nats::Subscriber,
}

impl Bus {
    /// Connects to `cluster.nats_url` (with `cluster.nats_credentials` if set), named after
    /// this host, and subscribes to [`REVOKED_SUBJECT`], [`gateway_subject`]`(host_id)` and
    /// [`GATEWAY_ANY_SUBJECT`] (in [`GATEWAY_QUEUE`]).
    pub async fn join(cluster: &ClusterConfig) -> Result<Bus, NatsError> {
        let host_id = cluster.host_id.as_deref().ok_or(NatsError::NoHostId)?;
        let client = agentworks_daemon::nats::connect(cluster, "agentworks-gatewayd").await?;
        let subscribe = |subject: String| {
            let client = client.clone();
            async move {
                client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|source| NatsError::Subscribe { subject, source })
            }
        };
        let revocations = subscribe(REVOKED_SUBJECT.to_owned()).await?;
        let host_calls = subscribe(gateway_subject(host_id)).await?;
        let any_calls = client
            .queue_subscribe(GATEWAY_ANY_SUBJECT, GATEWAY_QUEUE.to_owned())
            .await
            .map_err(|source| NatsError::Subscribe {
                subject: GATEWAY_ANY_SUBJECT.to_owned(),
                source,
            })?;
        // The subscriptions are in place on the server before READY.
        let _ = client.flush().await;
        Ok(Bus {
            client,
            revocations,
            host_calls,
            any_calls,
        })
    }
}

/// Reads [`REVOKED_SUBJECT`] until `shutdown`; see the module doc for what a message does.
pub async fn watch_revocations(
    gateway: Gateway,
    mut revocations: async_nats::Subscriber,
    shutdown: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return,
            message = revocations.next() => message,
        };
        let Some(message) = message else {
            tracing::warn!(
                subject = REVOKED_SUBJECT,
                "the NATS revocation subscription ended; the periodic token re-check remains"
            );
            return;
        };
        let revoked = match parse(&message.payload) {
            Ok(revoked) => revoked,
            Err(problem) => {
                tracing::warn!(
                    subject = REVOKED_SUBJECT,
                    bytes = message.payload.len(),
                    problem,
                    "dropped a revocation message"
                );
                continue;
            }
        };
        close_if_revoked(&gateway, &revoked.token_id).await;
    }
}

/// A revocation message's token id, or why the message is dropped.
fn parse(payload: &[u8]) -> Result<Revoked, &'static str> {
    if payload.len() > MAX_MESSAGE_BYTES {
        return Err("longer than 1024 bytes");
    }
    let revoked: Revoked = serde_json::from_slice(payload).map_err(|_| "not {\"token_id\": …}")?;
    if revoked.token_id.is_empty() {
        return Err("an empty token id");
    }
    Ok(revoked)
}

/// Closes `token_id`'s connections on this host if agentd no longer accepts the token.
async fn close_if_revoked(gateway: &Gateway, token_id: &str) {
    let connected: Vec<(String, u64, String)> = gateway
        .registry
        .tokens()
        .into_iter()
        .filter(|(_, _, token)| token == token_id)
        .collect();
    if connected.is_empty() {
        return;
    }
    match gateway.tokens.invalid(vec![token_id.to_owned()]).await {
        Ok(invalid) if invalid.iter().any(|t| t == token_id) => {
            for (device_id, conn_id, _) in &connected {
                revoke(gateway, device_id, *conn_id);
            }
        }
        Ok(_) => tracing::warn!(
            token_id,
            "a revocation message named a token agentd still accepts; nothing closed"
        ),
        Err(error) => tracing::warn!(
            %error,
            token_id,
            "cannot check a token named by a revocation message; the periodic re-check will"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_small_well_formed_message_names_a_token() {
        assert_eq!(
            parse(br#"{"token_id":"tok_1"}"#),
            Ok(Revoked {
                token_id: "tok_1".into()
            })
        );
        for bad in [
            &br#"{"token_id":""}"#[..],
            br#"{"token_id":"t","user":"u"}"#,
            br#"{"token":"t"}"#,
            b"tok_1",
            b"",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let long = format!(r#"{{"token_id":"{}"}}"#, "t".repeat(MAX_MESSAGE_BYTES));
        assert_eq!(parse(long.as_bytes()), Err("longer than 1024 bytes"));
    }
}
