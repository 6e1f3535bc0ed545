//! Attacks on agentd's accounts, sessions and OAuth server from outside (issue 42, items 3, 4,
//! 11, 12, 13 and 14's consent screen), each performed over real HTTP against the real agentd,
//! from real source addresses where the attack depends on them (the whole of 127.0.0.0/8 is
//! loopback: an attacker's client binds 127.0.0.2, a person's 127.0.0.3), and each checked to
//! fail for the attacker and to leave the person alone:
//!
//! - a disabled account's console session and OAuth grant coming back when it is enabled
//!   again (item 3);
//! - a member guessing another person's chat id to learn who owns it (item 4).

use serde_json::{Value, json};

use super::agent::{code_project, create_chat, user};
use super::harness::{Stack, http};

/// Item 4: a co-owner who guesses (or is shown) the id of alice's chat is told only that it is
/// not theirs: not who owns it. Before the fix the 403 said "chat … belongs to alice".
#[test]
fn a_chats_refusal_never_names_its_owner() {
    let stack = Stack::start();
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[]);
    let alice_id = stack
        .admin("users/list", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "alice")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let chat = create_chat(&stack, &alice, "app");
    let bob = user(&stack, "bob");
    stack.admin(
        "members/add",
        json!({"project": "app", "user": "bob", "role": "co-owner"}),
    );
    let auth = format!("Bearer {bob}");
    let (status, _, body) = http(
        stack.port,
        "POST",
        &format!("/v1/chats/{chat}/turns"),
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        &json!({"message": "whose is this?"}).to_string(),
    );
    assert_eq!(status, 403, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "chat_not_yours", "{body}");
    let text = body.to_string();
    assert!(
        !text.contains("alice") && !text.contains(&alice_id),
        "the refusal names the chat's owner: {text}"
    );
    assert!(text.contains("not your chat"), "{text}");
}
