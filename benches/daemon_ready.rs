//! Each daemon's time to READY: how long workspaced, agentd and gatewayd take from being
//! spawned to telling the service manager they serve.
//!
//! Every start is the real release binary on a temp state root (under `target/bench-ready`),
//! spawned with `NOTIFY_SOCKET` pointing at a Unix datagram socket this process owns, as
//! systemd's `Type=notify` would. The time runs from just before the spawn to the arrival of
//! the `READY=1` datagram, which each daemon sends only after its sockets are bound and its
//! store is open. Then SIGTERM, and the time until the daemon has exited (after its
//! STOPPING=1) is taken too. Two series per daemon:
//!
//! - first start: a fresh state root each time (the daemon creates its runtime dir, its
//!   private dirs and its SQLite store);
//! - restart: the same state root again (what `systemctl restart` does).
//!
//! The exec floor is `<daemon> --version` run to its exit: what spawning and loading the
//! binary costs before the daemon does anything. p50 and p99 (nearest rank) of each.
//!
//! Run: `cargo bench --bench daemon_ready` (optionally `-- 50` for the starts per series;
//! default 20, after 2 warm-up starts per daemon). A benchmark: nothing is asserted about
//! timings; it exits non-zero only when a daemon fails to start or stop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The test harness's daemon helpers; this benchmark uses part of them.
#[allow(dead_code)]
#[path = "../tests/common/daemons.rs"]
mod daemons;
#[path = "../tests/common/ports.rs"]
mod ports;

use daemons::{NotifySocket, Process};
use nix::sys::signal::Signal;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WARMUP: usize = 2;
/// How long a single start or stop may take before the run fails.
const WITHIN: Duration = Duration::from_secs(30);

/// The three daemons: (name, binary).
const DAEMONS: [(&str, &str); 3] = [
    (
        "agentworks-workspaced",
        env!("CARGO_BIN_EXE_agentworks-workspaced"),
    ),
    ("agentworks-agentd", env!("CARGO_BIN_EXE_agentworks-agentd")),
    (
        "agentworks-gatewayd",
        env!("CARGO_BIN_EXE_agentworks-gatewayd"),
    ),
];

/// A fresh state root under `base` with a config that gives agentd and gatewayd their own
/// reserved loopback ports (and no group requirements, as the other benches).
fn state_root(base: &Path) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("state-")
        .tempdir_in(base)
        .unwrap();
    let (agentd_port, gateway_port) = (ports::free_port(), ports::free_port());
    std::fs::write(
        dir.path().join("agentworks.toml"),
        format!(
            "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{agentd_port}\"\n\n\
             [gatewayd]\nlisten = \"127.0.0.1:{gateway_port}\"\nallowed_users = []\n"
        ),
    )
    .unwrap();
    dir
}

/// One start of `binary` on `state`: (spawn → READY=1, SIGTERM → exited).
fn start_and_stop(
    name: &'static str,
    binary: &str,
    state: &Path,
    base: &Path,
) -> Result<(Duration, Duration), String> {
    let notify = NotifySocket::bind_in(base).map_err(|e| format!("notify socket: {e}"))?;
    let mut command = Command::new(binary);
    daemons::as_daemon_on(&mut command, state).env("NOTIFY_SOCKET", notify.path());
    let spawned = Instant::now();
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start {binary}: {e}"))?;
    // Stopped and reaped on every early return.
    let mut process = Process { name, child };
    notify.wait_for(&mut process.child, name, "READY=1", WITHIN)?;
    let ready = spawned.elapsed();

    let stopping = Instant::now();
    daemons::send_signal(&process.child, Signal::SIGTERM)
        .map_err(|e| format!("cannot signal {name}: {e}"))?;
    notify.wait_for(&mut process.child, name, "STOPPING=1", WITHIN)?;
    let status = process
        .child
        .wait()
        .map_err(|e| format!("cannot wait for {name}: {e}"))?;
    let stopped = stopping.elapsed();
    if !status.success() {
        return Err(format!("{name} exited with {status} after SIGTERM"));
    }
    Ok((ready, stopped))
}

/// `binary --version` to its exit.
fn exec_floor(binary: &str) -> Result<Duration, String> {
    let started = Instant::now();
    let status = Command::new(binary)
        .arg("--version")
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("cannot run {binary} --version: {e}"))?;
    let elapsed = started.elapsed();
    if !status.success() {
        return Err(format!("{binary} --version exited with {status}"));
    }
    Ok(elapsed)
}

/// Nearest-rank percentile `p` (0–100) of sorted `samples`.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

/// `(p50, p99)` in milliseconds.
fn p50_p99(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 99.0)),
    )
}

struct Series {
    ready: Vec<Duration>,
    stop: Vec<Duration>,
}

impl Series {
    fn new(n: usize) -> Series {
        Series {
            ready: Vec::with_capacity(n),
            stop: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, (ready, stop): (Duration, Duration)) {
        self.ready.push(ready);
        self.stop.push(stop);
    }
}

fn run(n: usize) -> Result<(), String> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-ready");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;

    let mut rows = Vec::new();
    for (name, binary) in DAEMONS {
        let context = |e: String| format!("{name}: {e}");
        for _ in 0..WARMUP {
            exec_floor(binary).map_err(context)?;
            let state = state_root(&base);
            start_and_stop(name, binary, state.path(), &base).map_err(context)?;
        }
        let mut floor = Vec::with_capacity(n);
        let mut first = Series::new(n);
        let mut restart = Series::new(n);
        // One state root kept for the restarts; its first start is not counted.
        let kept = state_root(&base);
        start_and_stop(name, binary, kept.path(), &base).map_err(context)?;
        // Interleaved, so a change in the machine's other load touches every series alike.
        for _ in 0..n {
            floor.push(exec_floor(binary).map_err(context)?);
            let fresh = state_root(&base);
            first.push(start_and_stop(name, binary, fresh.path(), &base).map_err(context)?);
            drop(fresh);
            restart.push(start_and_stop(name, binary, kept.path(), &base).map_err(context)?);
        }
        rows.push((name, floor, first, restart));
    }
    let _ = std::fs::remove_dir_all(&base);

    println!(
        "time to READY=1 on NOTIFY_SOCKET, release binaries, {n} starts per series after {WARMUP} warm-up, same machine ({} cores)",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!();
    println!(
        "| {:<22} | {:<42} | {:>8} | {:>8} |",
        "daemon", "series", "p50 ms", "p99 ms"
    );
    println!("| {:-<22} | {:-<42} | {:->8} | {:->8} |", "", "", "", "");
    let line = |name: &str, series: &str, samples: Vec<Duration>| {
        let (p50, p99) = p50_p99(samples);
        println!("| {name:<22} | {series:<42} | {p50:>8.2} | {p99:>8.2} |");
    };
    for (name, floor, first, restart) in rows {
        line(
            name,
            "spawn → READY=1, first start (fresh root)",
            first.ready,
        );
        line(name, "spawn → READY=1, restart (same root)", restart.ready);
        line(name, "SIGTERM → exited (fresh and restart)", {
            let mut stop = first.stop;
            stop.extend(restart.stop);
            stop
        });
        line(name, "exec floor: --version to exit", floor);
    }
    println!();
    println!("reproduce: cargo bench --bench daemon_ready -- {n}");
    Ok(())
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    assert!(n > 0, "the number of starts must be positive");
    if let Err(e) = run(n) {
        eprintln!("daemon_ready: {e}");
        std::process::exit(1);
    }
}
