//! Attacks on agentd's accounts, sessions and OAuth server from outside (issue 42, items 3, 4,
//! 11, 12, 13 and 14's consent screen), each performed over real HTTP against the real agentd,
//! from real source addresses where the attack depends on them (the whole of 127.0.0.0/8 is
//! loopback: an attacker's client binds 127.0.0.2, a person's 127.0.0.3), and each checked to
//! fail for the attacker and to leave the person alone:
//!
//! - a disabled account's console session and OAuth grant coming back when it is enabled
//!   again (item 3);
//! - a member guessing another person's chat id to learn who owns it (item 4);
//! - a password guesser locking a person out of the console from another address (item 12);
//! - a login CSRF, a session cookie planted beside the person's, and the cookie's name on an
//!   https console (item 13);
//! - one address flooding `/oauth/authorize`, `/v1/device/code` and client metadata fetches,
//!   and the fetched document's answer shown on the error page (item 11); the consent screen
//!   naming a client (item 14).

use serde_json::{Value, json};

use super::agent::{code_project, create_chat, user};
use super::console_sessions::{PASSWORD, alice, origin, request};
use super::harness::{Stack, http, http_from};
use super::oauth::{REDIRECT, challenge_of, consent_view, granted, mcp_status, refresh, setup};

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
    let alice_id = super::attack_authority::user_id(&stack, "alice");
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

/// The attacker's client address, and a person's, both loopback.
const ATTACKER: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);
const PERSON: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 3);

/// A password sign-in from `source`, from the console's own page: (status, answer).
fn sign_in_from(
    stack: &Stack,
    source: std::net::Ipv4Addr,
    name: &str,
    password: &str,
) -> (u16, hyper::HeaderMap, Value) {
    let origin = origin(stack);
    let (status, headers, text) = http_from(
        source,
        stack.port,
        "POST",
        "/v1/console/sign-in",
        &[("content-type", "application/json"), ("origin", &origin)],
        &json!({"username": name, "password": password}).to_string(),
    );
    let answer = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, answer)
}

/// Item 12: an attacker who knows the name `alice` guesses passwords from one address. Past a
/// few failures that address waits (and keeps waiting: refused attempts are not counted, and
/// the right password does not help there), while alice signing in from another address gets
/// in at once. Before the fix five wrong passwords locked `alice` for 15 minutes for everyone.
#[test]
fn a_password_guesser_is_slowed_down_at_their_address_and_the_person_elsewhere_signs_in() {
    let stack = Stack::start();
    alice(&stack);
    for attempt in 0..5 {
        let (status, _, answer) = sign_in_from(&stack, ATTACKER, "alice", "wrong guess");
        assert_eq!(status, 401, "guess {attempt}: {answer}");
    }
    // alice, elsewhere: signed in at once.
    let (status, _, answer) = sign_in_from(&stack, PERSON, "alice", PASSWORD);
    assert_eq!(
        status, 200,
        "the person was locked out by the attacker: {answer}"
    );
    assert_eq!(answer["user"]["name"], "alice");
    for guess in ["wrong again", PASSWORD] {
        let (status, headers, answer) = sign_in_from(&stack, ATTACKER, "alice", guess);
        assert_eq!(status, 429, "{answer}");
        assert_eq!(answer["error"]["code"], "too_many_attempts");
        let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=30).contains(&retry), "the first wait is 30 s: {retry}");
    }
    // The attacker's other names at the same address are slowed down by the address's own
    // limit in the end, and alice elsewhere still is not.
    for i in 0..15 {
        let (status, _, _) = sign_in_from(&stack, ATTACKER, &format!("guess{i}"), "x-wrong-x");
        assert_eq!(status, 401, "name {i}");
    }
    let (status, _, _) = sign_in_from(&stack, ATTACKER, "someone", "x-wrong-x");
    assert_eq!(status, 429, "twenty failures from one address");
    let (status, _, answer) = sign_in_from(&stack, PERSON, "alice", PASSWORD);
    assert_eq!(status, 200, "{answer}");
}

