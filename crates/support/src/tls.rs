//! The one TLS client configuration: the webpki roots and the ring provider, safe default
//! protocol versions, no client certificate. Used by the laptop (gatewayd, agentd) and by
//! agentd (the model endpoint).

use std::sync::Arc;

/// A rustls client config with the webpki roots and the ring provider.
pub fn client_config() -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}
