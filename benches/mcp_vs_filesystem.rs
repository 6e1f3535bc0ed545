//! MCP `write_file` / `read_file` throughput: our endpoint against the reference filesystem MCP
//! server (`@modelcontextprotocol/server-filesystem` from npm, over stdio), side by side in one
//! run, on the same disk, with the same 4 KiB contents, 16-file rotation and operation count,
//! one client session each.
//!
//! What differs, by design:
//! - Ours: one HTTP/1.1 keep-alive connection to agentd's `/mcp` (stateless 2026-07-28 calls,
//!   the bearer token checked on every call); agentd resolves the workflow and the token's
//!   authority, then calls workspaced over its Unix socket. A write is guarded (its
//!   expected_revision must match), durable (the file and its folder are fsynced) and recorded:
//!   two SQLite receipts (prepared, applied) are committed per write.
//! - Reference: newline-delimited JSON-RPC over the child's stdin/stdout; a write is a plain
//!   write (temp file + rename when the file exists, no fsync, no revision check, no receipt).
//!
//! Ours should still not be slower; the ratios (ours/reference) are printed at the end.
//!
//! Run: `cargo bench --bench mcp_vs_filesystem -- 500` (writes and reads per server; default
//! 500, after 50 + 50 warm-up operations). The reference server, pinned by
//! `benches/mcp-reference/package-lock.json`, is installed once with `npm ci` into
//! `target/bench-mcp-node`; without it (no npm, no network) the benchmark fails, never guesses.
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
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const FILES: usize = 16;
const SIZE: usize = 4096;
const WARMUP: usize = 50;
/// Operations per turn when the two servers take turns.
const CHUNK: usize = 25;
const PROTOCOL: &str = "2026-07-28";

fn content(i: usize) -> String {
    let mut s = format!("write {i}\n");
    while s.len() < SIZE {
        s.push_str("agentworks MCP write benchmark line\n");
    }
    s.truncate(SIZE);
    s
}

/// One MCP server under test, driven synchronously by [`measure`].
trait Server {
    /// Replace (or create) `f<slot>.txt` with `content`; `seq` is unique per write.
    fn write(&mut self, slot: usize, content: &str, seq: usize);
    /// The content of `f<slot>.txt`.
    fn read(&mut self, slot: usize) -> String;
}

struct Figures {
    writes: Duration,
    reads: Duration,
}

/// Both servers do the same operations in the same order: warm-up (WARMUP writes, WARMUP
/// reads), then `ops` timed writes and `ops` timed reads, interleaved in chunks of CHUNK
/// operations (alternating which server goes first) so that load drifting during the run
/// weighs on both alike. Every read is checked against the content last written to that file.
fn measure(mut servers: [&mut dyn Server; 2], ops: usize) -> [Figures; 2] {
    let contents: Vec<String> = (0..WARMUP + ops).map(content).collect();
    let mut last = [usize::MAX; FILES];
    let write = |server: &mut dyn Server, range: std::ops::Range<usize>| {
        let started = Instant::now();
        for seq in range {
            server.write(seq % FILES, &contents[seq], seq);
        }
        started.elapsed()
    };
    let read = |server: &mut dyn Server, range: std::ops::Range<usize>, last: &[usize; FILES]| {
        let started = Instant::now();
        for i in range {
            let slot = i % FILES;
            let got = server.read(slot);
            assert!(
                got == contents[last[slot]],
                "read of f{slot}.txt returned {} bytes that are not the last write",
                got.len()
            );
        }
        started.elapsed()
    };
    let chunks = |range: std::ops::Range<usize>| {
        (range.start..range.end)
            .step_by(CHUNK)
            .map(move |from| from..(from + CHUNK).min(range.end))
            .enumerate()
    };
    let mut figures = [(); 2].map(|()| Figures {
        writes: Duration::ZERO,
        reads: Duration::ZERO,
    });
    for server in servers.iter_mut() {
        write(&mut **server, 0..WARMUP);
    }
    for seq in 0..WARMUP {
        last[seq % FILES] = seq;
    }
    for server in servers.iter_mut() {
        read(&mut **server, 0..WARMUP, &last);
    }
    for (n, range) in chunks(WARMUP..WARMUP + ops) {
        for k in [n % 2, 1 - n % 2] {
            figures[k].writes += write(&mut *servers[k], range.clone());
        }
        for seq in range {
            last[seq % FILES] = seq;
        }
    }
    for (n, range) in chunks(0..ops) {
        for k in [n % 2, 1 - n % 2] {
            figures[k].reads += read(&mut *servers[k], range.clone(), &last);
        }
    }
    figures
}

