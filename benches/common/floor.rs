//! The least any durable replace costs on a filesystem: write the content to a new temp file,
//! fsync it, rename it over the target, fsync the folder. No socket, no lock, no database.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One durable replace of `dir/target` with `content`, through `dir/temp`; `dir_file` is `dir`
/// opened for the folder sync.
pub fn durable_replace(
    dir_file: &File,
    dir: &Path,
    temp: &str,
    target: &str,
    content: &[u8],
) -> std::io::Result<()> {
    let temp = dir.join(temp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&temp)?;
    f.write_all(content)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&temp, dir.join(target))?;
    dir_file.sync_all()
}

/// `streams` threads, each in its own folder `dir/s<k>`, doing durable replaces of a new
/// file each time with `content` from `start` (a moment for the threads to be ready) for
/// `warmup` and then `measure`. The latencies of the replaces that completed within `measure`
/// (all streams together).
pub fn timed_streams(
    dir: &Path,
    streams: usize,
    content: &[u8],
    start: Instant,
    warmup: Duration,
    measure: Duration,
) -> std::io::Result<Vec<Duration>> {
    let from = start + warmup;
    let until = from + measure;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..streams)
            .map(|k| {
                let folder = dir.join(format!("s{k}"));
                scope.spawn(move || -> std::io::Result<Vec<Duration>> {
                    std::fs::create_dir_all(&folder)?;
                    let dir_file = File::open(&folder)?;
                    let mut latencies = Vec::new();
                    std::thread::sleep(start.saturating_duration_since(Instant::now()));
                    let mut seq = 0u64;
                    loop {
                        let began = Instant::now();
                        if began >= until {
                            break;
                        }
                        seq += 1;
                        let name = format!("f{seq}.txt");
                        durable_replace(
                            &dir_file,
                            &folder,
                            &format!(".tmp-{seq}"),
                            &name,
                            content,
                        )?;
                        let done = Instant::now();
                        if done >= from && done <= until {
                            latencies.push(done - began);
                        }
                    }
                    Ok(latencies)
                })
            })
            .collect();
        let mut all = Vec::new();
        for handle in handles {
            all.extend(handle.join().expect("a floor stream panicked")?);
        }
        Ok(all)
    })
}

/// How long making one new empty file in a new folder `dir` takes, the mean over `files`.
///
/// On ext4 without a journal (these machines' root filesystem) the inode allocator passes over
/// every free inode freed in the last 60 s (300 s while its inode table block is not yet
/// written back), one buffer-cache lookup each, so a new file costs ~40 µs of CPU on a quiet
/// filesystem and 400–800 µs after a few tens of thousands of files were deleted nearby. Every
/// write here and in the floor makes a new file, so this is the measure of how far a run was
/// slowed by what was deleted before it.
pub fn create_cost(dir: &Path, files: usize) -> std::io::Result<Duration> {
    std::fs::create_dir_all(dir)?;
    let began = Instant::now();
    for n in 0..files {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(dir.join(format!("e{n}")))?;
    }
    Ok(began.elapsed() / files.max(1) as u32)
}
