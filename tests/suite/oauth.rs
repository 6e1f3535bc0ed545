//! agentd as an OAuth 2.1 authorization server for MCP clients (issue 13), over real HTTP
//! against a real agentd: metadata and challenges, registration, the authorization request
//! and the person's consent through the console's session API, the code and refresh grants,
//! revocation, and each refusal performed for real (a wrong verifier, a replayed code or
//! refresh token, a foreign redirect URI, a metadata document on a private address, a token
//! presented to another resource, a read-only client asking for write). The consent page in a
//! browser is `suite::console`'s `oauth-consent` scenario; the Python SDK's OAuth client is
//! `suite::oauth_sdk`.

use serde_json::{Value, json};

use super::console_sessions::{PASSWORD, alice, origin, request, sign_in};
use super::device_login::form_value;
use super::harness::{Stack, http, mcp_call};

// Not one of the ports browsers refuse to connect to (9, the discard port, is one).
pub(super) const REDIRECT: &str = "http://127.0.0.1:49151/callback";
const STATE: &str = "st-8f2";

/// A query or form body from pairs.
fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", form_value(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The PKCE S256 challenge of `verifier`.
pub(super) fn challenge_of(verifier: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier))
}

/// A query parameter of a URL.
pub(super) fn param(url: &str, name: &str) -> Option<String> {
    url::Url::parse(url)
        .ok()?
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

pub(super) struct Setup {
    pub(super) stack: Stack,
    pub(super) cookie: String,
    csrf: String,
    /// The `flows` workflow project's id: authoring paths `workflows` and `code`.
    pub(super) flows: String,
}

/// alice with a password, her code project `app` and a workflow project `flows` whose
/// policy makes `workflows` and `code` the authoring paths; signed in to the console.
pub(super) fn setup() -> Setup {
    setup_on(Stack::start())
}

/// [`setup`] on a stack already started (with its own config).
pub(super) fn setup_on(stack: Stack) -> Setup {
    alice(&stack);
    stack
        .state
        .project("flows", &[("workflows/a/step.yaml", "a\n")]);
    let project = stack.admin(
        "projects/add",
        json!({"name": "flows", "kind": "workflow", "owner": "alice",
               "policy": {"write_paths": ["workflows", "code"]}}),
    );
    let flows = project["id"].as_str().unwrap().to_owned();
    let (cookie, answer) = sign_in(&stack, json!({"username": "alice", "password": PASSWORD}));
    let csrf = answer["csrf_token"].as_str().unwrap().to_owned();
    Setup {
        stack,
        cookie,
        csrf,
        flows,
    }
}

fn post_form(stack: &Stack, path: &str, body: &str, extra: &[(&str, &str)]) -> (u16, Value) {
    let mut headers = vec![("content-type", "application/x-www-form-urlencoded")];
    headers.extend_from_slice(extra);
    let (status, _, text) = http(stack.port, "POST", path, &headers, body);
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `POST /register` of a public client with `redirect_uris`.
fn register(stack: &Stack, body: Value) -> (u16, Value) {
    let (status, _, answer) = request(stack, "POST", "/register", &[], body);
    (status, answer)
}

fn public_client(stack: &Stack) -> String {
    let (status, answer) = register(
        stack,
        json!({"client_name": "Test <b>App</b>", "redirect_uris": [REDIRECT],
               "token_endpoint_auth_method": "none"}),
    );
    assert_eq!(status, 201, "{answer}");
    assert!(answer.get("client_secret").is_none(), "{answer}");
    answer["client_id"].as_str().unwrap().to_owned()
}

/// `GET /oauth/authorize`: (status, Location, body).
pub(super) fn authorize(stack: &Stack, pairs: &[(&str, &str)]) -> (u16, String, String) {
    let (status, headers, text) = http(
        stack.port,
        "GET",
        &format!("/oauth/authorize?{}", form(pairs)),
        &[],
        "",
    );
    let location = headers
        .get("location")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, location, text)
}

fn resource(stack: &Stack) -> String {
    stack.mcp_url()
}

/// A valid authorization request for `client` asking `scope`: the consent request id.
pub(super) fn start(s: &Setup, client: &str, scope: &str, verifier: &str) -> String {
    let resource = resource(&s.stack);
    let challenge = challenge_of(verifier);
    let (status, location, text) = authorize(
        &s.stack,
        &[
            ("response_type", "code"),
            ("client_id", client),
            ("redirect_uri", REDIRECT),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("state", STATE),
            ("resource", &resource),
            ("scope", scope),
        ],
    );
    assert_eq!(status, 303, "{text}");
    location
        .strip_prefix("/oauth/consent?request=")
        .unwrap_or_else(|| panic!("not the consent page: {location}"))
        .to_owned()
}

/// What the consent page shows for a pending request (200 asserted).
pub(super) fn consent_view(s: &Setup, request_id: &str) -> Value {
    let (status, _, view) = request(
        &s.stack,
        "GET",
        &format!("/v1/console/oauth/requests/{request_id}"),
        &[("cookie", &s.cookie)],
        Value::Null,
    );
    assert_eq!(status, 200, "{view}");
    view
}

fn consent(s: &Setup, request_id: &str, decision: Value) -> (u16, Value) {
    consent_on(s, s.stack.port, request_id, decision)
}

/// [`consent`] through the agentd on `port` (another host of a cluster), with its origin.
fn consent_on(s: &Setup, port: u16, request_id: &str, decision: Value) -> (u16, Value) {
    let origin = format!("http://127.0.0.1:{port}");
    let (status, _, text) = http(
        port,
        "POST",
        &format!("/v1/console/oauth/requests/{request_id}"),
        &[
            ("content-type", "application/json"),
            ("cookie", &s.cookie),
            ("origin", &origin),
            ("x-csrf-token", &s.csrf),
        ],
        &decision.to_string(),
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Allow with `decision` and return the code from the redirect (checking state and iss).
pub(super) fn allow(s: &Setup, request_id: &str, decision: Value) -> String {
    let (status, answer) = consent(s, request_id, decision);
    assert_eq!(status, 200, "{answer}");
    let redirect = answer["redirect"].as_str().unwrap();
    assert!(redirect.starts_with(REDIRECT), "{redirect}");
    assert_eq!(param(redirect, "state").as_deref(), Some(STATE));
    assert_eq!(
        param(redirect, "iss").as_deref(),
        Some(origin(&s.stack).as_str())
    );
    param(redirect, "code").unwrap()
}

pub(super) fn exchange(s: &Setup, client: &str, code: &str, verifier: &str) -> (u16, Value) {
    post_form(
        &s.stack,
        "/oauth/token",
        &form(&[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", REDIRECT),
            ("code_verifier", verifier),
            ("client_id", client),
            ("resource", &resource(&s.stack)),
        ]),
        &[],
    )
}

pub(super) fn refresh(s: &Setup, client: &str, token: &str, scope: Option<&str>) -> (u16, Value) {
    let mut pairs = vec![
        ("grant_type", "refresh_token"),
        ("refresh_token", token),
        ("client_id", client),
    ];
    if let Some(scope) = scope {
        pairs.push(("scope", scope));
    }
    post_form(&s.stack, "/oauth/token", &form(&pairs), &[])
}

/// A whole grant for the `flows` project with `decision`: (client, tokens).
pub(super) fn granted(s: &Setup, scope: &str, decision: Value) -> (String, Value) {
    let client = public_client(&s.stack);
    let verifier = "v".repeat(43) + "-fixed-verifier";
    let id = start(s, &client, scope, &verifier);
    let code = allow(s, &id, decision);
    let (status, tokens) = exchange(s, &client, &code, &verifier);
    assert_eq!(status, 200, "{tokens}");
    (client, tokens)
}

fn write(s: &Setup, token: &str, path: &str, id: &str) -> Result<Value, Value> {
    let (status, body) = mcp_call(
        s.stack.port,
        token,
        "write_file",
        json!({"workflow_id": s.flows, "path": path, "content": "x\n",
               "expected_revision": "missing", "request_id": id}),
    );
    assert_eq!(status, 200, "{body}");
    let result = &body["result"];
    if result["isError"] == true {
        Err(result["structuredContent"]["error"].clone())
    } else {
        Ok(result["structuredContent"].clone())
    }
}

/// The HTTP status `/mcp` answers a `tools/list` with this token.
pub(super) fn mcp_status(s: &Setup, token: &str) -> u16 {
    mcp_call(s.stack.port, token, "list_workflows", json!({})).0
}

#[test]
fn the_metadata_names_the_authorization_server_and_401_says_which_scopes() {
    let stack = Stack::start();
    let base = origin(&stack);
    let (status, _, text) = http(
        stack.port,
        "GET",
        "/.well-known/oauth-authorization-server",
        &[],
        "",
    );
    assert_eq!(status, 200, "{text}");
    let server: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(server["issuer"], base);
    assert_eq!(server["code_challenge_methods_supported"], json!(["S256"]));
    assert_eq!(server["client_id_metadata_document_supported"], true);
    assert_eq!(
        server["authorization_response_iss_parameter_supported"],
        true
    );
    assert_eq!(server["registration_endpoint"], format!("{base}/register"));
    assert!(
        !text.contains("devices:"),
        "device scopes are never offered: {text}"
    );
    let (_, _, text) = http(
        stack.port,
        "GET",
        "/.well-known/oauth-protected-resource/mcp",
        &[],
        "",
    );
    let resource: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(resource["authorization_servers"], json!([base]));
    assert_eq!(resource["resource"], format!("{base}/mcp"));
    let (status, headers, _) = http(
        stack.port,
        "POST",
        "/mcp",
        &[("content-type", "application/json")],
        "{}",
    );
    assert_eq!(status, 401);
    let challenge = headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains(&format!(
            "resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\""
        )),
        "{challenge}"
    );
    assert!(
        challenge.contains("scope=\"workflows:read workflows:run workflows:write\""),
        "{challenge}"
    );
}

#[test]
fn consent_to_one_folder_then_writes_refresh_reuse_and_revocation() {
    let s = setup();
    let client = public_client(&s.stack);
    let verifier = "a-verifier-of-forty-three-or-more-characters-long";
    let id = start(&s, &client, "workflows:read workflows:write", verifier);
    // The consent page's view: the client's name as sent, the redirect host, the scopes and
    // alice's projects with their authoring paths.
    let view = consent_view(&s, &id);
    assert_eq!(view["client_name"], "Test <b>App</b>");
    assert_eq!(view["redirect_host"], "127.0.0.1:49151");
    assert_eq!(view["writes"], true);
    let flows = view["projects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "flows")
        .unwrap();
    assert_eq!(flows["authoring_paths"], json!(["workflows", "code"]));
    // A bearer token cannot consent on the person's behalf.
    let pat = s.stack.token("alice", &["workflows:write"], json!({}));
    let (status, _, answer) = request(
        &s.stack,
        "GET",
        &format!("/v1/console/oauth/requests/{id}"),
        &[("authorization", &format!("Bearer {pat}"))],
        Value::Null,
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("session_required"))
    );
    // A folder outside the authoring paths is refused, and the request is still open.
    let (status, answer) = consent(
        &s,
        &id,
        json!({"allow": true, "projects": [s.flows], "write_folders": ["docs"]}),
    );
    assert_eq!(status, 400, "{answer}");
    let code = allow(
        &s,
        &id,
        json!({"allow": true, "projects": [s.flows], "write_folders": ["workflows/a"]}),
    );
    // Decided once.
    let (status, answer) = consent(&s, &id, json!({"allow": false}));
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("already_decided"))
    );
    let (status, tokens) = exchange(&s, &client, &code, verifier);
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["token_type"], "Bearer");
    assert_eq!(tokens["scope"], "workflows:read workflows:write");
    let access = tokens["access_token"].as_str().unwrap();
    // Inside the consented folder: written. Outside it: forbidden, nothing on disk.
    assert!(write(&s, access, "workflows/a/new.yaml", "w1").is_ok());
    let refused = write(&s, access, "workflows/b/new.yaml", "w2").unwrap_err();
    assert_eq!(refused["code"], "forbidden", "{refused}");
    let documents = s.stack.state.documents();
    assert!(documents.join("flows/workflows/a/new.yaml").exists());
    assert!(!documents.join("flows/workflows/b/new.yaml").exists());
    // Not a consented project: the code project `app` is not visible.
    let (status, body) = mcp_call(
        s.stack.port,
        access,
        "list_files",
        json!({"workflow_id": "app"}),
    );
    assert_eq!(status, 200);
    assert_eq!(body["result"]["isError"], true, "{body}");
    // The token is bound to /mcp: the chat API, another resource, refuses it.
    let (status, _, _) = http(
        s.stack.port,
        "GET",
        "/v1/chats",
        &[("authorization", &format!("Bearer {access}"))],
        "",
    );
    assert_eq!(status, 401);
    // The code works once; its replay is refused and revokes what it issued.
    let (status, answer) = exchange(&s, &client, &code, verifier);
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    assert_eq!(
        mcp_status(&s, access),
        401,
        "the replayed code revoked its tokens"
    );

    // A second grant: refresh rotates, a spent refresh token revokes the family.
    let (client, tokens) = granted(
        &s,
        "workflows:write",
        json!({"allow": true, "projects": [s.flows], "write_folders": null}),
    );
    let first = tokens["refresh_token"].as_str().unwrap().to_owned();
    let (status, renewed) = refresh(&s, &client, &first, None);
    assert_eq!(status, 200, "{renewed}");
    let second_access = renewed["access_token"].as_str().unwrap().to_owned();
    assert_ne!(renewed["refresh_token"], tokens["refresh_token"]);
    assert!(write(&s, &second_access, "code/x.py", "w3").is_ok());
    let (status, answer) = refresh(&s, &client, &first, None);
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    assert_eq!(mcp_status(&s, &second_access), 401, "the family is revoked");
    let (status, _) = refresh(
        &s,
        &client,
        renewed["refresh_token"].as_str().unwrap(),
        None,
    );
    assert_eq!(status, 400, "the rotated token died with its family");

    // RFC 7009: revoking the refresh token ends the grant's access tokens too; an unknown
    // token, or another client's, is answered 200 and changes nothing.
    let (client, tokens) = granted(
        &s,
        "workflows:read",
        json!({"allow": true, "projects": [s.flows]}),
    );
    let access = tokens["access_token"].as_str().unwrap().to_owned();
    let other = public_client(&s.stack);
    for (token, by) in [
        (
            "awr_0000000000000000_".to_owned() + &"0".repeat(64),
            client.as_str(),
        ),
        (
            tokens["refresh_token"].as_str().unwrap().to_owned(),
            other.as_str(),
        ),
    ] {
        let (status, _) = post_form(
            &s.stack,
            "/oauth/revoke",
            &form(&[("token", &token), ("client_id", by)]),
            &[],
        );
        assert_eq!(status, 200);
        assert_eq!(mcp_status(&s, &access), 200, "nothing was revoked");
    }
    let (status, _) = post_form(
        &s.stack,
        "/oauth/revoke",
        &form(&[
            ("token", tokens["refresh_token"].as_str().unwrap()),
            ("token_type_hint", "refresh_token"),
            ("client_id", &client),
        ]),
        &[],
    );
    assert_eq!(status, 200);
    assert_eq!(
        mcp_status(&s, &access),
        401,
        "revoked with its refresh token"
    );
    let (status, _) = refresh(&s, &client, tokens["refresh_token"].as_str().unwrap(), None);
    assert_eq!(status, 400);

    // A third grant, revoked in Connected apps: its tokens stop at once.
    let (_, tokens) = granted(
        &s,
        "workflows:read",
        json!({"allow": true, "projects": [s.flows]}),
    );
    let access = tokens["access_token"].as_str().unwrap().to_owned();
    assert_eq!(mcp_status(&s, &access), 200);
    let (status, _, apps) = request(
        &s.stack,
        "GET",
        "/v1/console/oauth/apps",
        &[("cookie", &s.cookie)],
        Value::Null,
    );
    assert_eq!(status, 200, "{apps}");
    let listed = apps["apps"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "only the live grant: {apps}");
    assert_eq!(listed[0]["scopes"], json!(["workflows:read"]));
    assert_eq!(listed[0]["projects"][0]["name"], "flows");
    assert_eq!(listed[0]["write_folders"], json!([]));
    let grant = listed[0]["grant"].as_str().unwrap();
    let origin = origin(&s.stack);
    let (status, _, answer) = request(
        &s.stack,
        "DELETE",
        &format!("/v1/console/oauth/apps/{grant}"),
        &[
            ("cookie", &s.cookie),
            ("origin", &origin),
            ("x-csrf-token", &s.csrf),
        ],
        Value::Null,
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(mcp_status(&s, &access), 401);
    // Personal access tokens keep working beside all this.
    assert_eq!(mcp_status(&s, &pat), 200);
}