// ---------------------------------------------------------------------------------------------
// Ours: workspaced + agentd, one keep-alive HTTP/1.1 connection to /mcp.

/// Fields drop in order: the connection, then the stack.
struct Ours {
    sender: SendRequest<Full<Bytes>>,
    runtime: tokio::runtime::Runtime,
    port: u16,
    auth: String,
    workflow_id: String,
    revisions: Vec<String>,
    next_id: u64,
    _stack: common::stack::Stack,
}

impl Ours {
    /// One `tools/call` on the session's connection; the `structuredContent` of a success.
    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.next_id += 1;
        let body = json!({
            "jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
            "params": {
                "name": tool, "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                    "io.modelcontextprotocol/clientCapabilities": {}
                }
            }
        });
        let request = hyper::Request::post("/mcp")
            .header("host", format!("127.0.0.1:{}", self.port))
            .header("authorization", &self.auth)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", PROTOCOL)
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let sender = &mut self.sender;
        let (status, sse, bytes) = self.runtime.block_on(async {
            sender
                .ready()
                .await
                .expect("the /mcp connection closed: the session must stay on one connection");
            let response = sender.send_request(request).await.expect("send to /mcp");
            let status = response.status().as_u16();
            let sse = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status, sse, bytes)
        });
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(status, 200, "{tool}: HTTP {status}: {text}");
        let json_text = if sse {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            text.into_owned()
        };
        let reply: Value = serde_json::from_str(&json_text)
            .unwrap_or_else(|e| panic!("{tool}: not JSON ({e}): {json_text}"));
        let result = &reply["result"];
        assert!(
            result.is_object() && result["isError"] != true,
            "{tool} failed: {reply}"
        );
        result["structuredContent"].clone()
    }
}

impl Server for Ours {
    fn write(&mut self, slot: usize, content: &str, seq: usize) {
        let arguments = json!({
            "workflow_id": self.workflow_id, "path": format!("f{slot}.txt"), "content": content,
            "expected_revision": self.revisions[slot], "request_id": format!("bench-{seq}")
        });
        let written = self.call("write_file", arguments);
        self.revisions[slot] = written["revision"]
            .as_str()
            .unwrap_or_else(|| panic!("write_file returned no revision: {written}"))
            .to_owned();
    }

    fn read(&mut self, slot: usize) -> String {
        let arguments = json!({"workflow_id": self.workflow_id, "path": format!("f{slot}.txt")});
        let read = self.call("read_file", arguments);
        read["content"]
            .as_str()
            .unwrap_or_else(|| panic!("read_file returned no content: {read}"))
            .to_owned()
    }
}

fn start_ours(base: &Path) -> Ours {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stack = common::stack::start(base, 1, 1, &runtime);
    let port = stack.port;
    let sender = runtime.block_on(async {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        sender
    });
    Ours {
        sender,
        runtime,
        port,
        auth: stack.auth.clone(),
        workflow_id: stack.workflows[0].clone(),
        revisions: vec!["missing".to_owned(); FILES],
        next_id: 0,
        _stack: stack,
    }
}

// ---------------------------------------------------------------------------------------------
// Reference: @modelcontextprotocol/server-filesystem over stdio.

/// Fields drop in order: the pipes, the server, then its temp dir.
struct Reference {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    process: Process,
    dir: PathBuf,
    read_tool: &'static str,
    next_id: u64,
    line: String,
    work: tempfile::TempDir,
}

impl Reference {
    /// Start the server on a fresh temp dir under `base` and open the session.
    fn start(entry: &Path, base: &Path) -> Result<Reference, String> {
        let work = tempfile::Builder::new()
            .prefix("reference-")
            .tempdir_in(base)
            .unwrap();
        std::fs::create_dir_all(work.path().join("files")).unwrap();
        // The server compares real paths: hand it the canonical one.
        let dir = work.path().join("files").canonicalize().unwrap();
        let log =
            std::fs::File::create(work.path().join("server.stderr")).map_err(|e| e.to_string())?;
        let mut child = Command::new("node")
            .arg(entry)
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run node: {e}"))?;
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut reference = Reference {
            stdin,
            stdout,
            process: Process {
                name: "server-filesystem",
                child,
            },
            dir,
            read_tool: "read_text_file",
            next_id: 0,
            line: String::new(),
            work,
        };
        reference.open().map_err(|e| reference.with_log(e))?;
        Ok(reference)
    }

