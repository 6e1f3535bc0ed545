//! The laptop CLI's TLS client, one type per platform with the same three uses: the executor's
//! WebSocket to gatewayd ([`ws_connector`]), and `login`/`chat`'s HTTPS requests to agentd
//! ([`connect`]).
//!
//! - Linux: rustls with the webpki roots and the ring provider ([`agentworks_support::tls`],
//!   the configuration the daemons use).
//! - macOS: the system's TLS, Security.framework through `native-tls`, with the system's trust
//!   settings (the login and System keychains). rustls' ring provider needs a C compiler for the
//!   target, which a Linux machine checking the macOS build does not have; Security.framework
//!   is linked, never compiled.
//!
//! Must never: turn off certificate or host name verification, or fall back to plain TCP.

use tokio::net::TcpStream;

/// Why the TLS client could not be built or could not connect.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot set up TLS: {0}")]
    Setup(String),
    /// (Only the library's reason is shown: callers name the URL.)
    #[error("{reason}")]
    ServerName { host: String, reason: String },
    #[error("{reason}")]
    Handshake { host: String, reason: String },
}

/// The client configuration, cheap to clone.
#[cfg(target_os = "linux")]
#[derive(Clone)]
pub struct TlsClient(std::sync::Arc<rustls::ClientConfig>);

/// The client configuration, cheap to clone.
#[cfg(target_os = "macos")]
#[derive(Clone)]
pub struct TlsClient(native_tls::TlsConnector);

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsClient")
    }
}

/// A TLS stream over TCP, as [`connect`] returns it.
#[cfg(target_os = "linux")]
pub type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;
/// A TLS stream over TCP, as [`connect`] returns it.
#[cfg(target_os = "macos")]
pub type TlsStream = tokio_native_tls::TlsStream<TcpStream>;

impl TlsClient {
    /// The platform's client: safe default protocol versions, the platform's trusted roots, no
    /// client certificate.
    #[cfg(target_os = "linux")]
    pub fn new() -> Result<TlsClient, TlsError> {
        agentworks_support::tls::client_config()
            .map(TlsClient)
            .map_err(|e| TlsError::Setup(e.to_string()))
    }

    /// The platform's client: TLS 1.2 at least, the system's trust settings, no client
    /// certificate.
    #[cfg(target_os = "macos")]
    pub fn new() -> Result<TlsClient, TlsError> {
        native_tls::TlsConnector::builder()
            .min_protocol_version(Some(native_tls::Protocol::Tlsv12))
            .build()
            .map(TlsClient)
            .map_err(|e| TlsError::Setup(e.to_string()))
    }
}

/// The WebSocket client's connector for this client.
pub fn ws_connector(client: TlsClient) -> tokio_tungstenite::Connector {
    #[cfg(target_os = "linux")]
    return tokio_tungstenite::Connector::Rustls(client.0);
    #[cfg(target_os = "macos")]
    return tokio_tungstenite::Connector::NativeTls(client.0);
}

/// TLS over `tcp` to `host` (a DNS name or an IP address, without brackets), the certificate
/// checked against it.
pub async fn connect(
    client: &TlsClient,
    host: &str,
    tcp: TcpStream,
) -> Result<TlsStream, TlsError> {
    let handshake = |reason: String| TlsError::Handshake {
        host: host.to_owned(),
        reason,
    };
    #[cfg(target_os = "linux")]
    {
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
            TlsError::ServerName {
                host: host.to_owned(),
                reason: e.to_string(),
            }
        })?;
        tokio_rustls::TlsConnector::from(std::sync::Arc::clone(&client.0))
            .connect(name, tcp)
            .await
            .map_err(|e| handshake(e.to_string()))
    }
    #[cfg(target_os = "macos")]
    {
        tokio_native_tls::TlsConnector::from(client.0.clone())
            .connect(host, tcp)
            .await
            .map_err(|e| handshake(e.to_string()))
    }
}