/// In a cluster, an authorization request made through agentd A is shown and decided on
/// agentd B's consent page, once, and its code is exchanged at A: the load balancer need not
/// keep a person's consent on the host that took the request. Kept in A's memory, B answered
/// 404 `not_found`.
#[test]
fn a_request_made_on_one_host_is_consented_to_on_another() {
    let (stack, _) = Stack::start_in_cluster_with_gateway_and("");
    let s = setup_on(stack);
    let (_agentd_b, port_b) = s.stack.start_agentd_host("host-b");
    let client = public_client(&s.stack);
    let verifier = "a-verifier-of-forty-three-or-more-characters-long";
    let id = start(&s, &client, "workflows:read", verifier);
    let path = format!("/v1/console/oauth/requests/{id}");
    let (status, _, view) = http(port_b, "GET", &path, &[("cookie", &s.cookie)], "");
    assert_eq!(status, 200, "{view}");
    let (status, answer) = consent_on(
        &s,
        port_b,
        &id,
        json!({"allow": true, "projects": [s.flows]}),
    );
    assert_eq!(status, 200, "{answer}");
    let code = param(answer["redirect"].as_str().unwrap(), "code").unwrap();
    // Decided once, whichever host is asked next.
    let (status, again) = consent(&s, &id, json!({"allow": false}));
    assert_eq!(
        (status, again["error"].as_str()),
        (409, Some("already_decided"))
    );
    let (status, tokens) = exchange(&s, &client, &code, verifier);
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["scope"], "workflows:read");
}

