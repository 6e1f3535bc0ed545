//! What runnerd adds to a coding CLI's turn, as ratios in one run against the same scripted
//! model: the time from the turn's start to the CLI's first model request, through runnerd (the
//! request on runnerd.sock → the runtime prepared, the project pinned, the capability opened,
//! the config written, the sandbox's launcher, Codex, the model gateway) against the bare
//! `codex exec` started by hand with the same config pointing straight at the model (goal: at
//! most 150 ms more at p50).
//!
//! Both run the real release binaries: runnerd (`cargo bench` builds it) and the pinned Codex
//! (`tests/codex`, `npm ci --ignore-scripts` there). The model is the tests' scripted Responses
//! server on loopback, answering each request with one short text. The two kinds of start
//! alternate, so both see the same machine.
//!
//! Run: `cargo bench --bench runnerd_turn` (optionally `-- N` starts per series; default 15,
//! after 2 warm-up starts each). A benchmark: nothing is asserted about timings; it exits
//! non-zero only when a start fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../tests/common/daemons.rs"]
mod daemons;
#[path = "../crates/runner/tests/support/mod.rs"]
mod support;

use daemons::Process;
use serde_json::json;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::codex_binary;
use support::responses::{Reply, ScriptedResponses};

const WARMUP: usize = 2;
const WITHIN: Duration = Duration::from_secs(60);

fn main() {
    let starts: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(15);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let total = 2 * (WARMUP + starts);
    let model = runtime
        .block_on(ScriptedResponses::start(
            (0..total)
                .map(|i| Reply::Text(format!("answer {i}")))
                .collect(),
        ))
        .unwrap();
    let codex = codex_binary();
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-runnerd");
    std::fs::create_dir_all(&base).unwrap();
    let state = tempfile::Builder::new()
        .prefix("state-")
        .tempdir_in(&base)
        .unwrap();
    std::fs::create_dir_all(state.path().join("documents/p")).unwrap();
    std::fs::write(state.path().join("documents/p/hello.txt"), "hello\n").unwrap();
    std::fs::write(
        state.path().join("agentworks.toml"),
        format!(
            "[runnerd]\nallowed_users = []\n[runnerd.providers.codex]\ndriver = \"codex\"\n\
             executable = \"{}\"\nmodel = \"scripted\"\nupstream = \"{}\"\n",
            codex.display(),
            model.base_url()
        ),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentworks-runnerd"));
    daemons::as_daemon_on(&mut command, state.path());
    let child = command.spawn().expect("spawn runnerd");
    let mut runnerd = Process {
        name: "agentworks-runnerd",
        child,
    };
    let socket = state.path().join("run/runnerd.sock");
    let deadline = Instant::now() + WITHIN;
    while !socket.exists() {
        assert!(runnerd.exited().is_none(), "runnerd exited during start");
        assert!(Instant::now() < deadline, "runnerd did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let bare_home = tempfile::Builder::new()
        .prefix("bare-")
        .tempdir_in(&base)
        .unwrap();
    let config = agentworks_runner::codex::config_toml(&agentworks_runner::codex::CodexConfig {
        model: "scripted",
        gateway_base_url: &model.base_url(),
        key_env: "AGENTWORKS_MODEL_KEY",
        bridge: None,
        builder: false,
    })
    .unwrap();
    std::fs::create_dir_all(bare_home.path().join("codex")).unwrap();
    std::fs::write(bare_home.path().join("codex/config.toml"), config).unwrap();

    let mut through_runnerd = Vec::new();
    let mut bare = Vec::new();
    for i in 0..(WARMUP + starts) {
        let seen = model.requests().len();
        let t = runnerd_turn(&socket, i);
        through_runnerd.push(first_request_after(&model, seen, t));
        let seen = model.requests().len();
        let t = bare_codex(&codex, bare_home.path());
        bare.push(first_request_after(&model, seen, t));
    }
    let report = |name: &str, samples: &[Duration]| {
        let mut sorted = samples[WARMUP..].to_vec();
        sorted.sort();
        let p50 = sorted[sorted.len() / 2];
        println!(
            "{name:>34}: p50 {:7.1} ms  min {:7.1} ms  max {:7.1} ms  (n = {})",
            p50.as_secs_f64() * 1000.0,
            sorted[0].as_secs_f64() * 1000.0,
            sorted[sorted.len() - 1].as_secs_f64() * 1000.0,
            sorted.len()
        );
        p50
    };
    println!("time from the turn's start to the CLI's first model request:");
    let ours = report("through runnerd (sandboxed)", &through_runnerd);
    let theirs = report("bare codex exec", &bare);
    let more = ours.as_secs_f64() * 1000.0 - theirs.as_secs_f64() * 1000.0;
    println!(
        "{:>34}: {more:+.1} ms at p50 ({:.2}x; goal: at most +150 ms)",
        "runnerd adds",
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
    drop(runnerd);
}

/// Starts a turn on runnerd.sock (as agentd would, through curl) and reads it to its end;
/// returns when it started.
fn runnerd_turn(socket: &Path, i: usize) -> Instant {
    let request = json!({
        "chat_id": format!("bench-{i}"),
        "user_id": "bench",
        "project": "p",
        "provider": "codex",
        "mode": "run",
        "guard": {},
        "prompt": "say hi",
    });
    let started = Instant::now();
    let mut curl = Command::new("curl")
        .args(["-sS", "-N", "--unix-socket"])
        .arg(socket)
        .args([
            "-X",
            "POST",
            "--data-binary",
            "@-",
            "http://runnerd/v1/turns",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn curl");
    curl.stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let stdout = curl.stdout.take().unwrap();
    let mut last = String::new();
    for line in std::io::BufReader::new(stdout).lines() {
        last = line.unwrap();
    }
    curl.wait().unwrap();
    assert!(last.contains("\"end\""), "the turn failed: {last}");
    started
}

/// Runs `codex exec --json` by hand with `home`'s config pointing at the model; returns when
/// it was started.
fn bare_codex(codex: &Path, home: &Path) -> Instant {
    let started = Instant::now();
    let mut child = Command::new(codex)
        .args(agentworks_runner::codex::args(None))
        .current_dir(home)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("CODEX_HOME", home.join("codex"))
        .env("AGENTWORKS_MODEL_KEY", "bench")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn codex");
    child.stdin.take().unwrap().write_all(b"say hi").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "codex exec failed");
    started
}

/// The time from `started` to the first model request after the first `seen`.
fn first_request_after(model: &ScriptedResponses, seen: usize, started: Instant) -> Duration {
    let requests = model.requests();
    let first = requests.get(seen).expect("the CLI asked the model");
    first.at.duration_since(started)
}
