//! The identity store's behaviour, written once and run on both back ends: the unit tests run
//! it on SQLite, and the integration suite (`tests/suite/identity_store.rs`) on a real
//! PostgreSQL server. Each function takes `open`, which opens (again) one fresh database: two
//! handles from it are two agentd hosts sharing it.
//!
//! Panics on a failed expectation, as a test does.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Barrier;

use agentworks_core::guard::Guard;

use super::accounts::{CodeKind, SessionPolicy};
use super::attempt_limits::AttemptLimit;
use super::authority::{FileGuard, Role, Scope};
use super::authorization_requests::{Decision, PendingLimits, PendingRefusal};
use super::device_logins::{DEVICE_LOGIN_TTL_MS, DecideError, DevicePoll, WaitingRefusal};
use super::oauth::NewGrant;
use super::store::{IdentityError, IdentityStore, ProjectKind, TokenRefusal, TokenRequest, now_ms};
use crate::oauth::pkce;

fn policy() -> Guard {
    Guard {
        write_paths: vec!["workflows".into()],
        ..Guard::default()
    }
}

/// `work` on every host at the same moment (they wait for each other at a barrier first): the
/// answers, in the hosts' order.
fn at_once<T: Send>(hosts: &[IdentityStore], work: impl Fn(&IdentityStore) -> T + Sync) -> Vec<T> {
    let barrier = Barrier::new(hosts.len());
    std::thread::scope(|scope| {
        let runs: Vec<_> = hosts
            .iter()
            .map(|host| {
                let (barrier, work) = (&barrier, &work);
                scope.spawn(move || {
                    barrier.wait();
                    work(host)
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    })
}

fn token_for(store: &IdentityStore, user: &str, scopes: Vec<Scope>) -> String {
    store
        .create_token(&TokenRequest {
            user: user.into(),
            label: "t".into(),
            scopes,
            ..Default::default()
        })
        .unwrap()
        .1
}

/// Users, projects and members: what is added is found, a taken name is `Exists`, roles change
/// and go, and every listing is ordered by name.
pub fn users_projects_and_members(open: &dyn Fn() -> IdentityStore) {
    let s = open();
    let bob = s.add_user("bob").unwrap();
    let alice = s.add_user("alice").unwrap();
    assert!(matches!(
        s.add_user("alice"),
        Err(IdentityError::Exists { .. })
    ));
    assert_eq!(s.user_by_name("alice").unwrap(), Some(alice.clone()));
    assert_eq!(s.user_by_id(&bob.id).unwrap(), Some(bob.clone()));
    assert_eq!(s.user_by_name("carol").unwrap(), None);
    let names: Vec<String> = s
        .list_users()
        .unwrap()
        .into_iter()
        .map(|u| u.name)
        .collect();
    assert_eq!(names, ["alice", "bob"]);
    assert!(s.set_user_disabled("bob", true).unwrap().disabled);
    assert!(s.user_by_id(&bob.id).unwrap().unwrap().disabled);

    let demo = s
        .add_project("demo", ProjectKind::Workflow, "demo", &policy(), "alice")
        .unwrap();
    assert!(matches!(
        s.add_project("demo", ProjectKind::Workflow, "other", &policy(), "alice"),
        Err(IdentityError::Exists { .. })
    ));
    // Another name on a folder a project already has.
    assert!(matches!(
        s.add_project("again", ProjectKind::Workflow, "demo", &policy(), "alice"),
        Err(IdentityError::Exists { .. })
    ));
    assert_eq!(s.find_project("demo").unwrap(), Some(demo.clone()));
    assert_eq!(s.find_project(&demo.id).unwrap(), Some(demo.clone()));
    assert_eq!(s.role_of(&demo.id, &alice.id).unwrap(), Some(Role::Owner));
    assert_eq!(s.role_of(&demo.id, &bob.id).unwrap(), None);
    assert_eq!(s.capabilities(&bob.id, None).unwrap(), (false, false));

    s.set_member("demo", "bob", Role::Viewer).unwrap();
    assert_eq!(s.capabilities(&bob.id, None).unwrap(), (true, false));
    s.set_member("demo", "bob", Role::Editor).unwrap();
    assert_eq!(s.capabilities(&bob.id, None).unwrap(), (true, true));
    assert_eq!(
        s.capabilities(&bob.id, Some(&["prj_other".to_owned()]))
            .unwrap(),
        (false, false)
    );
    assert_eq!(
        s.capabilities(&bob.id, Some(std::slice::from_ref(&demo.id)))
            .unwrap(),
        (true, true)
    );
    let members: Vec<(String, Role)> = s
        .list_members("demo")
        .unwrap()
        .into_iter()
        .map(|m| (m.user, m.role))
        .collect();
    assert_eq!(
        members,
        [
            ("alice".to_owned(), Role::Owner),
            ("bob".to_owned(), Role::Editor)
        ]
    );
    assert_eq!(
        s.projects_of(&bob.id).unwrap(),
        [(demo.clone(), Role::Editor)]
    );
    s.remove_member("demo", "bob").unwrap();
    assert!(matches!(
        s.remove_member("demo", "bob"),
        Err(IdentityError::NotFound { .. })
    ));
    assert!(s.projects_of(&bob.id).unwrap().is_empty());

    // A second host sees the same rows at once.
    let other = open();
    assert_eq!(other.find_project("demo").unwrap(), Some(demo));
    assert!(other.user_by_name("bob").unwrap().unwrap().disabled);
}

/// Tokens: checked against live rows, so a revocation or a disabled user made through one host
/// refuses the token on the other at once; a wrong secret is invalid; listings filter by user.
pub fn tokens_are_checked_against_live_rows(open: &dyn Fn() -> IdentityStore) {
    let a = open();
    let b = open();
    a.add_user("alice").unwrap();
    a.add_user("bob").unwrap();
    let plain = token_for(&a, "alice", vec![Scope::WorkflowsRead]);
    let (info, user) = b.authenticate(&plain).unwrap().unwrap();
    assert_eq!(
        (user.name.as_str(), info.scopes.as_slice()),
        ("alice", &[Scope::WorkflowsRead][..])
    );
    let mut wrong = plain.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == '0' { '1' } else { '0' });
    assert!(matches!(
        b.authenticate(&wrong).unwrap(),
        Err(TokenRefusal::Invalid)
    ));
    token_for(&a, "bob", vec![Scope::WorkflowsWrite]);
    assert_eq!(b.list_tokens(None).unwrap().len(), 2);
    assert_eq!(b.list_tokens(Some("bob")).unwrap().len(), 1);

    b.revoke_token(&info.id).unwrap();
    assert!(matches!(
        a.authenticate(&plain).unwrap(),
        Err(TokenRefusal::Revoked)
    ));
    assert!(
        a.token_by_id(&info.id)
            .unwrap()
            .unwrap()
            .revoked_at_ms
            .is_some()
    );

    let bobs = token_for(&a, "bob", vec![Scope::WorkflowsRead]);
    a.set_user_disabled("bob", true).unwrap();
    assert!(matches!(
        b.authenticate(&bobs).unwrap(),
        Err(TokenRefusal::Disabled)
    ));
    assert!(matches!(
        a.create_token(&TokenRequest {
            user: "alice".into(),
            scopes: vec![Scope::WorkflowsRead],
            expires_at_ms: Some(now_ms() - 1),
            ..Default::default()
        }),
        Err(IdentityError::Invalid(_))
    ));
}

fn new_grant(user_id: &str, project_id: &str, verifier: &str) -> NewGrant {
    NewGrant {
        user_id: user_id.into(),
        client_id: "cli_x".into(),
        client_name: "X".into(),
        redirect_uri: "http://127.0.0.1:1/cb".into(),
        scopes: vec![Scope::WorkflowsWrite],
        projects: vec![project_id.into()],
        file_guard: FileGuard {
            write_folders: Some(vec!["workflows/a".into()]),
            read_only_folders: Vec::new(),
        },
        resource: "http://h/mcp".into(),
        code_challenge: pkce::challenge_of(verifier),
    }
}

const VERIFIER: &str = "0123456789012345678901234567890123456789abc";
const REDIRECT: &str = "http://127.0.0.1:1/cb";

/// OAuth: a code is exchanged once (its reuse revokes what it issued), refresh tokens rotate (a
/// spent one presented again revokes the grant), and a grant revoked on one host stops its
/// tokens on the other.
pub fn oauth_codes_and_refresh_tokens_work_once(open: &dyn Fn() -> IdentityStore) {
    let a = open();
    let b = open();
    let user = a.add_user("alice").unwrap();
    let project = a
        .add_project("demo", ProjectKind::Workflow, "demo", &policy(), "alice")
        .unwrap();
    let now = now_ms();
    let (grant, code) = a
        .create_grant(&new_grant(&user.id, &project.id, VERIFIER), now)
        .unwrap();
    assert!(
        b.exchange_code(
            &code,
            "cli_x",
            REDIRECT,
            "wrong-verifier-wrong-verifier-wrong-verifier",
            now
        )
        .is_err()
    );
    // The failed try spent the code.
    assert!(
        b.exchange_code(&code, "cli_x", REDIRECT, VERIFIER, now)
            .is_err()
    );

    let (grant, code) = {
        let _ = grant;
        a.create_grant(&new_grant(&user.id, &project.id, VERIFIER), now)
            .unwrap()
    };
    let issued = b
        .exchange_code(&code, "cli_x", REDIRECT, VERIFIER, now)
        .unwrap();
    let (info, _) = a.authenticate(&issued.access_token).unwrap().unwrap();
    assert_eq!(info.grant_id.as_deref(), Some(grant.id.as_str()));
    assert_eq!(info.project_restriction(), Some(vec![project.id.clone()]));
    assert_eq!(info.audience.as_deref(), Some("http://h/mcp"));
    assert_eq!(a.grants_of(&user.id).unwrap().len(), 1);

    let second = a
        .refresh(&issued.refresh_token, "cli_x", None, now)
        .unwrap();
    assert!(b.authenticate(&second.access_token).unwrap().is_ok());
    // The spent refresh token again: the whole grant is revoked.
    assert!(
        b.refresh(&issued.refresh_token, "cli_x", None, now)
            .is_err()
    );
    assert!(a.authenticate(&second.access_token).unwrap().is_err());
    assert!(
        a.refresh(&second.refresh_token, "cli_x", None, now)
            .is_err()
    );
    assert!(a.grants_of(&user.id).unwrap().is_empty());

    // A code used twice revokes the tokens its first use issued.
    let (_, code) = a
        .create_grant(&new_grant(&user.id, &project.id, VERIFIER), now)
        .unwrap();
    let first = a
        .exchange_code(&code, "cli_x", REDIRECT, VERIFIER, now)
        .unwrap();
    assert!(
        b.exchange_code(&code, "cli_x", REDIRECT, VERIFIER, now)
            .is_err()
    );
    assert!(a.authenticate(&first.access_token).unwrap().is_err());

    // Revoking a grant through one host stops its token on the other.
    let (live, code) = a
        .create_grant(&new_grant(&user.id, &project.id, VERIFIER), now)
        .unwrap();
    let tokens = a
        .exchange_code(&code, "cli_x", REDIRECT, VERIFIER, now)
        .unwrap();
    assert!(b.revoke_grant(&live.id, &user.id, now).unwrap());
    assert!(!b.revoke_grant(&live.id, &user.id, now).unwrap());
    assert!(a.authenticate(&tokens.access_token).unwrap().is_err());
}

/// Disabling an account on one host ends its sessions and its OAuth grants for good, on every
/// host: the session is gone, the grant's access token refused and its refresh token refused,
/// and enabling the account again brings none of them back (issue 42, item 3). A personal
/// token an operator made is only refused while the account is disabled.
pub fn disabling_an_account_ends_its_sessions_and_grants_for_good(
    open: &dyn Fn() -> IdentityStore,
) {
    let (a, b) = (open(), open());
    let alice = a.add_user("alice").unwrap();
    let project = a
        .add_project("demo", ProjectKind::Workflow, "demo", &policy(), "alice")
        .unwrap();
    let now = now_ms();
    let policy = SessionPolicy::default();
    let session = a.create_session(&alice, policy, now).unwrap();
    let (_, code) = a
        .create_grant(&new_grant(&alice.id, &project.id, VERIFIER), now)
        .unwrap();
    let issued = a
        .exchange_code(&code, "cli_x", REDIRECT, VERIFIER, now)
        .unwrap();
    let personal = token_for(&a, "alice", vec![Scope::WorkflowsRead]);

    b.set_user_disabled("alice", true).unwrap();
    assert!(
        a.check_session(&session.secret, policy, now)
            .unwrap()
            .is_none()
    );
    assert!(a.authenticate(&issued.access_token).unwrap().is_err());
    assert!(
        a.refresh(&issued.refresh_token, "cli_x", None, now)
            .is_err()
    );
    assert!(matches!(
        a.create_grant(&new_grant(&alice.id, &project.id, VERIFIER), now),
        Err(IdentityError::Invalid(_))
    ));
    assert!(a.create_session(&alice, policy, now).is_err());

    a.set_user_disabled("alice", false).unwrap();
    assert!(
        b.check_session(&session.secret, policy, now)
            .unwrap()
            .is_none(),
        "the session came back with the account"
    );
    assert!(
        b.authenticate(&issued.access_token).unwrap().is_err(),
        "the grant's access token came back with the account"
    );
    assert!(
        b.refresh(&issued.refresh_token, "cli_x", None, now)
            .is_err(),
        "the grant's refresh token came back with the account"
    );
    assert!(b.grants_of(&alice.id).unwrap().is_empty());
    assert!(b.authenticate(&personal).unwrap().is_ok());
}

/// One code exchanged through several hosts at once issues tokens once; one user name added
/// through several hosts at once is one user, the others told it exists.
pub fn racing_hosts_redeem_a_code_once_and_take_a_name_once(open: &dyn Fn() -> IdentityStore) {
    const HOSTS: usize = 6;
    let setup = open();
    let user = setup.add_user("alice").unwrap();
    let project = setup
        .add_project("demo", ProjectKind::Workflow, "demo", &policy(), "alice")
        .unwrap();
    let now = now_ms();
    let (_, code) = setup
        .create_grant(&new_grant(&user.id, &project.id, VERIFIER), now)
        .unwrap();
    let hosts: Vec<IdentityStore> = (0..HOSTS).map(|_| open()).collect();
    let exchanged: Vec<bool> = at_once(&hosts, |host| {
        host.exchange_code(&code, "cli_x", REDIRECT, VERIFIER, now)
            .is_ok()
    });
    assert_eq!(
        exchanged.iter().filter(|ok| **ok).count(),
        1,
        "one code, {HOSTS} hosts at once: {exchanged:?}"
    );

    let added: Vec<Result<(), String>> = at_once(&hosts, |host| match host.add_user("racer") {
        Ok(_) => Ok(()),
        Err(IdentityError::Exists { .. }) => Err("exists".to_owned()),
        Err(other) => Err(other.to_string()),
    });
    assert_eq!(added.iter().filter(|r| r.is_ok()).count(), 1, "{added:?}");
    assert!(
        added
            .iter()
            .all(|r| r.as_ref().err().is_none_or(|e| e == "exists")),
        "the others are told the name exists: {added:?}"
    );
}

/// Console accounts: passwords verify, a one-time code works once (through any host), and a
/// session ends everywhere when signed out.
pub fn accounts_codes_and_sessions(open: &dyn Fn() -> IdentityStore) {
    let a = open();
    let b = open();
    let alice = a.add_user("alice").unwrap();
    a.set_password("alice", "correct horse battery").unwrap();
    assert_eq!(
        b.verify_password("alice", "correct horse battery")
            .unwrap()
            .map(|u| u.id),
        Some(alice.id.clone())
    );
    assert!(
        b.verify_password("alice", "wrong password here")
            .unwrap()
            .is_none()
    );

    let now = now_ms();
    let code = a.create_code("alice", CodeKind::SignIn, now).unwrap().code;
    assert!(
        b.redeem_code(&code, CodeKind::Invite, now)
            .unwrap()
            .is_none()
    );
    assert_eq!(
        b.redeem_code(&code, CodeKind::SignIn, now)
            .unwrap()
            .map(|u| u.id),
        Some(alice.id.clone())
    );
    assert!(
        a.redeem_code(&code, CodeKind::SignIn, now)
            .unwrap()
            .is_none()
    );

    let policy = SessionPolicy::default();
    let session = a.create_session(&alice, policy, now).unwrap();
    let found = b
        .check_session(&session.secret, policy, now)
        .unwrap()
        .unwrap();
    assert_eq!(found.id, session.session.id);
    assert!(b.end_session(&session.secret).unwrap());
    assert!(
        a.check_session(&session.secret, policy, now)
            .unwrap()
            .is_none()
    );
    let token = a.token_by_id(&session.session.token.id).unwrap().unwrap();
    assert!(
        token.revoked_at_ms.is_some(),
        "signing out revokes the session's token"
    );
}

/// Device logins (`agentworks login`) across hosts: started on one, looked up and decided on
/// another, polled on a third; decided once; redeemed once even when six hosts poll the
/// approved code at the same moment; a denial and an expiry are final.
pub fn device_logins_are_decided_once_and_redeemed_once(open: &dyn Fn() -> IdentityStore) {
    const HOSTS: usize = 6;
    let (a, b) = (open(), open());
    a.add_user("alice").unwrap();
    let now = now_ms();
    let login = a
        .start_device_login("<b>laptop</b>", "10.0.0.1", now, 10, 10)
        .unwrap()
        .unwrap();
    assert_eq!(login.user_code.len(), 9, "{login:?}");
    assert_eq!(login.device_code.len(), 64);
    assert_eq!(
        b.poll_device_login(&login.device_code, now).unwrap(),
        DevicePoll::Pending
    );
    assert_eq!(
        a.poll_device_login(&login.device_code, now + 100).unwrap(),
        DevicePoll::SlowDown,
        "a poll right after another, on any host"
    );
    let typed = login.user_code.to_lowercase().replace('-', "");
    let pending = b
        .pending_device_login(&typed, now + 1_000)
        .unwrap()
        .unwrap();
    assert_eq!(pending.user_code, login.user_code);
    assert_eq!(pending.label, "<b>laptop</b>", "the label is kept as given");
    assert_eq!(pending.expires_in_ms, DEVICE_LOGIN_TTL_MS - 1_000);
    // Vowels are not in the alphabet: no login can have this code.
    assert_eq!(b.pending_device_login("AAAA-AAAA", now).unwrap(), None);
    assert_eq!(
        b.decide_device_login("AAAA-AAAA", "alice", true, now)
            .unwrap(),
        Err(DecideError::NotFound)
    );
    assert_eq!(
        b.decide_device_login(&typed, "alice", true, now).unwrap(),
        Ok("<b>laptop</b>".to_owned())
    );
    assert_eq!(
        b.pending_device_login(&typed, now).unwrap(),
        None,
        "decided"
    );
    for (user, approve) in [("mallory", true), ("alice", false)] {
        assert_eq!(
            a.decide_device_login(&login.user_code, user, approve, now)
                .unwrap(),
            Err(DecideError::AlreadyDecided),
            "a decision is final ({user}, {approve})"
        );
    }

    let hosts: Vec<IdentityStore> = (0..HOSTS).map(|_| open()).collect();
    let polls: Vec<DevicePoll> = at_once(&hosts, |host| {
        host.poll_device_login(&login.device_code, now + 5_000)
            .unwrap()
    });
    let granted: Vec<&DevicePoll> = polls
        .iter()
        .filter(|p| matches!(p, DevicePoll::Granted { .. }))
        .collect();
    assert_eq!(
        granted.len(),
        1,
        "one code, {HOSTS} hosts at once: {polls:?}"
    );
    assert!(
        polls
            .iter()
            .all(|p| matches!(p, DevicePoll::Granted { .. } | DevicePoll::Invalid)),
        "{polls:?}"
    );
    let DevicePoll::Granted { access_token, .. } = granted[0] else {
        unreachable!()
    };
    let (token, user) = b.authenticate(access_token).unwrap().unwrap();
    assert_eq!(user.name, "alice");
    assert_eq!(token.scopes, vec![Scope::DevicesConnect]);
    assert_eq!(token.label, "agentworks login: <b>laptop</b>");
    assert_eq!(
        a.poll_device_login(&login.device_code, now + 9_000)
            .unwrap(),
        DevicePoll::Invalid,
        "redeemed once"
    );
    assert_eq!(
        a.poll_device_login("nope", now).unwrap(),
        DevicePoll::Invalid
    );
    assert_eq!(
        a.poll_device_login(&"0".repeat(64), now).unwrap(),
        DevicePoll::Invalid
    );

    let denied = a
        .start_device_login("", "10.0.0.1", now, 10, 10)
        .unwrap()
        .unwrap();
    assert_eq!(
        b.decide_device_login(&denied.user_code, "alice", false, now)
            .unwrap(),
        Ok(String::new())
    );
    assert_eq!(
        b.decide_device_login(&denied.user_code, "alice", true, now)
            .unwrap(),
        Err(DecideError::AlreadyDecided),
        "a denial is final"
    );
    assert_eq!(
        a.poll_device_login(&denied.device_code, now).unwrap(),
        DevicePoll::Denied
    );
    assert_eq!(
        a.poll_device_login(&denied.device_code, now).unwrap(),
        DevicePoll::Invalid,
        "a denied login is gone once answered"
    );

    let expired = a
        .start_device_login("old", "10.0.0.2", now, 10, 10)
        .unwrap()
        .unwrap();
    // At most two waiting ("old" and this one: the redeemed and the denied logins are gone);
    // expired ones free their places.
    a.start_device_login("third", "10.0.0.3", now, 10, 2)
        .unwrap()
        .unwrap();
    assert_eq!(
        b.start_device_login("fourth", "10.0.0.4", now, 10, 2)
            .unwrap(),
        Err(WaitingRefusal::Total)
    );
    let later = now + DEVICE_LOGIN_TTL_MS;
    assert_eq!(
        b.pending_device_login(&expired.user_code, later).unwrap(),
        None
    );
    assert_eq!(
        b.decide_device_login(&expired.user_code, "alice", true, later)
            .unwrap(),
        Err(DecideError::NotFound)
    );
    assert_eq!(
        a.poll_device_login(&expired.device_code, later).unwrap(),
        DevicePoll::Expired
    );
    assert!(
        b.start_device_login("fourth", "10.0.0.4", later, 10, 2)
            .unwrap()
            .is_ok()
    );

    // One address has its own share of waiting logins, counted on every host; a decided
    // login leaves it, and another address is not held back meanwhile.
    let fresh = later + DEVICE_LOGIN_TTL_MS;
    let first = a
        .start_device_login("flood", "10.9.9.9", fresh, 2, 100)
        .unwrap()
        .unwrap();
    b.start_device_login("flood", "10.9.9.9", fresh, 2, 100)
        .unwrap()
        .unwrap();
    assert_eq!(
        a.start_device_login("flood", "10.9.9.9", fresh, 2, 100)
            .unwrap(),
        Err(WaitingRefusal::Address)
    );
    assert!(
        b.start_device_login("person", "10.1.1.1", fresh, 2, 100)
            .unwrap()
            .is_ok()
    );
    b.decide_device_login(&first.user_code, "alice", false, fresh)
        .unwrap()
        .unwrap();
    assert!(
        a.start_device_login("flood", "10.9.9.9", fresh, 2, 100)
            .unwrap()
            .is_ok()
    );
}

/// Failed attempts: counted per key within the window on any host, refused past a limit with
/// the seconds to wait, uncounted on success, and never past the limit when hosts count at
/// the same moment.
pub fn failed_attempts_are_limited_across_hosts(open: &dyn Fn() -> IdentityStore) {
    const WINDOW: i64 = 15 * 60_000;
    let (a, b) = (open(), open());
    let now = 1_000_000;
    let keys = [("user:a", 2), ("address:x", 3)];
    let first = a.count_attempt(&keys, now, WINDOW).unwrap().unwrap();
    b.uncount_attempt(&first).unwrap();
    assert!(b.count_attempt(&keys, now, WINDOW).unwrap().is_ok());
    assert!(a.count_attempt(&keys, now + 1_000, WINDOW).unwrap().is_ok());
    assert_eq!(
        b.count_attempt(&keys, now + 2_000, WINDOW).unwrap(),
        Err(WINDOW / 1000 - 2),
        "two failures of user:a in the window, counted on two hosts"
    );
    assert!(
        a.count_attempt(&[("user:b", 2)], now, WINDOW)
            .unwrap()
            .is_ok()
    );
    assert!(
        a.count_attempt(&[("address:x", 3)], now + 2_000, WINDOW)
            .unwrap()
            .is_ok()
    );
    assert_eq!(
        b.count_attempt(&[("address:x", 3)], now + 2_000, WINDOW)
            .unwrap(),
        Err(WINDOW / 1000 - 2)
    );
    assert!(
        a.count_attempt(&keys, now + WINDOW + 1_000, WINDOW)
            .unwrap()
            .is_ok(),
        "the window passed"
    );

    const HOSTS: usize = 6;
    let hosts: Vec<IdentityStore> = (0..HOSTS).map(|_| open()).collect();
    let counted: Vec<bool> = at_once(&hosts, |host| {
        host.count_attempt(&[("user:racer", 3)], now, WINDOW)
            .unwrap()
            .is_ok()
    });
    assert_eq!(
        counted.iter().filter(|ok| **ok).count(),
        3,
        "a limit of 3, {HOSTS} hosts at once: {counted:?}"
    );

    // A backoff: two free, then 30 s after the last failure, then 60 s; counted on any host,
    // and a refused attempt is not counted (waiting is enough).
    let backoff = [(
        "signin:alice@x",
        AttemptLimit::Backoff {
            free: 2,
            first_wait_ms: 30_000,
        },
    )];
    assert!(a.count_attempt(&backoff, now, WINDOW).unwrap().is_ok());
    assert!(
        b.count_attempt(&backoff, now + 1_000, WINDOW)
            .unwrap()
            .is_ok()
    );
    assert_eq!(
        a.count_attempt(&backoff, now + 2_000, WINDOW).unwrap(),
        Err(29)
    );
    assert_eq!(
        b.count_attempt(&backoff, now + 30_000, WINDOW).unwrap(),
        Err(1)
    );
    assert!(
        b.count_attempt(&backoff, now + 31_000, WINDOW)
            .unwrap()
            .is_ok()
    );
    assert_eq!(
        a.count_attempt(&backoff, now + 31_000, WINDOW).unwrap(),
        Err(60)
    );
}

/// OAuth authorization requests waiting for consent: kept on one host, shown and decided on
/// another, decided once even when six hosts decide at once; none past the caps or the time:
/// undecided ones per client and per source address, and live ones in all (issue 42, item 11).
pub fn authorization_requests_are_decided_once(open: &dyn Fn() -> IdentityStore) {
    const TTL: i64 = 600_000;
    let limits = |per_client, per_address, total| PendingLimits {
        per_client,
        per_address,
        total,
    };
    let (a, b) = (open(), open());
    let now = 1_000_000;
    let put = |host: &IdentityStore, id: &str, client: &str, address: &str, at, caps| {
        host.put_authorization_request(id, "{}", client, address, at, TTL, caps)
            .unwrap()
    };
    assert_eq!(
        a.put_authorization_request(
            "r1",
            "{\"x\":1}",
            "c1",
            "10.0.0.1",
            now,
            TTL,
            limits(3, 3, 3)
        )
        .unwrap(),
        Ok(())
    );
    assert_eq!(
        b.authorization_request("r1", now + 1, TTL)
            .unwrap()
            .as_deref(),
        Some("{\"x\":1}")
    );
    assert_eq!(b.authorization_request("r2", now, TTL).unwrap(), None);
    let hosts: Vec<IdentityStore> = (0..6).map(|_| open()).collect();
    let decided: Vec<Decision> = at_once(&hosts, |host| {
        host.decide_authorization_request("r1", now + 2, TTL)
            .unwrap()
    });
    let taken = decided
        .iter()
        .filter(|d| matches!(d, Decision::Taken(_)))
        .count();
    assert_eq!(taken, 1, "{decided:?}");
    assert!(
        decided
            .iter()
            .all(|d| matches!(d, Decision::Taken(_) | Decision::AlreadyDecided)),
        "{decided:?}"
    );
    assert_eq!(b.authorization_request("r1", now + 3, TTL).unwrap(), None);
    assert_eq!(
        a.decide_authorization_request("nope", now, TTL).unwrap(),
        Decision::NotFound
    );
    // The total counts live requests (the decided one included); an expired one frees its
    // place.
    assert_eq!(
        put(&a, "r2", "c2", "10.0.0.2", now, limits(3, 3, 3)),
        Ok(())
    );
    assert_eq!(
        put(&a, "r3", "c3", "10.0.0.3", now, limits(3, 3, 3)),
        Ok(())
    );
    assert_eq!(
        put(&b, "r4", "c4", "10.0.0.4", now, limits(3, 3, 3)),
        Err(PendingRefusal::Total)
    );
    assert_eq!(
        b.decide_authorization_request("r2", now + TTL, TTL)
            .unwrap(),
        Decision::NotFound,
        "expired"
    );
    assert_eq!(
        put(&b, "r4", "c4", "10.0.0.4", now + TTL, limits(3, 3, 3)),
        Ok(())
    );

    // One address, then one client, fill their own shares (counted on every host); another
    // client from another address still gets in. A decided request leaves the shares.
    let later = now + 3 * TTL;
    let caps = limits(3, 2, 100);
    assert_eq!(put(&a, "f1", "flood", "10.6.6.6", later, caps), Ok(()));
    assert_eq!(put(&b, "f2", "flood", "10.6.6.6", later, caps), Ok(()));
    assert_eq!(
        put(&a, "f3", "other", "10.6.6.6", later, caps),
        Err(PendingRefusal::Address)
    );
    assert_eq!(put(&b, "f4", "flood", "10.7.7.7", later, caps), Ok(()));
    assert_eq!(
        put(&a, "f5", "flood", "10.8.8.8", later, caps),
        Err(PendingRefusal::Client)
    );
    assert_eq!(put(&b, "p1", "person", "10.1.1.1", later, caps), Ok(()));
    assert!(matches!(
        a.decide_authorization_request("f1", later, TTL).unwrap(),
        Decision::Taken(_)
    ));
    assert_eq!(put(&a, "f6", "flood", "10.8.8.8", later, caps), Ok(()));
    assert_eq!(put(&b, "f7", "other", "10.6.6.6", later, caps), Ok(()));
}

#[cfg(test)]
mod on_sqlite {
    /// A fresh SQLite file; every call of the closure opens it again (another connection, as a
    /// second process would).
    fn run(check: fn(&dyn Fn() -> super::IdentityStore)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        check(&|| super::IdentityStore::open(&path).unwrap());
    }

    /// One conformance function as a test on SQLite.
    macro_rules! on_sqlite {
        ($($name:ident),* $(,)?) => {
            $(
                #[test]
                fn $name() {
                    run(super::$name);
                }
            )*
        };
    }

    on_sqlite!(
        users_projects_and_members,
        tokens_are_checked_against_live_rows,
        oauth_codes_and_refresh_tokens_work_once,
        racing_hosts_redeem_a_code_once_and_take_a_name_once,
        accounts_codes_and_sessions,
        disabling_an_account_ends_its_sessions_and_grants_for_good,
        authorization_requests_are_decided_once,
        failed_attempts_are_limited_across_hosts,
        device_logins_are_decided_once_and_redeemed_once,
    );
}
