//! The console's sessions end to end: a real agentd and workspaced, the password set with a
//! real `agentworksctl`, every request over real HTTP to agentd's public listener: sign-in,
//! the cookie on the chat API with its Origin and CSRF checks, sign-out, the failed-attempt
//! limits, invites and one-time sign-in links, a disabled user.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::agent::code_project;
use super::harness::{Stack, http};

pub(crate) const PASSWORD: &str = "correct horse battery";

/// `agentworksctl user passwd NAME` with the password on stdin.
pub(crate) fn passwd(stack: &Stack, name: &str, password: &str) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(["user", "passwd", name])
        .env("AGENTWORKS_STATE_ROOT", stack.state.root())
        .env(
            "AGENTWORKS_CONFIG",
            stack.state.root().join("agentworks.toml"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    child.wait_with_output().unwrap()
}

/// A user with a console password and a code project they own.
pub(crate) fn alice(stack: &Stack) {
    let added = stack.ctl(&["user", "add", "alice"]);
    assert!(added.status.success(), "{added:?}");
    let set = passwd(stack, "alice", PASSWORD);
    assert!(set.status.success(), "{set:?}");
    code_project(stack, "app", "alice", &[("README.md", "hello\n")]);
}

pub(crate) fn origin(stack: &Stack) -> String {
    format!("http://127.0.0.1:{}", stack.port)
}

/// A request with these headers and a JSON body: (status, headers, JSON or text).
pub(crate) fn request(
    stack: &Stack,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, hyper::HeaderMap, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let (status, headers, text) = http(stack.port, method, path, &all, &body);
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, value)
}

/// A successful sign-in from the console's page (its Origin): (the `aw_session=…` cookie
/// pair, the answer).
pub(crate) fn sign_in(stack: &Stack, body: Value) -> (String, Value) {
    let own = origin(stack);
    let (status, headers, answer) = request(
        stack,
        "POST",
        "/v1/console/sign-in",
        &[("origin", &own)],
        body,
    );
    assert_eq!(status, 200, "{answer}");
    (session_cookie(&headers), answer)
}

