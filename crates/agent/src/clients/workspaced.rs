//! How agentd reaches workspaced: over `workspaced.sock` on this host (the default), or, with
//! `[agentd] workspaced_host` in a cluster, over NATS to the workspaced of that host (issue 16),
//! which serves the same endpoints and bodies ([`agentworks_contract::cluster::workspaced_subject`]).
//! `[agentd.project_workspaced_hosts]` sends single projects to other hosts, so the documents
//! may be spread over several volumes, each served by its own workspaced.
//! Either way a call gives the same result or [`ClientError`], so the file tools and the
//! operator API do not know which.
//!
//! Over NATS a call is sealed with the cluster's workspaced key ([`agentworks_daemon::bus`]). A
//! call that timed out may have run there: the caller's request id (its receipt) says whether it
//! did, as after a lost socket connection.

use std::collections::BTreeMap;
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

/// A cheap-to-clone client for workspaced: where each project's calls go.
#[derive(Clone)]
pub struct WorkspacedClient {
    /// Every project not listed in `by_project`.
    default: Route,
    /// `[agentd.project_workspaced_hosts]`: a project's folder → its workspaced.
    by_project: Arc<BTreeMap<String, Route>>,
}

/// One workspaced.
#[derive(Clone)]
enum Route {
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
    /// `agentd.workspaced_host` when set, else the socket; and to the host
    /// `[agentd.project_workspaced_hosts]` names for each project listed there.
    pub async fn for_config(
        config: &Config,
        nats: Option<async_nats::Client>,
    ) -> Result<WorkspacedClient, WorkspacedClientError> {
        let socket = Route::Socket(UnixClient::new(config.workspaced_socket()));
        let agentd = &config.agentd;
        let (Some(client), true) = (
            nats,
            agentd.workspaced_host.is_some() || !agentd.project_workspaced_hosts.is_empty(),
        ) else {
            return Ok(WorkspacedClient {
                default: socket,
                by_project: Arc::default(),
            });
        };
        let key = bus::cluster_key(&config.cluster, "agentworks-agentd", WORKSPACED_KEY)
            .await
            .map_err(WorkspacedClientError::Key)?;
        let origin: Arc<str> = Arc::from(config.cluster.host_id.as_deref().unwrap_or("-"));
        let on_host = |host: &str| Route::Cluster {
            client: client.clone(),
            key: key.clone(),
            host: Arc::from(host),
            origin: origin.clone(),
        };
        Ok(WorkspacedClient {
            default: agentd.workspaced_host.as_deref().map_or(socket, on_host),
            by_project: Arc::new(
                agentd
                    .project_workspaced_hosts
                    .iter()
                    .map(|(folder, host)| (folder.clone(), on_host(host)))
                    .collect(),
            ),
        })
    }

    /// Where calls go, for logs: the socket's path or the NATS subject, and each project
    /// sent elsewhere.
    pub fn target(&self) -> String {
        let mut target = self.default.target();
        for (folder, route) in self.by_project.iter() {
            target.push_str(&format!(", project {folder:?}: {}", route.target()));
        }
        target
    }

    /// POSTs `body` as JSON to `path` of the workspaced holding the project whose folder is
    /// `project`: the 2xx answer as `Resp`, or the error envelope as [`ClientError::Remote`],
    /// as [`UnixClient::post`] does.
    pub async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        project: &str,
        path: &str,
        body: &Req,
    ) -> Result<Resp, ClientError> {
        self.by_project
            .get(project)
            .unwrap_or(&self.default)
            .post(path, body)
            .await
    }
}

impl Route {
    fn target(&self) -> String {
        match self {
            Route::Socket(client) => client.socket().display().to_string(),
            Route::Cluster { host, .. } => workspaced_subject(host),
        }
    }

    async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, ClientError> {
        match self {
            Route::Socket(client) => client.post(path, body).await,
            Route::Cluster {
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
