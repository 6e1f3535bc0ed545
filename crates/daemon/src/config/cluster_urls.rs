//! What a `[cluster]` URL says about the network it crosses: whether every host it names is this
//! machine (a loopback address, `localhost`, or for PostgreSQL a Unix socket), and the TLS a
//! PostgreSQL URL asks for with libpq's `sslmode` and `sslrootcert`.
//!
//! The config loader refuses a URL that would carry the cluster's traffic to another machine in
//! clear; gatewayd's store opens the database with the TLS read here. The `postgres` driver knows
//! only `sslmode=disable|prefer|require` and no `sslrootcert`, so both are taken out of the URL
//! it is given and applied by the store: whenever TLS is asked for, the server's certificate
//! and name are verified (as libpq's `verify-full`), against `sslrootcert` if set, else the
//! system's trusted CAs.
//!
//! Must never print a URL's password: callers show URLs through `redact_url`.

use std::path::PathBuf;

use agentworks_support::url::is_loopback_host;

/// The hosts in the authority of `url` (`scheme://[user[:password]@]host[:port][,host[:port]…]`),
/// percent-decoded, IPv6 brackets removed; an empty one stays empty.
fn authority_hosts(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    hosts
        .split(',')
        .map(|host_port| {
            let host = match host_port.strip_prefix('[') {
                Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
                None => host_port.split(':').next().unwrap_or_default(),
            };
            decode(host)
        })
        .collect()
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// The first host of `url` that is not this machine's loopback, if any. `local_socket` says
/// whether a host may also be a Unix socket directory (PostgreSQL: an absolute path, or empty
/// for the driver's default).
fn first_remote_host<'a>(
    hosts: impl IntoIterator<Item = &'a String>,
    local_socket: bool,
) -> Option<String> {
    hosts
        .into_iter()
        .find(|host| {
            let socket = local_socket && (host.is_empty() || host.starts_with('/'));
            !socket && !is_loopback_host(host)
        })
        .cloned()
}

/// The host of a `nats://` or `tls://` URL when it is not this machine, else `None`.
pub fn nats_remote_host(url: &str) -> Option<String> {
    first_remote_host(&authority_hosts(url), false)
}

/// The TLS a PostgreSQL URL asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseTls {
    /// No TLS: `sslmode` unset, `disable`, `allow` or `prefer` (this machine only).
    Off,
    /// `sslmode=require`, `verify-ca` or `verify-full`: TLS, the certificate and the server's
    /// name verified, against `root_cert` (`sslrootcert`) if set, else the system's CAs.
    Verified { root_cert: Option<PathBuf> },
}

/// A PostgreSQL URL read for its hosts and TLS.
#[derive(Debug, Clone)]
pub struct DatabaseUrl {
    /// The URL without `sslmode` and `sslrootcert`, for the `postgres` driver.
    pub driver_url: String,
    /// What `sslmode` and `sslrootcert` ask for.
    pub tls: DatabaseTls,
    /// The first host it names (in the authority, `host=` or `hostaddr=`) that is not this
    /// machine, if any.
    pub remote_host: Option<String>,
}

/// Why the TLS parameters of a PostgreSQL URL are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatabaseTlsProblem {
    #[error("sslmode={0:?} is not one of disable, allow, prefer, require, verify-ca, verify-full")]
    UnknownSslMode(String),
    #[error("sslrootcert {0:?} must be an absolute path (or \"system\")")]
    RelativeRootCert(String),
    #[error("sslrootcert is set but sslmode does not ask for TLS: add sslmode=verify-full")]
    RootCertWithoutTls,
}

