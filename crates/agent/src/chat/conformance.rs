//! The chat stores' behaviour ([`ChatStore`], [`AttachmentStore`]), written once and run on
//! both back ends: the unit tests run it on SQLite,
//! and the integration suite (`tests/suite/chat_stores.rs`) on a real PostgreSQL server. Each
//! function takes `open`, which opens (again) one fresh database: two handles from it are two
//! agentd hosts sharing it, and the `racing_hosts_…` functions have several at once do what
//! must happen once.
//!
//! Panics on a failed expectation, as a test does.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;

use serde_json::json;

use crate::chat::attachments::{AttachmentError, AttachmentStore, PENDING_LIFETIME_MS};
use crate::chat::model::Usage;
use crate::chat::store::{ChatAgent, ChatStore, CliSession, Mode, TurnUsage};
use crate::db::Sql;
use crate::db::conformance::{HOSTS, race};

fn usage(prompt: u64, completion: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
    }
}

/// A chat's agent and mode are kept as created (an `api` chat in Run mode by default, a CLI
/// chat as chosen) and listed; a CLI session recorded by one host is what another resumes,
/// and the last one recorded replaces the one before.
pub fn a_chat_keeps_its_agent_mode_and_cli_session(open: &dyn Fn() -> ChatStore) {
    let a = open();
    let b = open();
    let api = a.create("p1", "u1", "alice").unwrap();
    assert_eq!((api.agent.as_str(), api.mode), ("api", Mode::Run));
    assert!(!api.is_cli());
    let builder = ChatAgent {
        agent: "codex".into(),
        mode: Mode::Builder,
    };
    let cli = a.create_with("p1", "u1", "alice", &builder).unwrap();
    assert!(cli.is_cli());
    let read = b.get(&cli.chat_id).unwrap().unwrap();
    assert_eq!(read, cli);
    assert_eq!((read.agent.as_str(), read.mode), ("codex", Mode::Builder));
    assert_eq!(read.cli_session, None);
    let listed = b.list("u1", Some("p1")).unwrap();
    assert!(
        listed
            .iter()
            .any(|c| c.chat_id == cli.chat_id && c.mode == Mode::Builder)
    );
    let first = CliSession {
        session_id: "thread-1".into(),
        session_key: "key-1".into(),
    };
    a.set_cli_session(&cli.chat_id, &first).unwrap();
    assert_eq!(
        b.get(&cli.chat_id).unwrap().unwrap().cli_session,
        Some(first)
    );
    let second = CliSession {
        session_id: "thread-2".into(),
        session_key: "key-2".into(),
    };
    b.set_cli_session(&cli.chat_id, &second).unwrap();
    let read = a.get(&cli.chat_id).unwrap().unwrap();
    assert_eq!(read.cli_session, Some(second));
    assert_eq!(
        read.mode,
        Mode::Builder,
        "recording a session changes nothing else"
    );
    assert_eq!(a.get(&api.chat_id).unwrap().unwrap().cli_session, None);
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

#[cfg(test)]
mod on_sqlite {
    use crate::db::conformance::on_sqlite;

    #[test]
    fn chats_messages_turns_and_bindings() {
        on_sqlite(
            "chats.db",
            |path| crate::chat::store::ChatStore::open(path).unwrap(),
            super::chats_messages_turns_and_bindings,
        );
    }

    #[test]
    fn a_chat_keeps_its_agent_mode_and_cli_session() {
        on_sqlite(
            "chats.db",
            |path| crate::chat::store::ChatStore::open(path).unwrap(),
            super::a_chat_keeps_its_agent_mode_and_cli_session,
        );
    }

    #[test]
    fn a_chat_is_titled_once() {
        on_sqlite(
            "chats.db",
            |path| crate::chat::store::ChatStore::open(path).unwrap(),
            super::a_chat_is_titled_once,
        );
    }

    #[test]
    fn racing_hosts_number_turns_and_messages_once() {
        on_sqlite(
            "chats.db",
            |path| crate::chat::store::ChatStore::open(path).unwrap(),
            super::racing_hosts_number_turns_and_messages_once,
        );
    }

    #[test]
    fn one_host_at_a_time_runs_a_chats_turn() {
        on_sqlite(
            "chats.db",
            |path| crate::chat::store::ChatStore::open(path).unwrap(),
            super::one_host_at_a_time_runs_a_chats_turn,
        );
    }

    #[test]
    fn attachments_upload_claim_and_read() {
        on_sqlite(
            "attachments.db",
            |path| crate::chat::attachments::AttachmentStore::open(path).unwrap(),
            super::attachments_upload_claim_and_read,
        );
    }

    #[test]
    fn racing_hosts_claim_an_upload_once() {
        on_sqlite(
            "attachments.db",
            |path| crate::chat::attachments::AttachmentStore::open(path).unwrap(),
            super::racing_hosts_claim_an_upload_once,
        );
    }
}
