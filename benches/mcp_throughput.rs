//! MCP throughput under concurrency, in one run on one filesystem: our `/mcp` (agentd →
//! workspaced, durable `write_file` and `read_file`) against the reference filesystem MCP
//! server over streamable HTTP, and against the disk's floor for a durable replace.
//!
//! - Ours: workspaced + agentd on a temp state root with 8 workflow projects. A Rust load
//!   generator (one thread, hyper HTTP/1.1 keep-alive, one request in flight per connection)
//!   sends stateless 2026-07-28 `tools/call` POSTs (the protocol version and client capabilities
//!   in `_meta`, the bearer token on every call). `write_file` creates a new 4 KiB file on every
//!   call (`expected_revision: "missing"`, a fresh request id); `read_file` reads one of 16
//!   4 KiB files written beforehand. 1, 4 and 16 connections in one project, and 8 projects
//!   in parallel with 1, 4 and 16 connections each. Bodies are built as text around contents
//!   escaped once, and replies read only as far as the check needs (see [`call`]): the
//!   generator shares the two cores with the servers.
//! - Reference: `@modelcontextprotocol/server-filesystem` (pinned in `benches/mcp-reference/`)
//!   on the TypeScript SDK's streamable HTTP transport, one initialised session shared by all
//!   connections (the SDK's stateless mode needs a server per request, which that server
//!   cannot make), JSON responses, driven the same way. Its write is a plain write (no fsync,
//!   no revision check, no receipt). It runs before ours and again after (a fresh server each
//!   time), and the better of the two counts, as for the floor: its rate moved by a tenth
//!   between runs, and a slow run of its own would flatter our ratios.
//! - Floor: write 4 KiB to a new temp file, fsync, rename, fsync the folder, in 1, 4 and 8
//!   threads (one folder each), next to the state root; before and after the servers, the
//!   better of the two runs counts (other load on the disk only ever slows it).
//! - A new empty file's cost, before the floor, before ours and before the floor after: every
//!   write makes a new file, and on ext4 without a journal (these machines' root filesystem)
//!   each new file's inode search passes over the inodes freed in the last 60–300 s. On a quiet
//!   filesystem a new file took ~40 µs of CPU; after a run's tree was deleted, 400–800 µs, and
//!   the 8-stream floor fell from ~7,300 to ~3,900/s. Nothing is deleted until the end (the
//!   stack's state root included), and a run within ~5 minutes of the last one's cleanup
//!   starts slowed: the probe line says so.
//! - The whole machine's CPU in each cell's measured window (`/proc/stat`, every process and
//!   the kernel): how many cores were busy, and the µs of CPU per operation. The last line
//!   turns 0.6× the 8-stream floor's rate into the most CPU a write of ours may use with every
//!   core busy, beside what one used.
//!
//! Each cell runs WARMUP, then MEASURE; ops/s counts the calls completed within MEASURE, and
//! p50/p99 are their latencies. A benchmark: nothing is asserted about timings; it exits
//! non-zero only when something fails to run (a daemon, npm, a call that errors).
//!
//! Run: `cargo bench --bench mcp_throughput` (optionally `-- 5` for the seconds per cell).
//! While working on one side, `-- 3 --writes-only` skips the reads (`--reads-only` the
//! writes) and `--no-reference` the
//! reference server (their ratios are then left out), `--eight-only` the cells of one
//! project, and `--in-flight N` every other number in flight (to profile one cell); the
//! closing numbers come from a full run. `--keep` leaves this run's files (in a folder of its
//! own under `target/bench-mcp-throughput`, which a run without it removes first), so that runs
//! back to back, to compare two builds, do not slow each other's new files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The test harness's daemon helpers; this benchmark uses part of them.
#[allow(dead_code)]
mod common;
#[allow(dead_code)]
#[path = "../tests/common/daemons.rs"]
mod daemons;
#[path = "../tests/common/ports.rs"]
mod ports;

use bytes::Bytes;
use daemons::Process;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SIZE: usize = 4096;
const READ_FILES: usize = 16;
const PROJECTS: usize = 8;
const IN_FLIGHT: [usize; 3] = [1, 4, 16];
const STREAMS: [usize; 3] = [1, 4, 8];
const WARMUP: Duration = Duration::from_millis(500);
const PROTOCOL: &str = "2026-07-28";
/// What the reference server is initialised with (its SDK predates 2026-07-28).
const REFERENCE_PROTOCOL: &str = "2025-06-18";

type Error = String;

// ---------------------------------------------------------------------------------------------
// The load generator.

