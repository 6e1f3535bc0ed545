//! Power-loss suites: workspaced's state root and project folders on the power-cut FUSE
//! filesystem (`harness/powercut_fs.rs`), which keeps only what was synced when the power is
//! cut. A `kill -9` (the crash suite) keeps everything the kernel already accepted; this is
//! the stronger test of the write path's fsyncs, renames, folder syncs and SQLite's WAL.
//!
//! First the filesystem itself is tested against real system calls (so that a pass below
//! means something): unsynced data, an unsynced rename and an unsynced new entry are lost at
//! a cut, synced ones survive. Then workspaced under a stream of writes to several projects
//! (with conflicts between writers and replays of answered requests) has its power cut at
//! random points, is restarted and reconciles, and every acknowledged write, every file and
//! every receipt is checked against the disk.
//!
//! `AGENTWORKS_POWERCUT_CUTS` sets the number of cuts (CI: [`CI_CUTS`]);
//! `AGENTWORKS_POWERCUT_SEED` replays a run (the seed is printed at the start and on failure;
//! thread interleavings still vary, the contents, sizes and cut delays do not). A machine
//! without `/dev/fuse` fails these tests, saying so: it never skips them.

use super::harness::*;
use agentworks_contract::executor::{
    ExecutorFrame, GatewayFrame, Operation, Outcome as ExecOutcome,
};
use agentworks_contract::workspaced::Context;
use agentworks_support::unix_http::{ClientError, UnixClient};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Cuts in a CI run (one run takes well under a minute on the 2-core CI machine).
const CI_CUTS: usize = 25;

/// The power-cut filesystem mounted over a fresh [`StateRoot`], with the root's set-up (the
/// config, `documents/`) recreated on it and made durable. Fields drop in order: the daemon
/// first, then the filesystem (unmounted), then the temp dirs.
struct PowerRig {
    daemon: Option<Workspaced>,
    fs: PowercutFs,
    state: StateRoot,
    /// workspaced's socket lives here, off the cut filesystem (as `/run` is a tmpfs).
    run: tempfile::TempDir,
}

impl PowerRig {
    fn new() -> PowerRig {
        let state = StateRoot::new();
        let fs = PowercutFs::mount(state.root()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(state.documents()).unwrap();
        std::fs::write(state.root().join("agentworks.toml"), "").unwrap();
        fs.sync_all();
        PowerRig {
            daemon: None,
            fs,
            state,
            run: tempfile::tempdir().unwrap(),
        }
    }

    fn options(&self) -> Options {
        Options {
            socket: Some(self.run.path().join("workspaced.sock")),
            ..Options::default()
        }
    }

    fn start(&mut self) -> Client {
        let daemon = Workspaced::start_with(&self.state, self.options());
        let client = daemon.client();
        self.daemon = Some(daemon);
        client
    }

    /// Cut the power, kill workspaced, bring the power back (remounted, unsynced changes gone).
    fn cut(&mut self) {
        self.fs.cut();
        if let Some(mut daemon) = self.daemon.take() {
            daemon.kill();
        }
        self.fs
            .restore_power()
            .unwrap_or_else(|e| panic!("restoring power: {e}"));
    }
}

/// Write `content` to `path` and fsync it (or not), through the kernel.
fn write_file(path: &Path, content: &[u8], sync: bool) {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)
        .unwrap();
    file.write_all(content).unwrap();
    if sync {
        file.sync_all().unwrap();
    }
}

