//! The chat-side stores' behaviour ([`ChatStore`], [`AttachmentStore`], [`ConnectionStore`],
//! [`SecretStore`]), written once and run on both back ends: the unit tests run it on SQLite,
//! and the integration suite (`tests/suite/chat_stores.rs`) on a real PostgreSQL server. Each
//! function takes `open`, which opens (again) one fresh database: two handles from it are two
//! agentd hosts sharing it, and the `racing_hosts_…` functions have several at once do what
//! must happen once.
//!
//! Panics on a failed expectation, as a test does.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use serde_json::json;

use crate::attachments::{AttachmentError, AttachmentStore, PENDING_LIFETIME_MS};
use crate::chats::{ChatStore, TurnUsage};
use crate::db::Sql;
use crate::mcp_connections::{
    CheckedConnection, ConnectionRuleError, ConnectionStore, MAX_PER_PROJECT, SignInTakeRefusal,
    Transport,
};
use crate::model::Usage;
use crate::project_secrets::{SecretRuleError, SecretStore, SecretStoreError};
use crate::sealed::SealError;

/// How many hosts race in the `racing_hosts_…` functions.
const HOSTS: usize = 6;

/// Runs `work` on every host at once (after a barrier); what each returned, in host order.
fn race<H: Sync, T: Send>(hosts: &[H], work: impl Fn(usize, &H) -> T + Sync) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(hosts.len()));
    std::thread::scope(|scope| {
        let runs: Vec<_> = hosts
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let (barrier, work) = (barrier.clone(), &work);
                scope.spawn(move || {
                    barrier.wait();
                    work(i, host)
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    })
}

fn usage(prompt: u64, completion: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
    }
}

/// Chats, messages, turns, usage and bindings: what one host writes another reads, listings
/// are the owner's (optionally one project's), turn numbers and message numbers grow, usage
/// adds up per turn, and every bind or unbind moves the generation on.
pub fn chats_messages_turns_and_bindings(open: &dyn Fn() -> ChatStore) {
    let a = open();
    let b = open();
    let chat = a.create("p1", "u1", "alice").unwrap();
    a.create("p2", "u1", "alice").unwrap();
    a.create("p1", "u2", "bob").unwrap();
    assert_eq!(b.get(&chat.chat_id).unwrap(), Some(chat.clone()));
    assert!(b.get("nope").unwrap().is_none());
    assert_eq!(b.list("u1", None).unwrap().len(), 2);
    assert_eq!(b.list("u1", Some("p1")).unwrap(), vec![chat.clone()]);
    assert!(b.list("u3", None).unwrap().is_empty());

    assert_eq!(a.next_turn(&chat.chat_id).unwrap(), 1);
    a.append(&chat.chat_id, 1, &json!({"role": "user", "content": "hi"}))
        .unwrap();
    b.append(
        &chat.chat_id,
        1,
        &json!({"role": "assistant", "content": "yo"}),
    )
    .unwrap();
    assert_eq!(b.next_turn(&chat.chat_id).unwrap(), 2);
    let messages = a.messages(&chat.chat_id).unwrap();
    let seqs: Vec<i64> = messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [1, 2]);
    assert_eq!(messages[0].message["content"], "hi");
    assert_eq!(messages[1].message["role"], "assistant");
    assert!(messages.iter().all(|m| m.turn == 1));
    assert!(a.next_turn("nope").is_err(), "no turn for a missing chat");

    a.add_usage(&chat.chat_id, 1, &usage(10, 2)).unwrap();
    b.add_usage(&chat.chat_id, 1, &usage(15, 3)).unwrap();
    a.add_usage(&chat.chat_id, 2, &Usage::default()).unwrap();
    assert_eq!(
        b.usage(&chat.chat_id).unwrap(),
        vec![
            TurnUsage {
                turn: 1,
                prompt_tokens: 25,
                completion_tokens: 5,
                total_tokens: 30
            },
            TurnUsage {
                turn: 2,
                ..TurnUsage::default()
            }
        ]
    );
    assert!(a.usage("nope").unwrap().is_empty());

    let bound = a
        .set_binding(&chat.chat_id, Some(("d1", "proj")))
        .unwrap()
        .unwrap();
    assert_eq!(bound.binding.as_ref().unwrap().device_id, "d1");
    assert_eq!(bound.binding.as_ref().unwrap().folder, "proj");
    assert_eq!(bound.binding_generation, 1);
    let seen = b.get(&chat.chat_id).unwrap().unwrap();
    assert_eq!((seen.binding, seen.turns), (bound.binding, 2));
    let unbound = b.set_binding(&chat.chat_id, None).unwrap().unwrap();
    assert_eq!(unbound.binding, None);
    assert_eq!(unbound.binding_generation, 2);
    assert_eq!(a.set_binding("nope", None).unwrap(), None);
}

