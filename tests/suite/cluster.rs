//! The cluster-mode servers themselves (issue 16): the harness's private PostgreSQL and
//! `nats-server` start, answer, say why when they cannot start, and are gone once dropped.

use super::harness::*;

#[test]
fn a_private_postgres_answers_on_loopback_and_stops_when_dropped() {
    let postgres = Postgres::start();
    assert_eq!(
        postgres.url(),
        format!(
            "postgres://agentworks@127.0.0.1:{}/agentworks",
            postgres.port
        )
    );
    assert_eq!(postgres.psql("agentworks", "SELECT 1 + 1"), "2");
    assert_eq!(
        postgres.psql("agentworks", "SHOW listen_addresses"),
        "127.0.0.1"
    );
    // Its own temp socket directory, never the system's /var/run/postgresql.
    let socket = postgres.psql("agentworks", "SHOW unix_socket_directories");
    assert!(socket.contains("aw-postgres-"), "{socket}");
    // Not root: postgres refuses to run as root, and the test runs as root.
    let owner = std::fs::metadata(format!("/proc/{}", postgres.pid()))
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap();
    assert_ne!(owner, 0);
    postgres.create_database("second");
    assert_eq!(
        postgres.psql("second", "SELECT current_database()"),
        "second"
    );
    let (pid, port) = (postgres.pid(), postgres.port);
    drop(postgres);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn a_private_nats_server_greets_and_stops_when_dropped() {
    let nats = Nats::start();
    assert_eq!(nats.url(), format!("nats://127.0.0.1:{}", nats.port));
    let (pid, port) = (nats.pid(), nats.port);
    drop(nats);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn a_nats_server_that_cannot_start_says_why() {
    // The port is taken: the panic carries nats-server's own stderr, naming the cause.
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = taken.local_addr().unwrap().port();
    let Err(failed) = std::panic::catch_unwind(|| Nats::start_on(port)) else {
        panic!("nats-server started on a port already taken");
    };
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("nats-server exited during start"),
        "{message}"
    );
    assert!(message.contains("address already in use"), "{message}");
}
