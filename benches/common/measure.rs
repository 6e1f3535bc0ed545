//! What a benchmark reads off a process and its samples: a process's resident memory
//! (`VmRSS` from `/proc/<pid>/status`), this process's open-files limit raised before it starts
//! daemons (they inherit it), and nearest-rank percentiles of latency samples. Not part of
//! [`common`](super): a benchmark that wants it includes it with `#[path]`, as
//! `cluster_dispatch` does. It starts nothing and asserts nothing about timings.

use std::time::Duration;

/// Raise this process's soft RLIMIT_NOFILE to at least `wanted`: within the hard limit, and
/// past it as far as the kernel lets this process raise the hard limit (root, or
/// `CAP_SYS_RESOURCE`). Processes started afterwards inherit it. Returns the soft limit in
/// force, which may be below `wanted`; the caller says what that means for its run.
pub fn raise_nofile(wanted: u64) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if current >= wanted {
        return current;
    }
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if hard < wanted {
        let raised = Rlimit {
            current: Some(wanted),
            maximum: Some(wanted),
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return wanted;
        }
    }
    let soft = wanted.min(hard);
    let within = Rlimit {
        current: Some(soft),
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, within) {
        Ok(()) => soft,
        Err(_) => current,
    }
}

/// VmRSS of `pid`, in KiB; `None` once the process is gone.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

/// p50, p99 and the mean of a set of latency samples.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub mean: Duration,
}

/// Nearest-rank percentiles and the mean of `samples` (which must not be empty).
pub fn stats(mut samples: Vec<Duration>) -> Stats {
    assert!(!samples.is_empty(), "no samples to summarise");
    samples.sort();
    Stats {
        count: samples.len(),
        p50: percentile(&samples, 50.0),
        p99: percentile(&samples, 99.0),
        mean: samples.iter().sum::<Duration>() / samples.len() as u32,
    }
}

/// The nearest-rank `p`th percentile of `sorted` (ascending, not empty).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

/// A duration in milliseconds, for a table.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
