//! TLS to the cluster's PostgreSQL: the connector the pool connects with, for the TLS that
//! `cluster.database_url` asks for ([`DatabaseTls`], read from its `sslmode` and
//! `sslrootcert`).
//!
//! rustls with ring, as everywhere else, through `tokio-postgres-rustls`. When TLS is asked for
//! at all (`sslmode=require`, `verify-ca` or `verify-full`) the server's certificate chain *and*
//! its name are verified, as libpq's `verify-full` does: a certificate that does not verify
//! fails the connection, never falls back to clear. The trusted CAs are `sslrootcert` alone
//! when set, else the system's (`/etc/ssl/certs`, Debian's `ca-certificates`).
//!
//! Must never turn verification off: there is no "accept any certificate" mode.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::cluster_urls::{DatabaseTls, DatabaseTlsProblem};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Why the TLS to the database cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseTlsError {
    /// `sslmode` or `sslrootcert` is not usable (the config loader refuses these first).
    #[error("{0}")]
    Url(#[from] DatabaseTlsProblem),
    /// The `sslrootcert` file cannot be read or is not PEM.
    #[error("cannot read sslrootcert {path}: {source}")]
    RootCert {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    /// The `sslrootcert` file holds no certificate rustls can trust.
    #[error("sslrootcert {path} holds no usable CA certificate")]
    NoRootCert { path: PathBuf },
    /// No system CA could be loaded.
    #[error(
        "no system CA certificates could be loaded ({problems}); install ca-certificates, or \
         name the server's CA with sslrootcert=/path/ca.pem in the URL"
    )]
    NoSystemRoots { problems: String },
    /// rustls refused the configuration (no safe protocol version).
    #[error("cannot configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The connector for `tls`. With [`DatabaseTls::Off`] the store turns TLS off in the driver,
/// which never calls it; it trusts nothing, so if it were called it would fail.
pub fn connector(tls: &DatabaseTls) -> Result<MakeRustlsConnect, DatabaseTlsError> {
    let roots = match tls {
        DatabaseTls::Off => rustls::RootCertStore::empty(),
        DatabaseTls::Verified {
            root_cert: Some(path),
        } => file_roots(path)?,
        DatabaseTls::Verified { root_cert: None } => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The CA certificates in the PEM file at `path`.
fn file_roots(path: &PathBuf) -> Result<rustls::RootCertStore, DatabaseTlsError> {
    let failed = |source| DatabaseTlsError::RootCert {
        path: path.clone(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(failed)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(DatabaseTlsError::NoRootCert { path: path.clone() });
    }
    Ok(roots)
}

/// The system's trusted CAs; an error only if none at all could be loaded.
fn system_roots() -> Result<rustls::RootCertStore, DatabaseTlsError> {
    let loaded = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(loaded.certs);
    if added == 0 {
        let problems = loaded
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        return Err(DatabaseTlsError::NoSystemRoots {
            problems: if problems.is_empty() {
                "none found".to_owned()
            } else {
                problems
            },
        });
    }
    Ok(roots)
}