#[test]
fn read_only_consent_never_becomes_write() {
    let s = setup();
    let client = public_client(&s.stack);
    let verifier = "r".repeat(50);
    let id = start(&s, &client, "workflows:read", &verifier);
    // Writable folders cannot be given to a read-only request.
    let (status, answer) = consent(
        &s,
        &id,
        json!({"allow": true, "projects": [s.flows], "write_folders": ["workflows"]}),
    );
    assert_eq!(status, 400, "{answer}");
    let code = allow(&s, &id, json!({"allow": true, "projects": [s.flows]}));
    let (status, tokens) = exchange(&s, &client, &code, &verifier);
    assert_eq!(status, 200, "{tokens}");
    // Asking for write at the token endpoint: invalid_scope, nothing issued.
    let (status, answer) = refresh(
        &s,
        &client,
        tokens["refresh_token"].as_str().unwrap(),
        Some("workflows:read workflows:write"),
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_scope")),
        "{answer}"
    );
    // The write tool is refused with the step-up challenge.
    let access = tokens["access_token"].as_str().unwrap();
    let (status, _) = mcp_call(
        s.stack.port,
        access,
        "write_file",
        json!({"workflow_id": s.flows, "path": "workflows/z.yaml", "content": "x",
               "expected_revision": "missing", "request_id": "z"}),
    );
    assert_eq!(status, 403);
    assert!(
        !s.stack
            .state
            .documents()
            .join("flows/workflows/z.yaml")
            .exists()
    );
    // The refresh token still works for what was granted (the failed ask spent nothing).
    let (status, renewed) = refresh(&s, &client, tokens["refresh_token"].as_str().unwrap(), None);
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["scope"], "workflows:read");
}