fn sync_dir(path: &Path) {
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

// ----- the filesystem itself -----

#[test]
fn the_filesystem_keeps_exactly_what_was_synced() {
    let mount = tempfile::tempdir().unwrap();
    let mut fs = PowercutFs::mount(mount.path()).unwrap_or_else(|e| panic!("{e}"));
    let root = mount.path();
    std::fs::create_dir(root.join("dir")).unwrap();
    write_file(&root.join("dir/kept.txt"), b"old", false);
    write_file(&root.join("dir/overwritten.txt"), b"old", false);
    write_file(&root.join("dir/renamed.txt"), b"old", false);
    fs.sync_all();

    // Data written without a sync: gone. Data synced: kept, although its folder never was.
    write_file(
        &root.join("dir/overwritten.txt"),
        b"new, never synced",
        false,
    );
    write_file(&root.join("dir/kept.txt"), b"new, synced", true);
    // A rename with its file synced but not its folder: undone.
    std::fs::rename(root.join("dir/renamed.txt"), root.join("dir/moved.txt")).unwrap();
    // A new file synced, its folder not: gone. Another, with its folder synced: kept, but as
    // the folder saw it, so one whose data was never synced is there and empty.
    std::fs::create_dir(root.join("dir/sub")).unwrap();
    write_file(&root.join("dir/sub/orphan.txt"), b"synced file", true);
    std::fs::create_dir(root.join("fresh")).unwrap();
    write_file(
        &root.join("fresh/synced.txt"),
        b"synced file, synced folder",
        true,
    );
    write_file(&root.join("fresh/empty.txt"), b"unsynced data", false);
    sync_dir(&root.join("fresh"));
    sync_dir(root);
    // xattrs are metadata: made durable by fsync of the file, like its mode.
    let attr_file = std::fs::File::open(root.join("fresh/synced.txt")).unwrap();
    rustix::fs::fsetxattr(
        &attr_file,
        "user.kept",
        b"v1",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    attr_file.sync_all().unwrap();
    rustix::fs::fsetxattr(
        &attr_file,
        "user.lost",
        b"v2",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    drop(attr_file);
    // syncfs(2) succeeds but makes nothing durable: Linux sends FUSE_SYNCFS only to virtiofs
    // (the product never relies on it; overwritten.txt below shows it).
    rustix::fs::syncfs(std::fs::File::open(root).unwrap()).unwrap();
    // Still all there before the cut.
    assert_eq!(
        std::fs::read(root.join("dir/overwritten.txt")).unwrap(),
        b"new, never synced"
    );
    assert!(root.join("dir/moved.txt").exists());

    fs.cut();
    // Every request fails while the power is off.
    let err = std::fs::read(root.join("dir/kept.txt")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    fs.restore_power().unwrap();

    let read = |p: &str| std::fs::read(root.join(p)).ok();
    assert_eq!(read("dir/overwritten.txt").as_deref(), Some(&b"old"[..]));
    assert_eq!(read("dir/kept.txt").as_deref(), Some(&b"new, synced"[..]));
    assert_eq!(read("dir/renamed.txt").as_deref(), Some(&b"old"[..]));
    assert_eq!(read("dir/moved.txt"), None);
    assert!(
        !root.join("dir/sub").exists(),
        "dir/ was never synced after mkdir sub"
    );
    assert_eq!(
        read("fresh/synced.txt").as_deref(),
        Some(&b"synced file, synced folder"[..])
    );
    assert_eq!(read("fresh/empty.txt").as_deref(), Some(&b""[..]));
    let synced = std::fs::File::open(root.join("fresh/synced.txt")).unwrap();
    let mut value = [0u8; 16];
    let n = rustix::fs::fgetxattr(&synced, "user.kept", &mut value).unwrap();
    assert_eq!(&value[..n], b"v1");
    assert_eq!(
        rustix::fs::fgetxattr(&synced, "user.lost", &mut value),
        Err(rustix::io::Errno::NODATA)
    );
    let counts = fs.counts();
    assert_eq!(counts.cuts, 1);
    assert!(counts.fsync >= 4 && counts.fsyncdir >= 2, "{counts:?}");
}

#[test]
fn the_filesystem_serves_what_workspaced_and_sqlite_need() {
    let mount = tempfile::tempdir().unwrap();
    let mut fs = PowercutFs::mount(mount.path()).unwrap_or_else(|e| panic!("{e}"));
    let root = mount.path();
    // RENAME_NOREPLACE and RENAME_EXCHANGE.
    write_file(&root.join("a"), b"a", false);
    write_file(&root.join("b"), b"b", false);
    let dir = std::fs::File::open(root).unwrap();
    assert_eq!(
        rustix::fs::renameat_with(&dir, "a", &dir, "b", rustix::fs::RenameFlags::NOREPLACE),
        Err(rustix::io::Errno::EXIST)
    );
    rustix::fs::renameat_with(&dir, "a", &dir, "b", rustix::fs::RenameFlags::EXCHANGE).unwrap();
    assert_eq!(std::fs::read(root.join("a")).unwrap(), b"b");
    // An open file or folder would keep the filesystem busy at the cut's unmount.
    drop(dir);
    // Content across chunk boundaries; a truncated file grown again shows zeros.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    write_file(&root.join("big"), &big, true);
    assert_eq!(std::fs::read(root.join("big")).unwrap(), big);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(root.join("big"))
        .unwrap();
    file.set_len(70_000).unwrap();
    file.set_len(140_000).unwrap();
    drop(file);
    let grown = std::fs::read(root.join("big")).unwrap();
    assert_eq!(grown.len(), 140_000);
    assert_eq!(grown[..70_000], big[..70_000]);
    assert!(grown[70_000..].iter().all(|b| *b == 0));
    // A POSIX ACL is stored as its xattr and reads back byte for byte (getfacl/setfacl are
    // the independent codec).
    let acl_file = root.join("acl.txt");
    write_file(&acl_file, b"acl", false);
    let status = std::process::Command::new("setfacl")
        .args(["-m", "u:12345:r--"])
        .arg(&acl_file)
        .status()
        .expect("setfacl (Debian package acl)");
    assert!(status.success());
    let listing = std::process::Command::new("getfacl")
        .arg("-cn")
        .arg(&acl_file)
        .output()
        .unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    assert!(listing.contains("user:12345:r--"), "{listing}");
    // SQLite in WAL mode, with its -shm mapped shared, committed, cut, and read back.
    let db = root.join("t.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        conn.execute_batch(
            "PRAGMA synchronous=FULL; CREATE TABLE t(v TEXT); INSERT INTO t VALUES ('committed');",
        )
        .unwrap();
        // A checkpoint moves the WAL into the database file, synced.
        conn.execute_batch("PRAGMA wal_checkpoint(FULL); INSERT INTO t VALUES ('in the wal');")
            .unwrap();
        fs.cut();
        // The connection is gone with the power (as a killed process's would be).
        drop(conn);
    }
    fs.restore_power().unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    let rows: Vec<String> = conn
        .prepare("SELECT v FROM t ORDER BY rowid")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows, ["committed", "in the wal"]);
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

// ----- workspaced under a stream of writes -----

const PROJECTS: [&str; 3] = ["p0", "p1", "p2"];
/// Per project: the files written, each by two writers (so they conflict).
const FILES: [&str; 2] = ["notes.txt", "sub/dir/plan.md"];
const WRITERS_PER_FILE: usize = 2;

fn initial_content(project: &str, path: &str) -> String {
    format!("initial content of {project}/{path}\n").repeat(20)
}

/// What one write came back with.
#[derive(Debug, Clone)]
enum Outcome {
    /// Answered with success: acknowledged.
    Applied { receipt_id: String },
    /// Refused with `revision_conflict`: no receipt, no change.
    Conflict,
    /// No answer, or an error answer after the cut: the outcome is for the receipt to tell.
    Unknown,
}

#[derive(Debug, Clone)]
struct Sent {
    project: &'static str,
    path: &'static str,
    request_id: String,
    content: String,
    expected: String,
    outcome: Outcome,
}

/// One call on a connection of its own: the writers run on many threads, each call on its own
/// throwaway runtime, so no pooled connection may outlive the runtime that drives it. An
/// answer that never comes fails the test instead of hanging it.
fn post(client: &Client, endpoint: &str, body: Value) -> Result<Value, (String, Value)> {
    let fresh = UnixClient::new(client.inner.socket());
    // The timer is made inside the runtime that drives it.
    let call = async {
        tokio::time::timeout(
            Duration::from_secs(60),
            fresh.post::<_, Value>(endpoint, &body),
        )
        .await
    };
    let reply = block_on(call)
        .unwrap_or_else(|_| panic!("no answer from workspaced to {endpoint} within 60 s"));
    match reply {
        Ok(v) => Ok(v),
        Err(ClientError::Remote { body, .. }) => {
            Err((body.code.clone(), serde_json::to_value(&body).unwrap()))
        }
        Err(e) => Err(("transport".into(), json!(e.to_string()))),
    }
}

fn write_body(ctx: &Context, s: &Sent) -> Value {
    json!({"context": ctx, "path": s.path, "content": s.content,
        "expected_revision": s.expected, "request_id": s.request_id})
}

/// Everything the writers of a round share.
struct Round {
    number: usize,
    seed: u64,
    cut: AtomicBool,
    acknowledged: AtomicUsize,
    sent: Mutex<Vec<Sent>>,
}

/// One writer: sequential writes to one file until the cut. Every few writes it sends its
/// last answered request again, which must replay the recorded outcome.
fn writer(client: Client, round: Arc<Round>, project: &'static str, path: &'static str, id: usize) {
    let ctx = ctx(project, "alice");
    let mut rng = SmallRng::seed_from_u64(round.seed ^ ((round.number as u64) << 20) ^ id as u64);
    let mut known = match post(&client, "/v1/read", json!({"context": ctx, "path": path})) {
        Ok(v) => v["revision"].as_str().unwrap().to_owned(),
        Err((code, body)) => {
            assert!(
                round.cut.load(Ordering::SeqCst),
                "read {project}/{path}: {code} {body}"
            );
            return;
        }
    };
    let mut last_applied: Option<Sent> = None;
    for i in 0.. {
        if round.cut.load(Ordering::SeqCst) {
            return;
        }
        if let Some(previous) = last_applied.take().filter(|_| rng.random_ratio(1, 6)) {
            match post(&client, "/v1/write", write_body(&ctx, &previous)) {
                Ok(v) => {
                    assert_eq!(v["replayed"], true, "{}: {v}", previous.request_id);
                    assert_eq!(v["state"], "applied", "{}: {v}", previous.request_id);
                }
                Err((code, body)) => {
                    assert!(
                        round.cut.load(Ordering::SeqCst),
                        "replay of {} before the cut: {code} {body}",
                        previous.request_id
                    );
                    return;
                }
            }
            continue;
        }
        let request_id = format!("r{}-w{id}-{i}", round.number);
        // Unique, and from a few hundred bytes to a few pages, so a torn or partial write
        // could never pass for a whole one.
        let content = format!(
            "{project}/{path} round {} writer {id} write {i}\n",
            round.number
        )
        .repeat(rng.random_range(8..400));
        let mut sent = Sent {
            project,
            path,
            request_id,
            content,
            expected: known.clone(),
            outcome: Outcome::Unknown,
        };
        let reply = post(&client, "/v1/write", write_body(&ctx, &sent));
        let stop = match reply {
            Ok(v) => {
                assert_eq!(v["state"], "applied", "{}: {v}", sent.request_id);
                assert_eq!(v["replayed"], false, "{}: {v}", sent.request_id);
                assert_eq!(
                    v["revision"],
                    revision(&sent.content),
                    "{}",
                    sent.request_id
                );
                known = revision(&sent.content);
                sent.outcome = Outcome::Applied {
                    receipt_id: v["receipt"]["receipt_id"].as_str().unwrap().to_owned(),
                };
                round.acknowledged.fetch_add(1, Ordering::SeqCst);
                false
            }
            Err((code, body)) if code == "revision_conflict" => {
                known = body["current_revision"].as_str().unwrap().to_owned();
                sent.outcome = Outcome::Conflict;
                false
            }
            Err((code, body)) => {
                // Only the cut may take an answer away or turn it into an error.
                assert!(
                    round.cut.load(Ordering::SeqCst),
                    "{} before the cut: {code} {body}",
                    sent.request_id
                );
                sent.outcome = Outcome::Unknown;
                true
            }
        };
        if matches!(sent.outcome, Outcome::Applied { .. }) {
            last_applied = Some(sent.clone());
        }
        round.sent.lock().unwrap().push(sent);
        if stop {
            return;
        }
    }
}

/// What the checks counted over a run.
#[derive(Debug, Default)]
struct Tally {
    cuts: usize,
    sent: usize,
    acknowledged: usize,
    conflicts: usize,
    unanswered: usize,
    /// Unanswered writes by the state their receipt was reconciled to.
    unanswered_by_state: BTreeMap<String, usize>,
    uncertain: usize,
    replays_after_restart: usize,
}

fn project_dir(rig: &PowerRig, project: &str) -> PathBuf {
    rig.state.documents().join(project)
}

/// The file as the disk holds it after the restart: it must exist and be exactly one of the
/// contents ever written to it.
fn content_on_disk(
    rig: &PowerRig,
    project: &str,
    path: &str,
    written: &HashMap<String, String>,
    context: &str,
) -> String {
    let bytes = std::fs::read(project_dir(rig, project).join(path))
        .unwrap_or_else(|e| panic!("{context}: {project}/{path} unreadable after restart: {e}"));
    let content = String::from_utf8(bytes).unwrap_or_else(|e| {
        panic!(
            "{context}: {project}/{path} is not text after restart ({} bytes)",
            e.as_bytes().len()
        )
    });
    assert!(
        written.contains_key(&revision(&content)),
        "{context}: {project}/{path} holds content nobody wrote ({} bytes: {:?}…)",
        content.len(),
        content.chars().take(80).collect::<String>()
    );
    content
}

/// The receipt of `request_id` as workspaced reports it (reconciled), or `None`.
fn receipt(client: &Client, project: &str, request_id: &str) -> Option<Value> {
    match client.receipt(&ctx(project, "alice"), request_id) {
        Ok(v) => Some(v),
        Err((code, body)) => {
            assert_eq!(code, "not_found", "receipt lookup for {request_id}: {body}");
            None
        }
    }
}

/// Check a file's recent receipts against the disk: none left prepared, applied ones form one
/// chain (each starts where the applied one before it ended) ending at what the disk holds,
/// an unapplied one never holds the disk's content, an uncertain one only where the disk
/// holds neither of its revisions.
fn check_history(
    client: &Client,
    project: &str,
    path: &str,
    on_disk: &str,
    context: &str,
    tally: &mut Tally,
) {
    let history = client
        .json(
            "/v1/history",
            json!({"context": ctx(project, "alice"), "path": path, "limit": 100}),
        )
        .unwrap();
    let entries = history["entries"].as_array().unwrap();
    let disk = revision(on_disk);
    let mut newer_applied_previous: Option<String> = None;
    for entry in entries {
        let r = &entry["receipt"];
        let (state, prev, result) = (
            r["state"].as_str().unwrap(),
            r["previous_revision"].as_str().unwrap(),
            r["resulting_revision"].as_str().unwrap(),
        );
        let id = r["request_id"].as_str().unwrap();
        match state {
            "applied" => {
                match &newer_applied_previous {
                    // The newest applied change is what the disk holds.
                    None => assert_eq!(
                        result, disk,
                        "{context}: {project}/{path}: newest applied {id} is not on disk"
                    ),
                    Some(next_prev) => assert_eq!(
                        result, next_prev,
                        "{context}: {project}/{path}: applied {id} is not what the next applied change started from"
                    ),
                }
                newer_applied_previous = Some(prev.to_owned());
            }
            "not_applied" => assert_ne!(
                result, disk,
                "{context}: {project}/{path}: {id} is not_applied but the disk holds its content"
            ),
            "uncertain" => {
                tally.uncertain += 1;
                assert!(
                    disk != prev && disk != result,
                    "{context}: {project}/{path}: {id} is uncertain but the disk holds one of its revisions"
                );
            }
            other => panic!("{context}: {project}/{path}: {id} left {other} after recovery"),
        }
    }
}

fn cuts_wanted() -> usize {
    std::env::var("AGENTWORKS_POWERCUT_CUTS")
        .ok()
        .map(|v| v.parse().expect("AGENTWORKS_POWERCUT_CUTS is a number"))
        .unwrap_or(CI_CUTS)
}

fn seed() -> u64 {
    std::env::var("AGENTWORKS_POWERCUT_SEED")
        .ok()
        .map(|v| v.parse().expect("AGENTWORKS_POWERCUT_SEED is a number"))
        .unwrap_or_else(rand::random)
}

#[test]
fn workspaced_keeps_every_acknowledged_write_across_power_cuts() {
    let cuts = cuts_wanted();
    let seed = seed();
    eprintln!("power cuts: {cuts} cuts, AGENTWORKS_POWERCUT_SEED={seed}");
    // On failure, the seed is printed again next to the panic.
    struct SeedOnPanic(u64);
    impl Drop for SeedOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("power cuts FAILED with AGENTWORKS_POWERCUT_SEED={}", self.0);
            }
        }
    }
    let _seed_on_panic = SeedOnPanic(seed);
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);

    let mut rig = PowerRig::new();
    // Every content ever written to each file (by revision), starting with its initial one.
    let mut written: HashMap<(&str, &str), HashMap<String, String>> = HashMap::new();
    for project in PROJECTS {
        let files: Vec<(&str, String)> = FILES
            .iter()
            .map(|f| (*f, initial_content(project, f)))
            .collect();
        let refs: Vec<(&str, &str)> = files.iter().map(|(f, c)| (*f, c.as_str())).collect();
        rig.state.project(project, &refs);
        for (f, c) in &files {
            written
                .entry((project, f))
                .or_default()
                .insert(revision(c), c.clone());
        }
    }
    rig.fs.sync_all();

    let mut tally = Tally::default();
    let mut acknowledged: Vec<Sent> = Vec::new();
    for number in 0..cuts {
        let context = format!("cut {number} (seed {seed})");
        let client = rig.start();
        let round = Arc::new(Round {
            number,
            seed,
            cut: AtomicBool::new(false),
            acknowledged: AtomicUsize::new(0),
            sent: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        let mut id = 0;
        for project in PROJECTS {
            for path in FILES {
                for _ in 0..WRITERS_PER_FILE {
                    let (client, round) = (client.clone(), round.clone());
                    threads.push(std::thread::spawn(move || {
                        writer(client, round, project, path, id)
                    }));
                    id += 1;
                }
            }
        }
        // Cut after at least one acknowledged write (however slow the machine), then at a
        // random point of the stream that follows.
        let deadline = Instant::now() + Duration::from_secs(60);
        while round.acknowledged.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "{context}: no write acknowledged in 60 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..=60)));
        round.cut.store(true, Ordering::SeqCst);
        rig.cut();
        for t in threads {
            t.join().unwrap();
        }
        let sent = std::mem::take(&mut *round.sent.lock().unwrap());
        tally.cuts += 1;
        for s in &sent {
            written
                .entry((s.project, s.path))
                .or_default()
                .insert(revision(&s.content), s.content.clone());
        }

        let client = rig.start();
        // No staged file survives recovery.
        for project in PROJECTS {
            let left: Vec<_> = all_files(&project_dir(&rig, project))
                .into_iter()
                .filter(|f| f.contains(".agentworks-tmp-"))
                .collect();
            assert!(
                left.is_empty(),
                "{context}: staged files left in {project}: {left:?}"
            );
        }
        // Every file is whole, and its receipts agree with it.
        let mut on_disk: HashMap<(&str, &str), String> = HashMap::new();
        for project in PROJECTS {
            for path in FILES {
                let content =
                    content_on_disk(&rig, project, path, &written[&(project, path)], &context);
                check_history(&client, project, path, &content, &context, &mut tally);
                on_disk.insert((project, path), content);
            }
        }
        // Every write of the round, by what its sender saw.
        for s in &sent {
            tally.sent += 1;
            let found = receipt(&client, s.project, &s.request_id);
            let state = found
                .as_ref()
                .map(|r| r["state"].as_str().unwrap().to_owned());
            let disk = &on_disk[&(s.project, s.path)];
            match &s.outcome {
                Outcome::Applied { receipt_id } => {
                    tally.acknowledged += 1;
                    let r = found.unwrap_or_else(|| {
                        panic!(
                            "{context}: acknowledged {} has no receipt after the cut",
                            s.request_id
                        )
                    });
                    assert_eq!(
                        r["state"], "applied",
                        "{context}: acknowledged {}: {r}",
                        s.request_id
                    );
                    assert_eq!(
                        r["receipt_id"],
                        receipt_id.as_str(),
                        "{context}: {}",
                        s.request_id
                    );
                    assert_eq!(
                        r["resulting_revision"],
                        revision(&s.content),
                        "{context}: {}",
                        s.request_id
                    );
                    acknowledged.push(s.clone());
                }
                Outcome::Conflict => {
                    tally.conflicts += 1;
                    assert!(
                        found.is_none(),
                        "{context}: refused {} left a receipt",
                        s.request_id
                    );
                    assert_ne!(
                        disk, &s.content,
                        "{context}: refused {} is on disk",
                        s.request_id
                    );
                }
                Outcome::Unknown => {
                    tally.unanswered += 1;
                    let state = state.clone().unwrap_or_else(|| "not_found".into());
                    if state != "applied" {
                        assert_ne!(
                            disk, &s.content,
                            "{context}: {} is {state} but on disk",
                            s.request_id
                        );
                    }
                    *tally.unanswered_by_state.entry(state).or_default() += 1;
                }
            }
            // Some answered or recorded requests are sent again: the recorded outcome comes
            // back and the file is not touched.
            if let (Some(state), true) = (state, rng.random_ratio(1, 4)) {
                let again = post(
                    &client,
                    "/v1/write",
                    write_body(&ctx(s.project, "alice"), s),
                )
                .unwrap_or_else(|(code, body)| {
                    panic!("{context}: replay of {}: {code} {body}", s.request_id)
                });
                assert_eq!(
                    again["replayed"], true,
                    "{context}: {}: {again}",
                    s.request_id
                );
                assert_eq!(
                    again["state"],
                    state.as_str(),
                    "{context}: {}: {again}",
                    s.request_id
                );
                let now =
                    std::fs::read_to_string(project_dir(&rig, s.project).join(s.path)).unwrap();
                assert_eq!(
                    &now, disk,
                    "{context}: the replay of {} changed the file",
                    s.request_id
                );
                tally.replays_after_restart += 1;
            }
        }
        // A few acknowledged writes of earlier cuts: still applied.
        for _ in 0..4.min(acknowledged.len()) {
            let s = &acknowledged[rng.random_range(0..acknowledged.len())];
            let r = receipt(&client, s.project, &s.request_id).unwrap_or_else(|| {
                panic!("{context}: acknowledged {} lost its receipt", s.request_id)
            });
            assert_eq!(r["state"], "applied", "{context}: {}: {r}", s.request_id);
        }
        // And the cut, with the daemon running again.
        rig.cut();
    }

    // At the end, every acknowledged write ever, once more.
    let client = rig.start();
    for s in &acknowledged {
        let r = receipt(&client, s.project, &s.request_id).unwrap_or_else(|| {
            panic!(
                "acknowledged {} lost its receipt (seed {seed})",
                s.request_id
            )
        });
        assert_eq!(r["state"], "applied", "{}: {r} (seed {seed})", s.request_id);
    }
    let counts = rig.fs.counts();
    eprintln!(
        "power cuts: {} cuts in {:.1} s (seed {seed}); {} writes sent, {} acknowledged and \
         checked, {} conflicts, {} unanswered by receipt state {:?}; {} uncertain receipts; \
         {} replays after restart; the filesystem saw {} fsync, {} fdatasync, {} fsyncdir, \
         {} requests refused while the power was off",
        tally.cuts,
        started.elapsed().as_secs_f64(),
        tally.sent,
        tally.acknowledged,
        tally.conflicts,
        tally.unanswered,
        tally.unanswered_by_state,
        tally.uncertain,
        tally.replays_after_restart,
        counts.fsync,
        counts.fdatasync,
        counts.fsyncdir,
        counts.refused,
    );
    assert!(tally.acknowledged >= cuts, "{tally:?}");
}

/// Regression, found by the workspaced model (`crates/workspace/tests/model.rs`, its property
/// "a receipt says applied only if its change is on disk"): a change killed after its rename
/// (or unlink, or move) and before its folder's sync is reconciled at the next start from what
/// the disk shows; a power cut after that must not undo what the receipt then says. Before the
/// fix recovery read the new entry without syncing its folder, recorded `applied` durably, and
/// after the cut the file held the old content again (or the deleted file was back) while its
/// receipt, and every replay of the request, still said applied.
#[test]
fn a_change_reconciled_after_a_crash_survives_a_power_cut() {
    const OLD: &str = "the old content\n";
    const NEW: &str = "the new content\n";
    let alice = ctx("p", "alice");
    // (endpoint, request body beyond the context, what notes.txt and moved.txt hold after it)
    let changes = [
        (
            "/v1/write",
            json!({"path": "notes.txt", "content": NEW, "expected_revision": revision(OLD)}),
            (Some(NEW), None),
        ),
        (
            "/v1/delete",
            json!({"path": "notes.txt", "expected_revision": revision(OLD)}),
            (None, None),
        ),
        (
            "/v1/move",
            json!({"path": "notes.txt", "to_path": "moved.txt", "expected_revision": revision(OLD)}),
            (None, Some(OLD)),
        ),
    ];
    for (endpoint, body, (notes, moved)) in changes {
        let mut rig = PowerRig::new();
        rig.state.project("p", &[("notes.txt", OLD)]);
        rig.fs.sync_all();
        let mut body = body;
        body["context"] = json!(alice);
        body["request_id"] = json!("r1");
        // Killed after the rename, before the folder's sync.
        let mut dying = Workspaced::start_with(
            &rig.state,
            Options {
                failpoint: Some("after_rename".into()),
                ..rig.options()
            },
        );
        let cut_off = post(&dying.client(), endpoint, body.clone());
        assert!(
            matches!(&cut_off, Err((code, _)) if code == "transport"),
            "{endpoint}: answered although killed: {cut_off:?}"
        );
        dying.child.wait().unwrap();
        // Recovery decides the change applied from what it sees: the new entry.
        let client = rig.start();
        let found = receipt(&client, "p", "r1").expect("the receipt");
        assert_eq!(found["state"], "applied", "{endpoint}: {found}");
        // The power goes; what the receipt says must still be what the disk holds.
        rig.cut();
        let client = rig.start();
        let found = receipt(&client, "p", "r1").expect("the receipt");
        assert_eq!(found["state"], "applied", "{endpoint}: {found}");
        let dir = project_dir(&rig, "p");
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        assert_eq!(
            (read("notes.txt").as_deref(), read("moved.txt").as_deref()),
            (notes, moved),
            "{endpoint}: the receipt says applied, the disk after the cut"
        );
        let again = post(&client, endpoint, body).expect("the replay");
        assert_eq!(
            (&again["state"], &again["replayed"]),
            (&json!("applied"), &json!(true)),
            "{endpoint}: {again}"
        );
    }
}

/// Regression (issue 48, the model's "write into a new folder" scenario and its property "an
/// acknowledged change is never lost"): a write into a folder that does not exist makes the
/// folder, then syncs the folder above it. Killed between the two (`after_mkdir`), or with
/// that sync failing while workspaced runs on (`after_mkdir:fail`), the folder is there but
/// its entry is not durable; every later change finds it there and never made it durable.
/// Before the fix a write acknowledged in it after that was lost with the folder at the next
/// power cut. Now start-up recovery syncs every folder of every project, and a folder whose
/// sync failed is remembered and synced by the next change that creates a file in it.
#[test]
fn a_write_acknowledged_in_a_folder_made_before_a_crash_survives_a_power_cut() {
    let alice = ctx("p", "alice");
    let write = |path: &str, request_id: &str| {
        json!({"context": alice, "path": path, "content": format!("{path}\n"),
            "expected_revision": "missing", "request_id": request_id})
    };
    for (failpoint, killed) in [("after_mkdir", true), ("after_mkdir:fail", false)] {
        let mut rig = PowerRig::new();
        rig.state.project("p", &[("notes.txt", "notes\n")]);
        rig.fs.sync_all();
        let mut first = Workspaced::start_with(
            &rig.state,
            Options {
                failpoint: Some(failpoint.into()),
                ..rig.options()
            },
        );
        let refused = post(&first.client(), "/v1/write", write("new/first.txt", "r1"));
        let dir = project_dir(&rig, "p");
        assert!(dir.join("new").is_dir(), "{failpoint}: the folder was made");
        let client = if killed {
            assert!(
                matches!(&refused, Err((code, _)) if code == "transport"),
                "{failpoint}: answered although killed: {refused:?}"
            );
            first.child.wait().unwrap();
            rig.start()
        } else {
            assert!(
                matches!(&refused, Err((code, _)) if code == "io_error"),
                "{failpoint}: {refused:?}"
            );
            let client = first.client();
            rig.daemon = Some(first);
            client
        };
        // Written into the folder, after the restart or by the same daemon: acknowledged.
        let acked = post(&client, "/v1/write", write("new/second.txt", "r2")).expect("the write");
        assert_eq!(acked["state"], "applied", "{failpoint}: {acked}");
        rig.cut();
        let client = rig.start();
        assert_eq!(
            std::fs::read_to_string(dir.join("new/second.txt"))
                .ok()
                .as_deref(),
            Some("new/second.txt\n"),
            "{failpoint}: the acknowledged write after the cut"
        );
        let found = receipt(&client, "p", "r2").expect("the receipt");
        assert_eq!(found["state"], "applied", "{failpoint}: {found}");
    }
}

// ----- the laptop executor -----

/// A counter file the executor's patches step up, one value at a time.
fn counter(value: usize) -> String {
    format!("value {value}\n")
}

fn step_patch(value: usize) -> Operation {
    patch(
        "counter.txt",
        &format!(
            "--- a/counter.txt\n+++ b/counter.txt\n@@ -1 +1 @@\n-value {value}\n+value {}\n",
            value + 1
        ),
    )
}

/// How many times each request id ran a command, from the witness log (off the cut
/// filesystem, appended by the commands themselves).
fn runs(witness: &Path) -> HashMap<String, usize> {
    let mut runs = HashMap::new();
    if let Ok(log) = std::fs::read_to_string(witness.join("runs")) {
        for id in log.lines() {
            *runs.entry(id.to_owned()).or_default() += 1;
        }
    }
    runs
}

/// Cut both filesystems, kill the executor (and wait for it), bring the power back.
fn cut_executor(fs: &mut [&mut PowercutFs], child: &mut KillOnDrop) {
    for fs in fs.iter() {
        fs.cut();
    }
    let _ = child.0.kill();
    let _ = child.0.wait();
    for fs in fs.iter_mut() {
        fs.restore_power()
            .unwrap_or_else(|e| panic!("restoring power: {e}"));
    }
}

#[test]
fn the_executor_keeps_every_acknowledged_result_across_power_cuts() {
    // Each cut restarts the executor and its sandbox, so fewer than for workspaced.
    let cuts = (cuts_wanted() / 2).max(1);
    let seed = seed();
    eprintln!("executor power cuts: {cuts} cuts, AGENTWORKS_POWERCUT_SEED={seed}");
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);

    let laptop = Laptop::new("aw-powercut-laptop-", &[]);
    laptop.write_credentials("device-token");
    // The executor's state dir (its receipts) and the shared folder are each on a power-cut
    // filesystem; the witness folder, where commands log that they ran, is not.
    let mut state_fs = PowercutFs::mount(&laptop.state_home()).unwrap_or_else(|e| panic!("{e}"));
    let project = laptop.folder("proj");
    std::fs::create_dir_all(&project).unwrap();
    let mut project_fs = PowercutFs::mount(&project).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(project.join("counter.txt"), counter(0)).unwrap();
    project_fs.sync_all();
    state_fs.sync_all();
    let witness = laptop.folder("witness");
    std::fs::create_dir_all(&witness).unwrap();
    let args = [
        "--write-folder",
        project.to_str().unwrap(),
        "--write-folder",
        witness.to_str().unwrap(),
    ];

    // Every request sent, with the outcome it was acknowledged with (if it was).
    let mut acknowledged: Vec<(String, Operation, ExecOutcome)> = Vec::new();
    let mut unanswered = 0;
    let mut interrupted = 0;
    // The counter's value as the last acknowledged (or replayed) patch left it.
    let mut value = 0;
    let rt = runtime();
    rt.block_on(async {
        let gateway = Gateway::new().await;
        for number in 0..cuts {
            let context = format!("executor cut {number} (seed {seed})");
            let mut child = spawn_executor(&laptop, &gateway.url(), &args);
            let (mut ws, _, _) = gateway.accept().await;

            // Check the last round first, now that the executor is back: every acknowledged
            // result is answered again from the receipts, and nothing runs twice.
            let before = runs(&witness);
            for (id, operation, outcome) in &acknowledged {
                if !rng.random_ratio(1, 3) && id != &acknowledged.last().unwrap().0 {
                    continue;
                }
                let again = request(&mut ws, id, "proj", operation.clone()).await;
                assert_eq!(
                    &again, outcome,
                    "{context}: {id} answered differently after the cut"
                );
            }
            assert_eq!(
                runs(&witness),
                before,
                "{context}: a replayed command ran again"
            );
            let on_disk = std::fs::read_to_string(project.join("counter.txt")).unwrap();
            assert_eq!(
                on_disk,
                counter(value),
                "{context}: the counter after the cut"
            );

            // A stream of commands and patches, cut at a random point.
            let delay = Duration::from_millis(rng.random_range(0..=400));
            let cut_at = tokio::time::Instant::now() + delay;
            let mut in_flight: Option<(String, Operation)> = None;
            for i in 0.. {
                let id = format!("c{number}-{i}");
                let operation = if rng.random_ratio(1, 2) {
                    shell(&format!(
                        "echo {id} >> {}/runs; echo out-{id}",
                        witness.display()
                    ))
                } else {
                    step_patch(value)
                };
                send(
                    &mut ws,
                    &GatewayFrame::Request {
                        request_id: id.clone(),
                        folder: "proj".into(),
                        operation: operation.clone(),
                    },
                )
                .await;
                in_flight = Some((id.clone(), operation.clone()));
                let answer = tokio::time::timeout_at(cut_at, async {
                    loop {
                        match next_frame(&mut ws).await {
                            ExecutorFrame::Result {
                                request_id,
                                outcome,
                            } if request_id == id => return outcome,
                            _ => {}
                        }
                    }
                })
                .await;
                let Ok(outcome) = answer else { break };
                match (&operation, &outcome) {
                    (
                        Operation::ExecuteShellCommand { .. },
                        ExecOutcome::Completed { stdout, .. },
                    ) => {
                        assert_eq!(stdout, &format!("out-{id}\n"), "{context}: {id}");
                    }
                    (Operation::DiffPatchWorkspaceFile { .. }, ExecOutcome::Patched { .. }) => {
                        value += 1;
                    }
                    _ => panic!("{context}: {id}: {outcome:?}"),
                }
                acknowledged.push((id, operation, outcome));
                in_flight = None;
            }
            cut_executor(&mut [&mut state_fs, &mut project_fs], &mut child);
            drop(ws);

            // The request the cut interrupted, sent again to a restarted executor: if its
            // command ran, it is answered from the receipts (never run again); the counter
            // is whole, and a patch is applied at most once.
            let Some((id, operation)) = in_flight else {
                continue;
            };
            unanswered += 1;
            let mut child = spawn_executor(&laptop, &gateway.url(), &args);
            let (mut ws, _, _) = gateway.accept().await;
            let on_disk = std::fs::read_to_string(project.join("counter.txt")).unwrap();
            let ran_before = runs(&witness).get(&id).copied().unwrap_or(0);
            let again = request(&mut ws, &id, "proj", operation.clone()).await;
            let ran_after = runs(&witness).get(&id).copied().unwrap_or(0);
            assert!(ran_after <= 1, "{context}: {id} ran {ran_after} times");
            if ran_before == 1 {
                assert_eq!(ran_after, 1, "{context}: {id} ran again after the cut");
            }
            match (&operation, &again) {
                (_, ExecOutcome::Interrupted { .. }) => interrupted += 1,
                (Operation::ExecuteShellCommand { .. }, ExecOutcome::Completed { stdout, .. }) => {
                    assert_eq!(stdout, &format!("out-{id}\n"), "{context}: {id}");
                    acknowledged.push((id.clone(), operation.clone(), again.clone()));
                }
                (Operation::DiffPatchWorkspaceFile { .. }, ExecOutcome::Patched { .. }) => {
                    // Applied before the cut and recorded, or applied now: once either way.
                    assert!(
                        on_disk == counter(value) || on_disk == counter(value + 1),
                        "{context}: torn counter {on_disk:?}"
                    );
                    value += 1;
                    acknowledged.push((id.clone(), operation.clone(), again.clone()));
                }
                _ => panic!("{context}: {id} after the cut: {again:?}"),
            }
            let now = std::fs::read_to_string(project.join("counter.txt")).unwrap();
            if matches!(again, ExecOutcome::Interrupted { .. }) {
                // Interrupted: the patch may or may not have reached the disk; take what is there.
                assert!(
                    now == counter(value) || now == counter(value + 1),
                    "{context}: torn counter {now:?}"
                );
                if now == counter(value + 1) {
                    value += 1;
                }
            } else {
                assert_eq!(now, counter(value), "{context}: {id}");
            }
            // Cut again, idle: what this executor answered must survive that too (the next
            // round starts by checking it).
            cut_executor(&mut [&mut state_fs, &mut project_fs], &mut child);
            drop(ws);
        }
        let mut child = spawn_executor(&laptop, &gateway.url(), &args);
        let (mut ws, _, _) = gateway.accept().await;
        let before = runs(&witness);
        for (id, operation, outcome) in &acknowledged {
            let again = request(&mut ws, id, "proj", operation.clone()).await;
            assert_eq!(
                &again, outcome,
                "{id} answered differently at the end (seed {seed})"
            );
        }
        assert_eq!(
            runs(&witness),
            before,
            "a replayed command ran again (seed {seed})"
        );
        let _ = child.0.kill();
        let _ = child.0.wait();
    });
    let ran_twice: Vec<_> = runs(&witness).into_iter().filter(|(_, n)| *n > 1).collect();
    assert!(
        ran_twice.is_empty(),
        "commands ran twice: {ran_twice:?} (seed {seed})"
    );
    eprintln!(
        "executor power cuts: {cuts} cuts in {:.1} s (seed {seed}); {} results acknowledged and \
         replayed, {unanswered} requests cut before their answer ({interrupted} of them \
         reported interrupted); the counter reached {value}",
        started.elapsed().as_secs_f64(),
        acknowledged.len(),
    );
    assert!(!acknowledged.is_empty());
}
