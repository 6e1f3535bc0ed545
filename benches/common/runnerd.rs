//! runnerd for a benchmark: the release `agentworks-runnerd` on a temp state root, and the
//! `holder` CLI, a provider's executable that only writes its environment (the bridge's URL and
//! the turn's capability) to `bridge.env` in its runtime and holds the turn open until a `stop`
//! file appears there, so the benchmark can drive the turn's bridge itself. Not part of
//! [`common`](super): a benchmark includes it with `#[path]` (as `runnerd_turn` and
//! `runnerd_laptop` do), after declaring the test harness's `daemons` module, which it uses.
//! It starts processes and never asserts timings.

use crate::daemons::{self, Process};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long runnerd's start, or a held turn's start, may take.
pub const WITHIN: Duration = Duration::from_secs(60);

/// The release runnerd on a state root of its own under `base` (project `p` with one file),
/// with `providers` (`[runnerd.providers.*]` tables) in its config; stopped when dropped.
pub struct BenchRunnerd {
    /// Declared first: runnerd stops (when dropped) before its state root goes.
    _process: Process,
    pub state: tempfile::TempDir,
}

impl BenchRunnerd {
    pub fn start(base: &Path, providers: &str) -> BenchRunnerd {
        let state = tempfile::Builder::new()
            .prefix("state-")
            .tempdir_in(base)
            .unwrap();
        std::fs::create_dir_all(state.path().join("documents/p")).unwrap();
        std::fs::write(state.path().join("documents/p/hello.txt"), "hello\n").unwrap();
        std::fs::write(
            state.path().join("agentworks.toml"),
            format!("[runnerd]\nallowed_users = []\n{providers}"),
        )
        .unwrap();
        BenchRunnerd {
            _process: start_on(state.path()),
            state,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.state.path().join("run/runnerd.sock")
    }
}

/// The release runnerd on the state root `state` (its config already written), once its socket
/// exists.
pub fn start_on(state: &Path) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentworks-runnerd"));
    daemons::as_daemon_on(&mut command, state);
    let child = command.spawn().expect("spawn runnerd");
    let mut process = Process {
        name: "agentworks-runnerd",
        child,
    };
    let socket = state.join("run/runnerd.sock");
    let deadline = Instant::now() + WITHIN;
    while !socket.exists() {
        assert!(process.exited().is_none(), "runnerd exited during start");
        assert!(Instant::now() < deadline, "runnerd did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    process
}

/// Writes the holder CLI to `base/holder-cli` and returns its path. As a Codex provider's
/// executable it ends its turn with a Codex `turn.completed` line once `stop` exists.
pub fn holder_cli(base: &Path) -> PathBuf {
    let holder = base.join("holder-cli");
    std::fs::write(
        &holder,
        "#!/bin/sh\nenv > bridge.env\nwhile [ ! -e stop ]; do sleep 0.05; done\n\
         echo '{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&holder, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    holder
}

/// A held turn's runtime, once its holder has written `bridge.env` there.
pub struct HeldTurn {
    /// The runtime directory; a `stop` file there ends the turn.
    pub runtime: PathBuf,
    /// The bridge endpoint's URL ([`agentworks_runner::bridge::URL_ENV`]).
    pub url: String,
    /// The turn's bridge capability ([`agentworks_runner::bridge::TOKEN_ENV`]).
    pub token: String,
}

impl HeldTurn {
    /// Waits (up to [`WITHIN`]) for a runtime under runnerd's `state` whose holder has written
    /// its environment; panics if none does.
    pub fn wait(state: &Path) -> HeldTurn {
        use agentworks_runner::bridge::{TOKEN_ENV, URL_ENV};
        let runtimes = state.join("runner/runtimes");
        let deadline = Instant::now() + WITHIN;
        loop {
            for entry in std::fs::read_dir(&runtimes).into_iter().flatten().flatten() {
                let Ok(env) = std::fs::read_to_string(entry.path().join("bridge.env")) else {
                    continue;
                };
                let var = |name: &str| {
                    env.lines()
                        .find_map(|l| l.strip_prefix(&format!("{name}=")))
                        .map(str::to_owned)
                };
                if let (Some(url), Some(token)) = (var(URL_ENV), var(TOKEN_ENV)) {
                    return HeldTurn {
                        runtime: entry.path(),
                        url,
                        token,
                    };
                }
            }
            assert!(Instant::now() < deadline, "the held turn never started");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends the turn: the holder sees `stop` and exits.
    pub fn stop(&self) {
        std::fs::write(self.runtime.join("stop"), "").unwrap();
    }
}