#[test]
fn authorization_and_token_requests_are_refused_each_with_its_error() {
    let s = setup();
    let client = public_client(&s.stack);
    let resource = resource(&s.stack);
    let verifier = "w".repeat(43);
    let challenge = challenge_of(&verifier);
    let base = [
        ("response_type", "code"),
        ("client_id", client.as_str()),
        ("redirect_uri", REDIRECT),
        ("code_challenge", challenge.as_str()),
        ("code_challenge_method", "S256"),
        ("state", STATE),
        ("resource", resource.as_str()),
        ("scope", "workflows:read"),
    ];
    let with = |name: &'static str, value: Option<&str>| -> Vec<(&str, String)> {
        let mut pairs: Vec<(&str, String)> = base
            .iter()
            .filter(|(k, _)| *k != name)
            .map(|(k, v)| (*k, v.to_string()))
            .collect();
        if let Some(value) = value {
            pairs.push((name, value.to_owned()));
        }
        pairs
    };
    let run = |pairs: Vec<(&str, String)>| {
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        authorize(&s.stack, &pairs)
    };
    // A redirect URI that does not match, an unknown client, and metadata documents on a
    // loopback or a private address: an error page here, never a redirect. (What a metadata
    // document's address came to is never told: only that the document could not be used.)
    for (name, value, says) in [
        (
            "redirect_uri",
            "http://127.0.0.1:49151/other",
            "redirect_uri",
        ),
        (
            "redirect_uri",
            "https://evil.example/callback",
            "redirect_uri",
        ),
        ("client_id", "cli_0000000000000000", "not registered"),
        (
            "client_id",
            "https://127.0.0.1/client.json",
            "could not be used",
        ),
        (
            "client_id",
            "https://10.1.2.3/client.json",
            "could not be used",
        ),
        (
            "client_id",
            "https://169.254.169.254/latest/meta-data",
            "could not be used",
        ),
    ] {
        let (status, location, page) = run(with(name, Some(value)));
        assert_eq!(status, 400, "{name}={value}: {location} {page}");
        assert!(
            location.is_empty(),
            "{name}={value} redirected to {location}"
        );
        assert!(page.contains(says), "{name}={value}: {page}");
    }
    // The rest go back to the client with the error, state and iss.
    for (name, value, error) in [
        ("code_challenge", None, "invalid_request"),
        ("code_challenge_method", Some("plain"), "invalid_request"),
        ("state", None, "invalid_request"),
        ("resource", None, "invalid_request"),
        (
            "resource",
            Some("https://other.example/mcp"),
            "invalid_target",
        ),
        ("response_type", Some("token"), "unsupported_response_type"),
        ("scope", Some("devices:connect"), "invalid_scope"),
    ] {
        let (status, location, _) = run(with(name, value));
        assert_eq!(status, 303, "{name}={value:?}");
        assert!(location.starts_with(REDIRECT), "{location}");
        assert_eq!(
            param(&location, "error").as_deref(),
            Some(error),
            "{name}={value:?}: {location}"
        );
        assert_eq!(
            param(&location, "iss").as_deref(),
            Some(origin(&s.stack).as_str())
        );
        if name != "state" {
            assert_eq!(param(&location, "state").as_deref(), Some(STATE));
        }
    }
    // A wrong code_verifier spends the code: the right one afterwards is refused too.
    let id = start(&s, &client, "workflows:read", &verifier);
    let code = allow(&s, &id, json!({"allow": true, "projects": [s.flows]}));
    let (status, answer) = exchange(&s, &client, &code, &"x".repeat(43));
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant")),
        "{answer}"
    );
    let (status, _) = exchange(&s, &client, &code, &verifier);
    assert_eq!(status, 400);
    // Another client cannot redeem a code; a denied request redirects with access_denied.
    let other = public_client(&s.stack);
    let id = start(&s, &client, "workflows:read", &verifier);
    let code = allow(&s, &id, json!({"allow": true, "projects": [s.flows]}));
    let (status, answer) = exchange(&s, &other, &code, &verifier);
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    let id = start(&s, &client, "workflows:read", &verifier);
    let (status, answer) = consent(&s, &id, json!({"allow": false}));
    assert_eq!(status, 200);
    let redirect = answer["redirect"].as_str().unwrap();
    assert_eq!(param(redirect, "error").as_deref(), Some("access_denied"));
    assert!(param(redirect, "code").is_none());
    // A token request for another resource.
    let id = start(&s, &client, "workflows:read", &verifier);
    let code = allow(&s, &id, json!({"allow": true, "projects": [s.flows]}));
    let (status, answer) = post_form(
        &s.stack,
        "/oauth/token",
        &form(&[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", REDIRECT),
            ("code_verifier", &verifier),
            ("client_id", &client),
            ("resource", "https://other.example/mcp"),
        ]),
        &[],
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_target")),
        "{answer}"
    );
    // Tokens never travel in a query string: one there is ignored, so the request is 401.
    let (_, tokens) = granted(
        &s,
        "workflows:read",
        json!({"allow": true, "projects": [s.flows]}),
    );
    let access = tokens["access_token"].as_str().unwrap();
    let (status, _, _) = http(
        s.stack.port,
        "POST",
        &format!("/mcp?access_token={access}"),
        &[("content-type", "application/json")],
        "{}",
    );
    assert_eq!(status, 401);
}