    /// `initialize`, `notifications/initialized`, and the read tool's name from `tools/list`.
    fn open(&mut self) -> Result<(), String> {
        let reference = self;
        reference.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "agentworks-bench", "version": env!("CARGO_PKG_VERSION")}
            }),
        )?;
        reference.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        let tools = reference.request("tools/list", json!({}))?;
        let names: Vec<&str> = tools["tools"]
            .as_array()
            .map(|ts| ts.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        if !names.contains(&"write_file") {
            return Err(format!("the reference has no write_file tool: {names:?}"));
        }
        reference.read_tool = if names.contains(&"read_text_file") {
            "read_text_file"
        } else if names.contains(&"read_file") {
            "read_file"
        } else {
            return Err(format!("the reference has no read tool: {names:?}"));
        };
        Ok(())
    }

    /// `error` followed by what the server wrote to its stderr.
    fn with_log(&self, error: String) -> String {
        let log =
            std::fs::read_to_string(self.work.path().join("server.stderr")).unwrap_or_default();
        format!("{error}\nreference server stderr:\n{log}")
    }

    fn send(&mut self, message: &Value) -> Result<(), String> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("writing to the reference server: {e}"))
    }

    /// One request; the `result` of its response (notifications in between are skipped).
    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        loop {
            self.line.clear();
            let n = self
                .stdout
                .read_line(&mut self.line)
                .map_err(|e| format!("reading from the reference server: {e}"))?;
            if n == 0 {
                return Err(format!(
                    "the reference server closed its stdout during {method}"
                ));
            }
            let Ok(message) = serde_json::from_str::<Value>(&self.line) else {
                continue;
            };
            if message["id"] != id {
                continue;
            }
            if !message["error"].is_null() {
                return Err(format!("{method} failed: {}", message["error"]));
            }
            return Ok(message["result"].clone());
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let result = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(result["isError"] != true, "{tool} failed: {result}");
        result
    }

    fn path(&self, slot: usize) -> String {
        self.dir.join(format!("f{slot}.txt")).display().to_string()
    }
}

impl Server for Reference {
    fn write(&mut self, slot: usize, content: &str, _seq: usize) {
        let arguments = json!({"path": self.path(slot), "content": content});
        self.call("write_file", arguments);
    }

    fn read(&mut self, slot: usize) -> String {
        let arguments = json!({"path": self.path(slot)});
        let result = self.call(self.read_tool, arguments);
        result["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{} returned no text: {result}", self.read_tool))
            .to_owned()
    }
}

fn main() {
    let ops: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(500);
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    // Same disk for both servers: temp dirs under the build's target dir.
    let base = target.join("bench-mcp");

    // The reference first: without it there is nothing to compare against.
    let installed = match common::reference::install(&target.join("bench-mcp-node")) {
        Ok(installed) => installed,
        Err(e) => {
            eprintln!("cannot install the reference MCP server: {e}");
            std::process::exit(1);
        }
    };

    std::fs::create_dir_all(&base).unwrap();
    let mut ours = start_ours(&base);
    let mut reference = match Reference::start(&installed.entry, &base) {
        Ok(reference) => reference,
        Err(e) => {
            eprintln!("the reference MCP server failed to start: {e}");
            drop(ours);
            let _ = std::fs::remove_dir(&base);
            std::process::exit(1);
        }
    };
    let [mine, theirs] = measure([&mut ours, &mut reference], ops);
    if let Some(status) = reference.process.exited() {
        let error = reference.with_log(format!("the reference server exited: {status}"));
        eprintln!("{error}");
        drop((ours, reference));
        let _ = std::fs::remove_dir(&base);
        std::process::exit(1);
    }
    drop(ours);
    drop(reference);
    let _ = std::fs::remove_dir(&base);

    let per_sec = |d: Duration| ops as f64 / d.as_secs_f64();
    let (ours_w, ours_r) = (per_sec(mine.writes), per_sec(mine.reads));
    let (ref_w, ref_r) = (per_sec(theirs.writes), per_sec(theirs.reads));
    println!(
        "MCP tools/call, 4 KiB files, {FILES}-file rotation, {ops} writes then {ops} reads per server \
         (after {WARMUP} + {WARMUP} warm-up; the servers take turns every {CHUNK} ops), one client \
         session each, same disk ({})",
        base.display()
    );
    println!("                                              write_file/s   read_file/s");
    println!("  agentworks /mcp (HTTP keep-alive, durable)  {ours_w:>12.1}  {ours_r:>12.1}");
    println!(
        "  server-filesystem {} (stdio)       {ref_w:>12.1}  {ref_r:>12.1}",
        installed.version
    );
    println!(
        "  ratio ours/reference                        {:>12.3}  {:>12.3}",
        ours_w / ref_w,
        ours_r / ref_r
    );
    println!("reproduce: cargo bench --bench mcp_vs_filesystem -- {ops}");
}
