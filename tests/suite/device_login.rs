//! Approving an `agentworks login` in the web console, end to end: a real agentd and
//! workspaced, a real `agentworksctl` for the password, every request over real HTTP. The
//! approval page and its security headers, the session-only JSON API (`/v1/console/device-login`)
//! with its Origin/CSRF rule, decide-once, the guess limit, and the bearer approval
//! (`POST /v1/device/approve` with `devices:approve`) that keeps working beside it.

use serde_json::{Value, json};

use super::console_sessions::{PASSWORD, alice, origin, request, sign_in};
use super::harness::{Stack, http};

const API: &str = "/v1/console/device-login";
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// `value` form-encoded: every byte but letters and digits as `%XX`.
pub(super) fn form_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A signed-in alice: (cookie, CSRF token).
fn signed_in(stack: &Stack) -> (String, String) {
    alice(stack);
    let (cookie, answer) = sign_in(stack, json!({"username": "alice", "password": PASSWORD}));
    (cookie, answer["csrf_token"].as_str().unwrap().to_owned())
}

/// A pending device login as the CLI starts it: (user code, device code).
fn start_login(stack: &Stack, device_name: &str) -> (String, String) {
    let body = format!(
        "client_id=agentworks&device_name={}",
        form_value(device_name)
    );
    let (status, _, text) = http(
        stack.port,
        "POST",
        "/v1/device/code",
        &[("content-type", "application/x-www-form-urlencoded")],
        &body,
    );
    assert_eq!(status, 200, "{text}");
    let code: Value = serde_json::from_str(&text).unwrap();
    let user_code = code["user_code"].as_str().unwrap().to_owned();
    assert_eq!(
        code["verification_uri"],
        format!("http://127.0.0.1:{}/v1/device/approve", stack.port)
    );
    assert_eq!(
        code["verification_uri_complete"],
        format!(
            "{}?user_code={user_code}",
            code["verification_uri"].as_str().unwrap()
        )
    );
    (user_code, code["device_code"].as_str().unwrap().to_owned())
}

/// The CLI's poll: (status, the OAuth answer).
fn poll(stack: &Stack, device_code: &str) -> (u16, Value) {
    let body = format!(
        "grant_type={}&device_code={device_code}",
        form_value("urn:ietf:params:oauth:grant-type:device_code")
    );
    let (status, _, text) = http(
        stack.port,
        "POST",
        "/v1/device/token",
        &[("content-type", "application/x-www-form-urlencoded")],
        &body,
    );
    (status, serde_json::from_str(&text).unwrap())
}

fn lookup(stack: &Stack, cookie: &str, user_code: &str) -> (u16, hyper::HeaderMap, Value) {
    request(
        stack,
        "GET",
        &format!("{API}?user_code={user_code}"),
        &[("cookie", cookie)],
        Value::Null,
    )
}

fn decide(
    stack: &Stack,
    cookie: &str,
    csrf: &str,
    user_code: &str,
    approve: bool,
) -> (u16, hyper::HeaderMap, Value) {
    let origin = origin(stack);
    request(
        stack,
        "POST",
        API,
        &[
            ("cookie", cookie),
            ("origin", &origin),
            ("x-csrf-token", csrf),
        ],
        json!({"user_code": user_code, "approve": approve}),
    )
}

pub(super) fn bearer_approve(
    stack: &Stack,
    token: &str,
    user_code: &str,
) -> (u16, hyper::HeaderMap, Value) {
    request(
        stack,
        "POST",
        "/v1/device/approve",
        &[("authorization", &format!("Bearer {token}"))],
        json!({"user_code": user_code}),
    )
}

/// The tokens `agentworks login` got for alice.
pub(super) fn login_tokens(stack: &Stack) -> Vec<Value> {
    stack
        .admin("tokens/list", json!({"user": "alice"}))
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["label"].as_str().unwrap().starts_with("agentworks login"))
        .cloned()
        .collect()
}