/// A chat's title: none when created, then the first one given, kept whoever titles it next
/// (the first message titles the chat; later ones leave it), and listed with the chat. Of
/// hosts titling one chat at once, exactly one sets it.
pub fn a_chat_is_titled_once(open: &dyn Fn() -> ChatStore) {
    let a = open();
    let b = open();
    let chat = a.create("p1", "u1", "alice").unwrap();
    assert_eq!(chat.title, None);
    assert_eq!(b.get(&chat.chat_id).unwrap().unwrap().title, None);
    assert!(a.title_once(&chat.chat_id, "Fix the build").unwrap());
    assert!(!b.title_once(&chat.chat_id, "and the tests").unwrap());
    assert_eq!(
        b.get(&chat.chat_id).unwrap().unwrap().title.as_deref(),
        Some("Fix the build")
    );
    assert_eq!(
        b.list("u1", Some("p1")).unwrap()[0].title.as_deref(),
        Some("Fix the build")
    );
    assert!(
        !a.title_once("nope", "x").unwrap(),
        "no title for a missing chat"
    );

    let racing = a.create("p1", "u1", "alice").unwrap();
    let hosts: Vec<ChatStore> = (0..HOSTS).map(|_| open()).collect();
    let set = race(&hosts, |i, host| {
        host.title_once(&racing.chat_id, &format!("title {i}"))
            .unwrap()
    });
    let winners: Vec<usize> = (0..HOSTS).filter(|&i| set[i]).collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one host titles the chat: {set:?}"
    );
    assert_eq!(
        a.get(&racing.chat_id).unwrap().unwrap().title,
        Some(format!("title {}", winners[0]))
    );
}

/// Hosts starting turns, appending messages and adding usage to one chat at once: every turn
/// number and every message number is taken once, and no usage is lost.
pub fn racing_hosts_number_turns_and_messages_once(open: &dyn Fn() -> ChatStore) {
    let chat = open().create("p1", "u1", "alice").unwrap();
    let hosts: Vec<ChatStore> = (0..HOSTS).map(|_| open()).collect();
    let turns: BTreeSet<i64> = race(&hosts, |_, host| host.next_turn(&chat.chat_id).unwrap())
        .into_iter()
        .collect();
    assert_eq!(turns, (1..=HOSTS as i64).collect(), "each turn number once");

    race(&hosts, |i, host| {
        host.append(&chat.chat_id, 1, &json!({"role": "user", "content": i}))
            .unwrap()
    });
    let messages = hosts[0].messages(&chat.chat_id).unwrap();
    let seqs: Vec<i64> = messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=HOSTS as i64).collect::<Vec<_>>());
    let contents: BTreeSet<u64> = messages
        .iter()
        .map(|m| m.message["content"].as_u64().unwrap())
        .collect();
    assert_eq!(contents, (0..HOSTS as u64).collect(), "no message lost");

    race(&hosts, |_, host| {
        host.add_usage(&chat.chat_id, 1, &usage(10, 1)).unwrap()
    });
    let used = hosts[0].usage(&chat.chat_id).unwrap();
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].total_tokens, 11 * HOSTS as i64, "no usage lost");
}

