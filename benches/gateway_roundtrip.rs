//! gatewayd: the round trip of a trivial command dispatched to a connected laptop, and what an
//! idle executor connection costs the gateway in memory.
//!
//! 1. Latency. workspaced, agentd and gatewayd on a temp state root, and ONE real
//!    `agentworks executor connect` (its own temp HOME, logged in with a devices:connect token)
//!    sharing a write folder. Each timed round trip is one `POST /v1/dispatch` on
//!    `gatewayd.sock` of `execute_shell_command {command: "true"}` with a fresh request id:
//!    gatewayd records the request, sends it over the WebSocket, the executor records its
//!    receipt and runs `true` in its Landlock sandbox, the result comes back and is recorded,
//!    and the dispatch answers. Timed the same way in the same run: the floor, `sh -c true`
//!    spawned directly, and `ssh localhost true` over a persistent connection (an OpenSSH
//!    ControlMaster to a private sshd this benchmark starts on a reserved loopback port with a
//!    temp host key and authorized_keys; see `benches/common/sshd.rs`). p50, p99 and mean of
//!    each, and the ratios of the p50s. The ssh row needs `openssh-server` (`/usr/sbin/sshd`;
//!    `apt-get install openssh-server`); without it that row says so and is skipped.
//! 2. Memory. Before the executor starts, gatewayd's VmRSS right after start (no connection),
//!    then with 1,000 idle executor WebSocket connections opened by this process (each with its
//!    own devices:connect token and a valid hello, then idle, answering pings), and the
//!    per-connection delta.
//!
//! Run: `cargo bench --bench gateway_roundtrip` (optionally `-- 500` for the number of timed
//! dispatches, direct runs and ssh runs; default 200, after 20 warm-up each).
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The test harness's daemon helpers; this benchmark uses part of them.
#[allow(dead_code)]
#[path = "../tests/common/daemons.rs"]
mod daemons;
#[path = "../tests/common/laptop_cli.rs"]
mod laptop_cli;
#[path = "../tests/common/ports.rs"]
mod ports;
#[path = "common/sshd.rs"]
mod sshd;
// The stack and the laptop; this benchmark leaves the state root's path unread.
#[allow(dead_code)]
#[path = "common/gateway.rs"]
mod gateway;

use agentworks_contract::executor::{ExecutorFrame, FolderAccess, FolderInfo, GatewayFrame};
use futures_util::{SinkExt, StreamExt};
use gateway::{Laptop, Stack, start_executor, wait_online};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;

const WARMUP: usize = 20;
const IDLE_CONNECTIONS: usize = 1000;
/// gatewayd's `max_connections_per_address` here: the idle connections and the round trip's
/// all come from 127.0.0.1.
const IDLE_CONNECTIONS_LIMIT: usize = IDLE_CONNECTIONS + 64;
/// Connections being opened at once (each asks agentd about its token before the upgrade).
const DIAL_CONCURRENCY: usize = 32;
/// File descriptors wanted for this process and (inherited) the daemons.
const NOFILE: u64 = 8192;

/// Raise this process's soft RLIMIT_NOFILE to at least [`NOFILE`] (within the hard limit);
/// the daemons started afterwards inherit it. The limit in force.
fn raise_nofile() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if current >= NOFILE {
        return current;
    }
    let wanted = limit.maximum.map_or(NOFILE, |max| max.min(NOFILE));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(wanted),
            maximum: limit.maximum,
        },
    )
    .expect("raise RLIMIT_NOFILE");
    wanted
}

/// VmRSS of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Memory: idle executor connections opened by this process.