/// How to reach one server's `/mcp` and what each call carries.
struct Endpoint {
    port: u16,
    /// Headers on every POST besides host, content-type and accept.
    headers: Vec<(&'static str, String)>,
    /// Ours: the 2026-07-28 `_meta` in every `tools/call`; the reference has a session.
    stateless_meta: bool,
}

/// JSON-RPC ids, unique across all connections (the reference's session needs that).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

async fn connect(port: u16) -> Result<SendRequest<Full<Bytes>>, Error> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
    stream.set_nodelay(true).unwrap();
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with 127.0.0.1:{port}: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// POST one JSON-RPC message (`body`, JSON text) to `/mcp`; the status, the response headers
/// and the JSON reply as bytes (an event stream's `data:` lines joined; empty for no body).
async fn post_raw(
    sender: &mut SendRequest<Full<Bytes>>,
    endpoint: &Endpoint,
    extra: &[(&str, &str)],
    body: String,
) -> Result<(u16, hyper::HeaderMap, Bytes), Error> {
    let mut request = hyper::Request::post("/mcp")
        .header("host", format!("127.0.0.1:{}", endpoint.port))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (name, value) in &endpoint.headers {
        request = request.header(*name, value);
    }
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::from(body))).unwrap();
    sender
        .ready()
        .await
        .map_err(|e| format!("the connection closed: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("POST /mcp: {e}"))?;
    let status = response.status().as_u16();
    let (parts, body) = response.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(|e| format!("reading the reply: {e}"))?
        .to_bytes();
    let sse = parts
        .headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let json = if sse {
        Bytes::from(
            String::from_utf8_lossy(&bytes)
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect::<Vec<_>>()
                .join("\n"),
        )
    } else {
        bytes
    };
    Ok((status, parts.headers, json))
}

/// [`post_raw`] with `body` a JSON value and the reply parsed (`Value::Null` for none): for
/// the few calls that set a server up.
async fn post(
    sender: &mut SendRequest<Full<Bytes>>,
    endpoint: &Endpoint,
    extra: &[(&str, &str)],
    body: &Value,
) -> Result<(u16, hyper::HeaderMap, Value), Error> {
    let (status, headers, json) = post_raw(sender, endpoint, extra, body.to_string()).await?;
    let reply = if json.trim_ascii().is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&json).map_err(|e| {
            let text = String::from_utf8_lossy(&json);
            format!("HTTP {status}, not JSON ({e}): {text}")
        })?
    };
    Ok((status, headers, reply))
}

/// A `tools/call` reply, read into the few fields the load generator checks (the rest is
/// skipped without building anything).
#[derive(serde::Deserialize)]
struct Reply<'a> {
    #[serde(borrow, default)]
    result: Option<CallResult<'a>>,
}

#[derive(serde::Deserialize)]
struct CallResult<'a> {
    #[serde(rename = "isError", default)]
    is_error: bool,
    /// Ours: `read_file` answers its content here.
    #[serde(rename = "structuredContent", borrow, default)]
    structured_content: Option<StructuredContent<'a>>,
    /// The reference: `read_text_file` answers its content in the first block's text.
    #[serde(borrow, default)]
    content: Vec<ContentBlock<'a>>,
}

#[derive(serde::Deserialize)]
struct StructuredContent<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct ContentBlock<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

/// One `tools/call` of `tool` with `arguments` (JSON text), whose result must not be an
/// error and must pass `check`.
///
/// The body is built as text around the arguments and the reply read into [`Reply`], not
/// through `serde_json::Value`: the load generator shares the machine's two cores with the
/// servers, and building a `Value` for every request and parsing every reply into one cost
/// it about 48 µs of CPU per write in its own code at 8 projects, 16 in flight (this way,
/// about 28), which the issue's own load generator (`wrk`) never spent.
async fn call(
    sender: &mut SendRequest<Full<Bytes>>,
    endpoint: &Endpoint,
    tool: &str,
    arguments: &str,
    check: impl FnOnce(&CallResult<'_>) -> Result<(), Error>,
) -> Result<(), Error> {
    // The same for every call of ours: made once.
    static STATELESS_META: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            r#","_meta":{{"io.modelcontextprotocol/protocolVersion":"{PROTOCOL}","io.modelcontextprotocol/clientCapabilities":{{}}}}"#
        )
    });
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let meta = if endpoint.stateless_meta {
        STATELESS_META.as_str()
    } else {
        ""
    };
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":{tool},"arguments":{arguments}{meta}}}}}"#,
        tool = json_text(tool),
    );
    let extra: &[(&str, &str)] = if endpoint.stateless_meta {
        &[("mcp-method", "tools/call"), ("mcp-name", tool)]
    } else {
        &[]
    };
    let (status, _, json) = post_raw(sender, endpoint, extra, body).await?;
    let refused = |why: &str| {
        let text = String::from_utf8_lossy(&json);
        format!("{tool}: HTTP {status}: {why}: {text}")
    };
    let reply: Reply<'_> =
        serde_json::from_slice(&json).map_err(|e| refused(&format!("not a reply ({e})")))?;
    match reply.result {
        Some(result) if status == 200 && !result.is_error => {
            check(&result).map_err(|e| refused(&e))
        }
        _ => Err(refused("no result, or an error")),
    }
}

