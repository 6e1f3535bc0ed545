//! How agentd reaches workspaced: over `workspaced.sock` on this host (the default), or, with
//! `[agentd] workspaced_host` in a cluster, over NATS to the workspaced of that host (issue 16),
//! which serves the same endpoints and bodies ([`agentworks_contract::cluster::workspaced_subject`]).
//! Either way a call gives the same result or [`ClientError`], so the file tools and the
//! operator API do not know which.
//!
//! Over NATS a call is sealed with the cluster's workspaced key ([`agentworks_daemon::bus`]). A
//! call that timed out may have run there: the caller's request id (its receipt) says whether it
//! did, as after a lost socket connection.

use std::sync::Arc;
use std::time::Duration;

use agentworks_contract::cluster::{PeerCall, WORKSPACED_KEY, workspaced_subject};
use agentworks_daemon::bus::{self, BusError, BusKey};
use agentworks_daemon::config::Config;
use agentworks_support::clock::now_ms;
use agentworks_support::unix_http::{ClientError, UnixClient, decode_response};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How long a call over NATS waits for workspaced's answer: longer than a write may wait for
/// its project's lock.
pub const CLUSTER_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the workspaced of another host cannot be reached at start.
#[derive(Debug, thiserror::Error)]
pub enum WorkspacedClientError {
    #[error("cannot read the cluster's workspaced key from the cluster database")]
    Key(#[source] bus::KeyError),
}

/// A cheap-to-clone client for workspaced.
#[derive(Clone)]
pub enum WorkspacedClient {
    /// `workspaced.sock` on this host.
    Socket(UnixClient),
    /// The workspaced of cluster host `host`, over NATS.
    Cluster {
        client: async_nats::Client,
        key: BusKey,
        /// The workspaced host called.
        host: Arc<str>,
        /// This agentd's host id, as the calls' origin.
        origin: Arc<str>,
    },
}

impl WorkspacedClient {
    /// The client `config` asks for: over NATS (`nats`, agentd's connection) to
    /// `agentd.workspaced_host` when set, else the socket.
    pub async fn for_config(
        config: &Config,
        nats: Option<async_nats::Client>,
    ) -> Result<WorkspacedClient, WorkspacedClientError> {
        let (Some(host), Some(client)) = (&config.agentd.workspaced_host, nats) else {
            return Ok(WorkspacedClient::Socket(UnixClient::new(
                config.workspaced_socket(),
            )));
        };
        let key = bus::cluster_key(&config.cluster, "agentworks-agentd", WORKSPACED_KEY)
            .await
            .map_err(WorkspacedClientError::Key)?;
        Ok(WorkspacedClient::Cluster {
            client,
            key,
            host: Arc::from(host.as_str()),
            origin: Arc::from(config.cluster.host_id.as_deref().unwrap_or("-")),
        })
    }

    /// Where calls go, for logs: the socket's path or the NATS subject.
    pub fn target(&self) -> String {
        match self {
            WorkspacedClient::Socket(client) => client.socket().display().to_string(),
            WorkspacedClient::Cluster { host, .. } => workspaced_subject(host),
        }
    }

    /// POSTs `body` as JSON to `path`: the 2xx answer as `Resp`, or the error envelope as
    /// [`ClientError::Remote`], as [`UnixClient::post`] does.
    pub async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, ClientError> {
        match self {
            WorkspacedClient::Socket(client) => client.post(path, body).await,
            WorkspacedClient::Cluster {
                client,
                key,
                host,
                origin,
            } => {
                let body = serde_json::to_string(body).map_err(|source| ClientError::Encode {
                    endpoint: path.to_owned(),
                    source,
                })?;
                let call = PeerCall {
                    origin: origin.to_string(),
                    sent_at_ms: now_ms(),
                    path: path.to_owned(),
                    body,
                };
                let subject = workspaced_subject(host);
                let (status, answer) =
                    bus::request(client, key, &subject, &call, CLUSTER_CALL_TIMEOUT)
                        .await
                        .map_err(|error| ClientError::Elsewhere {
                            endpoint: path.to_owned(),
                            reason: match error {
                                BusError::NoResponders { .. } => format!(
                                    "no workspaced serves cluster host {host:?} ({subject}); \
                                     nothing was sent"
                                ),
                                other => other.to_string(),
                            },
                        })?;
                decode_response(path, status, &answer)
            }
        }
    }
}
