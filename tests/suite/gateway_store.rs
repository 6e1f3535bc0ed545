//! gatewayd's store on both back ends (issue 16): the conformance suite written once in
//! `agentworks_gateway::store::conformance`, run on SQLite and on a real PostgreSQL server (one
//! private server per test, from the harness), then what only the shared database has:
//! migrations under the advisory lock, pending requests that belong to one host, a schema
//! from the future, an unreachable server, TLS (required, verified, never a fallback to clear).

use super::harness::Postgres;
use agentworks_contract::executor::Outcome;
use agentworks_contract::gatewayd::DispatchState;
use agentworks_gateway::store::conformance::{self, new_request};
use agentworks_gateway::store::{Begin, LOST_HOST_REASON, RESTART_REASON, Store, StoreError};

/// A fresh SQLite database; the closure opens (or reopens) it.
fn sqlite() -> (tempfile::TempDir, impl Fn(i64) -> (Store, usize)) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gatewayd.db");
    (dir, move |now| Store::open_sqlite(&path, now).unwrap())
}

/// A private PostgreSQL server; the closure opens (or reopens) its database as host `gw-a`.
fn postgres() -> (Postgres, impl Fn(i64) -> (Store, usize)) {
    let server = Postgres::start();
    let url = server.url();
    (server, move |now| {
        Store::open_postgres(&url, "gw-a", now).unwrap()
    })
}

/// One conformance function as a test on each back end.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[test]
                fn $name() {
                    let (_dir, open) = super::sqlite();
                    super::conformance::$name(&open);
                }
            )*
        }
        mod on_postgres {
            $(
                #[test]
                fn $name() {
                    let (_server, open) = super::postgres();
                    super::conformance::$name(&open);
                }
            )*
        }
    };
}

on_both_backends!(
    device_ids_are_stable_per_user_credential_and_name,
    a_request_id_is_recorded_once_and_pending_becomes_unknown_at_reopen,
    only_a_sent_unknown_request_is_recovered_and_a_claimed_id_is_never_sent,
    two_stores_claiming_one_request_id_at_once_record_it_once,
    leases_are_taken_renewed_released_and_expire_after_three_missed_renewals,
    a_persons_live_leases_are_listed_in_one_query,
);

#[test]
fn hosts_starting_together_migrate_the_schema_once() {
    let server = Postgres::start();
    let url = server.url();
    let opened: Vec<_> = (0..6)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || Store::open_postgres(&url, &format!("gw-{i}"), 1))
        })
        .collect();
    for open in opened {
        let (store, reconciled) = open.join().unwrap().unwrap();
        assert_eq!(reconciled, 0);
        assert_eq!(store.backend(), "postgres");
    }
    assert_eq!(
        server.psql(
            "agentworks",
            "SELECT string_agg(version::text, ',' ORDER BY version) FROM gateway_schema"
        ),
        "1,2,3,4"
    );
    let tables = server.psql(
        "agentworks",
        "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables \
         WHERE tablename LIKE 'gateway_%'",
    );
    assert_eq!(
        tables,
        "gateway_devices,gateway_hosts,gateway_leases,gateway_requests,gateway_schema"
    );
}

#[test]
fn a_restarting_host_makes_only_its_own_pending_requests_unknown() {
    let server = Postgres::start();
    let (a, _) = Store::open_postgres(&server.url(), "gw-a", 1).unwrap();
    let (b, _) = Store::open_postgres(&server.url(), "gw-b", 1).unwrap();
    assert_eq!(
        a.begin_request(&new_request("on-a", "h"), 2).unwrap(),
        Begin::New
    );
    assert_eq!(
        b.begin_request(&new_request("on-b", "h"), 2).unwrap(),
        Begin::New
    );
    // Each host sees the other's claim: the id is never sent again, from either.
    assert!(matches!(
        b.begin_request(&new_request("on-a", "h"), 3).unwrap(),
        Begin::Existing(record) if record.state == DispatchState::Pending
    ));
    drop(a);
    // gw-a restarts: what it had on a laptop may have run; gw-b's request is still on gw-b.
    let (a, reconciled) = Store::open_postgres(&server.url(), "gw-a", 4).unwrap();
    assert_eq!(reconciled, 1);
    assert_eq!(
        a.request("on-a").unwrap().unwrap().state,
        DispatchState::Unknown {
            reason: RESTART_REASON.into()
        }
    );
    assert_eq!(
        a.request("on-b").unwrap().unwrap().state,
        DispatchState::Pending
    );
    assert_eq!(
        server.psql(
            "agentworks",
            "SELECT host_id FROM gateway_requests WHERE request_id = 'on-b'"
        ),
        "gw-b"
    );
}

