//! Durable write throughput through workspaced's socket against the physical floor, measured
//! in the same run on the same disk.
//!
//! The floor is the least any durable replace costs: a plain loop of write + fsync + rename +
//! fsync(dir) of the same 4 KiB files. Ours adds the socket round trip, the lock, the revision
//! check, two durable SQLite commits (prepared, applied) and ownership carry-over. The number
//! that matters is the ratio, printed at the end.
//!
//! Run: `cargo bench --bench durable_write` (optionally `-- 1000` for the number of writes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The test harness's daemon helpers; this benchmark uses part of them.
#[allow(dead_code)]
mod common;
#[allow(dead_code)]
#[path = "../tests/common/daemons.rs"]
mod daemons;
#[allow(dead_code)]
#[path = "../tests/common/ports.rs"]
mod ports;

use agentworks_support::unix_http::UnixClient;
use daemons::Process;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

const FILES: usize = 16;
const SIZE: usize = 4096;

fn content(i: usize) -> String {
    let mut s = format!("write {i}\n");
    while s.len() < SIZE {
        s.push_str("agentworks durable write benchmark line\n");
    }
    s.truncate(SIZE);
    s
}

fn floor(dir: &Path, writes: usize) -> Duration {
    let dir_file = std::fs::File::open(dir).unwrap();
    let started = Instant::now();
    for i in 0..writes {
        common::floor::durable_replace(
            &dir_file,
            dir,
            &format!(".tmp-{i}"),
            &format!("f{}.txt", i % FILES),
            content(i).as_bytes(),
        )
        .unwrap();
    }
    started.elapsed()
}

fn ours(state: &Path, writes: usize) -> Duration {
    let project = state.join("documents/bench");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(state.join("agentworks.toml"), "").unwrap();
    let mut workspaced = Process::daemon(
        "agentworks-workspaced",
        env!("CARGO_BIN_EXE_agentworks-workspaced"),
        state,
    );
    let socket = state.join("run/workspaced.sock");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let elapsed = runtime.block_on(async {
        let client = UnixClient::new(&socket);
        workspaced
            .wait_ready(Duration::from_secs(20), || async {
                client.get::<serde_json::Value>("/v1/health").await.is_ok()
            })
            .await;
        let context = json!({"project": "bench", "principal": {"user_id": "u", "user_name": "bench", "source": "bench"}, "guard": {"write_paths": ["."]}});
        let mut revisions = vec!["missing".to_string(); FILES];
        let started = Instant::now();
        for i in 0..writes {
            let slot = i % FILES;
            let answer: serde_json::Value = client
                .post(
                    "/v1/write",
                    &json!({"context": context, "path": format!("f{slot}.txt"), "content": content(i),
                        "expected_revision": revisions[slot], "request_id": format!("bench-{i}")}),
                )
                .await
                .unwrap();
            revisions[slot] = answer["revision"].as_str().unwrap().to_owned();
        }
        started.elapsed()
    });
    drop(workspaced);
    elapsed
}

fn main() {
    let writes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(500);
    // Same disk for both: a directory under the build's target dir.
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-durable-write");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let floor_dir = base.join("floor");
    std::fs::create_dir_all(&floor_dir).unwrap();

    // Warm up both paths once, then measure floor, ours, floor again (take the faster floor).
    floor(&floor_dir, 50);
    let floor_a = floor(&floor_dir, writes);
    let ours_time = ours(&base.join("state"), writes);
    let floor_b = floor(&floor_dir, writes);
    let floor_time = floor_a.min(floor_b);
    let per_sec = |d: Duration| writes as f64 / d.as_secs_f64();
    println!(
        "durable 4 KiB replaces, {writes} writes, {FILES} files, same disk ({})",
        base.display()
    );
    println!(
        "  floor (write+fsync+rename+fsync dir): {:>9.1} writes/s",
        per_sec(floor_time)
    );
    println!(
        "  workspaced via socket:                {:>9.1} writes/s",
        per_sec(ours_time)
    );
    println!(
        "  ratio ours/floor: {:.3} (workspaced reaches {:.1}% of the floor)",
        per_sec(ours_time) / per_sec(floor_time),
        100.0 * per_sec(ours_time) / per_sec(floor_time)
    );
    let _ = std::fs::remove_dir_all(&base);
}
