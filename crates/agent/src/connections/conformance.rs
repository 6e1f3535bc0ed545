//! The connection-side stores' behaviour ([`ConnectionStore`], [`SecretStore`]), written once
//! and run on both back ends: the unit tests run it on SQLite, and the integration suite
//! (`tests/suite/chat_stores.rs`) on a real PostgreSQL server. Each function takes `open`, which
//! opens (again) one fresh database: two handles from it are two agentd hosts sharing it, and
//! the `racing_hosts_…` functions have several at once do what must happen once.
//!
//! Panics on a failed expectation, as a test does.

#![allow(clippy::unwrap_used, clippy::panic)]

use crate::connections::sealed::SealError;
use crate::connections::secrets::{SecretRuleError, SecretStore, SecretStoreError};
use crate::connections::store::{
    CheckedConnection, ConnectionRuleError, ConnectionStore, MAX_PER_PROJECT, SignInTakeRefusal,
    Transport,
};
use crate::db::Sql;
use crate::db::conformance::{HOSTS, race};

fn connection(name: &str) -> CheckedConnection {
    let mut headers = std::collections::BTreeMap::new();
    headers.insert(
        "authorization".to_owned(),
        crate::connections::store::SecretHeader {
            secret: "API_KEY".into(),
            format: "Bearer {}".into(),
        },
    );
    CheckedConnection {
        name: name.into(),
        url: "https://example.com/mcp?k=v".into(),
        transport: Transport::Sse,
        headers,
    }
}

/// Sign-ins waiting for their callback: taken once, through any host, only by who started
/// one (another person's attempt leaves it in place), never once expired; past the cap the
/// oldest go first.
pub fn sign_ins_wait_for_their_callback_once(open: &dyn Fn() -> ConnectionStore) {
    let (a, b) = (open(), open());
    let now = 1_000_000;
    a.put_sign_in("s1", "alice", b"sealed-1", now, now - 600_000, 256)
        .unwrap();
    assert_eq!(
        b.take_sign_in("s1", "mallory", now - 600_000).unwrap(),
        Err(SignInTakeRefusal::NotYours)
    );
    assert_eq!(
        b.take_sign_in("nope", "alice", now - 600_000).unwrap(),
        Err(SignInTakeRefusal::Unknown)
    );
    assert_eq!(
        b.take_sign_in("s1", "alice", now - 600_000).unwrap(),
        Ok(b"sealed-1".to_vec())
    );
    assert_eq!(
        a.take_sign_in("s1", "alice", now - 600_000).unwrap(),
        Err(SignInTakeRefusal::Unknown),
        "taken once"
    );

    a.put_sign_in("old", "alice", b"x", now, now - 600_000, 256)
        .unwrap();
    assert_eq!(
        b.take_sign_in("old", "alice", now + 1).unwrap(),
        Err(SignInTakeRefusal::Unknown),
        "expired"
    );
    // At most three kept: the fourth drops the oldest.
    for (i, state) in ["c1", "c2", "c3", "c4"].iter().enumerate() {
        a.put_sign_in(state, "alice", b"x", now + i as i64, now - 600_000, 3)
            .unwrap();
    }
    let taken: Vec<bool> = ["c1", "c2", "c3", "c4"]
        .iter()
        .map(|state| {
            b.take_sign_in(state, "alice", now - 600_000)
                .unwrap()
                .is_ok()
        })
        .collect();
    assert_eq!(taken, [false, true, true, true]);
}

/// Connections, their sign-ins and the operator's apps: what one host adds another lists in
/// order (even within one millisecond), another project's id reaches nothing, a sign-in goes
/// with its connection, and an app is replaced by key.
pub fn connections_sign_ins_and_apps(open: &dyn Fn() -> ConnectionStore) {
    let a = open();
    let b = open();
    let first = a.add("p1", "u1", connection("Docs")).unwrap().unwrap();
    let second = b.add("p1", "u1", connection("Docs")).unwrap().unwrap();
    a.add("p2", "u1", connection("Other")).unwrap().unwrap();
    assert_ne!(first.id, second.id);
    assert_eq!(first.transport, Transport::Sse);
    assert_eq!(first.headers["authorization"].secret, "API_KEY");
    // Listed in the order they were added, even when added in one millisecond.
    let mut conn = a.db.conn().unwrap();
    conn.execute(
        "UPDATE mcp_connections SET created_at_ms = 1 WHERE project_id = 'p1'",
        &[],
    )
    .unwrap();
    drop(conn);
    let listed: Vec<String> = b
        .list("p1")
        .unwrap()
        .into_iter()
        .map(|connection| connection.id)
        .collect();
    assert_eq!(listed, [first.id.clone(), second.id.clone()]);
    let got = a.get("p1", &second.id).unwrap().unwrap();
    assert_eq!(
        (got.url.as_str(), got.headers),
        (second.url.as_str(), second.headers)
    );
    assert_eq!(a.get("p2", &first.id).unwrap(), None);

    assert!(a.put_credentials(&first.id, b"sealed-1").unwrap());
    assert!(b.put_credentials(&first.id, b"sealed-2").unwrap());
    assert_eq!(
        a.credentials(&first.id).unwrap().as_deref(),
        Some(&b"sealed-2"[..])
    );
    assert_eq!(b.signed_in("p1").unwrap(), [first.id.clone()].into());
    assert!(!a.remove("p2", &first.id).unwrap());
    assert!(b.remove("p1", &first.id).unwrap());
    assert_eq!(a.credentials(&first.id).unwrap(), None);
    assert!(!a.put_credentials(&first.id, b"late").unwrap());
    assert!(b.put_credentials(&second.id, b"s").unwrap());
    assert!(a.remove_credentials(&second.id).unwrap());
    assert!(!a.remove_credentials(&second.id).unwrap());
    assert!(b.signed_in("p1").unwrap().is_empty());

    a.set_app(
        "google",
        "id-1",
        Some(b"sealed"),
        "https://accounts.google.com",
    )
    .unwrap();
    let app = b.app("google").unwrap().unwrap();
    assert_eq!(app.sealed_secret.as_deref(), Some(&b"sealed"[..]));
    assert_eq!(app.issuer.as_deref(), Some("https://accounts.google.com"));
    b.set_app("google", "id-2", None, "https://oauth.google.example")
        .unwrap();
    b.set_app("github", "id-3", None, "https://github.com/login/oauth")
        .unwrap();
    let app = a.app("google").unwrap().unwrap();
    assert_eq!((app.client_id.as_str(), app.sealed_secret), ("id-2", None));
    assert_eq!(app.issuer.as_deref(), Some("https://oauth.google.example"));
    let keys: Vec<String> = a.apps().unwrap().into_iter().map(|app| app.key).collect();
    assert_eq!(keys, ["github", "google"]);
    assert!(a.remove_app("google").unwrap());
    assert!(!b.remove_app("google").unwrap());
    assert_eq!(b.app("google").unwrap(), None);
}