/// Reads `url`'s hosts and its `sslmode` and `sslrootcert` (the query string is
/// `key=value&…`, percent-encoded).
pub fn parse_database_url(url: &str) -> Result<DatabaseUrl, DatabaseTlsProblem> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut hosts = authority_hosts(base);
    let (mut sslmode, mut root_cert) = (None, None);
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match decode(key).as_str() {
            "sslmode" => sslmode = Some(decode(value)),
            "sslrootcert" => root_cert = Some(decode(value)),
            "host" | "hostaddr" => {
                hosts.extend(decode(value).split(',').map(str::to_owned));
                kept.push(pair);
            }
            _ => kept.push(pair),
        }
    }
    let wants_tls = match sslmode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => false,
        Some("require" | "verify-ca" | "verify-full") => true,
        Some(other) => return Err(DatabaseTlsProblem::UnknownSslMode(other.to_owned())),
    };
    let root_cert = match root_cert.as_deref() {
        None | Some("system") => None,
        Some(path) if path.starts_with('/') => Some(PathBuf::from(path)),
        Some(path) => return Err(DatabaseTlsProblem::RelativeRootCert(path.to_owned())),
    };
    let tls = match (wants_tls, root_cert) {
        (true, root_cert) => DatabaseTls::Verified { root_cert },
        (false, None) => DatabaseTls::Off,
        (false, Some(_)) => return Err(DatabaseTlsProblem::RootCertWithoutTls),
    };
    let driver_url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(DatabaseUrl {
        driver_url,
        tls,
        remote_host: first_remote_host(&hosts, true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_hosts_on_this_machine_and_elsewhere() {
        for local in [
            "nats://127.0.0.1:4222",
            "nats://localhost",
            "tls://u:p@[::1]:4222",
            "nats://127.0.0.2:4222",
        ] {
            assert_eq!(nats_remote_host(local), None, "{local}");
        }
        for (remote, host) in [
            ("nats://nats.internal:4222", "nats.internal"),
            ("nats://user:pw@10.0.0.5:4222", "10.0.0.5"),
            ("tls://[2001:db8::1]:4222", "2001:db8::1"),
            ("nats://localhost.example.com", "localhost.example.com"),
            // The password's "@127.0.0.1" must not pass for the host.
            ("nats://u:x@127.0.0.1@evil.example:4222", "evil.example"),
        ] {
            assert_eq!(nats_remote_host(remote).as_deref(), Some(host), "{remote}");
        }
    }

    #[test]
    fn database_hosts_include_query_hosts_and_unix_sockets_are_local() {
        let local = |url: &str| parse_database_url(url).unwrap().remote_host;
        assert_eq!(local("postgres://aw@127.0.0.1:5432/aw"), None);
        assert_eq!(local("postgres://aw@%2Frun%2Fpostgresql/aw"), None);
        assert_eq!(local("postgresql:///aw?host=/run/postgresql"), None);
        assert_eq!(local("postgres://aw@localhost,[::1]:5433/aw"), None);
        for (url, host) in [
            ("postgres://aw:pw@db.internal/aw", "db.internal"),
            ("postgres://aw@localhost,db2:5432/aw", "db2"),
            ("postgres://aw@localhost/aw?host=db.internal", "db.internal"),
            ("postgres://aw@/aw?hostaddr=10.1.2.3", "10.1.2.3"),
        ] {
            assert_eq!(local(url).as_deref(), Some(host), "{url}");
        }
    }

    #[test]
    fn sslmode_and_sslrootcert_are_read_and_taken_out_of_the_driver_url() {
        let parsed = parse_database_url(
            "postgres://aw@db/aw?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(parsed.driver_url, "postgres://aw@db/aw?connect_timeout=3");
        assert_eq!(
            parsed.tls,
            DatabaseTls::Verified {
                root_cert: Some(PathBuf::from("/etc/ca.pem"))
            }
        );
        for mode in ["require", "verify-ca", "verify-full"] {
            let parsed = parse_database_url(&format!("postgres://db/aw?sslmode={mode}")).unwrap();
            assert_eq!(parsed.tls, DatabaseTls::Verified { root_cert: None });
            assert_eq!(parsed.driver_url, "postgres://db/aw");
        }
        let system = parse_database_url("postgres://db/aw?sslmode=require&sslrootcert=system");
        assert_eq!(
            system.unwrap().tls,
            DatabaseTls::Verified { root_cert: None }
        );
        for mode in ["", "?sslmode=disable", "?sslmode=prefer", "?sslmode=allow"] {
            let parsed = parse_database_url(&format!("postgres://127.0.0.1/aw{mode}")).unwrap();
            assert_eq!(parsed.tls, DatabaseTls::Off, "{mode}");
        }
        assert_eq!(
            parse_database_url("postgres://db/aw?sslmode=strict").unwrap_err(),
            DatabaseTlsProblem::UnknownSslMode("strict".into())
        );
        assert_eq!(
            parse_database_url("postgres://db/aw?sslmode=require&sslrootcert=ca.pem").unwrap_err(),
            DatabaseTlsProblem::RelativeRootCert("ca.pem".into())
        );
        assert_eq!(
            parse_database_url("postgres://127.0.0.1/aw?sslrootcert=/ca.pem").unwrap_err(),
            DatabaseTlsProblem::RootCertWithoutTls
        );
    }
}
