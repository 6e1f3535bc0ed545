//! Joining the cluster's NATS server (`[cluster] nats_url`), the one way agentd and gatewayd
//! connect: named after the daemon and this host, with `nats_credentials` if set, refusing
//! after [`CONNECT_TIMEOUT`]. What each daemon publishes or reads is its own.
//!
//! Must never log the credentials, only their path; a URL is shown with its password hidden.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ClusterConfig, redact_url};

/// How long the first connection may take before NATS counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a daemon could not join the NATS server.
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

/// Connects `daemon` (e.g. `agentworks-gatewayd`) to `cluster.nats_url`.
pub async fn connect(
    cluster: &ClusterConfig,
    daemon: &str,
) -> Result<async_nats::Client, NatsError> {
    let url = cluster.nats_url.as_deref().ok_or(NatsError::NoUrl)?;
    let host = cluster.host_id.as_deref().unwrap_or("-");
    let mut options = async_nats::ConnectOptions::new()
        .name(format!("{daemon} {host}"))
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
    options
        .connect(url)
        .await
        .map_err(|source| NatsError::Connect {
            url: redact_url(url),
            source,
        })
}
