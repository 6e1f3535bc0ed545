//! `ssh localhost true` over a persistent connection, as a bench's floor for a remote command:
//! a private OpenSSH server on a reserved loopback port and one ControlMaster connection to it,
//! through which each timed `ssh -S <socket> localhost true` opens a session and runs `true`
//! with the user's login shell (no new TCP connection, key exchange or authentication).
//!
//! It never touches the system's sshd or its config: a temp dir holds the config, a fresh
//! host key, a fresh client key and the authorized_keys naming only it, and the server runs in
//! the foreground as `/usr/sbin/sshd -D -e -f <config> -p <port> -o ListenAddress=127.0.0.1`,
//! for this process's user only, with public-key authentication only. The ssh clients run
//! with a cleared environment and `-F /dev/null` (no user or system client config, no agent).
//! The master connection is closed and the server stopped when [`Sshd`] is dropped.
//!
//! The timed calls carry no key and may not use public-key authentication, so a call that
//! could not use the master connection fails instead of quietly timing a full login.
//!
//! Needs `openssh-server` (`/usr/sbin/sshd`) and the OpenSSH client (`ssh`, `ssh-keygen`);
//! [`missing`] says which is absent. Included on its own (`#[path]`) by `gateway_roundtrip`.

use crate::daemons::Process;
use crate::ports;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary, where Debian's and Ubuntu's `openssh-server` install it.
pub const SSHD: &str = "/usr/sbin/sshd";
/// How to get it.
pub const INSTALL: &str = "apt-get install openssh-server";

/// Why the row cannot be measured on this machine, if a needed program is missing: the name
/// of the missing program and its package.
pub fn missing() -> Option<String> {
    if !Path::new(SSHD).is_file() {
        return Some(format!(
            "sshd is not installed ({SSHD}, package openssh-server)"
        ));
    }
    for client in ["ssh", "ssh-keygen"] {
        let found = Command::new(client)
            .arg("-V")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!(
                "{client} is not installed (package openssh-client)"
            ));
        }
    }
    None
}

/// The private server and the master connection to it.
pub struct Sshd {
    /// The temp dir with the config, the keys, the logs and the control socket.
    dir: tempfile::TempDir,
    port: u16,
    user: String,
    /// The login shell `true` runs with on the server side.
    pub shell: String,
    /// The user's home directory (where that shell starts).
    home: std::path::PathBuf,
    /// Whether the master connection is up (and must be closed on drop).
    master: bool,
    /// The server; stopped after the master connection is closed.
    server: Option<Process>,
}

impl Sshd {
    /// Start the server under `base` and open the master connection.
    pub fn start(base: &Path) -> Result<Sshd, String> {
        let dir = tempfile::Builder::new()
            .prefix("ssh-")
            .tempdir_in(base)
            .map_err(|e| format!("cannot create a temp dir under {}: {e}", base.display()))?;
        let me = nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .ok_or("this process's user has no passwd entry")?;
        let mut sshd = Sshd {
            port: ports::free_port(),
            user: me.name,
            shell: me.shell.display().to_string(),
            home: me.dir,
            master: false,
            server: None,
            dir,
        };
        let path = sshd.dir.path().to_path_buf();
        for key in ["host_ed25519", "client_ed25519"] {
            keygen(&path.join(key))?;
        }
        let client_public = read(&path.join("client_ed25519.pub"))?;
        std::fs::write(path.join("authorized_keys"), client_public)
            .map_err(|e| format!("cannot write authorized_keys: {e}"))?;
        let host_public = read(&path.join("host_ed25519.pub"))?;
        let host_public = host_public.trim();
        let port = sshd.port;
        std::fs::write(
            path.join("known_hosts"),
            format!("[localhost]:{port} {host_public}\n[127.0.0.1]:{port} {host_public}\n"),
        )
        .map_err(|e| format!("cannot write known_hosts: {e}"))?;
        std::fs::write(path.join("sshd_config"), sshd.config())
            .map_err(|e| format!("cannot write sshd_config: {e}"))?;
        privsep_dir()?;

        let log = log_file(&path.join("sshd.log"))?;
        let child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(path.join("sshd_config"))
            .arg("-p")
            .arg(port.to_string())
            .args(["-o", "ListenAddress=127.0.0.1"])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {SSHD}: {e}"))?;
        sshd.server = Some(Process {
            name: "sshd",
            child,
        });
        sshd.wait_listening()?;

        // The master: authenticate once with the client key, then stay in the background
        // (`-f -N`, ControlPersist) serving sessions on the control socket.
        let status = sshd
            .ssh()
            .args(["-M", "-o", "ControlPersist=yes", "-f", "-N"])
            .arg("-o")
            .arg(format!(
                "IdentityFile={}",
                path.join("client_ed25519").display()
            ))
            .arg("localhost")
            .status()
            .map_err(|e| format!("cannot run ssh: {e}"))?;
        if !status.success() {
            return Err(sshd.failure(&format!("the master connection failed ({status})")));
        }
        sshd.master = true;
        let status = sshd
            .ssh()
            .args(["-O", "check", "localhost"])
            .status()
            .map_err(|e| format!("cannot run ssh: {e}"))?;
        if !status.success() {
            return Err(sshd.failure("the master connection is not running"));
        }
        Ok(sshd)
    }