/// `value` as JSON text (a string, quoted and escaped).
fn json_text(value: impl serde::Serialize) -> String {
    serde_json::to_string(&value).unwrap()
}

/// What one connection does, call after call.
#[derive(Clone, Copy)]
enum Op {
    Write,
    Read,
}

/// One server under load: which tool, with which arguments, and how to check the reply.
trait Target: Send + Sync {
    fn endpoint(&self) -> &Endpoint;
    /// The tool of call `seq` of connection `conn` in cell `cell`, and its arguments as JSON
    /// text.
    fn request(&self, op: Op, cell: usize, conn: usize, seq: u64) -> (&'static str, String);
    /// The content a `read_file` result carries.
    fn read_content<'r>(&self, result: &'r CallResult<'_>) -> Option<&'r str>;
}

struct Sample {
    latencies: Vec<Duration>,
    window: Duration,
    /// Every call completed, the warm-up's included.
    calls: u64,
    /// The whole machine's busy CPU time in the window (see [`machine_busy`]).
    busy: Duration,
}

impl Sample {
    fn per_sec(&self) -> f64 {
        self.latencies.len() as f64 / self.window.as_secs_f64()
    }

    /// Cores the whole machine kept busy in the window, on average.
    fn cores_busy(&self) -> f64 {
        self.busy.as_secs_f64() / self.window.as_secs_f64()
    }

    /// The whole machine's CPU per operation completed in the window, in µs: the servers',
    /// the kernel's and the load generator's (or the floor loop's) together.
    fn machine_us_per_op(&self) -> f64 {
        self.busy.as_secs_f64() * 1e6 / self.latencies.len().max(1) as f64
    }

    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }
}