#[test]
fn a_host_whose_heartbeat_lapsed_is_lost_once_even_with_no_lease_left() {
    let server = Postgres::start();
    let (a, _) = Store::open_postgres(&server.url(), "gw-a", 1).unwrap();
    let (b, _) = Store::open_postgres(&server.url(), "gw-b", 1).unwrap();
    a.renew_host("gw-a", 3_000).unwrap();
    b.renew_host("gw-b", 3_000).unwrap();
    assert_eq!(a.expire_hosts(2_999).unwrap(), Vec::<String>::new());
    a.renew_host("gw-a", 6_000).unwrap();
    // B stopped renewing; it had no lease at all, and is still found lost, once.
    assert_eq!(a.expire_hosts(3_000).unwrap(), ["gw-b"]);
    assert_eq!(a.expire_hosts(3_001).unwrap(), Vec::<String>::new());
    // Back again (a restart): alive until its next lapse.
    b.renew_host("gw-b", 9_000).unwrap();
    assert_eq!(b.expire_hosts(6_000).unwrap(), ["gw-a"]);
    let dir = tempfile::tempdir().unwrap();
    let (one_host, _) = Store::open_sqlite(&dir.path().join("g.db"), 1).unwrap();
    one_host.renew_host("only", 1).unwrap();
    assert_eq!(one_host.expire_hosts(10).unwrap(), Vec::<String>::new());
}

#[test]
fn a_host_counted_lost_while_alive_records_the_device_answer_it_then_gets() {
    let server = Postgres::start();
    let (a, _) = Store::open_postgres(&server.url(), "gw-a", 1).unwrap();
    let (b, _) = Store::open_postgres(&server.url(), "gw-b", 1).unwrap();
    for id in ["lost-b", "lost-a"] {
        b.begin_request(&new_request(id, "h"), 2).unwrap();
    }
    // A counts B lost (B's heartbeat lapsed while the database was away from B).
    assert_eq!(
        a.lose_host_requests("gw-b", LOST_HOST_REASON, 3).unwrap(),
        2
    );
    let done = DispatchState::Done {
        outcome: Outcome::Refused {
            code: "x".into(),
            message: "y".into(),
        },
    };
    // B, alive, gets the device's answer: it replaces the lost-host unknown.
    b.finish_request("lost-b", &done, 4).unwrap();
    assert_eq!(b.request("lost-b").unwrap().unwrap().state, done);
    // Another host cannot do that for B's request.
    a.finish_request("lost-a", &done, 4).unwrap();
    assert!(matches!(
        a.request("lost-a").unwrap().unwrap().state,
        DispatchState::Unknown { .. }
    ));
}

