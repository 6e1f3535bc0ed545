//! agentd's identity store on both back ends (issue 16): the conformance suite written once in
//! `agentworks_agent::identity::conformance` runs on SQLite in the unit tests; here it runs on
//! a real PostgreSQL server (one private server per test, from the harness), where every
//! `open` is another agentd host's connection pool on the same database. Then what only the
//! shared database has: the schema migrated once under its lock by hosts starting together,
//! and a clear error for an unreachable server.

use super::harness::Postgres;
use agentworks_agent::identity::conformance;
use agentworks_agent::identity::{IdentityError, IdentityStore};

/// One conformance function as a test on PostgreSQL.
macro_rules! on_postgres {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let server = Postgres::start();
                let url = server.url();
                conformance::$name(&|| IdentityStore::open_postgres(&url).unwrap());
            }
        )*
    };
}

on_postgres!(
    users_projects_and_members,
    tokens_are_checked_against_live_rows,
    oauth_codes_and_refresh_tokens_work_once,
    racing_hosts_redeem_a_code_once_and_take_a_name_once,
    accounts_codes_and_sessions,
    disabling_an_account_ends_its_sessions_and_grants_for_good,
    device_logins_are_decided_once_and_redeemed_once,
    failed_attempts_are_limited_across_hosts,
    authorization_requests_are_decided_once,
);

/// Hosts starting together on an empty database: each migration is applied once, and all of
/// them then work on the same tables, which live in the `agentd` namespace beside gatewayd's.
#[test]
fn hosts_starting_together_migrate_the_schema_once() {
    let server = Postgres::start();
    let url = server.url();
    let stores: Vec<IdentityStore> = std::thread::scope(|scope| {
        let opens: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| IdentityStore::open_postgres(&url)))
            .collect();
        opens
            .into_iter()
            .map(|open| open.join().unwrap().unwrap())
            .collect()
    });
    stores[0].add_user("alice").unwrap();
    for store in &stores {
        assert!(store.user_by_name("alice").unwrap().is_some());
    }
    let applied = server.psql("agentworks", "SELECT count(*) FROM agentd.identity_schema");
    assert_eq!(
        applied.trim(),
        agentworks_agent::identity::store::POSTGRES_MIGRATIONS
            .len()
            .to_string(),
        "each migration recorded once"
    );
    let tables = server.psql(
        "agentworks",
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'agentd' AND table_name = 'users'",
    );
    assert_eq!(tables.trim(), "1");
}

/// An unreachable server is refused at open with the redacted URL, never a panic or a wait
/// without end.
#[test]
fn an_unreachable_server_is_a_clear_error() {
    let port = super::harness::free_port();
    let url = format!("postgresql://agentd:secret-password@127.0.0.1:{port}/agentworks");
    let error = match IdentityStore::open_postgres(&url) {
        Err(error) => error,
        Ok(_) => panic!("opened a store on a port nobody listens on"),
    };
    let text = error.to_string();
    assert!(matches!(error, IdentityError::OpenShared(_)), "{text}");
    assert!(text.contains("cannot reach the cluster database"), "{text}");
    assert!(
        !text.contains("secret-password"),
        "the password is redacted: {text}"
    );
}