    /// One `ssh -S <socket> localhost true` through the master connection, to its exit.
    pub fn run_true(&self) -> Result<(), String> {
        let status = self
            .ssh()
            // No key for these: only the master connection can run them.
            .args(["-o", "PubkeyAuthentication=no", "localhost", "true"])
            .status()
            .map_err(|e| format!("cannot run ssh: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(self.failure(&format!("ssh localhost true exited with {status}")))
        }
    }

    /// The server side's share of [`Sshd::run_true`] run locally: the login shell started as
    /// sshd starts it for a command (`<shell> -c true`, in the home dir, with `SSH_CLIENT` and
    /// `SSH_CONNECTION` set, so a bash built to read `~/.bashrc` under sshd, as Debian's is,
    /// reads it), to its exit. What the user's startup files cost is in every ssh call but is
    /// not ssh's; this shows how much of it there is.
    pub fn login_shell_true(&self) -> Result<(), String> {
        let status = Command::new(&self.shell)
            .args(["-c", "true"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("USER", &self.user)
            .env("LOGNAME", &self.user)
            .env("SHELL", &self.shell)
            .env("SSH_CLIENT", format!("127.0.0.1 40000 {}", self.port))
            .env(
                "SSH_CONNECTION",
                format!("127.0.0.1 40000 127.0.0.1 {}", self.port),
            )
            .current_dir(&self.home)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {}: {e}", self.shell))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{} -c true exited with {status}", self.shell))
        }
    }

    fn config(&self) -> String {
        let dir = self.dir.path().display();
        format!(
            "HostKey {dir}/host_ed25519\n\
             AuthorizedKeysFile {dir}/authorized_keys\n\
             AllowUsers {user}\n\
             PidFile none\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\n\
             UsePAM no\n\
             # the temp dir may sit below a group-writable directory\n\
             StrictModes no\n\
             PrintMotd no\n\
             PrintLastLog no\n\
             UseDNS no\n\
             LogLevel ERROR\n",
            user = self.user
        )
    }

    /// `ssh` with this server's client options: no config files, this dir's known_hosts only,
    /// batch mode, the control socket; stderr appended to `ssh.log`.
    fn ssh(&self) -> Command {
        let dir = self.dir.path();
        let mut command = Command::new("ssh");
        command
            .args(["-F", "/dev/null", "-o", "BatchMode=yes"])
            .args(["-o", "StrictHostKeyChecking=yes"])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                dir.join("known_hosts").display()
            ))
            .args(["-o", "GlobalKnownHostsFile=/dev/null"])
            .args(["-o", "IdentitiesOnly=yes", "-o", "AddressFamily=inet"])
            .arg("-S")
            .arg(dir.join("master.sock"))
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-l")
            .arg(&self.user)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        match log_file(&dir.join("ssh.log")) {
            Ok(log) => command.stderr(log),
            Err(_) => command.stderr(Stdio::null()),
        };
        command
    }

    /// Until the server accepts TCP connections; an error with its log if it exits first.
    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.server.as_mut().and_then(Process::exited) {
                return Err(self.failure(&format!("sshd exited during start ({status})")));
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.failure("sshd did not listen within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `what`, with the server's and the clients' logs.
    fn failure(&self, what: &str) -> String {
        let log = |name: &str| read(&self.dir.path().join(name)).unwrap_or_default();
        format!(
            "{what}\nsshd log:\n{}ssh log:\n{}",
            log("sshd.log"),
            log("ssh.log")
        )
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // The master first: stopping the listening sshd leaves its sessions running.
        if self.master {
            let _ = self.ssh().args(["-O", "exit", "localhost"]).status();
        }
        drop(self.server.take());
    }
}

fn keygen(path: &Path) -> Result<(), String> {
    let output = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "agentworks-bench",
            "-f",
        ])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ssh-keygen: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ssh-keygen failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// sshd refuses to start without its privilege separation directory, which the package's
/// service creates at boot (`RuntimeDirectory=sshd`); where no service ever ran (a container),
/// create it the same way, empty and root-owned 0755. Only root runs sshd with privilege
/// separation, so only root needs it.
fn privsep_dir() -> Result<(), String> {
    let dir = Path::new("/run/sshd");
    if dir.is_dir() || !nix::unistd::getuid().is_root() {
        return Ok(());
    }
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(dir)
        .map_err(|e| format!("cannot create sshd's {}: {e}", dir.display()))?;
    eprintln!(
        "created {} (sshd's privilege separation directory)",
        dir.display()
    );
    Ok(())
}

fn log_file(path: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}