/// A sign-in POST with `headers` (besides the JSON content type): (status, Set-Cookie pair
/// or "", answer).
fn sign_in_with(
    stack: &Stack,
    headers: &[(&str, &str)],
    name: &str,
    password: &str,
) -> (u16, String, Value) {
    let (status, headers, answer) = request(
        stack,
        "POST",
        "/v1/console/sign-in",
        headers,
        json!({"username": name, "password": password}),
    );
    let cookie = headers
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
        .unwrap_or_default();
    (status, cookie, answer)
}

/// Item 13, on a console served over plain loopback http (cookie `aw_session`): a login CSRF
/// (another site's form posting the attacker's password, so the victim's browser works in the
/// attacker's account) is refused when the request says it comes from the console in neither
/// `Origin` nor `Sec-Fetch-Site`; a session cookie planted beside the person's own (a cookie
/// for a narrower path is sent with it) makes the request refused, not served as the planter.
/// Before the fix the sign-in answered 200 with a cookie, and the request with two cookies was
/// served in the first one's session.
#[test]
fn a_login_csrf_and_a_planted_second_session_cookie_are_refused() {
    let stack = Stack::start();
    alice(&stack);
    let added = stack.ctl(&["user", "add", "mallory"]);
    assert!(added.status.success(), "{added:?}");
    let set = super::console_sessions::passwd(&stack, "mallory", PASSWORD);
    assert!(set.status.success(), "{set:?}");

    for (headers, why) in [
        (vec![], "neither Origin nor Sec-Fetch-Site"),
        (vec![("sec-fetch-site", "cross-site")], "a cross-site form"),
        (
            vec![("sec-fetch-site", "same-site")],
            "a sibling host's form",
        ),
        (vec![("origin", "http://evil.example")], "another origin"),
    ] {
        let (status, cookie, answer) = sign_in_with(&stack, &headers, "mallory", PASSWORD);
        assert_eq!(status, 403, "{why}: {answer}");
        assert_eq!(answer["error"]["code"], "csrf_refused", "{why}");
        assert!(cookie.is_empty(), "{why}: a session cookie was set");
    }
    // The console's own pages: its Origin, or (a browser that sent none) same-origin.
    let own = origin(&stack);
    let (status, mallory_cookie, _) =
        sign_in_with(&stack, &[("origin", &own)], "mallory", PASSWORD);
    assert_eq!(status, 200);
    let (status, alice_cookie, _) = sign_in_with(
        &stack,
        &[("sec-fetch-site", "same-origin")],
        "alice",
        PASSWORD,
    );
    assert_eq!(status, 200);
    assert!(alice_cookie.starts_with("aw_session="), "{alice_cookie}");

    // mallory's cookie planted beside alice's: refused, whichever comes first.
    let who = |cookies: &str| {
        let (status, _, answer) = request(
            &stack,
            "GET",
            "/v1/console/session",
            &[("cookie", cookies)],
            Value::Null,
        );
        (status, answer)
    };
    for cookies in [
        format!("{mallory_cookie}; {alice_cookie}"),
        format!("{alice_cookie}; theme=dark; {mallory_cookie}"),
    ] {
        let (status, answer) = who(&cookies);
        assert_eq!(status, 400, "served with two session cookies: {answer}");
        assert_eq!(answer["error"]["code"], "duplicate_session_cookie");
        let (status, _, chats) = request(
            &stack,
            "GET",
            "/v1/chats",
            &[("cookie", &cookies)],
            Value::Null,
        );
        assert_eq!(status, 400, "{chats}");
    }
    let (status, answer) = who(&alice_cookie);
    assert_eq!(
        (status, answer["user"]["name"].as_str()),
        (200, Some("alice"))
    );
}