#[test]
fn confidential_clients_authenticate_and_registration_is_checked_and_limited() {
    use base64::Engine;
    let s = setup();
    let (status, answer) = register(
        &s.stack,
        json!({"client_name": "Server App", "redirect_uris": ["https://app.example/cb"]}),
    );
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["token_endpoint_auth_method"], "client_secret_basic");
    let client = answer["client_id"].as_str().unwrap().to_owned();
    let secret = answer["client_secret"].as_str().unwrap().to_owned();
    let basic = |secret: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{client}:{secret}"))
        )
    };
    let body = form(&[("grant_type", "refresh_token"), ("refresh_token", "awr_x")]);
    let wrong = basic("not-the-secret");
    let (status, answer) = post_form(
        &s.stack,
        "/oauth/token",
        &body,
        &[("authorization", &wrong)],
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("invalid_client"))
    );
    let right = basic(&secret);
    let (status, answer) = post_form(
        &s.stack,
        "/oauth/token",
        &body,
        &[("authorization", &right)],
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant")),
        "authenticated, then the refresh token is refused: {answer}"
    );
    // client_secret_post: the same client, its secret in the form.
    let (status, answer) = post_form(
        &s.stack,
        "/oauth/token",
        &format!(
            "{body}&{}",
            form(&[("client_id", &client), ("client_secret", &secret)])
        ),
        &[],
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant")),
        "{answer}"
    );
    let (status, answer) = post_form(
        &s.stack,
        "/oauth/token",
        &format!(
            "{body}&{}",
            form(&[("client_id", &client), ("client_secret", "nope")])
        ),
        &[],
    );
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("invalid_client"))
    );
    // Without its secret a confidential client is refused.
    let (status, _) = post_form(
        &s.stack,
        "/oauth/token",
        &format!("{body}&client_id={client}"),
        &[],
    );
    assert_eq!(status, 401);
    // Registration: bad redirect URIs are refused with their error.
    for uris in [
        json!(["http://app.example/cb"]),
        json!(["myapp://cb"]),
        json!([]),
    ] {
        let (status, answer) = register(&s.stack, json!({"redirect_uris": uris}));
        assert_eq!(status, 400, "{uris}: {answer}");
        assert!(
            matches!(
                answer["error"].as_str(),
                Some("invalid_redirect_uri" | "invalid_client_metadata")
            ),
            "{answer}"
        );
    }
    // At most 10 registrations per address in 15 minutes (3 made above, the refused ones
    // are not counted).
    let mut last = 0;
    for _ in 0..12 {
        last = register(
            &s.stack,
            json!({"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"}),
        )
        .0;
        if last == 429 {
            break;
        }
    }
    assert_eq!(last, 429);
}