#[test]
fn the_approval_page_is_html_with_the_consoles_headers() {
    let stack = Stack::start();
    for path in [
        "/v1/device/approve",
        "/v1/device/approve?user_code=BCDF-GHJK",
    ] {
        for method in ["GET", "HEAD"] {
            let (status, headers, body) = http(stack.port, method, path, &[], "");
            assert_eq!(status, 200, "{method} {path}: {body}");
            assert_eq!(headers["content-type"], "text/html; charset=utf-8");
            assert_eq!(headers["content-security-policy"], CSP, "{method} {path}");
            assert_eq!(headers["x-frame-options"], "DENY");
            assert_eq!(headers["x-content-type-options"], "nosniff");
            assert_eq!(headers["cache-control"], "no-store");
            if method == "GET" {
                assert!(
                    body.contains(
                        r#"<script type="module" src="/console/assets/device-approve.js"></script>"#
                    ),
                    "{body}"
                );
                assert!(!body.contains("<script>"), "no inline script: {body}");
            }
        }
    }
    for method in ["PUT", "DELETE", "PATCH"] {
        let (status, headers, body) = http(stack.port, method, "/v1/device/approve", &[], "");
        assert_eq!(status, 405, "{method}: {body}");
        assert_eq!(headers["allow"], "GET, HEAD, POST");
    }
    let (status, headers, body) = http(
        stack.port,
        "GET",
        "/console/assets/device-approve.js",
        &[],
        "",
    );
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/javascript; charset=utf-8");
    assert!(body.contains("/v1/console/device-login"), "{body}");
    // The other device endpoints still only take POST.
    let (status, _, _) = http(stack.port, "GET", "/v1/device/token", &[], "");
    assert_eq!(status, 405);
}

#[test]
fn a_signed_in_person_approves_once_and_the_device_gets_only_devices_connect() {
    let stack = Stack::start();
    let (cookie, csrf) = signed_in(&stack);
    let (user_code, device_code) = start_login(&stack, "<b>lap</b>top");

    let (status, headers, found) = lookup(&stack, &cookie, &user_code.to_lowercase());
    assert_eq!(status, 200, "{found}");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(found["user_code"], user_code.as_str());
    assert_eq!(found["device_name"], "<b>lap</b>top");
    assert_eq!(found["scopes"], json!(["devices:connect"]));
    let expires_in = found["expires_in"].as_u64().unwrap();
    assert!((540..=600).contains(&expires_in), "{found}");
    let (status, _) = poll(&stack, &device_code);
    assert_eq!(status, 400, "pending before the decision");

    let (status, _, decided) = decide(&stack, &cookie, &csrf, &user_code, true);
    assert_eq!(status, 200, "{decided}");
    assert_eq!(
        decided,
        json!({"approved": true, "device_name": "<b>lap</b>top", "user": "alice"})
    );
    let (status, _, again) = decide(&stack, &cookie, &csrf, &user_code, false);
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["error"], "already_decided");
    let approver = stack.token("alice", &["devices:approve"], json!({}));
    let (status, _, bearer) = bearer_approve(&stack, &approver, &user_code);
    assert_eq!(status, 409, "decided once, by either path: {bearer}");
    assert_eq!(bearer["error"], "already_decided");
    let (status, _, gone) = lookup(&stack, &cookie, &user_code);
    assert_eq!(status, 404, "{gone}");
    assert_eq!(gone["error"], "not_found");

    let (status, token) = poll(&stack, &device_code);
    assert_eq!(status, 200, "{token}");
    assert!(token["access_token"].as_str().unwrap().len() > 20);
    let minted = login_tokens(&stack);
    assert_eq!(minted.len(), 1, "{minted:?}");
    assert_eq!(minted[0]["scopes"], json!(["devices:connect"]));
    assert_eq!(minted[0]["label"], "agentworks login: <b>lap</b>top");
}

#[test]
fn a_denied_login_is_refused_to_the_device() {
    let stack = Stack::start();
    let (cookie, csrf) = signed_in(&stack);
    let (user_code, device_code) = start_login(&stack, "laptop");
    let (status, _, decided) = decide(&stack, &cookie, &csrf, &user_code, false);
    assert_eq!(status, 200, "{decided}");
    assert_eq!(
        decided,
        json!({"approved": false, "device_name": "laptop", "user": "alice"})
    );
    let (status, _, again) = decide(&stack, &cookie, &csrf, &user_code, true);
    assert_eq!(status, 409, "a denial is final: {again}");
    let (status, answer) = poll(&stack, &device_code);
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"], "access_denied");
    assert!(login_tokens(&stack).is_empty());
}