/// Item 13, on a console served over https (behind a TLS proxy: `public_url` is https): the
/// session cookie is `__Host-aw_session`, `Secure`, `Path=/` and without `Domain`, so no
/// sibling host or path can plant one; an unprefixed `aw_session` cookie (what a sibling could
/// plant) is no session at all. Before the fix the cookie was `aw_session` on https too.
#[test]
fn over_https_the_session_cookie_is_host_prefixed_and_an_unprefixed_one_is_no_session() {
    let port = super::harness::free_port();
    let console = "https://console.example";
    let stack = Stack::start_on(
        port,
        &format!(
            "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\npublic_url = \"{console}\"\n"
        ),
    );
    alice(&stack);
    let (status, headers, answer) = request(
        &stack,
        "POST",
        "/v1/console/sign-in",
        &[("origin", console)],
        json!({"username": "alice", "password": PASSWORD}),
    );
    assert_eq!(status, 200, "{answer}");
    let set_cookie = headers["set-cookie"].to_str().unwrap().to_owned();
    let (pair, attributes) = set_cookie.split_once("; ").unwrap();
    let (name, secret) = pair.split_once('=').unwrap();
    assert_eq!(name, "__Host-aw_session", "{set_cookie}");
    let attributes: Vec<&str> = attributes.split("; ").collect();
    for wanted in ["Path=/", "Secure", "HttpOnly", "SameSite=Lax"] {
        assert!(attributes.contains(&wanted), "{wanted}: {set_cookie}");
    }
    assert!(
        !attributes
            .iter()
            .any(|a| a.to_ascii_lowercase().starts_with("domain")),
        "{set_cookie}"
    );
    let who = |cookie: String| {
        request(
            &stack,
            "GET",
            "/v1/console/session",
            &[("cookie", &cookie)],
            Value::Null,
        )
        .0
    };
    assert_eq!(who(format!("__Host-aw_session={secret}")), 200);
    assert_eq!(
        who(format!("aw_session={secret}")),
        401,
        "an unprefixed cookie was taken as the session"
    );
}

/// `GET /oauth/authorize` for `client` from `source`: where it sends the browser (a 303's
/// Location), or the status of a page answered instead.
fn authorize_from(stack: &Stack, source: std::net::Ipv4Addr, client: &str) -> Result<String, u16> {
    let resource = stack.mcp_url();
    let challenge = challenge_of(&"c".repeat(43));
    let query = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("response_type", "code"),
            ("client_id", client),
            ("redirect_uri", REDIRECT),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("state", "st-flood"),
            ("resource", &resource),
        ])
        .finish();
    let (status, headers, _) = http_from(
        source,
        stack.port,
        "GET",
        &format!("/oauth/authorize?{query}"),
        &[],
        "",
    );
    match headers.get("location") {
        Some(location) if status == 303 => Ok(location.to_str().unwrap().to_owned()),
        _ => Err(status),
    }
}

/// Whether an authorization request was kept for consent (not refused back to the client).
fn kept(answer: &Result<String, u16>) -> bool {
    matches!(answer, Ok(location) if location.starts_with("/oauth/consent?request="))
}

/// A client registered with `/register` under `name` (a public one, redirecting to
/// [`REDIRECT`]).
fn registered_client(stack: &Stack, name: &str) -> String {
    let (status, _, answer) = request(
        stack,
        "POST",
        "/register",
        &[],
        json!({"client_name": name, "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"}),
    );
    assert_eq!(status, 201, "{answer}");
    answer["client_id"].as_str().unwrap().to_owned()
}