/// Dial `/v1/executor`, send a hello, wait for the welcome; then stay idle (answering pings,
/// which tungstenite does while the stream is read) until `stop`, and close.
async fn idle_executor(
    port: u16,
    token: String,
    name: String,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let mut request = format!("ws://127.0.0.1:{port}/v1/executor")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| format!("{name}: cannot connect: {e}"))?;
    let hello = ExecutorFrame::Hello {
        device_name: name.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        folders: vec![FolderInfo {
            alias: "proj".to_owned(),
            access: FolderAccess::ReadWrite,
            downloads: false,
        }],
    };
    ws.send(Message::text(serde_json::to_string(&hello).unwrap()))
        .await
        .map_err(|e| format!("{name}: cannot send the hello: {e}"))?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => {
                match serde_json::from_str::<GatewayFrame>(text.as_str()) {
                    Ok(GatewayFrame::Welcome { .. }) => break,
                    other => return Err(format!("{name}: expected a welcome, got {other:?}")),
                }
            }
            Some(Ok(Message::Close(frame))) => {
                return Err(format!("{name}: closed before the welcome: {frame:?}"));
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("{name}: {e}")),
            None => return Err(format!("{name}: disconnected before the welcome")),
        }
    }
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
                    return;
                }
                message = ws.next() => match message {
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                        eprintln!("idle connection {name} ended before the measurement did");
                        return;
                    }
                    Some(Ok(_)) => {}
                },
            }
        }
    }))
}

struct MemoryFigures {
    before_kib: u64,
    after_kib: u64,
    fds_before: usize,
    fds_after: usize,
    token_note: String,
}

async fn measure_memory(stack: &Stack) -> MemoryFigures {
    let pid = stack.gatewayd.pid();
    let _ = stack.admin("users/add", json!({"name": "idle"})).await;
    // Let the freshly started gatewayd settle before the baseline.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stack.connected().await, 0);
    let before_kib = rss_kib(pid);
    let fds_before = open_fds(pid);

    // One token per connection; if agentd refuses that many, one token and distinct names.
    let mut tokens = Vec::with_capacity(IDLE_CONNECTIONS);
    let mut token_note = format!("{IDLE_CONNECTIONS} tokens, one per connection");
    for i in 0..IDLE_CONNECTIONS {
        match stack.device_token("idle").await {
            Ok((token, _)) => tokens.push(token),
            Err(e) => {
                assert!(i > 0, "cannot create a devices:connect token: {e}");
                token_note = format!(
                    "agentd refused token {} ({e}); one token shared by all {IDLE_CONNECTIONS} connections, distinct device names",
                    i + 1
                );
                tokens = vec![tokens[0].clone(); IDLE_CONNECTIONS];
                break;
            }
        }
    }

    let stop = CancellationToken::new();
    let port = stack.gateway_port;
    let opened = Instant::now();
    let tasks: Vec<_> = futures_util::stream::iter(tokens.into_iter().enumerate())
        .map(|(i, token)| idle_executor(port, token, format!("idle-{i:04}"), stop.clone()))
        .buffer_unordered(DIAL_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("an idle connection failed: {e}"));
    let open_time = opened.elapsed();
    assert_eq!(stack.connected().await, IDLE_CONNECTIONS as u64);
    // Idle for a while (past the first token re-checks), then read.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        stack.connected().await,
        IDLE_CONNECTIONS as u64,
        "idle connections were dropped"
    );
    let after_kib = rss_kib(pid);
    let fds_after = open_fds(pid);
    eprintln!(
        "opened {IDLE_CONNECTIONS} idle connections in {:.2} s",
        open_time.as_secs_f64()
    );

    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while stack.connected().await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    MemoryFigures {
        before_kib,
        after_kib,
        fds_before,
        fds_after,
        token_note,
    }
}

// ---------------------------------------------------------------------------------------------
// ---------------------------------------------------------------------------------------------
// Latency: one real executor.

