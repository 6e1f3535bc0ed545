//! A fake laptop for the `agentworks` CLI (the executor's side): a temp HOME with optional
//! XDG dirs, the commands run with a cleared environment, and `agentworks login` against a
//! [`Stack`]. It starts no daemon itself; [`Laptop::executor_connect`] starts `agentworks executor
//! connect` in the background ([`ExecutorProcess`], its stderr kept for the test's messages).

use super::{Stack, laptop_cli};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A fake laptop for the `agentworks` CLI: a temp dir holding a private HOME (`<root>/home`)
/// and, unless made with [`Laptop::with_default_dirs`], XDG config and state dirs beside it.
/// Every accessor agrees with the environment [`Laptop::command`] sets.
pub struct Laptop {
    dir: tempfile::TempDir,
    /// `XDG_CONFIG_HOME` and `XDG_STATE_HOME` are set (to `<root>/xdg-config`,
    /// `<root>/xdg-state`); otherwise unset, so `agentworks` uses `~/.config` and `~/.local/state`.
    xdg: bool,
}

impl Laptop {
    /// A laptop in a temp dir named `<prefix>…`, with `files` (path under HOME, content)
    /// written, and its XDG config and state dirs created outside HOME.
    pub fn new(prefix: &str, files: &[(&str, &str)]) -> Laptop {
        let laptop = Laptop::make(prefix, files, true);
        std::fs::create_dir_all(laptop.config_home()).unwrap();
        std::fs::create_dir_all(laptop.state_home()).unwrap();
        laptop
    }

    /// As [`Laptop::new`], but no `XDG_*` variables: the default `~/.config` and
    /// `~/.local/state` are used (and left for `agentworks` to create).
    pub fn with_default_dirs(prefix: &str, files: &[(&str, &str)]) -> Laptop {
        Laptop::make(prefix, files, false)
    }

    fn make(prefix: &str, files: &[(&str, &str)], xdg: bool) -> Laptop {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let laptop = Laptop { dir, xdg };
        std::fs::create_dir_all(laptop.home()).unwrap();
        for (path, content) in files {
            let path = laptop.home().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        laptop
    }

    /// The temp dir, canonical.
    pub fn root(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    pub fn home(&self) -> PathBuf {
        self.root().join("home")
    }

    /// The config dir: `<root>/xdg-config`, or `~/.config` with default dirs.
    pub fn config_home(&self) -> PathBuf {
        if self.xdg {
            self.root().join("xdg-config")
        } else {
            self.home().join(".config")
        }
    }

    /// The state dir (receipts, scratch dirs below `agentworks/`): `<root>/xdg-state`, or
    /// `~/.local/state` with default dirs.
    pub fn state_home(&self) -> PathBuf {
        if self.xdg {
            self.root().join("xdg-state")
        } else {
            self.home().join(".local/state")
        }
    }

    /// Where `agentworks login` stores the credential.
    pub fn credentials(&self) -> PathBuf {
        self.config_home().join("agentworks/credentials.json")
    }

    /// Store a credential for an unreachable server with `token`, as a login would (the
    /// executor tests give it their own `--gateway`).
    pub fn write_credentials(&self, token: &str) {
        let path = self.credentials();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            serde_json::json!({"server": "http://127.0.0.1:9", "token": token}).to_string(),
        )
        .unwrap();
    }

    /// A project folder: `~/src/<name>`.
    pub fn folder(&self, name: &str) -> PathBuf {
        self.home().join("src").join(name)
    }

    /// `agentworks <args>` with a cleared environment: PATH, HOME and (unless default dirs)
    /// the XDG dirs; stdin null.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentworks"));
        command
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", self.home())
            .stdin(Stdio::null());
        if self.xdg {
            command
                .env("XDG_CONFIG_HOME", self.config_home())
                .env("XDG_STATE_HOME", self.state_home());
        }
        command
    }

    /// `agentworks login --server … --gateway … --with-token`, the token on stdin; asserts it
    /// succeeds and stores the credential.
    pub fn login(&self, stack: &Stack, gateway_port: u16, token: &str) {
        self.login_to(stack, &[&format!("ws://127.0.0.1:{gateway_port}")], token);
    }

    /// [`Laptop::login`] with several gateways (one `--gateway` each, in order).
    pub fn login_to(&self, stack: &Stack, gateways: &[&str], token: &str) {
        let server = format!("http://127.0.0.1:{}", stack.port);
        laptop_cli::login_with_token(self.command(&[]), &server, gateways, token);
        assert!(self.credentials().exists());
    }

    /// `agentworks executor connect <args>` in the background with `env` added to its
    /// environment, stdout discarded and stderr kept in a file under the laptop's root.
    pub fn executor_connect<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        env: &[(&str, &str)],
    ) -> ExecutorProcess {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let stderr = self.root().join(format!("executor-stderr-{n}"));
        let child = self
            .command(&["executor", "connect"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        ExecutorProcess { child, stderr }
    }
}

/// A running `agentworks executor connect` ([`Laptop::executor_connect`]), its stderr in a file.
/// SIGKILLed and reaped when dropped.
pub struct ExecutorProcess {
    child: Child,
    stderr: PathBuf,
}

impl ExecutorProcess {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid()), signal).unwrap();
    }

    /// The exit status if the process ends within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What it wrote to stderr so far (its status lines).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Polls `cond` until it holds; fails the test with `what` and the executor's stderr if it
    /// does not within `within`, or as soon as the executor exits.
    pub fn wait_until(&mut self, what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while !cond() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the executor exited ({status}) before {what}; its stderr:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what}; the executor's stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ExecutorProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill(Pid::from_raw(self.pid()), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}