/// A chat's running turn is claimed by one host at a time: of several claiming at once one gets
/// it and the others learn which host has it; it is renewed and released by its claim only, and
/// an expired claim (its host died) or one of a host starting again is taken over.
pub fn one_host_at_a_time_runs_a_chats_turn(open: &dyn Fn() -> ChatStore) {
    let chat = open().create("p1", "u1", "alice").unwrap().chat_id;
    let hosts: Vec<ChatStore> = (0..HOSTS).map(|_| open()).collect();
    let now = 1_000_000;
    let claims = race(&hosts, |i, host| {
        let claim = format!("claim-{i}");
        let held = host
            .claim_turn(&chat, &claim, &format!("host-{i}"), now, now + 60_000)
            .unwrap();
        (claim, held)
    });
    let winners: Vec<&(String, Option<String>)> =
        claims.iter().filter(|(_, held)| held.is_none()).collect();
    assert_eq!(winners.len(), 1, "one claim of {HOSTS} at once: {claims:?}");
    let (claim, _) = winners[0].clone();
    let winner_host = format!("host-{}", claim.trim_start_matches("claim-"));
    for (_, held) in claims.iter().filter(|(c, _)| *c != claim) {
        assert_eq!(held.as_deref(), Some(winner_host.as_str()));
    }
    let other = open();
    // Renewed by its own claim only; another claim renews nothing.
    assert!(
        other
            .renew_turn_claim(&chat, &claim, now + 120_000)
            .unwrap()
    );
    assert!(
        !other
            .renew_turn_claim(&chat, "someone-else", now + 120_000)
            .unwrap()
    );
    // Not expired at the old expiry any more.
    let refused = other
        .claim_turn(&chat, "late", "host-x", now + 60_000, now + 120_000)
        .unwrap();
    assert_eq!(refused.as_deref(), Some(winner_host.as_str()));
    // Another claim releases nothing; its own does.
    other.release_turn_claim(&chat, "someone-else").unwrap();
    assert!(
        other
            .claim_turn(&chat, "late", "host-x", now, now + 1)
            .unwrap()
            .is_some()
    );
    other.release_turn_claim(&chat, &claim).unwrap();
    assert_eq!(
        other
            .claim_turn(&chat, "next", "host-x", now, now + 1_000)
            .unwrap(),
        None
    );
    // Expired (its host died): taken over.
    assert_eq!(
        hosts[0]
            .claim_turn(&chat, "after", "host-y", now + 1_000, now + 2_000)
            .unwrap(),
        None
    );
    // A host starting again drops its own claims, no one else's.
    let second = open().create("p1", "u1", "alice").unwrap().chat_id;
    other
        .claim_turn(&second, "x", "host-x", now, now + 60_000)
        .unwrap();
    assert_eq!(other.release_turn_claims_of("host-x").unwrap(), 1);
    assert_eq!(
        hosts[0]
            .claim_turn(&chat, "z", "host-z", now, now + 1)
            .unwrap(),
        Some("host-y".into())
    );
    assert_eq!(
        other
            .claim_turn(&second, "y", "host-y", now, now + 1)
            .unwrap(),
        None
    );
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

/// Uploads, claims and reads: an upload through one host is claimed through another, all or
/// none, by its chat's owner only, once; a turn reads only its own, in upload order (even
/// within one millisecond); bytes come back whole; unclaimed uploads expire.
pub fn attachments_upload_claim_and_read(open: &dyn Fn() -> AttachmentStore) {
    let a = open();
    let b = open();
    let image = a.add("c1", "u1", "shot.png", PNG).unwrap();
    let text = a.add("c1", "u1", "notes.md", b"# notes").unwrap();
    let other_chat = a.add("c2", "u1", "other.png", PNG).unwrap();
    let stolen = b.claim_for_turn("c1", "u2", std::slice::from_ref(&image.attachment_id), 1);
    assert!(matches!(stolen, Err(AttachmentError::NotFound { .. })));
    let cross = b.claim_for_turn(
        "c1",
        "u1",
        std::slice::from_ref(&other_chat.attachment_id),
        1,
    );
    assert!(matches!(cross, Err(AttachmentError::NotFound { .. })));
    let mixed = [image.attachment_id.clone(), "att_missing".to_owned()];
    assert!(b.claim_for_turn("c1", "u1", &mixed, 1).is_err());
    let claimed = b
        .claim_for_turn(
            "c1",
            "u1",
            &[image.attachment_id.clone(), text.attachment_id.clone()],
            1,
        )
        .unwrap();
    assert_eq!(claimed.len(), 2, "the failed claim left both pending");
    assert!(claimed.iter().all(|info| info.turn == Some(1)));
    let again = a.claim_for_turn("c1", "u1", std::slice::from_ref(&image.attachment_id), 2);
    assert!(matches!(again, Err(AttachmentError::NotFound { .. })));

    let names: Vec<String> = a
        .for_turn("c1", 1)
        .unwrap()
        .into_iter()
        .map(|info| info.name)
        .collect();
    assert_eq!(names, ["shot.png", "notes.md"]);
    let (info, bytes) = a.read_for_turn("c1", 1, "shot.png").unwrap();
    assert_eq!(info, claimed[0]);
    assert_eq!(bytes, PNG);
    let (_, bytes) = b.read_for_turn("c1", 1, &text.attachment_id).unwrap();
    assert_eq!(bytes, b"# notes");
    assert!(a.read_for_turn("c1", 2, &image.attachment_id).is_err());
    assert!(a.read_for_turn("c2", 1, &other_chat.attachment_id).is_err());

    // Uploads in one millisecond keep their order (the rows' insertion order).
    let same_ms: Vec<String> = (0..5)
        .map(|i| {
            let info = a.add("c3", "u1", &format!("f{i}.txt"), b"x").unwrap();
            info.attachment_id
        })
        .collect();
    let mut conn = a.db.conn().unwrap();
    conn.execute(
        "UPDATE attachments SET created_at_ms = 1 WHERE chat_id = 'c3'",
        &[],
    )
    .unwrap();
    drop(conn);
    b.claim_for_turn("c3", "u1", &same_ms, 1).unwrap();
    let order: Vec<String> = b
        .for_turn("c3", 1)
        .unwrap()
        .into_iter()
        .map(|info| info.attachment_id)
        .collect();
    assert_eq!(order, same_ms);

    // An upload nobody claimed expires at the next upload, through any host.
    let old = a.add("c1", "u1", "old.txt", b"old").unwrap();
    let mut conn = a.db.conn().unwrap();
    conn.execute(
        "UPDATE attachments SET created_at_ms = created_at_ms - ?1 WHERE id = ?2",
        &[&(PENDING_LIFETIME_MS + 1), &old.attachment_id],
    )
    .unwrap();
    drop(conn);
    b.add("c1", "u1", "new.txt", b"new").unwrap();
    let claim = a.claim_for_turn("c1", "u1", std::slice::from_ref(&old.attachment_id), 3);
    assert!(matches!(claim, Err(AttachmentError::NotFound { .. })));
}

/// Hosts claiming one upload at once (two browser tabs sending one message through two
/// hosts): one turn gets it, every other claim is told it is gone.
pub fn racing_hosts_claim_an_upload_once(open: &dyn Fn() -> AttachmentStore) {
    let upload = open().add("c1", "u1", "shot.png", PNG).unwrap();
    let hosts: Vec<AttachmentStore> = (0..HOSTS).map(|_| open()).collect();
    let claims = race(&hosts, |i, host| {
        host.claim_for_turn(
            "c1",
            "u1",
            std::slice::from_ref(&upload.attachment_id),
            i as i64 + 1,
        )
    });
    let won: Vec<i64> = claims
        .iter()
        .filter_map(|claim| claim.as_ref().ok())
        .map(|claimed| claimed[0].turn.unwrap())
        .collect();
    assert_eq!(won.len(), 1, "claimed once: {claims:?}");
    assert!(
        claims
            .iter()
            .all(|claim| claim.is_ok() || matches!(claim, Err(AttachmentError::NotFound { .. }))),
        "the others are told it is gone: {claims:?}"
    );
    let turn = hosts[0].for_turn("c1", won[0]).unwrap();
    assert_eq!(turn.len(), 1);
}

fn connection(name: &str) -> CheckedConnection {
    let mut headers = std::collections::BTreeMap::new();
    headers.insert(
        "authorization".to_owned(),
        crate::mcp_connections::SecretHeader {
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
    use std::path::Path;
    use std::sync::Arc;

    /// A fresh SQLite file in a temporary directory; every call of the closure opens it again
    /// (another connection, as a second process would).
    fn run<S>(file: &str, open: impl Fn(&Path) -> S, check: fn(&dyn Fn() -> S)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file);
        check(&|| open(&path));
    }

    #[test]
    fn chats_messages_turns_and_bindings() {
        run(
            "chats.db",
            |path| crate::chats::ChatStore::open(path).unwrap(),
            super::chats_messages_turns_and_bindings,
        );
    }

    #[test]
    fn a_chat_is_titled_once() {
        run(
            "chats.db",
            |path| crate::chats::ChatStore::open(path).unwrap(),
            super::a_chat_is_titled_once,
        );
    }

    #[test]
    fn racing_hosts_number_turns_and_messages_once() {
        run(
            "chats.db",
            |path| crate::chats::ChatStore::open(path).unwrap(),
            super::racing_hosts_number_turns_and_messages_once,
        );
    }

    #[test]
    fn one_host_at_a_time_runs_a_chats_turn() {
        run(
            "chats.db",
            |path| crate::chats::ChatStore::open(path).unwrap(),
            super::one_host_at_a_time_runs_a_chats_turn,
        );
    }

    #[test]
    fn attachments_upload_claim_and_read() {
        run(
            "attachments.db",
            |path| crate::attachments::AttachmentStore::open(path).unwrap(),
            super::attachments_upload_claim_and_read,
        );
    }

    #[test]
    fn racing_hosts_claim_an_upload_once() {
        run(
            "attachments.db",
            |path| crate::attachments::AttachmentStore::open(path).unwrap(),
            super::racing_hosts_claim_an_upload_once,
        );
    }

    #[test]
    fn connections_sign_ins_and_apps() {
        run(
            "mcp_connections.db",
            |path| crate::mcp_connections::ConnectionStore::open(path).unwrap(),
            super::connections_sign_ins_and_apps,
        );
    }

    #[test]
    fn sign_ins_wait_for_their_callback_once() {
        run(
            "mcp_connections.db",
            |path| crate::mcp_connections::ConnectionStore::open(path).unwrap(),
            super::sign_ins_wait_for_their_callback_once,
        );
    }

    #[test]
    fn racing_hosts_stay_within_the_connection_limit() {
        run(
            "mcp_connections.db",
            |path| crate::mcp_connections::ConnectionStore::open(path).unwrap(),
            super::racing_hosts_stay_within_the_connection_limit,
        );
    }

    #[test]
    fn secrets_sealed_listed_replaced_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(crate::sealed::SealingKey::load_or_create(dir.path(), None).unwrap());
        run(
            "project_secrets.db",
            |path| crate::project_secrets::SecretStore::open(path, key.clone()).unwrap(),
            super::secrets_sealed_listed_replaced_and_removed,
        );
    }
}