pub(crate) fn session_cookie(headers: &hyper::HeaderMap) -> String {
    let set = headers["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

fn password_sign_in(stack: &Stack, name: &str, password: &str) -> (u16, hyper::HeaderMap, Value) {
    request(
        stack,
        "POST",
        "/v1/console/sign-in",
        &[("origin", &origin(stack))],
        json!({"username": name, "password": password}),
    )
}

fn code(url: &str) -> String {
    url.split_once("#code=").unwrap().1.to_owned()
}

#[test]
fn a_password_sign_in_gives_a_cookie_the_chat_api_accepts_with_origin_and_csrf() {
    let stack = Stack::start();
    alice(&stack);
    let (status, _, wrong) = password_sign_in(&stack, "alice", "not the password");
    assert_eq!(status, 401, "{wrong}");
    assert_eq!(wrong["error"]["code"], "invalid_credentials");
    let (status, _, unknown) = password_sign_in(&stack, "nobody", PASSWORD);
    assert_eq!(status, 401);
    assert_eq!(unknown["error"], wrong["error"], "one answer for both");

    let (status, headers, answer) = password_sign_in(&stack, "alice", PASSWORD);
    assert_eq!(status, 200, "{answer}");
    let set_cookie = headers["set-cookie"].to_str().unwrap();
    let attributes: Vec<&str> = set_cookie.split("; ").skip(1).collect();
    assert_eq!(
        attributes[..3],
        ["Path=/", "HttpOnly", "SameSite=Lax"],
        "{set_cookie}"
    );
    assert_eq!(
        attributes.len(),
        4,
        "no Secure on an http console: {set_cookie}"
    );
    let max_age: i64 = attributes[3]
        .strip_prefix("Max-Age=")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (604_000..=604_800).contains(&max_age),
        "7 days: {set_cookie}"
    );
    assert_eq!(answer["user"]["name"], "alice");
    let csrf = answer["csrf_token"].as_str().unwrap().to_owned();
    assert!(answer["expires_at_ms"].as_i64().unwrap() > 0);
    let cookie = session_cookie(&headers);

    let (status, _, current) = request(
        &stack,
        "GET",
        "/v1/console/session",
        &[("cookie", &cookie)],
        Value::Null,
    );
    assert_eq!(status, 200, "{current}");
    assert_eq!(current["csrf_token"], csrf.as_str());
    assert_eq!(current["user"], answer["user"]);

    let (status, _, chats) = request(
        &stack,
        "GET",
        "/v1/chats",
        &[("cookie", &cookie)],
        Value::Null,
    );
    assert_eq!(status, 200, "{chats}");
    assert_eq!(chats["chats"], json!([]));

    let own = origin(&stack);
    let create = json!({"project": "app"});
    for (headers, why) in [
        (
            vec![("cookie", cookie.as_str()), ("origin", own.as_str())],
            "no CSRF token",
        ),
        (
            vec![
                ("cookie", cookie.as_str()),
                ("origin", own.as_str()),
                ("x-csrf-token", "0000"),
            ],
            "a wrong CSRF token",
        ),
        (
            vec![
                ("cookie", cookie.as_str()),
                ("origin", "http://evil.example"),
                ("x-csrf-token", csrf.as_str()),
            ],
            "a foreign Origin",
        ),
        (
            vec![("cookie", cookie.as_str()), ("x-csrf-token", csrf.as_str())],
            "no Origin",
        ),
    ] {
        let (status, _, refused) = request(&stack, "POST", "/v1/chats", &headers, create.clone());
        assert_eq!(status, 403, "{why}: {refused}");
        assert_eq!(refused["error"]["code"], "csrf_refused", "{why}");
    }
    let (status, _, chat) = request(
        &stack,
        "POST",
        "/v1/chats",
        &[
            ("cookie", &cookie),
            ("origin", &own),
            ("x-csrf-token", &csrf),
        ],
        create.clone(),
    );
    assert_eq!(status, 201, "{chat}");
    assert_eq!(chat["owner_name"], "alice");

    // An Authorization header is never read as a session, even with the cookie beside it.
    let (status, _, bearer) = request(
        &stack,
        "GET",
        "/v1/chats",
        &[("cookie", &cookie), ("authorization", "Bearer nonsense")],
        Value::Null,
    );
    assert_eq!(status, 401, "{bearer}");
    assert_eq!(bearer["error"]["code"], "invalid_token");

    // Sign-out needs the CSRF token too, then the cookie is dead and its token revoked.
    let (status, _, _) = request(
        &stack,
        "POST",
        "/v1/console/sign-out",
        &[("cookie", &cookie), ("origin", &own)],
        Value::Null,
    );
    assert_eq!(status, 403);
    let (status, headers, _) = request(
        &stack,
        "POST",
        "/v1/console/sign-out",
        &[
            ("cookie", &cookie),
            ("origin", &own),
            ("x-csrf-token", &csrf),
        ],
        Value::Null,
    );
    assert_eq!(status, 204);
    assert!(
        headers["set-cookie"]
            .to_str()
            .unwrap()
            .starts_with("aw_session=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0"),
        "{headers:?}"
    );
    let (status, _, after) = request(
        &stack,
        "GET",
        "/v1/chats",
        &[("cookie", &cookie)],
        Value::Null,
    );
    assert_eq!(status, 401, "{after}");
    assert_eq!(after["error"]["code"], "not_signed_in");
    let (status, _, _) = request(
        &stack,
        "GET",
        "/v1/console/session",
        &[("cookie", &cookie)],
        Value::Null,
    );
    assert_eq!(status, 401);
    let tokens = stack.admin("tokens/list", json!({"user": "alice"}));
    let session_tokens: Vec<&Value> = tokens
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["label"] == "console session")
        .collect();
    assert_eq!(session_tokens.len(), 1, "{tokens}");
    assert!(!session_tokens[0]["revoked_at_ms"].is_null(), "{tokens}");
}

/// In a cluster the limit holds across agentd hosts: wrong passwords spread over two hosts
/// (as a load balancer spreads them) count together. Counted in each host's memory, the
/// right password on A was still let through after 3 failures there and 2 on B.
#[test]
fn failed_sign_ins_on_one_host_count_on_another() {
    let (stack, _) = Stack::start_in_cluster_with_gateway_and("");
    alice(&stack);
    let (_agentd_b, port_b) = stack.start_agentd_host("host-b");
    let wrong = json!({"username": "alice", "password": "not the password"}).to_string();
    let origin_b = format!("http://127.0.0.1:{port_b}");
    let json = [("content-type", "application/json"), ("origin", &origin_b)];
    for _ in 0..3 {
        assert_eq!(password_sign_in(&stack, "alice", "not the password").0, 401);
    }
    for _ in 0..2 {
        let (status, _, body) = http(port_b, "POST", "/v1/console/sign-in", &json, &wrong);
        assert_eq!(status, 401, "{body}");
    }
    let (status, _, limited) = password_sign_in(&stack, "alice", PASSWORD);
    assert_eq!(status, 429, "{limited}");
    assert_eq!(limited["error"]["code"], "too_many_attempts");
}

