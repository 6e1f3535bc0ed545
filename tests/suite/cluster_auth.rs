//! Authentication between the hosts of a cluster (issue 16), on a real nats-server with TLS
//! (a private CA from [`TestCertificates`]) and one NATS user per daemon, with the subject
//! permissions README "Securing the cluster" tells an operator to set up ([`server_config`]).
//!
//! What is shown by doing it: only agentd's user may call a gateway (a call published as a
//! gatewayd user is refused by the server and never reaches the other gatewayd), and agentd may
//! not read revocations nor answer as a gateway; a gatewayd user may not read another host's
//! calls; and two real gatewayd hosts, each logged in as its own user over `tls://` with
//! `nats_ca_file`, answer agentd's dispatch (made as NATS user agentd) and close a revoked
//! token's connection, with agentd logged in as its user.

use super::harness::{
    ClusterAgentd, FakeExecutor, GatewayPair, Nats, Reply, TestCertificates, block_on, device_token,
};
use agentworks_contract::cluster::{
    AGENTD_SUBJECTS, GATEWAY_ANY_SUBJECT, GATEWAY_SUBJECTS, REVOKED_SUBJECT, WORKSPACED_SUBJECTS,
    agentd_subject, gateway_subject,
};
use agentworks_contract::executor::FolderAccess;
use futures_util::StreamExt;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// Each user's password (the operator's would be long and random, stored bcrypt-hashed).
fn password(user: &str) -> String {
    format!("{user}-secret")
}

/// The server's configuration: TLS with the test certificate, and one user per daemon:
/// agentd announces revocations, calls gatewayd, workspaced and agentd hosts, answers on
/// inboxes, and hears only its own subject and its inboxes; each gatewayd host answers on
/// inboxes only, and hears revocations, its own subject, any gateway's subject and its inboxes.
fn server_config(certificates: &TestCertificates) -> String {
    let gatewayd = |host: &str| {
        format!(
            "{{ user: gatewayd-{host}, password: \"{}\", permissions: {{\n\
             publish: [\"_INBOX.>\"]\n\
             subscribe: [\"{REVOKED_SUBJECT}\", \"{}\", \"{GATEWAY_ANY_SUBJECT}\", \"_INBOX.>\"] }} }}",
            password(&format!("gatewayd-{host}")),
            gateway_subject(&format!("gw-{host}")),
        )
    };
    format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n\
         authorization {{\n  users: [\n\
         {{ user: agentd, password: \"{}\", permissions: {{\n\
         publish: [\"{REVOKED_SUBJECT}\", \"{GATEWAY_SUBJECTS}\", \"{GATEWAY_ANY_SUBJECT}\", \"{WORKSPACED_SUBJECTS}\", \"{AGENTD_SUBJECTS}\", \"_INBOX.>\"]\n\
         subscribe: [\"{}\", \"_INBOX.>\"] }} }}\n\
         {}\n{}\n  ]\n}}\n",
        certificates.cert.display(),
        certificates.key.display(),
        password("agentd"),
        agentd_subject("gw-a"),
        gatewayd("a"),
        gatewayd("b"),
    )
}

/// A client logged in as `user` over TLS (trusting only the test CA), and what the server
/// reported to it after the connection (permission violations).
async fn login(
    nats: &Nats,
    ca: &Path,
    user: &str,
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (errors, reported) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password(user))
        .add_root_certificates(ca.to_path_buf())
        .require_tls(true)
        .event_callback(move |event| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    let _ = errors.send(error.to_string());
                }
            }
        })
        .connect(format!("tls://127.0.0.1:{}", nats.port))
        .await
        .unwrap_or_else(|e| panic!("{user} cannot log in: {e}"));
    (client, reported)
}

async fn next_error(reported: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(5), reported.recv())
        .await
        .expect("the server reported nothing")
        .unwrap()
}

async fn next_payload(subscriber: &mut async_nats::Subscriber) -> String {
    let message = tokio::time::timeout(Duration::from_secs(5), subscriber.next())
        .await
        .expect("no message arrived")
        .unwrap();
    String::from_utf8_lossy(&message.payload).into_owned()
}

