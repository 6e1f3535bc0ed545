//! The systemd contract of the daemons, with real sockets: READY=1 only once the socket
//! answers, WATCHDOG=1 when asked for, STOPPING=1 on SIGTERM, and socket activation through
//! systemd's own `systemd-socket-activate` (LISTEN_FDS / LISTEN_FDNAMES).

use super::harness::*;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn spawn_with_notify(
    state: &StateRoot,
    extra_env: &[(&str, &str)],
) -> (std::process::Child, UnixDatagram, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    // Generous: the whole suite runs many daemons at once on two cores.
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut command = Command::new(workspaced_bin());
    command
        .env_clear()
        .env("AGENTWORKS_STATE_ROOT", state.root())
        .env("AGENTWORKS_CONFIG", state.root().join("agentworks.toml"))
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // A daemon that fails to start says why.
        .stderr(Stdio::inherit());
    for (k, v) in extra_env {
        command.env(k, v);
    }
    (command.spawn().unwrap(), notify, dir)
}

fn next_message(notify: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = notify.recv(&mut buf).expect("a notification within 60 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn ready_after_the_socket_answers_watchdog_and_stopping() {
    let state = StateRoot::new();
    state.project("demo", &[("a.txt", "a")]);
    let (mut child, notify, _dir) = spawn_with_notify(&state, &[]);
    let ready = next_message(&notify);
    assert!(ready.contains("READY=1"), "{ready}");
    // READY means serving: the socket answers at once, no retry needed.
    let client = Client {
        inner: agentworks_support::unix_http::UnixClient::new(state.socket()),
    };
    assert!(client.read(&ctx("demo", "u"), "a.txt").is_ok());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // Every message until STOPPING=1 (a missing one times out the recv and fails the test).
    while !next_message(&notify).contains("STOPPING=1") {}
    assert!(child.wait().unwrap().success());
}

#[test]
fn watchdog_pings_when_systemd_asks_for_them() {
    let state = StateRoot::new();
    // WATCHDOG_PID must name the daemon itself; exec through sh so the pid is known before exec.
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("WATCHDOG_PID=$$ exec {}", workspaced_bin()))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AGENTWORKS_STATE_ROOT", state.root())
        .env("AGENTWORKS_CONFIG", state.root().join("agentworks.toml"))
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "400000")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut pings = 0;
    while pings < 2 {
        assert!(Instant::now() < deadline, "no WATCHDOG=1");
        if next_message(&notify).contains("WATCHDOG=1") {
            pings += 1;
        }
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    assert!(child.wait().unwrap().success());
}

#[test]
fn takes_its_socket_from_systemd_socket_activation() {
    let state = StateRoot::new();
    state.project("demo", &[("a.txt", "activated")]);
    let socket = state.root().join("activated.sock");
    let config = state.root().join("agentworks.toml");
    // Configure a different path: if workspaced bound its own socket it would be over there.
    std::fs::write(
        &config,
        format!(
            "[workspaced]\nsocket = {:?}\n",
            state.root().join("self-bound.sock").display().to_string()
        ),
    )
    .unwrap();
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .arg("--fdname=workspaced.sock")
        .arg("-E")
        .arg(format!("AGENTWORKS_STATE_ROOT={}", state.root().display()))
        .arg("-E")
        .arg(format!("AGENTWORKS_CONFIG={}", config.display()))
        .arg(workspaced_bin())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // systemd-socket-activate binds, then listens, and starts the daemon on the first
    // connection, which waits in the backlog meanwhile. The file exists from the bind on, so
    // wait until a connection is taken (refused in between), not only for the file.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "the activator did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = Client {
        inner: agentworks_support::unix_http::UnixClient::new(&socket),
    };
    let read = client.read(&ctx("demo", "u"), "a.txt").unwrap();
    assert_eq!(read["content"], "activated");
    assert!(
        !state.root().join("self-bound.sock").exists(),
        "it used the passed socket, not its own"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(activator.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = activator.wait();
}