/// `connections` connections, each with one call in flight, doing `op` for WARMUP then
/// `measure`.
fn load(
    runtime: &tokio::runtime::Runtime,
    target: Arc<dyn Target>,
    op: Op,
    cell: usize,
    connections: usize,
    measure: Duration,
) -> Result<Sample, Error> {
    let expected = common::content(0, SIZE);
    runtime.block_on(async {
        let mut senders = Vec::new();
        for _ in 0..connections {
            senders.push(connect(target.endpoint().port).await?);
        }
        let from = Instant::now() + WARMUP;
        let until = from + measure;
        let busy = machine_busy_between(from, until);
        let tasks: Vec<_> = senders
            .into_iter()
            .enumerate()
            .map(|(conn, mut sender)| {
                let target = Arc::clone(&target);
                let expected = expected.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut seq = 0u64;
                    let mut calls = 0u64;
                    loop {
                        let began = Instant::now();
                        if began >= until {
                            break;
                        }
                        seq += 1;
                        let (tool, arguments) = target.request(op, cell, conn, seq);
                        let check = |result: &CallResult<'_>| match op {
                            Op::Read if target.read_content(result) != Some(expected.as_str()) => {
                                Err("other content".to_owned())
                            }
                            _ => Ok(()),
                        };
                        call(&mut sender, target.endpoint(), tool, &arguments, check).await?;
                        let done = Instant::now();
                        calls += 1;
                        if done >= from && done <= until {
                            latencies.push(done - began);
                        }
                    }
                    Ok::<_, Error>((latencies, calls))
                })
            })
            .collect();
        let mut latencies = Vec::new();
        let mut calls = 0;
        for task in tasks {
            let (done, n) = task
                .await
                .map_err(|e| format!("a connection panicked: {e}"))??;
            latencies.extend(done);
            calls += n;
        }
        Ok(Sample {
            latencies,
            window: measure,
            calls,
            busy: joined(busy)?,
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Ours.

struct Ours {
    endpoint: Endpoint,
    /// The workflows the connections spread over (connection k → workflows[k % len]), as
    /// JSON text.
    workflows: Vec<String>,
    /// The contents written, as JSON text (escaped once, here).
    content: Vec<String>,
}

impl Ours {
    fn new(endpoint: Endpoint, workflows: &[String], content: &[String]) -> Ours {
        Ours {
            endpoint,
            workflows: workflows.iter().map(json_text).collect(),
            content: content.iter().map(json_text).collect(),
        }
    }
}

impl Target for Ours {
    fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn request(&self, op: Op, cell: usize, conn: usize, seq: u64) -> (&'static str, String) {
        let workflow = &self.workflows[conn % self.workflows.len()];
        match op {
            Op::Write => (
                "write_file",
                format!(
                    r#"{{"workflow_id":{workflow},"path":"t{cell}-c{conn}-{seq}.txt","content":{},"expected_revision":"missing","request_id":"bench-{cell}-{conn}-{seq}"}}"#,
                    self.content[seq as usize % self.content.len()],
                ),
            ),
            Op::Read => (
                "read_file",
                format!(
                    r#"{{"workflow_id":{workflow},"path":"r{}.txt"}}"#,
                    (conn / self.workflows.len()) % READ_FILES
                ),
            ),
        }
    }

    fn read_content<'r>(&self, result: &'r CallResult<'_>) -> Option<&'r str> {
        result.structured_content.as_ref()?.content.as_deref()
    }
}

// ---------------------------------------------------------------------------------------------
// The reference.

struct Reference {
    endpoint: Endpoint,
    /// The canonical folder it serves.
    dir: PathBuf,
    /// The contents written, as JSON text (escaped once, here).
    content: Vec<String>,
}

impl Target for Reference {
    fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn request(&self, op: Op, cell: usize, conn: usize, seq: u64) -> (&'static str, String) {
        match op {
            Op::Write => (
                "write_file",
                format!(
                    r#"{{"path":{},"content":{}}}"#,
                    json_text(self.dir.join(format!("t{cell}-c{conn}-{seq}.txt"))),
                    self.content[seq as usize % self.content.len()],
                ),
            ),
            Op::Read => (
                "read_text_file",
                format!(
                    r#"{{"path":{}}}"#,
                    json_text(self.dir.join(format!("r{}.txt", conn % READ_FILES)))
                ),
            ),
        }
    }

    fn read_content<'r>(&self, result: &'r CallResult<'_>) -> Option<&'r str> {
        result.content.first()?.text.as_deref()
    }
}

/// The reference server on streamable HTTP, serving a fresh folder under `base`; the process
/// and the folder (dropped in that order).
fn start_reference(
    installed: &common::reference::Installed,
    base: &Path,
    runtime: &tokio::runtime::Runtime,
    content: Vec<String>,
) -> Result<(Reference, Process, tempfile::TempDir), Error> {
    let work = tempfile::Builder::new()
        .prefix("reference-")
        .tempdir_in(base)
        .unwrap();
    std::fs::create_dir_all(work.path().join("files")).unwrap();
    // The server compares real paths: hand it the canonical one.
    let dir = work.path().join("files").canonicalize().unwrap();
    let log_path = work.path().join("server.stderr");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let port = ports::free_port();
    let register = url::Url::from_file_path(&installed.register).unwrap();
    let child = Command::new("node")
        .arg("--import")
        .arg(register.as_str())
        .arg(&installed.entry)
        .arg(&dir)
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot run node: {e}"))?;
    let mut process = Process {
        name: "server-filesystem",
        child,
    };
    let with_log = |e: String| {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        format!("{e}\nreference server stderr:\n{log}")
    };
    // Initialise one session (retrying until it listens); every connection then uses it.
    let session = runtime.block_on(async {
        let endpoint = Endpoint {
            port,
            headers: Vec::new(),
            stateless_meta: false,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut sender = loop {
            match connect(port).await {
                Ok(sender) => break sender,
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => {
                    if let Some(status) = process.exited() {
                        return Err(format!("the reference server exited: {status}"));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let initialize = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": REFERENCE_PROTOCOL, "capabilities": {},
                "clientInfo": {"name": "agentworks-bench", "version": env!("CARGO_PKG_VERSION")}
            }
        });
        let (status, headers, reply) = post(&mut sender, &endpoint, &[], &initialize).await?;
        let session = headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| format!("initialize: HTTP {status}, no session: {reply}"))?;
        let version = reply["result"]["protocolVersion"]
            .as_str()
            .unwrap_or(REFERENCE_PROTOCOL)
            .to_owned();
        let endpoint = Endpoint {
            port,
            headers: vec![
                ("mcp-session-id", session.clone()),
                ("mcp-protocol-version", version.clone()),
            ],
            stateless_meta: false,
        };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let (status, _, _) = post(&mut sender, &endpoint, &[], &initialized).await?;
        if status != 202 && status != 200 {
            return Err(format!("notifications/initialized: HTTP {status}"));
        }
        Ok((session, version))
    });
    let (session, version) = session.map_err(with_log)?;
    let reference = Reference {
        endpoint: Endpoint {
            port,
            headers: vec![
                ("mcp-session-id", session),
                ("mcp-protocol-version", version),
            ],
            stateless_meta: false,
        },
        dir,
        content: content.iter().map(json_text).collect(),
    };
    Ok((reference, process, work))
}

// ---------------------------------------------------------------------------------------------

/// Write the files that connections `0..READ_FILES * workflows` read (`r0.txt` … in each
/// workflow, each the content of write 0), through `target`.
fn prepare_reads(
    runtime: &tokio::runtime::Runtime,
    target: &dyn Target,
    workflows: usize,
) -> Result<(), Error> {
    let content = common::content(0, SIZE);
    runtime.block_on(async {
        let mut sender = connect(target.endpoint().port).await?;
        for conn in 0..READ_FILES * workflows {
            let (_, write) = target.request(Op::Write, 0, conn, 0);
            let (_, read) = target.request(Op::Read, 0, conn, 0);
            let mut arguments: Value = serde_json::from_str(&write).unwrap();
            let read: Value = serde_json::from_str(&read).unwrap();
            // Same folder, same workflow as the reads of connection `conn`.
            arguments["path"] = read["path"].clone();
            arguments["content"] = json!(content);
            if let Some(id) = arguments.get_mut("request_id") {
                *id = json!(format!("bench-read-{conn}"));
            }
            let arguments = arguments.to_string();
            call(
                &mut sender,
                target.endpoint(),
                "write_file",
                &arguments,
                |_| Ok(()),
            )
            .await?;
        }
        Ok(())
    })
}

struct Row {
    label: String,
    in_flight: usize,
    sample: Sample,
    /// Ours: CPU µs per call of agentd and of workspaced (user + system, warm-up included).
    cpu: Option<(f64, f64)>,
}

/// `ticks` of the kernel's clock (`USER_HZ`, what `/proc` counts CPU time in) as a duration.
fn clock_ticks(ticks: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

/// The whole machine's busy CPU time so far, every core summed: user, nice, system, irq,
/// softirq and steal from the first line of `/proc/stat` (Linux); idle and iowait are not busy.
/// Per operation, it says what one costs the machine (the floor's and ours alike), and how
/// close a cell came to using every core.
fn machine_busy() -> Result<Duration, Error> {
    let stat = std::fs::read_to_string("/proc/stat")
        .map_err(|e| format!("cannot read /proc/stat: {e}"))?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .ok_or("/proc/stat does not start with the machine's cpu line")?
        .split_whitespace()
        .map(|field| field.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal …; guest time is inside user already.
    let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = ticks[..] else {
        return Err("/proc/stat's cpu line has fewer than 8 fields".to_owned());
    };
    Ok(clock_ticks(user + nice + system + irq + softirq + steal))
}

/// [`machine_busy`] from `from` to `until`, measured on a thread of its own (joined with
/// [`joined`]), so the window is the cell's own and not its warm-up.
fn machine_busy_between(
    from: Instant,
    until: Instant,
) -> std::thread::JoinHandle<Result<Duration, Error>> {
    std::thread::spawn(move || {
        std::thread::sleep(from.saturating_duration_since(Instant::now()));
        let before = machine_busy()?;
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        Ok(machine_busy()?.saturating_sub(before))
    })
}

/// The busy time a [`machine_busy_between`] thread measured.
fn joined(busy: std::thread::JoinHandle<Result<Duration, Error>>) -> Result<Duration, Error> {
    busy.join()
        .map_err(|_| "the machine's CPU sampler panicked".to_owned())?
}

/// A process's user + system CPU time so far, from `/proc/<pid>/stat` (Linux).
fn cpu_time(pid: u32) -> Result<Duration, Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("cannot read /proc/{pid}/stat: {e}"))?;
    // After the command's `(…)`: fields 3 on; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let (Some(utime), Some(stime)) = (ticks(11), ticks(12)) else {
        return Err(format!("/proc/{pid}/stat has no CPU times"));
    };
    Ok(clock_ticks(utime + stime))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn run() -> Result<(), Error> {
    let seconds: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3.0);
    let measure = Duration::from_secs_f64(seconds);
    let selection = Selection {
        reads: !std::env::args().any(|a| a == "--writes-only"),
        writes: !std::env::args().any(|a| a == "--reads-only"),
        reference: !std::env::args().any(|a| a == "--no-reference"),
        one_project: !std::env::args().any(|a| a == "--eight-only"),
        in_flight: std::env::args()
            .skip_while(|a| a != "--in-flight")
            .nth(1)
            .and_then(|n| n.parse().ok()),
    };
    let keep = std::env::args().any(|a| a == "--keep");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    // One filesystem for all three: temp dirs under the build's target dir.
    let bench_dir = target.join("bench-mcp-throughput");
    if !keep {
        let _ = std::fs::remove_dir_all(&bench_dir);
    }
    std::fs::create_dir_all(&bench_dir).unwrap();
    // With `--keep`, a folder of this run's own beside the kept ones, left at the end.
    let base = if keep {
        tempfile::Builder::new()
            .prefix("run-")
            .tempdir_in(&bench_dir)
            .unwrap()
            .keep()
    } else {
        bench_dir.clone()
    };
    let base = base.canonicalize().unwrap();
    let result = measure_all(&target, &base, measure, selection);
    if keep {
        println!(
            "kept {} (remove {} when done; a new file is slower for ~5 minutes after)",
            base.display(),
            bench_dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&base);
    }
    result
}

/// Which parts of a full run to measure.
#[derive(Clone, Copy)]
struct Selection {
    reads: bool,
    /// The write cells (`--reads-only` skips them).
    writes: bool,
    reference: bool,
    /// The cells of one project (`--eight-only` skips them).
    one_project: bool,
    /// Only this many in flight (`--in-flight N`), for profiling one cell.
    in_flight: Option<usize>,
}

fn measure_all(
    target: &Path,
    base: &Path,
    measure: Duration,
    selection: Selection,
) -> Result<(), Error> {
    let installed = common::reference::install(&target.join("bench-mcp-node"))
        .map_err(|e| format!("cannot install the reference MCP server: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let contents: Vec<String> = (0..64).map(|i| common::content(i, SIZE)).collect();
    let mut rows: Vec<Row> = Vec::new();
    let mut cell = 0usize;

    // The floor first, while nothing else of ours runs, and the reference; both again at
    // the end.
    let mut allocator = vec![("before the floor", create_cost(base, 0)?)];
    let floor_before = floor(base, measure)?;
    let reference_before = if selection.reference {
        reference_rows(&installed, base, &runtime, &contents, measure, selection)?
    } else {
        Vec::new()
    };

    // Ours.
    let mut stack = common::stack::start(base, PROJECTS, PROJECTS * IN_FLIGHT[2] + 8, &runtime);
    // The stack's files go with the base at the end: deleted here, their freed inodes would
    // slow every new file of the floor after ours ([`common::floor::create_cost`]).
    stack.state.disable_cleanup(true);
    allocator.push(("before ours", create_cost(base, 1)?));
    let endpoint = || Endpoint {
        port: stack.port,
        headers: vec![
            ("authorization", stack.auth.clone()),
            ("mcp-protocol-version", PROTOCOL.to_owned()),
        ],
        stateless_meta: true,
    };
    let one: Arc<dyn Target> = Arc::new(Ours::new(endpoint(), &stack.workflows[..1], &contents));
    let eight: Arc<dyn Target> = Arc::new(Ours::new(endpoint(), &stack.workflows, &contents));
    prepare_reads(&runtime, &*eight, PROJECTS)?;
    for (label, target, per_project) in [
        ("ours, 1 project", &one, 1),
        ("ours, 8 projects", &eight, PROJECTS),
    ] {
        if per_project == 1 && !selection.one_project {
            continue;
        }
        for (op, tool) in [(Op::Write, "write_file"), (Op::Read, "read_file")] {
            if matches!(op, Op::Read) && !selection.reads
                || matches!(op, Op::Write) && !selection.writes
            {
                continue;
            }
            for in_flight in IN_FLIGHT {
                cell += 1;
                if selection.in_flight.is_some_and(|n| n != in_flight) {
                    continue;
                }
                let pids = [stack.agentd.pid(), stack.workspaced.pid()];
                let before = pids.map(cpu_time);
                let sample = load(
                    &runtime,
                    Arc::clone(target),
                    op,
                    cell,
                    in_flight * per_project,
                    measure,
                )
                .map_err(|e| format!("{label} {tool} at {in_flight} in flight: {e}"))?;
                let per_call = |(before, pid): (Result<Duration, Error>, u32)| {
                    Ok::<_, Error>(
                        (cpu_time(pid)? - before?).as_secs_f64() * 1e6 / sample.calls.max(1) as f64,
                    )
                };
                let [agentd, workspaced] = [0, 1].map(|i| per_call((before[i].clone(), pids[i])));
                rows.push(Row {
                    label: format!("{label}, {tool}"),
                    in_flight,
                    cpu: Some((agentd?, workspaced?)),
                    sample,
                });
            }
        }
    }
    for process in [&mut stack.agentd, &mut stack.workspaced] {
        if let Some(status) = process.exited() {
            return Err(format!("{} exited during the run: {status}", process.name));
        }
    }
    drop(stack);

    // The reference, the better of a run before ours and one after (as the floor), so a
    // slow moment of its own does not flatter our ratios.
    if selection.reference {
        let after = reference_rows(&installed, base, &runtime, &contents, measure, selection)?;
        rows.extend(better_of(reference_before, after));
    }

    allocator.push(("before the floor after ours", create_cost(base, 2)?));
    let floor_after = floor(base, measure)?;
    let mut all = better_of(floor_before, floor_after);
    all.extend(rows);
    report(&all, &allocator, base, measure);
    Ok(())
}

/// Each row of `before` or the same cell of `after`, whichever was faster.
fn better_of(before: Vec<Row>, after: Vec<Row>) -> Vec<Row> {
    before
        .into_iter()
        .zip(after)
        .map(|(before, after)| {
            if before.sample.per_sec() >= after.sample.per_sec() {
                before
            } else {
                after
            }
        })
        .collect()
}

/// The reference server's cells, on a server started for them (and stopped after).
fn reference_rows(
    installed: &common::reference::Installed,
    base: &Path,
    runtime: &tokio::runtime::Runtime,
    contents: &[String],
    measure: Duration,
    selection: Selection,
) -> Result<Vec<Row>, Error> {
    let mut rows = Vec::new();
    let mut cell = 0usize; // the server's files are new with each server
    let (reference, mut process, work) =
        start_reference(installed, base, runtime, contents.to_vec())?;
    let reference: Arc<dyn Target> = Arc::new(reference);
    let log = work.path().join("server.stderr");
    let with_log = |e: String| {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        format!("{e}\nreference server stderr:\n{log}")
    };
    prepare_reads(runtime, &*reference, 1).map_err(with_log)?;
    for (op, tool) in [(Op::Write, "write_file"), (Op::Read, "read_text_file")] {
        if matches!(op, Op::Read) && !selection.reads
            || matches!(op, Op::Write) && !selection.writes
        {
            continue;
        }
        for in_flight in IN_FLIGHT {
            cell += 1;
            let sample = load(
                runtime,
                Arc::clone(&reference),
                op,
                cell,
                in_flight,
                measure,
            )
            .map_err(|e| with_log(format!("reference {tool} at {in_flight} in flight: {e}")))?;
            rows.push(Row {
                label: format!("reference {}, {tool}", installed.version),
                in_flight,
                sample,
                cpu: None,
            });
        }
    }
    if let Some(status) = process.exited() {
        return Err(with_log(format!("the reference server exited: {status}")));
    }
    drop(process);
    drop(work);
    Ok(rows)
}

/// The floor loop with 1, 4 and 8 streams (each in a fresh folder under `base/floor`).
fn floor(base: &Path, measure: Duration) -> Result<Vec<Row>, Error> {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let content = common::content(1, SIZE);
    let mut rows = Vec::new();
    for streams in STREAMS {
        // A moment for the threads to be ready, then the warm-up, then the measured window.
        let start = Instant::now() + Duration::from_millis(20);
        let busy = machine_busy_between(start + WARMUP, start + WARMUP + measure);
        let latencies = common::floor::timed_streams(
            &base.join(format!("floor/run{run}-x{streams}")),
            streams,
            content.as_bytes(),
            start,
            WARMUP,
            measure,
        )
        .map_err(|e| format!("the floor loop failed: {e}"))?;
        rows.push(Row {
            label: format!("floor: write+fsync+rename+fsync dir, {streams} stream(s)"),
            in_flight: streams,
            sample: Sample {
                latencies,
                window: measure,
                calls: 0,
                busy: joined(busy)?,
            },
            cpu: None,
        });
    }
    Ok(rows)
}

/// The mean time to make a new empty file in a new folder under `base`, the `n`th probe.
fn create_cost(base: &Path, n: usize) -> Result<Duration, Error> {
    common::floor::create_cost(&base.join(format!("create-probe-{n}")), 500)
        .map_err(|e| format!("the file creation probe failed: {e}"))
}

fn report(rows: &[Row], allocator: &[(&str, Duration)], base: &Path, measure: Duration) {
    println!(
        "MCP throughput, 4 KiB files, {:.1} s per cell after {:.1} s warm-up, same filesystem ({})",
        measure.as_secs_f64(),
        WARMUP.as_secs_f64(),
        base.display()
    );
    println!(
        "ours: stateless {PROTOCOL} POSTs to agentd /mcp, write_file = new durable file; \
         reference: server-filesystem on the TypeScript SDK's streamable HTTP (one session, \
         no fsync); 8 projects: that many connections per project; floor and reference: the \
         better of a run before ours and one after"
    );
    let probes: Vec<String> = allocator
        .iter()
        .map(|(when, cost)| format!("{when} {:.0}", cost.as_secs_f64() * 1e6))
        .collect();
    println!(
        "a new empty file, µs (ext4 without a journal passes over inodes freed in the last \
         minutes; see create_cost): {}",
        probes.join(", ")
    );
    println!();
    println!(
        "| {:<58} | {:>9} | {:>9} | {:>8} | {:>8} | {:>21} | {:>13} | {:>10} |",
        "cell",
        "in flight",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "CPU µs/call agentd+ws",
        "machine µs/op",
        "cores busy"
    );
    println!(
        "| {:-<58} | {:->9} | {:->9} | {:->8} | {:->8} | {:->21} | {:->13} | {:->10} |",
        "", "", "", "", "", "", "", ""
    );
    for row in rows {
        let cpu = row.cpu.map_or(String::new(), |(agentd, workspaced)| {
            format!("{agentd:.0} + {workspaced:.0} = {:.0}", agentd + workspaced)
        });
        println!(
            "| {:<58} | {:>9} | {:>9.0} | {:>8.2} | {:>8.2} | {:>21} | {:>13.0} | {:>10.2} |",
            row.label,
            row.in_flight,
            row.sample.per_sec(),
            ms(row.sample.percentile(0.50)),
            ms(row.sample.percentile(0.99)),
            cpu,
            row.sample.machine_us_per_op(),
            row.sample.cores_busy(),
        );
    }
    // The row whose label starts with `prefix` and ends with `suffix`, and its ops/s.
    let find = |prefix: &str, suffix: &str, in_flight: usize| {
        rows.iter().find(|r| {
            r.label.starts_with(prefix) && r.label.ends_with(suffix) && r.in_flight == in_flight
        })
    };
    let rate = |prefix: &str, suffix: &str, in_flight: usize| {
        find(prefix, suffix, in_flight).map_or(f64::NAN, |r| r.sample.per_sec())
    };
    let floor1 = rate("floor", "", 1);
    let floor8 = rate("floor", "", 8);
    let reference_write = |n| rate("reference", "write_file", n);
    let reference_read = |n| rate("reference", "read_text_file", n);
    let ours = |label: &str, n| rate(label, "", n);
    println!();
    println!(
        "| {:<62} | {:>9} | {:>7} | {:>6} |",
        "ratio", "in flight", "value", "goal"
    );
    println!("| {:-<62} | {:->9} | {:->7} | {:->6} |", "", "", "", "");
    let line = |name: &str, n: usize, value: f64, goal: &str| {
        // A ratio of a cell this run skipped is left out.
        if value.is_nan() {
            return;
        }
        println!("| {name:<62} | {n:>9} | {value:>7.3} | {goal:>6} |");
    };
    for n in IN_FLIGHT {
        line(
            "ours write_file, 1 project / floor, 1 stream",
            n,
            ours("ours, 1 project, write_file", n) / floor1,
            if n == 16 { "≥ 1.0" } else { "" },
        );
    }
    for n in IN_FLIGHT {
        line(
            "ours write_file, 1 project / reference write_file",
            n,
            ours("ours, 1 project, write_file", n) / reference_write(n),
            if n == 16 { "≥ 2.0" } else { "" },
        );
    }
    for n in IN_FLIGHT {
        line(
            "ours write_file, 8 projects / (0.6 × floor, 8 streams)",
            n,
            ours("ours, 8 projects, write_file", n) / (0.6 * floor8),
            "≥ 1.0",
        );
    }
    for n in IN_FLIGHT {
        line(
            "ours read_file, 1 project / (3 × reference read_text_file)",
            n,
            ours("ours, 1 project, read_file", n) / (3.0 * reference_read(n)),
            if n == 16 { "≥ 1.0" } else { "" },
        );
    }
    // What the eight-project goal asks of each write, in the machine's CPU: 0.6× the floor's
    // rate, with every core busy, is at most this much CPU per write for everything ours runs
    // (the load generator included).
    if let (Some(floor), Some(eight)) = (
        find("floor", "", 8),
        find("ours, 8 projects, write_file", "", IN_FLIGHT[2]),
    ) {
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        let goal = 0.6 * floor.sample.per_sec();
        println!();
        println!(
            "the machine's CPU: the 8-stream floor kept {:.2} of {cores} cores busy at {:.0} µs \
             per replace; 0.6 × its rate, {goal:.0} writes/s, leaves at most {:.0} µs per write \
             with every core busy; ours, 8 projects at {} in flight, kept {:.2} busy at {:.0} µs \
             per write",
            floor.sample.cores_busy(),
            floor.sample.machine_us_per_op(),
            cores as f64 * 1e6 / goal,
            IN_FLIGHT[2],
            eight.sample.cores_busy(),
            eight.sample.machine_us_per_op(),
        );
    }
    println!();
    println!(
        "reproduce: cargo bench --bench mcp_throughput -- {}",
        measure.as_secs_f64()
    );
}

fn main() {
    if let Err(e) = run() {
        eprintln!("mcp_throughput: {e}");
        std::process::exit(1);
    }
}