/// Hosts adding connections to one nearly full project at once: the limit holds, the adds
/// past it are told so.
pub fn racing_hosts_stay_within_the_connection_limit(open: &dyn Fn() -> ConnectionStore) {
    let setup = open();
    for _ in 0..MAX_PER_PROJECT - 2 {
        setup.add("p", "u", connection("x")).unwrap().unwrap();
    }
    let hosts: Vec<ConnectionStore> = (0..HOSTS).map(|_| open()).collect();
    let adds = race(&hosts, |_, host| {
        host.add("p", "u", connection("y")).unwrap()
    });
    assert_eq!(adds.iter().filter(|add| add.is_ok()).count(), 2, "{adds:?}");
    assert!(
        adds.iter()
            .all(|add| add.is_ok() || add == &Err(ConnectionRuleError::TooMany)),
        "{adds:?}"
    );
    assert_eq!(setup.list("p").unwrap().len(), MAX_PER_PROJECT);
}

/// Project secrets (the hosts share the sealing key): set through one host, revealed through
/// another for their own place only, listed by name, replaced, removed; a sealed value moved to
/// another project does not open.
pub fn secrets_sealed_listed_replaced_and_removed(open: &dyn Fn() -> SecretStore) {
    let a = open();
    let b = open();
    let info = a.set("p1", "API_KEY", "value-1", "u1").unwrap().unwrap();
    assert_eq!(
        b.reveal("p1", "API_KEY").unwrap().as_deref(),
        Some("value-1")
    );
    assert_eq!(b.reveal("p2", "API_KEY").unwrap(), None);
    assert_eq!(b.list("p1").unwrap(), vec![info]);
    assert!(matches!(
        b.set("p1", "lower", "v", "u").unwrap(),
        Err(SecretRuleError::Name(_))
    ));
    b.set("p1", "API_KEY", "value-2", "u2").unwrap().unwrap();
    b.set("p1", "B_KEY", "b", "u2").unwrap().unwrap();
    assert_eq!(
        a.reveal("p1", "API_KEY").unwrap().as_deref(),
        Some("value-2")
    );
    let listed: Vec<(String, String)> = a
        .list("p1")
        .unwrap()
        .into_iter()
        .map(|info| (info.name, info.updated_by))
        .collect();
    assert_eq!(
        listed,
        [
            ("API_KEY".into(), "u2".into()),
            ("B_KEY".into(), "u2".into())
        ]
    );

    a.set("p2", "API_KEY", "other", "u1").unwrap().unwrap();
    let mut conn = a.db.conn().unwrap();
    conn.execute(
        "UPDATE project_secrets SET sealed = (SELECT sealed FROM project_secrets
         WHERE project_id = 'p1' AND name = 'API_KEY') WHERE project_id = 'p2'",
        &[],
    )
    .unwrap();
    drop(conn);
    assert!(matches!(
        b.reveal("p2", "API_KEY"),
        Err(SecretStoreError::Seal(SealError::Open { .. }))
    ));

    assert!(b.remove("p1", "API_KEY").unwrap());
    assert!(!a.remove("p1", "API_KEY").unwrap());
    assert_eq!(a.reveal("p1", "API_KEY").unwrap(), None);
}

#[cfg(test)]
mod on_sqlite {
    use crate::db::conformance::on_sqlite;
    use std::sync::Arc;

    #[test]
    fn connections_sign_ins_and_apps() {
        on_sqlite(
            "mcp_connections.db",
            |path| crate::connections::store::ConnectionStore::open(path).unwrap(),
            super::connections_sign_ins_and_apps,
        );
    }

    #[test]
    fn sign_ins_wait_for_their_callback_once() {
        on_sqlite(
            "mcp_connections.db",
            |path| crate::connections::store::ConnectionStore::open(path).unwrap(),
            super::sign_ins_wait_for_their_callback_once,
        );
    }

    #[test]
    fn racing_hosts_stay_within_the_connection_limit() {
        on_sqlite(
            "mcp_connections.db",
            |path| crate::connections::store::ConnectionStore::open(path).unwrap(),
            super::racing_hosts_stay_within_the_connection_limit,
        );
    }

    #[test]
    fn secrets_sealed_listed_replaced_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(
            crate::connections::sealed::SealingKey::load_or_create(dir.path(), None).unwrap(),
        );
        on_sqlite(
            "project_secrets.db",
            |path| crate::connections::secrets::SecretStore::open(path, key.clone()).unwrap(),
            super::secrets_sealed_listed_replaced_and_removed,
        );
    }
}
