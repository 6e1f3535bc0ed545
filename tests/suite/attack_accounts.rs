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
use super::console_sessions::request;
use super::harness::{Stack, http};
use super::oauth::{granted, mcp_status, refresh, setup};

/// Item 3: alice is signed in to the console and has an OAuth grant (an access token and a
/// refresh token). An operator disables her account: all of it stops at once. Enabled again,
/// none of it comes back (the session, the access token, the refresh token); before the fix
/// all three worked again.
#[test]
fn disabling_an_account_ends_its_sessions_and_grants_and_enabling_it_brings_none_back() {
    let s = setup();
    let (client, tokens) = granted(
        &s,
        "workflows:read",
        json!({"allow": true, "projects": [s.flows]}),
    );
    let access = tokens["access_token"].as_str().unwrap().to_owned();
    let refresh_token = tokens["refresh_token"].as_str().unwrap().to_owned();
    let session_status = || {
        request(
            &s.stack,
            "GET",
            "/v1/console/session",
            &[("cookie", &s.cookie)],
            Value::Null,
        )
        .0
    };
    assert_eq!(session_status(), 200);
    assert_eq!(mcp_status(&s, &access), 200);

    let disabled = s.stack.ctl(&["user", "disable", "alice"]);
    assert!(disabled.status.success(), "{disabled:?}");
    assert_eq!(session_status(), 401, "the session outlived the disable");
    assert_eq!(mcp_status(&s, &access), 401);
    let (status, answer) = refresh(&s, &client, &refresh_token, None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant")),
        "{answer}"
    );

    let enabled = s.stack.ctl(&["user", "enable", "alice"]);
    assert!(enabled.status.success(), "{enabled:?}");
    assert_eq!(
        session_status(),
        401,
        "the session came back with the account"
    );
    assert_eq!(
        mcp_status(&s, &access),
        401,
        "the grant's access token came back with the account"
    );
    let (status, answer) = refresh(&s, &client, &refresh_token, None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant")),
        "the grant's refresh token came back with the account: {answer}"
    );
    // The session's own token and the grant are revoked in the store, not only refused.
    let tokens = s.stack.admin("tokens/list", json!({"user": "alice"}));
    for token in tokens.as_array().unwrap() {
        if token["label"] == "console session" || token["label"] == "oauth: Test <b>App</b>" {
            assert!(!token["revoked_at_ms"].is_null(), "{token}");
        }
    }
}

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