#[test]
fn only_the_consoles_own_pages_with_a_session_can_decide() {
    let stack = Stack::start();
    let (cookie, csrf) = signed_in(&stack);
    let (user_code, device_code) = start_login(&stack, "laptop");
    let body = json!({"user_code": user_code, "approve": true});
    let own = origin(&stack);

    let (status, _, refused) = request(
        &stack,
        "POST",
        API,
        &[("cookie", &cookie), ("origin", &own)],
        body.clone(),
    );
    assert_eq!(status, 403, "no CSRF token: {refused}");
    assert_eq!(refused["error"], "csrf_refused");
    let (status, _, refused) = request(
        &stack,
        "POST",
        API,
        &[
            ("cookie", &cookie),
            ("origin", "https://evil.example"),
            ("x-csrf-token", &csrf),
        ],
        body.clone(),
    );
    assert_eq!(status, 403, "a foreign Origin: {refused}");
    let (status, _, refused) = request(&stack, "POST", API, &[("origin", &own)], body.clone());
    assert_eq!(status, 401, "no session: {refused}");
    let (status, _, refused) = request(
        &stack,
        "GET",
        &format!("{API}?user_code={user_code}"),
        &[],
        Value::Null,
    );
    assert_eq!(status, 401, "no session: {refused}");

    // A bearer token is not a session here, whatever its scope, even beside the cookie.
    for scopes in [
        &["devices:connect"][..],
        &["devices:approve"],
        &["workflows:read"],
    ] {
        let token = stack.token("alice", scopes, json!({}));
        let authorization = format!("Bearer {token}");
        let (status, _, refused) = request(
            &stack,
            "POST",
            API,
            &[("authorization", &authorization), ("origin", &own)],
            body.clone(),
        );
        assert_eq!(status, 401, "{scopes:?}: {refused}");
        assert_eq!(refused["error"], "session_required");
        let (status, _, refused) = request(
            &stack,
            "POST",
            API,
            &[
                ("authorization", &authorization),
                ("cookie", &cookie),
                ("origin", &own),
                ("x-csrf-token", &csrf),
            ],
            body.clone(),
        );
        assert_eq!(status, 401, "{scopes:?} with the cookie: {refused}");
        let (status, _, refused) = request(
            &stack,
            "GET",
            &format!("{API}?user_code={user_code}"),
            &[("authorization", &authorization)],
            Value::Null,
        );
        assert_eq!(status, 401, "{scopes:?}: {refused}");
    }

    // Nothing was decided.
    let (status, _, found) = lookup(&stack, &cookie, &user_code);
    assert_eq!(status, 200, "still pending: {found}");
    let (status, answer) = poll(&stack, &device_code);
    assert_eq!(status, 400);
    assert_eq!(answer["error"], "authorization_pending");
}

#[test]
fn guessing_codes_is_limited_to_ten_failures() {
    let stack = Stack::start();
    let (cookie, csrf) = signed_in(&stack);
    let (user_code, _) = start_login(&stack, "laptop");
    // Successful lookups do not count.
    for _ in 0..3 {
        let (status, _, found) = lookup(&stack, &cookie, &user_code);
        assert_eq!(status, 200, "{found}");
    }
    // No vowels in user codes: these are never pending.
    for i in 0..10 {
        let guess = format!("AAAA-AA{:02}", i);
        let (status, _, answer) = if i % 2 == 0 {
            lookup(&stack, &cookie, &guess)
        } else {
            decide(&stack, &cookie, &csrf, &guess, true)
        };
        assert_eq!(status, 404, "guess {i}: {answer}");
        assert_eq!(answer["error"], "not_found");
    }
    let (status, headers, refused) = lookup(&stack, &cookie, "AAAA-AAAA");
    assert_eq!(status, 429, "the 11th: {refused}");
    assert_eq!(refused["error"], "too_many_attempts");
    assert!(
        refused["error_description"]
            .as_str()
            .unwrap()
            .contains("try again in"),
        "{refused}"
    );
    let retry: i64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=900).contains(&retry), "{retry}");
    let (status, _, refused) = decide(&stack, &cookie, &csrf, &user_code, true);
    assert_eq!(
        status, 429,
        "even the right code, until the window passes: {refused}"
    );
}

#[test]
fn the_bearer_approval_still_needs_devices_approve() {
    let stack = Stack::start();
    alice(&stack);
    let (user_code, device_code) = start_login(&stack, "laptop");
    let connect = stack.token("alice", &["devices:connect"], json!({}));
    let (status, headers, refused) = bearer_approve(&stack, &connect, &user_code);
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["error"], "insufficient_scope");
    assert!(
        headers["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("devices:approve")
    );
    let approver = stack.token("alice", &["devices:approve"], json!({}));
    let (status, _, approved) = bearer_approve(&stack, &approver, &user_code);
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved, json!({"user": "alice", "approved": true}));
    let (status, token) = poll(&stack, &device_code);
    assert_eq!(status, 200, "{token}");
    assert_eq!(
        login_tokens(&stack)[0]["scopes"],
        json!(["devices:connect"])
    );
    let (status, _, unknown) = bearer_approve(&stack, &approver, "AAAA-AAAA");
    assert_eq!(status, 404, "{unknown}");
    assert_eq!(unknown["error"], "invalid_grant");
}