/// `tests/console/consent.mjs` running in the browser for one authorization: its stdin (for
/// `revoke`) and stdout lines.
pub(super) struct Consent {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Consent {
    /// Start the person's consent with `config` (see consent.mjs).
    pub(super) fn start(config: Value) -> Consent {
        use std::process::{Command, Stdio};
        super::console::require_browser();
        let mut child = Command::new("node")
            .arg("consent.mjs")
            .current_dir(super::console::console_dir())
            .env("AGENTWORKS_CONSENT", config.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node runs (apt-get install -y nodejs)");
        let stdin = child.stdin.take().unwrap();
        let lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        Consent {
            child,
            stdin,
            lines,
        }
    }

    /// The next line consent.mjs prints; panics (with its exit status) if it ended.
    pub(super) fn line(&mut self) -> String {
        match self.lines.next() {
            Some(line) => line.unwrap(),
            None => panic!("consent.mjs ended: {:?}", self.child.wait()),
        }
    }

    /// The URL the browser was sent back to the client with.
    pub(super) fn redirect(&mut self) -> String {
        let line = self.line();
        line.strip_prefix("REDIRECT ")
            .unwrap_or_else(|| panic!("consent.mjs: {line}"))
            .to_owned()
    }

    pub(super) fn say(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{line}").unwrap();
    }

    /// Wait for `ok` and a successful exit.
    pub(super) fn finish(mut self) {
        assert_eq!(self.line(), "ok");
        assert!(self.child.wait().unwrap().success());
    }
}

#[test]
fn a_person_consents_in_a_real_browser_and_revokes_in_connected_apps() {
    let s = setup();
    // A project alice may only run: listed, but not checked by default for a write request.
    s.stack.state.project("ops", &[]);
    s.stack.admin("users/add", json!({"name": "olga"}));
    s.stack.admin(
        "projects/add",
        json!({"name": "ops", "kind": "workflow", "owner": "olga"}),
    );
    s.stack.admin(
        "members/add",
        json!({"project": "ops", "user": "alice", "role": "runner"}),
    );
    let client = public_client(&s.stack);
    let verifier = "b".repeat(60);
    let challenge = challenge_of(&verifier);
    let resource = resource(&s.stack);
    let url = format!(
        "{}/oauth/authorize?{}",
        origin(&s.stack),
        form(&[
            ("response_type", "code"),
            ("client_id", &client),
            ("redirect_uri", REDIRECT),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("state", STATE),
            ("resource", &resource),
            ("scope", "workflows:read workflows:write"),
        ])
    );
    let shots = tempfile::tempdir().unwrap();
    let shot = shots.path().join("consent.png");
    let apps_shot = shots.path().join("apps.png");
    let mut consent = Consent::start(json!({
        "url": url,
        "username": "alice",
        "password": PASSWORD,
        "redirect": REDIRECT,
        "projects": ["flows"],
        "writable": ["workflows/a"],
        "expect": {"client_name": "Test <b>App</b>", "client_label": "unverified", "scopes": ["workflows:write"], "writes": true,
                   "checked": ["app", "flows"]},
        "shot": shot,
        "revoke": "Test <b>App</b>",
        "apps_shot": apps_shot,
    }));
    let redirect = consent.redirect();
    assert_eq!(param(&redirect, "state").as_deref(), Some(STATE));
    assert_eq!(
        param(&redirect, "iss").as_deref(),
        Some(origin(&s.stack).as_str())
    );
    let code = param(&redirect, "code").expect("a code");
    let (status, tokens) = exchange(&s, &client, &code, &verifier);
    assert_eq!(status, 200, "{tokens}");
    let access = tokens["access_token"].as_str().unwrap().to_owned();
    // What the person chose: one project, one folder.
    assert!(write(&s, &access, "workflows/a/b.yaml", "b1").is_ok());
    let refused = write(&s, &access, "code/outside.py", "b2").unwrap_err();
    assert_eq!(refused["code"], "forbidden", "{refused}");
    consent.say("revoke");
    assert_eq!(consent.line(), "REVOKED");
    consent.finish();
    assert_eq!(mcp_status(&s, &access), 401, "revoked in the console");
    super::console::assert_not_blank(&shot);
    super::console::assert_not_blank(&apps_shot);
}

#[test]
fn the_python_sdk_signs_in_with_oauth_writes_within_its_folder_refreshes_and_is_revoked() {
    use std::io::{BufRead, Write};
    use std::process::{Command, Stdio};
    let s = setup();
    let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client");
    let mut client = Command::new(super::harness::mcp_python())
        .arg(scripts.join("oauth_sdk_client.py"))
        .arg(s.stack.mcp_url())
        .args(["--callback", "stdin", "--pause", "--client-name", "SDK App"])
        .args(["--write", "inside", &s.flows, "workflows/a/sdk.yaml"])
        .args(["--write", "outside", &s.flows, "code/sdk.py"])
        .current_dir(&scripts)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut to_client = client.stdin.take().unwrap();
    let mut steps: Vec<Value> = Vec::new();
    let mut consent: Option<Consent> = None;
    let mut authorizations = 0;
    for line in std::io::BufReader::new(client.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        println!("oauth_sdk_client.py: {line}");
        if let Some(url) = line.strip_prefix("AUTHORIZE ") {
            authorizations += 1;
            assert_eq!(authorizations, 1, "the SDK had to authorize again");
            let redirect_uri = param(url, "redirect_uri").expect("a redirect_uri");
            assert_eq!(
                param(url, "resource").as_deref(),
                Some(s.stack.mcp_url().as_str())
            );
            let mut person = Consent::start(json!({
                "url": url,
                "username": "alice",
                "password": PASSWORD,
                "redirect": redirect_uri,
                "projects": ["flows"],
                "writable": ["workflows/a"],
                "expect": {"client_name": "SDK App", "client_label": "unverified", "writes": true},
                "revoke": "SDK App",
            }));
            let back = person.redirect();
            writeln!(to_client, "{back}").unwrap();
            consent = Some(person);
        } else if line == "PAUSE" {
            let mut person = consent.take().expect("consent ran");
            person.say("revoke");
            assert_eq!(person.line(), "REVOKED");
            person.finish();
            writeln!(to_client, "go on").unwrap();
        } else if let Ok(step) = serde_json::from_str::<Value>(&line) {
            steps.push(step);
        }
    }
    assert!(client.wait().unwrap().success(), "{steps:?}");
    let step = |name: &str, label: Option<&str>| {
        steps
            .iter()
            .find(|s| s["step"] == name && label.is_none_or(|l| s["label"] == l))
            .unwrap_or_else(|| panic!("no {name} step: {steps:?}"))
            .clone()
    };
    let registered = step("registered", None);
    assert_eq!(
        registered["token_endpoint_auth_method"], "none",
        "{registered}"
    );
    let inside = step("write_file", Some("inside"));
    assert_eq!(inside["ok"], true, "{inside}");
    let outside = step("write_file", Some("outside"));
    assert_eq!(outside["ok"], false, "{outside}");
    assert!(
        outside.to_string().contains("forbidden"),
        "the write outside the folder is forbidden: {outside}"
    );
    let documents = s.stack.state.documents();
    assert!(documents.join("flows/workflows/a/sdk.yaml").exists());
    assert!(!documents.join("flows/code/sdk.py").exists());
    let refresh = step("refresh", None);
    assert_eq!(refresh["grant_status"], 200, "{refresh}");
    assert_eq!(refresh["refresh_token_rotated"], true, "{refresh}");
    let revoked = step("after-pause", None);
    assert_eq!(revoked["status"], 401, "revoked in the console: {revoked}");
    assert_eq!(step("done", None)["ok"], true);
}
