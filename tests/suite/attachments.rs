//! Chat attachments end to end: real agentd and workspaced, the scripted model (tests/suite/
//! agent.rs) recording what it was sent. A text file reaches the model as a bounded preview in
//! the person's message; an image through `read_image`, offered only to the turn whose message
//! carries it and reading only that turn's attachments; limits and types are checked on the
//! bytes, never trusted from the client.

use serde_json::{Value, json};

use super::agent::{
    Model, calls, code_project, create_chat, of_kind, result_of, text, tool_names, user,
};
use super::harness::{Stack, http, http_bytes};

/// A 1x1 PNG.
pub(super) const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89\0\0\0\rIDATx\x9cc\xf8\xcf\xc0\xf0\x1f\0\x05\0\x01\xff\x89\x99=\x1d\0\0\0\0IEND\xaeB`\x82";

fn upload(stack: &Stack, token: &str, chat: &str, name: &str, bytes: &[u8]) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let query: String = url_encoded(name);
    let (status, _, text) = http_bytes(
        stack.port,
        "POST",
        &format!("/v1/chats/{chat}/attachments?name={query}"),
        // The browser's claim is never read: this "image" is declared as text and vice versa.
        &[("authorization", &auth), ("content-type", "text/plain")],
        bytes,
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A turn with a message and attachments: its events, or the refusal.
fn turn_with(
    stack: &Stack,
    token: &str,
    chat: &str,
    message: &str,
    ids: &[&str],
) -> Result<Vec<(String, Value)>, (u16, Value)> {
    let auth = format!("Bearer {token}");
    let (status, _, body) = http(
        stack.port,
        "POST",
        &format!("/v1/chats/{chat}/turns"),
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        &json!({"message": message, "attachments": ids}).to_string(),
    );
    if status != 200 {
        return Err((
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        ));
    }
    Ok(body
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|block| {
            let mut lines = block.lines();
            let kind = lines
                .next()
                .unwrap()
                .trim_start_matches("event: ")
                .to_owned();
            let data = lines.next().unwrap().trim_start_matches("data: ");
            (kind, serde_json::from_str(data).unwrap())
        })
        .collect())
}

fn setup() -> (Model, Stack, String, String) {
    let model = Model::start();
    let (stack, _gateway_port) = Stack::start_with_gateway_and(&model.config());
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[("server.txt", "server file\n")]);
    let chat = create_chat(&stack, &alice, "app");
    (model, stack, alice, chat)
}

/// The person's message of a recorded model request.
fn user_message(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap()
        .to_owned()
}

#[test]
fn the_model_gets_text_previews_and_reads_this_turns_images_only() {
    let (model, stack, alice, chat) = setup();
    let (status, image) = upload(&stack, &alice, &chat, "../../shot.png", PNG);
    assert_eq!(status, 201, "{image}");
    assert_eq!(
        (
            image["kind"].as_str(),
            image["media_type"].as_str(),
            image["name"].as_str()
        ),
        (Some("image"), Some("image/png"), Some("shot.png"))
    );
    let (status, notes) = upload(
        &stack,
        &alice,
        &chat,
        "notes.md",
        b"# Plan\nship the console\n",
    );
    assert_eq!(status, 201, "{notes}");
    assert_eq!(notes["kind"], "text");

    model.play(vec![
        calls(&[
            ("i1", "read_image", json!({"name": "shot.png"})),
            ("i2", "read_image", json!({"name": "notes.md"})),
        ]),
        text("a one-pixel image"),
    ]);
    let ids = [
        image["attachment_id"].as_str().unwrap(),
        notes["attachment_id"].as_str().unwrap(),
    ];
    let events = turn_with(&stack, &alice, &chat, "what is in these?", &ids).unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:?}"
    );
    assert_eq!(result_of(&events, "i1")["ok"], true, "{events:?}");
    // A text attachment is not an image: read_image refuses it.
    assert_eq!(
        result_of(&events, "i2")["error"]["code"],
        "attachment_not_found"
    );
    // Both uploads and the turn's messages are where this stack keeps agentd's state: in
    // cluster mode, rows in its PostgreSQL, and none of the chat-side SQLite files exist.
    assert_eq!(stack.agentd_rows("attachments.db", "attachments"), 2);
    assert!(stack.agentd_rows("chats.db", "messages") >= 2);
    if stack.cluster.is_some() {
        let agent_dir = stack.state.root().join("agent");
        for file in [
            "chats.db",
            "attachments.db",
            "mcp_connections.db",
            "project_secrets.db",
        ] {
            assert!(
                !agent_dir.join(file).exists(),
                "{file} exists in cluster mode"
            );
        }
    }

    let requests = model.requests();
    let first = &requests[0];
    assert!(
        tool_names(first).contains(&"read_image".to_owned()),
        "{:?}",
        tool_names(first)
    );
    let message = user_message(first);
    assert!(message.starts_with("what is in these?"), "{message}");
    assert!(message.contains("# Plan\nship the console"), "{message}");
    assert!(
        message.contains("shown whole") && message.contains("\"notes.md\""),
        "{message}"
    );
    assert!(
        message.contains("[attached image \"shot.png\""),
        "{message}"
    );
    // The image reaches the model after the round's tool results, as a data URL of its bytes.
    let second = requests[1]["messages"].as_array().unwrap();
    let last = second.last().unwrap();
    assert_eq!(last["role"], "user", "{last}");
    let url = last["content"][1]["image_url"]["url"].as_str().unwrap();
    use base64::Engine as _;
    let expected = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(PNG)
    );
    assert_eq!(url, expected);
    assert_eq!(second[second.len() - 2]["role"], "tool");

    // The next turn has no attachments: no read_image, and the earlier image is only named.
    model.clear();
    model.play(vec![
        calls(&[("i3", "read_image", json!({"name": "shot.png"}))]),
        text("done"),
    ]);
    let events = turn_with(&stack, &alice, &chat, "again", &[]).unwrap();
    assert_eq!(
        result_of(&events, "i3")["error"]["code"],
        "unknown_tool",
        "{events:?}"
    );
    let requests = model.requests();
    assert!(!tool_names(&requests[0]).contains(&"read_image".to_owned()));
    let sent = requests[0].to_string();
    assert!(
        !sent.contains("base64,"),
        "an earlier turn's image was sent again"
    );
    assert!(sent.contains("shown here in an earlier turn"), "{sent}");
    // The earlier message keeps its text preview; its image is only named, not offered.
    assert!(
        sent.contains("ship the console") && sent.contains("was attached to this earlier message"),
        "{sent}"
    );
    assert!(!sent.contains("call read_image"), "{sent}");

    // The chat as the console reads it: the person's text, and the attachments listed apart.
    let (status, stored) = super::agent::api(
        &stack,
        &alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert_eq!(status, 200, "{stored}");
    let first = &stored["messages"][0];
    assert_eq!(first["content"], "what is in these?", "{first}");
    let names: Vec<&str> = first["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["shot.png", "notes.md"]);
    assert!(
        !stored.to_string().contains("base64"),
        "the stored chat holds image bytes"
    );
}

#[test]
fn attachments_are_checked_on_their_bytes_limits_and_owner() {
    let (model, stack, alice, chat) = setup();
    // Executable bytes are neither an image nor text, whatever the name says.
    let (status, body) = upload(
        &stack,
        &alice,
        &chat,
        "photo.png",
        b"\x7fELF\x02\x01\x01\0\0\0",
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (415, Some("unsupported_attachment")),
        "{body}"
    );
    // Beyond 10 MB: refused with the limit in the message.
    let big = vec![b'a'; 10 * 1024 * 1024 + 1];
    let (status, body) = upload(&stack, &alice, &chat, "big.txt", &big);
    assert_eq!(status, 413, "{body}");
    assert!(body.to_string().contains("10485760"), "{body}");
    // Eleven files in one message: refused before the turn starts.
    let ids: Vec<String> = (0..11)
        .map(|i| {
            let (status, a) = upload(&stack, &alice, &chat, &format!("f{i}.txt"), b"x");
            assert_eq!(status, 201, "{a}");
            a["attachment_id"].as_str().unwrap().to_owned()
        })
        .collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let (status, body) = turn_with(&stack, &alice, &chat, "too many", &refs).unwrap_err();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("too_many_attachments")),
        "{body}"
    );

    // Bob cannot upload to alice's chat, nor send her upload in a chat of his.
    let bob = user(&stack, "bob");
    stack.admin(
        "members/add",
        json!({"project": "app", "user": "bob", "role": "editor"}),
    );
    let (status, _) = upload(&stack, &bob, &chat, "x.txt", b"x");
    assert_eq!(status, 403);
    let bobs_chat = create_chat(&stack, &bob, "app");
    model.play(vec![text("never")]);
    let (status, body) = turn_with(&stack, &bob, &bobs_chat, "steal", &refs[..1]).unwrap_err();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("attachment_not_found")),
        "{body}"
    );
    // The refused turn left bob's chat free: a plain turn runs.
    model.play(vec![text("hello bob")]);
    let events = turn_with(&stack, &bob, &bobs_chat, "hello", &[]).unwrap();
    assert_eq!(super::agent::answer_text(&events), "hello bob");
    // An upload is used by one message only.
    model.play(vec![text("ok")]);
    turn_with(&stack, &alice, &chat, "one", &refs[..1]).unwrap();
    let (status, body) = turn_with(&stack, &alice, &chat, "again", &refs[..1]).unwrap_err();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("attachment_not_found")),
        "{body}"
    );
}