/// Item 11 (and item 14's consent screen): one address floods `/oauth/authorize` with one
/// client until it is refused. It fills only its own share: a person at another address with
/// another app still gets to the consent page. More addresses flooding the same app fill that
/// app's share, and still not another app's. Before the fix the flood ran until the one global
/// cap (1,000 waiting) and then locked every client out. The consent page says the registered
/// app's name is unverified (anyone can register as "Claude").
#[test]
fn one_address_flooding_authorize_fills_only_its_own_share() {
    use agentworks_agent::oauth::server::{
        MAX_PENDING, MAX_PENDING_PER_ADDRESS, MAX_PENDING_PER_CLIENT,
    };
    let s = setup();
    let flood = registered_client(&s.stack, "Flood");
    let app = registered_client(&s.stack, "Claude");
    let mut sent = 0;
    while kept(&authorize_from(&s.stack, ATTACKER, &flood)) {
        sent += 1;
        assert!(sent <= MAX_PENDING, "never refused");
    }
    let person = authorize_from(&s.stack, PERSON, &app);
    assert!(
        kept(&person),
        "after {sent} requests from one address, a person elsewhere is refused: {person:?}"
    );
    assert_eq!(sent, MAX_PENDING_PER_ADDRESS, "one address's share");
    let refused = authorize_from(&s.stack, ATTACKER, &app).unwrap();
    assert!(
        refused.contains("error=temporarily_unavailable") && refused.contains("this+address"),
        "{refused}"
    );

    // The consent page for the person's request: the name is the app's own claim.
    let id = person.unwrap().split_once("request=").unwrap().1.to_owned();
    let view = consent_view(&s, &id);
    assert_eq!(view["client_name"], "Claude");
    assert_eq!(view["client_name_verified"], false, "{view}");
    assert_eq!(view["client_registered"], true, "{view}");
    assert_eq!(view["client_host"], Value::Null, "{view}");

    // More addresses flooding the same app: refused once the app has its share waiting.
    let mut from_many = sent;
    'flood: for last in 10..=30u8 {
        let source = std::net::Ipv4Addr::new(127, 0, 0, last);
        for _ in 0..MAX_PENDING_PER_ADDRESS {
            if !kept(&authorize_from(&s.stack, source, &flood)) {
                break 'flood;
            }
            from_many += 1;
        }
    }
    assert_eq!(from_many, MAX_PENDING_PER_CLIENT, "one app's share");
    let refused = authorize_from(&s.stack, PERSON, &flood).unwrap();
    assert!(refused.contains("this+app"), "{refused}");
    assert!(kept(&authorize_from(&s.stack, PERSON, &app)));
}

/// Item 11, device logins: one address asking `/v1/device/code` without end fills only its
/// own share of waiting logins; a laptop at another address still gets a code. Before the fix
/// the one bound was 10,000 waiting logins for everyone.
#[test]
fn one_address_flooding_device_logins_fills_only_its_own_share() {
    use agentworks_agent::identity::device_logins::{
        MAX_WAITING_DEVICE_LOGINS, MAX_WAITING_DEVICE_LOGINS_PER_ADDRESS,
    };
    let stack = Stack::start();
    let ask = |source| {
        let (status, _, body) = http_from(
            source,
            stack.port,
            "POST",
            "/v1/device/code",
            &[("content-type", "application/x-www-form-urlencoded")],
            "client_id=agentworks&scope=devices%3Aconnect",
        );
        (status, body)
    };
    let mut started = 0;
    loop {
        let (status, body) = ask(ATTACKER);
        if status != 200 {
            assert_eq!(status, 429, "{body}");
            break;
        }
        started += 1;
        assert!(started <= MAX_WAITING_DEVICE_LOGINS, "never refused");
    }
    let (status, body) = ask(PERSON);
    assert_eq!(
        status, 200,
        "after {started} logins from one address, a laptop elsewhere is refused: {body}"
    );
    assert_eq!(started, MAX_WAITING_DEVICE_LOGINS_PER_ADDRESS);
}