/// One dispatch of `true`; checks it completed with exit code 0.
async fn dispatch_true(stack: &Stack, user_id: &str, device_id: &str, request_id: &str) {
    let body = json!({
        "user_id": user_id, "device_id": device_id, "folder": "proj", "request_id": request_id,
        "operation": {"kind": "execute_shell_command", "command": "true"}
    });
    let answer: Value = stack
        .gatewayd_socket
        .post("/v1/dispatch", &body)
        .await
        .unwrap_or_else(|e| panic!("dispatch {request_id}: {e}"));
    assert!(
        answer["state"] == "done"
            && answer["outcome"]["status"] == "completed"
            && answer["outcome"]["exit_code"] == 0,
        "dispatch {request_id} did not run `true` to exit 0: {answer}"
    );
}

fn direct_true() {
    let status = Command::new("sh").args(["-c", "true"]).status().unwrap();
    assert!(status.success());
}

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

/// Nearest-rank percentiles and the mean.
fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let rank = |p: f64| {
        let i = ((p / 100.0) * samples.len() as f64).ceil() as usize;
        samples[i.clamp(1, samples.len()) - 1]
    };
    Stats {
        p50: rank(50.0),
        p99: rank(99.0),
        mean: samples.iter().sum::<Duration>() / samples.len() as u32,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    assert!(n > 0, "the number of round trips must be positive");
    let nofile = raise_nofile();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-gateway");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (memory, gateway, direct) = runtime.block_on(async {
        let stack = Stack::start(
            &base,
            // every idle connection comes from this process's one address
            &format!("max_connections_per_address = {IDLE_CONNECTIONS_LIMIT}"),
            "",
        )
        .await;
        let memory = measure_memory(&stack).await;

        let _ = stack.admin("users/add", json!({"name": "bench"})).await;
        let (token, user_id) = stack.device_token("bench").await.unwrap();
        let laptop = Laptop::new(&base);
        let mut executor = start_executor(&laptop, &stack, &token);
        let device_id = wait_online(&stack, &mut executor, &laptop, &user_id).await;

        for i in 0..WARMUP {
            dispatch_true(&stack, &user_id, &device_id, &format!("bench-warmup-{i}")).await;
        }
        let mut gateway = Vec::with_capacity(n);
        for i in 0..n {
            let request_id = format!("bench-{i}");
            let started = Instant::now();
            dispatch_true(&stack, &user_id, &device_id, &request_id).await;
            gateway.push(started.elapsed());
        }
        for _ in 0..WARMUP {
            direct_true();
        }
        let mut direct = Vec::with_capacity(n);
        for _ in 0..n {
            let started = Instant::now();
            direct_true();
            direct.push(started.elapsed());
        }
        if let Some(status) = executor.exited() {
            panic!("the executor exited during the run: {status}");
        }
        // Executor first, then the daemons (gatewayd, agentd, workspaced), then the dirs.
        drop(executor);
        drop(laptop);
        drop(stack);
        (memory, stats(gateway), stats(direct))
    });
    drop(runtime);
    // After the stack has stopped; the laptop's `true` ran with it idle too.
    let ssh = ssh_true(&base, n);
    let _ = std::fs::remove_dir_all(&base);

    println!(
        "round trip of `true`, {n} timed runs each after {WARMUP} warm-up, same machine ({} cores)",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!("                                                 p50 ms    p99 ms   mean ms");
    println!(
        "  gatewayd.sock dispatch -> executor -> sandbox {:>8.3}  {:>8.3}  {:>8.3}",
        ms(gateway.p50),
        ms(gateway.p99),
        ms(gateway.mean)
    );
    println!(
        "  sh -c true (direct spawn)                     {:>8.3}  {:>8.3}  {:>8.3}",
        ms(direct.p50),
        ms(direct.p99),
        ms(direct.mean)
    );
    let mut ssh_failed = None;
    match &ssh {
        SshRow::Measured {
            stats: ssh,
            login_shell,
            shell,
        } => {
            let shell = Path::new(shell)
                .file_name()
                .map_or(shell.clone(), |name| name.to_string_lossy().into_owned());
            for (label, stats) in [
                ("ssh localhost true (ControlMaster)", ssh),
                (
                    &*format!("  of which {shell} -c true as sshd runs it"),
                    login_shell,
                ),
            ] {
                println!(
                    "  {label:<45} {:>8.3}  {:>8.3}  {:>8.3}",
                    ms(stats.p50),
                    ms(stats.p99),
                    ms(stats.mean)
                );
            }
        }
        SshRow::Missing(why) => println!(
            "  ssh localhost true: not measured: {why}; install it with `{}`",
            sshd::INSTALL
        ),
        SshRow::Failed(e) => {
            println!("  ssh localhost true: FAILED (see stderr)");
            ssh_failed = Some(e.clone());
        }
    }
    println!(
        "  ratio of p50s gateway/direct: {:.2}",
        ms(gateway.p50) / ms(direct.p50)
    );
    if let SshRow::Measured {
        stats: ssh,
        login_shell,
        ..
    } = &ssh
    {
        println!(
            "  ratio of p50s gateway/ssh:    {:.2}",
            ms(gateway.p50) / ms(ssh.p50)
        );
        // The login shell's startup files (an rc that runs pyenv, say) are the user's, not
        // ssh's: the same ratio without them.
        println!(
            "  ratio of p50s gateway/(ssh - login shell + sh -c true): {:.2}",
            ms(gateway.p50) / (ms(ssh.p50) - ms(login_shell.p50) + ms(direct.p50))
        );
    }
    let delta = memory.after_kib as i64 - memory.before_kib as i64;
    println!(
        "gatewayd resident memory, {IDLE_CONNECTIONS} idle executor WebSocket connections ({}; RLIMIT_NOFILE {nofile})",
        memory.token_note
    );
    println!(
        "  VmRSS after start, 0 connections:      {:>8} KiB  ({} fds)",
        memory.before_kib, memory.fds_before
    );
    println!(
        "  VmRSS with {IDLE_CONNECTIONS} idle connections:     {:>8} KiB  ({} fds)",
        memory.after_kib, memory.fds_after
    );
    println!(
        "  per connection:                        {:>8.1} KiB",
        delta as f64 / IDLE_CONNECTIONS as f64
    );
    println!("reproduce: cargo bench --bench gateway_roundtrip -- {n}");
    if let Some(e) = ssh_failed {
        eprintln!("gateway_roundtrip: ssh localhost true: {e}");
        std::process::exit(1);
    }
}

