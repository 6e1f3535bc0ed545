//! agentd's chat-side stores on both back ends (issue 16): chats, attachments, MCP connections
//! and project secrets. The conformance suites written once in
//! `agentworks_agent::chat::conformance` and `agentworks_agent::connections::conformance` run on
//! SQLite in the unit tests; here they run on a real PostgreSQL server (one private server per test, from the harness), where every `open` is
//! another agentd host's connection pool on the same database. Then what only the shared
//! database has: each store's schema migrated once, beside the identity store's, by hosts
//! starting together, and a clear error for an unreachable server.

use std::sync::Arc;

use super::harness::Postgres;
use agentworks_agent::chat::attachments::AttachmentStore;
use agentworks_agent::chat::conformance as chat_conformance;
use agentworks_agent::chat::store::{ChatStore, ChatStoreError};
use agentworks_agent::connections::conformance as connection_conformance;
use agentworks_agent::connections::sealed::SealingKey;
use agentworks_agent::connections::secrets::SecretStore;
use agentworks_agent::connections::store::ConnectionStore;
use agentworks_agent::identity::IdentityStore;

/// One conformance function of `$suite` as a test on PostgreSQL; `open` makes one store from
/// the URL.
macro_rules! on_postgres {
    ($suite:ident, $open:expr => $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let server = Postgres::start();
                let url = server.url();
                let open = $open;
                $suite::$name(&|| open(&url));
            }
        )*
    };
}

on_postgres!(
    chat_conformance,
    |url: &str| ChatStore::open_postgres(url).unwrap() =>
    chats_messages_turns_and_bindings,
    a_chat_is_titled_once,
    a_chat_keeps_its_agent_mode_and_cli_session,
    racing_hosts_number_turns_and_messages_once,
    one_host_at_a_time_runs_a_chats_turn,
);

on_postgres!(
    chat_conformance,
    |url: &str| AttachmentStore::open_postgres(url).unwrap() =>
    attachments_upload_claim_and_read,
    racing_hosts_claim_an_upload_once,
);

on_postgres!(
    connection_conformance,
    |url: &str| ConnectionStore::open_postgres(url).unwrap() =>
    connections_sign_ins_and_apps,
    sign_ins_wait_for_their_callback_once,
    racing_hosts_stay_within_the_connection_limit,
);

/// The secrets' hosts share one sealing key, as a cluster's hosts must (one credential).
#[test]
fn secrets_sealed_listed_replaced_and_removed() {
    let server = Postgres::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let key = Arc::new(SealingKey::load_or_create(dir.path(), None).unwrap());
    connection_conformance::secrets_sealed_listed_replaced_and_removed(&|| {
        SecretStore::open_postgres(&url, key.clone()).unwrap()
    });
}

/// Hosts starting together on an empty database, each opening its stores in agentd's order
/// (identity first, which makes the `agentd` namespace, then the chat-side stores): each
/// store's migration is applied once, recorded in its own version table, and every host then
/// works on the same tables.
#[test]
fn hosts_starting_together_migrate_each_schema_once() {
    let server = Postgres::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let key = Arc::new(SealingKey::load_or_create(dir.path(), None).unwrap());
    type Host = (ChatStore, AttachmentStore, ConnectionStore, SecretStore);
    let hosts: Vec<Host> = std::thread::scope(|scope| {
        let opens: Vec<_> = (0..4)
            .map(|_| {
                let (url, key) = (&url, key.clone());
                scope.spawn(move || {
                    IdentityStore::open_postgres(url).unwrap();
                    (
                        ChatStore::open_postgres(url).unwrap(),
                        AttachmentStore::open_postgres(url).unwrap(),
                        ConnectionStore::open_postgres(url).unwrap(),
                        SecretStore::open_postgres(url, key).unwrap(),
                    )
                })
            })
            .collect();
        opens.into_iter().map(|open| open.join().unwrap()).collect()
    });
    let chat = hosts[0].0.create("p1", "u1", "alice").unwrap();
    hosts[1]
        .3
        .set("p1", "API_KEY", "value", "u1")
        .unwrap()
        .unwrap();
    for (chats, _, _, secrets) in &hosts {
        assert_eq!(chats.get(&chat.chat_id).unwrap(), Some(chat.clone()));
        assert_eq!(
            secrets.reveal("p1", "API_KEY").unwrap().as_deref(),
            Some("value")
        );
    }
    for (table, migrations) in [
        (
            "identity_schema",
            agentworks_agent::identity::store::POSTGRES_MIGRATIONS.len(),
        ),
        (
            "chats_schema",
            agentworks_agent::chat::store::POSTGRES_MIGRATIONS.len(),
        ),
        (
            "attachments_schema",
            agentworks_agent::chat::attachments::POSTGRES_MIGRATIONS.len(),
        ),
        (
            "mcp_connections_schema",
            agentworks_agent::connections::store::POSTGRES_MIGRATIONS.len(),
        ),
        (
            "project_secrets_schema",
            agentworks_agent::connections::secrets::POSTGRES_MIGRATIONS.len(),
        ),
    ] {
        // Each version recorded once: as many rows as migrations, none twice.
        let applied = server.psql(
            "agentworks",
            &format!("SELECT count(*) || ',' || count(DISTINCT version) FROM agentd.{table}"),
        );
        assert_eq!(
            applied.trim(),
            format!("{migrations},{migrations}"),
            "{table}"
        );
    }
    let tables = server.psql(
        "agentworks",
        "SELECT string_agg(table_name, ',' ORDER BY table_name) FROM information_schema.tables
         WHERE table_schema = 'agentd' AND table_name IN ('chats', 'messages', 'turn_usage',
             'attachments', 'mcp_connections', 'mcp_credentials', 'mcp_apps', 'project_secrets')",
    );
    assert_eq!(
        tables.trim(),
        "attachments,chats,mcp_apps,mcp_connections,mcp_credentials,messages,project_secrets,turn_usage"
    );
}

/// An unreachable server is refused at open with the redacted URL, never a panic or a wait
/// without end.
#[test]
fn an_unreachable_server_is_a_clear_error() {
    let port = super::harness::free_port();
    let url = format!("postgresql://agentd:secret-password@127.0.0.1:{port}/agentworks");
    let error = match ChatStore::open_postgres(&url) {
        Err(error) => error,
        Ok(_) => panic!("opened a store on a port nobody listens on"),
    };
    let text = error.to_string();
    assert!(matches!(error, ChatStoreError::OpenShared(_)), "{text}");
    assert!(text.contains("cannot reach the cluster database"), "{text}");
    assert!(
        !text.contains("secret-password"),
        "the password is redacted: {text}"
    );
}