/// Item 11, client metadata documents: an anonymous client makes agentd fetch addresses of
/// its choosing. The error page says only that the document could not be used, never what
/// the address answered (a status, a body, an error); and one address gets a bounded number
/// of fetches in the window, while a person elsewhere is still served. Item 14: the consent
/// page names a metadata document's client by its client id's host. Before the fix the page
/// said "fetching the client metadata document answered 404 Not Found" and fetches were
/// unbounded.
#[test]
fn client_metadata_fetches_are_bounded_per_address_and_their_answers_never_shown() {
    use super::oauth_cimd::{agentd_with, internal_ca, requested, serve_documents};
    use super::outbound::Netns;
    use agentworks_agent::oauth::server::MAX_METADATA_FETCHES_PER_ADDRESS;

    let netns = Netns::create();
    let dir = tempfile::tempdir().unwrap();
    internal_ca(dir.path(), netns.inside);
    let origin = format!("https://{}", netns.inside);
    let client = format!("{origin}/client.json");
    let document =
        json!({"client_id": client, "client_name": "Doc App", "redirect_uris": [REDIRECT]});
    let log = dir.path().join("requests.log");
    let _server = serve_documents(
        &netns,
        dir.path(),
        json!({
            "/client.json": {"status": 200, "headers": {"Content-Type": "application/json"},
                             "body": document.to_string()},
            "/secret.json": {"status": 404, "body": "internal-banner-7f3 at db.corp"},
            "/junk.json": {"status": 200, "body": "db_password=hunter2"},
        }),
        &log,
    );
    let s = super::oauth::setup_on(agentd_with(&format!(
        "outbound_root_certificates = [{:?}]",
        dir.path().join("ca.pem").display().to_string()
    )));
    for (path, answered) in [
        ("/secret.json", ["404", "Not Found", "internal-banner"]),
        ("/junk.json", ["hunter2", "JSON", "expected"]),
    ] {
        let (status, _, page) = http_from(
            ATTACKER,
            s.stack.port,
            "GET",
            &format!(
                "/oauth/authorize?client_id={}&redirect_uri={}&response_type=code",
                percent(&format!("{origin}{path}")),
                percent(REDIRECT)
            ),
            &[],
            "",
        );
        assert_eq!(status, 400, "{page}");
        assert!(page.contains("could not be used"), "{page}");
        for told in answered {
            assert!(
                !page.contains(told),
                "the page tells what {path} answered ({told}): {page}"
            );
        }
    }
    // Every fetch counts, whatever the request came to (here a redirect URI the document
    // does not list: refused after the fetch, nothing kept): the address's share runs out,
    // and a refused request fetches nothing.
    let fetch = || {
        http_from(
            ATTACKER,
            s.stack.port,
            "GET",
            &format!(
                "/oauth/authorize?client_id={}&redirect_uri={}&response_type=code",
                percent(&client),
                percent("https://elsewhere.example/cb")
            ),
            &[],
            "",
        )
        .0
    };
    let mut fetched = requested(&log).len();
    assert_eq!(fetched, 2);
    while fetch() == 400 {
        fetched += 1;
        assert!(
            fetched <= MAX_METADATA_FETCHES_PER_ADDRESS + 1,
            "never refused"
        );
    }
    assert_eq!(fetched, MAX_METADATA_FETCHES_PER_ADDRESS);
    assert_eq!(fetch(), 429);
    assert_eq!(authorize_from(&s.stack, ATTACKER, &client), Err(429));
    assert_eq!(requested(&log).len(), fetched, "a refused request fetched");
    // A person elsewhere: fetched, and the consent page names the document's host.
    let person = authorize_from(&s.stack, PERSON, &client);
    assert!(kept(&person), "{person:?}");
    let id = person.unwrap().split_once("request=").unwrap().1.to_owned();
    let view = consent_view(&s, &id);
    assert_eq!(view["client_name"], "Doc App");
    assert_eq!(view["client_registered"], false, "{view}");
    assert_eq!(view["client_host"], netns.inside.to_string(), "{view}");
    assert_eq!(view["client_name_verified"], false, "{view}");
}

/// A query value, percent-encoded.
fn percent(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}