#[test]
fn each_daemon_user_may_publish_and_read_only_its_own_subjects() {
    let dir = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::generate(dir.path());
    let nats = Nats::start_with_config(&server_config(&certificates));
    let ca = &certificates.ca;
    block_on(async {
        let (gw_b, _) = login(&nats, ca, "gatewayd-b").await;
        let mut calls_to_b = gw_b.subscribe(gateway_subject("gw-b")).await.unwrap();
        let mut any_calls = gw_b
            .queue_subscribe(GATEWAY_ANY_SUBJECT, "agentworks-gatewayd".into())
            .await
            .unwrap();
        let mut revocations = gw_b.subscribe(REVOKED_SUBJECT).await.unwrap();
        gw_b.flush().await.unwrap();

        // Gateway A publishes a call for gateway B, and one for any gateway: the server refuses
        // both and B never sees them.
        let (gw_a, mut gw_a_errors) = login(&nats, ca, "gatewayd-a").await;
        for subject in [gateway_subject("gw-b"), GATEWAY_ANY_SUBJECT.to_owned()] {
            gw_a.publish(subject.clone(), "from gw-a".into())
                .await
                .unwrap();
            gw_a.flush().await.unwrap();
            let refusal = next_error(&mut gw_a_errors).await;
            assert!(
                refusal.contains(&format!(
                    "Permissions Violation for Publish to \"{subject}\""
                )),
                "{refusal}"
            );
        }
        // agentd's calls, published after the server handled A's, are the first B gets.
        let (agentd, mut agentd_errors) = login(&nats, ca, "agentd").await;
        agentd
            .publish(gateway_subject("gw-b"), "from agentd".into())
            .await
            .unwrap();
        agentd
            .publish(GATEWAY_ANY_SUBJECT, "from agentd to any".into())
            .await
            .unwrap();
        agentd.flush().await.unwrap();
        assert_eq!(next_payload(&mut calls_to_b).await, "from agentd");
        assert_eq!(next_payload(&mut any_calls).await, "from agentd to any");
        // agentd may not listen as a gateway.
        let _ = agentd.subscribe(GATEWAY_ANY_SUBJECT).await.unwrap();
        agentd.flush().await.unwrap();
        let refusal = next_error(&mut agentd_errors).await;
        assert!(
            refusal
                .contains("Permissions Violation for Subscription to \"agentworks.gateways.call\""),
            "{refusal}"
        );

        // What agentd is for: announcing a revocation, which every gatewayd hears.
        agentd
            .publish(REVOKED_SUBJECT, "{\"token_id\":\"tok_1\"}".into())
            .await
            .unwrap();
        assert_eq!(
            next_payload(&mut revocations).await,
            "{\"token_id\":\"tok_1\"}"
        );

        // agentd reads no revocation, and a gatewayd host may not read another host's calls.
        let _ = agentd.subscribe(REVOKED_SUBJECT).await.unwrap();
        agentd.flush().await.unwrap();
        let refusal = next_error(&mut agentd_errors).await;
        assert!(
            refusal.contains(
                "Permissions Violation for Subscription to \"agentworks.tokens.revoked\""
            ),
            "{refusal}"
        );
        let _ = gw_a.subscribe(gateway_subject("gw-b")).await.unwrap();
        gw_a.flush().await.unwrap();
        let refusal = next_error(&mut gw_a_errors).await;
        assert!(
            refusal.contains(
                "Permissions Violation for Subscription to \"agentworks.gateway.gw-b.call\""
            ),
            "{refusal}"
        );
    });
}

#[test]
fn gatewayd_hosts_answer_agentd_and_revoke_as_their_own_users_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::generate(dir.path());
    let nats = Nats::start_with_config(&server_config(&certificates));
    let port = nats.port;
    let ca = certificates.ca.clone();
    let nats_keys = move |user: &str| {
        format!(
            "nats_url = \"tls://{user}:{}@127.0.0.1:{port}\"\nnats_ca_file = {ca:?}\n",
            password(user)
        )
    };
    // Tokens are re-checked once at the connection, then not for an hour: only the NATS
    // message can close the revoked one in time.
    let mut pair = GatewayPair::start_on(
        nats,
        "heartbeat_secs = 1\ntoken_recheck_ms = 3600000\n",
        &|host| nats_keys(&host.replace("gw-", "gatewayd-")),
    );
    // agentd again, in the cluster as NATS user agentd. Here it shares the stack's config file
    // with gateway A, which has read its own login from it already.
    let path = pair.stack.state.root().join("agentworks.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    assert!(config.contains(&nats_keys("gatewayd-a")), "{config}");
    std::fs::write(
        &path,
        config.replace(&nats_keys("gatewayd-a"), &nats_keys("agentd")),
    )
    .unwrap();
    pair.stack.restart_agentd();

    let (token, token_id, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let folders = [("proj", FolderAccess::ReadWrite)];
    let on_b = FakeExecutor::connect(pair.b.port, &token, "laptop", &folders, Reply::Echo)
        .expect("the executor was refused");
    // agentd's dispatch: located on any host and called on B's subject as NATS user agentd,
    // answered as gatewayd-b.
    let body = json!({"user_id": alice, "device_id": on_b.device_id, "folder": "proj",
                      "request_id": "req-tls", "operation":
                      {"kind": "execute_shell_command", "command": "echo over tls", "timeout": 5}});
    let as_agentd =
        async_nats::ConnectOptions::with_user_and_password("agentd".into(), password("agentd"))
            .add_root_certificates(certificates.ca.clone())
            .require_tls(true);
    let agentd = ClusterAgentd::connect_with(
        &pair.postgres,
        as_agentd,
        &format!("tls://127.0.0.1:{port}"),
        "ag-1",
    );
    let answered = agentd.json("/v1/dispatch", body).unwrap();
    assert_eq!(answered["state"], "done", "{answered}");
    assert_eq!(answered["outcome"]["stdout"], "echo over tls", "{answered}");
    assert_eq!(pair.request_state("req-tls"), "gw-b done");

    // Revoked through agentd, announced as agentd, heard by B: the executor is closed.
    let revoked_at = std::time::Instant::now();
    pair.stack.admin("tokens/revoke", json!({"id": token_id}));
    let (_, closed_at) = on_b.wait_closed(Duration::from_secs(5));
    let took = closed_at.duration_since(revoked_at);
    assert!(
        took < Duration::from_secs(1),
        "closed {took:?} after the revocation"
    );
}
