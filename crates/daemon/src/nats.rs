//! Joining the cluster's NATS server (`[cluster] nats_url`), the one way agentd and gatewayd
//! connect: named after the daemon and this host, with `nats_credentials` if set, refusing
//! after [`CONNECT_TIMEOUT`]. What each daemon publishes or reads is its own.
//!
//! TLS: `tls://` (which the config loader requires for any host but loopback) verifies the
//! server's certificate and name against the system's CAs, or against `nats_ca_file` alone
//! when set (which also makes TLS required). A user and password in the URL
//! (`tls://user:password@host`) are sent as the NATS user: the client library reads them from
//! the URL but does not send them, so they are taken out of the URL here and passed as options;
//! nothing it logs then holds the password. Errors the server reports after the connection
//! (a permissions violation: this daemon's NATS user may not publish or subscribe there) are
//! logged as warnings.
//!
//! Credentials: `nats_credentials` if set, else the systemd credential `nats.creds`
//! (`$CREDENTIALS_DIRECTORY/nats.creds`, from `LoadCredential=nats.creds:/etc/…` in the unit),
//! else none. The systemd credential is how agentd and gatewayd on one host log in as two NATS
//! users with their own permissions while they read the same `[cluster]` section: each unit
//! loads its own file, readable by that unit alone.
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
    /// `cluster.nats_ca_file` cannot be read.
    #[error("cannot read cluster.nats_ca_file {path}: {source}")]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `cluster.nats_url` is not a NATS URL the client accepts.
    #[error("cluster.nats_url {url} is not a usable NATS URL: {source}")]
    Url { url: String, source: std::io::Error },
    /// The NATS server did not accept a connection.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
}

/// The NATS credentials file to use: `cluster.nats_credentials`, else `nats.creds` in
/// `credentials_dir` (`$CREDENTIALS_DIRECTORY`, set by systemd) if it is there.
pub fn credentials_file(
    cluster: &ClusterConfig,
    credentials_dir: Option<&std::path::Path>,
) -> Option<PathBuf> {
    cluster.nats_credentials.clone().or_else(|| {
        credentials_dir
            .map(|dir| dir.join("nats.creds"))
            .filter(|path| path.is_file())
    })
}

/// Connects `daemon` (e.g. `agentworks-gatewayd`) to `cluster.nats_url`.
pub async fn connect(
    cluster: &ClusterConfig,
    daemon: &str,
) -> Result<async_nats::Client, NatsError> {
    let url = cluster.nats_url.as_deref().ok_or(NatsError::NoUrl)?;
    let host = cluster.host_id.as_deref().unwrap_or("-");
    let mut address: async_nats::ServerAddr = url.parse().map_err(|source| NatsError::Url {
        url: redact_url(url),
        source,
    })?;
    let name = format!("{daemon} {host}");
    let mut options = async_nats::ConnectOptions::new()
        .name(name.clone())
        .connection_timeout(CONNECT_TIMEOUT)
        .event_callback(move |event| {
            let name = name.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    tracing::warn!(client = %name, "the NATS server reported: {error}");
                }
            }
        });
    if let (Some(user), Some(password)) = (address.username(), address.password()) {
        let decode = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8_lossy()
                .into_owned()
        };
        options = options.user_and_password(decode(user), decode(password));
        let mut bare = address.into_inner();
        // Both only fail on a URL that cannot have credentials, which this one just had.
        let _ = bare.set_password(None);
        let _ = bare.set_username("");
        address = async_nats::ServerAddr::from_url(bare).map_err(|source| NatsError::Url {
            url: redact_url(url),
            source,
        })?;
    }
    if let Some(path) = &cluster.nats_ca_file {
        // Read here for an error that names the file; the client reads it again to connect.
        std::fs::File::open(path).map_err(|source| NatsError::CaFile {
            path: path.clone(),
            source,
        })?;
        options = options
            .add_root_certificates(path.clone())
            .require_tls(true);
    }
    let credentials_dir = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    if let Some(path) = &credentials_file(cluster, credentials_dir.as_deref()) {
        tracing::info!(path = %path.display(), "logging in to NATS with a credentials file");
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
        .connect(address)
        .await
        .map_err(|source| NatsError::Connect {
            url: redact_url(url),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_file_wins_then_the_systemd_credential_then_none() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = ClusterConfig::default();
        assert_eq!(credentials_file(&cluster, Some(dir.path())), None);
        std::fs::write(dir.path().join("nats.creds"), "x").unwrap();
        assert_eq!(
            credentials_file(&cluster, Some(dir.path())),
            Some(dir.path().join("nats.creds"))
        );
        assert_eq!(credentials_file(&cluster, None), None);
        cluster.nats_credentials = Some(PathBuf::from("/etc/agentworks/nats.creds"));
        assert_eq!(
            credentials_file(&cluster, Some(dir.path())),
            Some(PathBuf::from("/etc/agentworks/nats.creds"))
        );
    }
}