enum SshRow {
    Measured {
        stats: Stats,
        /// The login shell run alone as sshd runs it (its startup files included).
        login_shell: Stats,
        shell: String,
    },
    /// A program the row needs is not installed: which.
    Missing(String),
    /// sshd is installed but the row could not be measured.
    Failed(String),
}

/// `ssh localhost true` through a master connection to a private sshd, and the login shell
/// alone as sshd starts it: [`WARMUP`] calls of each, then `n` timed ones, interleaved.
fn ssh_true(base: &Path, n: usize) -> SshRow {
    if let Some(why) = sshd::missing() {
        return SshRow::Missing(why);
    }
    let measured = (|| {
        let server = sshd::Sshd::start(base)?;
        for _ in 0..WARMUP {
            server.run_true()?;
            server.login_shell_true()?;
        }
        let (mut samples, mut shell_samples) = (Vec::with_capacity(n), Vec::with_capacity(n));
        // Interleaved, so both see the same load.
        for _ in 0..n {
            let started = Instant::now();
            server.run_true()?;
            samples.push(started.elapsed());
            let started = Instant::now();
            server.login_shell_true()?;
            shell_samples.push(started.elapsed());
        }
        Ok::<_, String>(SshRow::Measured {
            stats: stats(samples),
            login_shell: stats(shell_samples),
            shell: server.shell.clone(),
        })
    })();
    measured.unwrap_or_else(SshRow::Failed)
}