#[test]
fn failed_sign_ins_are_limited_per_user_and_per_address() {
    let stack = Stack::start();
    alice(&stack);
    for _ in 0..5 {
        let (status, _, _) = password_sign_in(&stack, "alice", "not the password");
        assert_eq!(status, 401);
    }
    // The right password no longer helps: the limit is checked before the password.
    let (status, headers, limited) = password_sign_in(&stack, "alice", PASSWORD);
    assert_eq!(status, 429, "{limited}");
    assert_eq!(limited["error"]["code"], "too_many_attempts");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=900).contains(&retry), "{retry}");

    // The address has 5 failures; 15 more under other names reach its limit of 20.
    for i in 0..15 {
        let (status, _, _) = password_sign_in(&stack, &format!("guess{i}"), "not the password");
        assert_eq!(status, 401, "attempt {i}");
    }
    let (status, headers, _) = password_sign_in(&stack, "someone-else", "not the password");
    assert_eq!(status, 429);
    assert!(headers.contains_key("retry-after"));
    let (status, _, _) = request(
        &stack,
        "POST",
        "/v1/console/sign-in",
        &[("origin", &origin(&stack))],
        json!({"link_code": "0".repeat(64)}),
    );
    assert_eq!(status, 429, "links count against the address too");
}

#[test]
fn invites_and_sign_in_links_work_once_and_a_disabled_user_is_signed_out() {
    let stack = Stack::start();
    let added = stack.ctl(&["user", "add", "alice"]);
    assert!(added.status.success());
    code_project(&stack, "app", "alice", &[("README.md", "hello\n")]);

    let invited = stack.ctl(&["user", "invite", "alice"]);
    assert!(invited.status.success(), "{invited:?}");
    let printed = String::from_utf8(invited.stdout).unwrap();
    let url = printed.lines().next().unwrap();
    assert!(
        url.starts_with(&format!("{}/console/invite#code=", origin(&stack))),
        "{printed}"
    );
    let invite = code(url);
    let own = origin(&stack);
    let (status, _, short) = request(
        &stack,
        "POST",
        "/v1/console/invite",
        &[("origin", &own)],
        json!({"code": invite, "password": "short"}),
    );
    assert_eq!(status, 400, "{short}");
    let (status, headers, answer) = request(
        &stack,
        "POST",
        "/v1/console/invite",
        &[("origin", &origin(&stack))],
        json!({"code": invite, "password": PASSWORD}),
    );
    assert_eq!(
        status, 200,
        "a too-short password did not use up the invite: {answer}"
    );
    assert_eq!(answer["user"]["name"], "alice");
    let invited_cookie = session_cookie(&headers);
    let (status, _, again) = request(
        &stack,
        "POST",
        "/v1/console/invite",
        &[("origin", &own)],
        json!({"code": invite, "password": "another password"}),
    );
    assert_eq!(status, 401, "{again}");
    assert_eq!(again["error"]["code"], "invalid_code");
    let (status, _, _) = password_sign_in(&stack, "alice", PASSWORD);
    assert_eq!(status, 200, "the invite set the password");

    let (status, _, foreign) = request(
        &stack,
        "POST",
        "/v1/console/sign-in",
        &[("origin", "http://evil.example")],
        json!({"username": "alice", "password": PASSWORD}),
    );
    assert_eq!(status, 403, "{foreign}");

    let link = stack.admin("users/alice/sign-in-links", json!({}));
    let url = link["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}/console/sign-in#code=", origin(&stack))),
        "{link}"
    );
    assert!(link["expires_at_ms"].as_i64().unwrap() > 0);
    let (link_cookie, answer) = sign_in(&stack, json!({"link_code": code(url)}));
    assert_eq!(answer["user"]["name"], "alice");
    let (status, _, used) = request(
        &stack,
        "POST",
        "/v1/console/sign-in",
        &[("origin", &own)],
        json!({"link_code": code(url)}),
    );
    assert_eq!(status, 401, "{used}");
    assert_eq!(used["error"]["code"], "invalid_credentials");

    for cookie in [&invited_cookie, &link_cookie] {
        let (status, _, _) = request(
            &stack,
            "GET",
            "/v1/chats",
            &[("cookie", cookie)],
            Value::Null,
        );
        assert_eq!(status, 200);
    }
    stack.admin("users/disable", json!({"name": "alice"}));
    for cookie in [&invited_cookie, &link_cookie] {
        let (status, _, refused) = request(
            &stack,
            "GET",
            "/v1/chats",
            &[("cookie", cookie)],
            Value::Null,
        );
        assert_eq!(status, 401, "{refused}");
    }
    let (status, _, _) = password_sign_in(&stack, "alice", PASSWORD);
    assert_eq!(status, 401, "a disabled user cannot sign in");
}