#[test]
fn a_database_with_a_newer_schema_is_refused() {
    let server = Postgres::start();
    drop(Store::open_postgres(&server.url(), "gw-a", 1).unwrap());
    server.psql(
        "agentworks",
        "INSERT INTO gateway_schema (version, applied_at_ms) VALUES (99, 0)",
    );
    let Err(error) = Store::open_postgres(&server.url(), "gw-a", 2) else {
        panic!("a schema from a newer gatewayd was accepted");
    };
    assert!(
        matches!(
            error,
            StoreError::PostgresSchemaTooNew {
                found: 99,
                known: 4
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("upgrade gatewayd"), "{error}");
}

#[test]
fn an_unreachable_server_is_an_error_at_open_without_the_password() {
    // A reserved port nobody listens on.
    let port = super::harness::free_port();
    let url = format!("postgres://agentworks:hunter2@127.0.0.1:{port}/agentworks");
    let started = std::time::Instant::now();
    let Err(error) = Store::open_postgres(&url, "gw-a", 1) else {
        panic!("opened a store on a server that is not there");
    };
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(
        matches!(error, StoreError::PostgresConnect { .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("cannot reach the cluster database"),
        "{message}"
    );
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    let Err(error) = Store::open_postgres("postgres://[::1", "gw-a", 1) else {
        panic!("a malformed URL was accepted");
    };
    assert!(matches!(error, StoreError::PostgresUrl { .. }), "{error}");
}

#[test]
fn a_database_url_that_requires_tls_is_refused_rather_than_sent_in_clear() {
    // A server without TLS: a URL that demands it fails to open, never falls back.
    let server = Postgres::start();
    let url = format!("{}?sslmode=require", server.url());
    let Err(error) = Store::open_postgres(&url, "gw-a", 1) else {
        panic!("sslmode=require opened a connection without TLS");
    };
    assert!(
        matches!(error, StoreError::PostgresConnect { .. }),
        "{error}"
    );
    assert!(error.to_string().to_lowercase().contains("tls"), "{error}");
}

#[test]
fn a_database_url_that_asks_for_tls_gets_it_with_the_certificate_and_name_verified() {
    let server = Postgres::start_with_tls();
    let ca = server.ca.clone().unwrap();
    let port = server.port;
    let url = |host: &str, query: &str| {
        format!("postgres://agentworks:hunter2@{host}:{port}/agentworks?{query}")
    };
    // The server's CA from sslrootcert, by name and by address (both in the certificate).
    let with_ca = format!("sslrootcert={}", ca.display());
    for url in [
        url("localhost", &format!("sslmode=verify-full&{with_ca}")),
        url("127.0.0.1", &format!("sslmode=require&{with_ca}")),
    ] {
        let (store, _) = Store::open_postgres(&url, "gw-a", 1).unwrap();
        assert_eq!(store.lease("dev_tls", 1).unwrap(), None);
        // Every connection the store holds is encrypted (the pool keeps one open).
        let connections = server.psql(
            "agentworks",
            "SELECT string_agg(s.ssl::text, ',') FROM pg_stat_ssl s \
             JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'agentworks-gatewayd'",
        );
        assert!(!connections.is_empty(), "{url}: no store connection found");
        assert!(
            connections.split(',').all(|ssl| ssl == "true"),
            "{connections}"
        );
        drop(store);
    }
    // A certificate the trusted CAs did not sign (the system's do not know this test CA), and
    // one for another name (the address is right, the name is not in the certificate): refused.
    for (url, why) in [
        (url("localhost", "sslmode=require"), "UnknownIssuer"),
        (
            url(
                "db.example",
                &format!("sslmode=verify-ca&{with_ca}&hostaddr=127.0.0.1"),
            ),
            "certificate not valid for name \"db.example\"",
        ),
    ] {
        let Err(error) = Store::open_postgres(&url, "gw-a", 1) else {
            panic!("{url} opened with a certificate that does not verify");
        };
        assert!(
            matches!(error, StoreError::PostgresConnect { .. }),
            "{error}"
        );
        let message = error.to_string();
        assert!(message.contains(why), "{why}: {message}");
        assert!(!message.contains("hunter2"), "{message}");
    }
    // An sslrootcert that cannot be read: refused before connecting, naming the file.
    let missing = url(
        "localhost",
        "sslmode=require&sslrootcert=/nonexistent/ca.pem",
    );
    let Err(error) = Store::open_postgres(&missing, "gw-a", 1) else {
        panic!("a missing sslrootcert was accepted");
    };
    assert!(matches!(error, StoreError::PostgresTls { .. }), "{error}");
    assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
}
