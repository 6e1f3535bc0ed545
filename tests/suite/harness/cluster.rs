//! The servers a cluster-mode test needs (issue 16), real ones from Debian's packages:
//! [`Postgres`] (`postgresql`: `initdb` and `postgres` from `/usr/lib/postgresql/<ver>/bin`) and
//! [`Nats`] (`nats-server`). `.ci/run` installs both.
//!
//! Each is private to one test: PostgreSQL gets a fresh data directory in its own temp dir,
//! owned by an unprivileged user it runs as (the tests run as root, and `postgres` refuses
//! root), listens on `127.0.0.1` only, on a port reserved with [`reserve_ports`], with its Unix
//! socket in the same temp dir, and trusts every loopback connection (the test is the only
//! client). `nats-server` listens on `127.0.0.1` on a reserved port. A start returns only once
//! the server answers (`pg_isready`; the NATS `INFO` line), and panics with the server's own
//! stderr when it exits or does not answer in time. Dropping either stops and reaps it.
//!
//! For TLS, [`TestCertificates`] makes a private CA and a server certificate for `127.0.0.1`
//! and `localhost` with Debian's `openssl`; [`Postgres::start_with_tls`] serves it (`ssl=on`),
//! and a [`Nats::start_with_config`] config can name it in its `tls` block.

use super::daemons::send_signal;
use super::{ensure_user, reserve_ports, users_lock};
use nix::sys::signal::Signal;
use serde_json::Value;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The unprivileged user the test PostgreSQL servers run as.
const POSTGRES_USER: &str = "agentworks-test-pg";
/// The database role and database every test server has; trusted from loopback.
const POSTGRES_ROLE: &str = "agentworks";

/// How long a server has to answer after its start.
const START_WITHIN: Duration = Duration::from_secs(30);

/// The newest `/usr/lib/postgresql/<ver>/bin` (Debian installs each major version there and
/// puts none of the server programs on PATH).
fn postgres_bin_dir() -> PathBuf {
    let versions = std::fs::read_dir("/usr/lib/postgresql").unwrap_or_else(|e| {
        panic!("PostgreSQL is not installed (/usr/lib/postgresql: {e}); apt-get install postgresql")
    });
    let newest = versions
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    newest
        .map(|(_, bin)| bin)
        .expect("no /usr/lib/postgresql/<version>/bin/postgres; apt-get install postgresql")
}

/// What a server wrote to `log` so far, for a failure message.
fn log_of(log: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(log) {
        let _ = file.read_to_string(&mut text);
    }
    text
}

/// Polls `ready` every 20 ms until it holds. Panics with `log`'s contents as soon as `child`
/// exits first, and once [`START_WITHIN`] has passed.
fn wait_answering(child: &mut Child, name: &str, log: &Path, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + START_WITHIN;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{name} exited during start: {status}; it said:\n{}",
                log_of(log)
            );
        }
        if ready() {
            return;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name} did not answer within {START_WITHIN:?}; it said:\n{}",
                log_of(log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A private CA and a server certificate it signed, valid for `localhost` and `127.0.0.1`
/// (ECDSA P-256, two days), made with `openssl` in `dir`: `ca.crt` (what a client trusts),
/// `server.crt` and `server.key` (mode 0600).
pub struct TestCertificates {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCertificates {
    pub fn generate(dir: &Path) -> TestCertificates {
        let run = |args: &[&str]| {
            let output = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("cannot run openssl ({e}); apt-get install openssl"));
            assert!(
                output.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let common = ["-x509", "-nodes", "-days", "2"];
        run(&[
            &["req"][..],
            &common,
            &new_key,
            &["-subj", "/CN=agentworks-test-ca", "-keyout", "ca.key"],
            &["-out", "ca.crt"],
        ]
        .concat());
        // A leaf (CA:FALSE): rustls refuses a CA certificate as a server's own.
        run(&[
            &["req"][..],
            &common,
            &new_key,
            &[
                "-subj",
                "/CN=localhost",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
            ],
            &["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            &["-addext", "basicConstraints=critical,CA:FALSE"],
            &["-keyout", "server.key", "-out", "server.crt"],
        ]
        .concat());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::Permissions::from_mode(0o600);
        std::fs::set_permissions(dir.join("server.key"), mode).unwrap();
        TestCertificates {
            ca: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
        }
    }
}

/// A private PostgreSQL server for one test. Stopped (immediate shutdown) and reaped when
/// dropped; its temp dir, data and socket with it.
pub struct Postgres {
    child: Child,
    pub port: u16,
    /// With [`Postgres::start_with_tls`]: the CA that signed the server's certificate.
    pub ca: Option<PathBuf>,
    /// The postmaster's arguments and its user, to start it again on the same data.
    args: Vec<std::ffi::OsString>,
    owner: (u32, u32),
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// The `[cluster]` section of a host `host_id` on `postgres` and `nats`.
pub fn cluster_section(postgres: &Postgres, nats: &Nats, host_id: &str) -> String {
    format!(
        "[cluster]\ndatabase_url = \"{}\"\nnats_url = \"{}\"\nhost_id = \"{host_id}\"\n",
        postgres.url(),
        nats.url()
    )
}

impl Postgres {
    /// `initdb` a new cluster (role and database `agentworks`, trust authentication) and start
    /// `postgres` on it, as [`POSTGRES_USER`]; returns once it accepts connections.
    pub fn start() -> Postgres {
        Postgres::start_serving(false)
    }

    /// [`Postgres::start`] with `ssl=on`, serving a [`TestCertificates`] certificate (its CA in
    /// [`Postgres::ca`]); clients may still connect without TLS (the test decides).
    pub fn start_with_tls() -> Postgres {
        Postgres::start_serving(true)
    }

    fn start_serving(tls: bool) -> Postgres {
        let bin = postgres_bin_dir();
        let (uid, gid) = {
            let _lock = users_lock();
            ensure_user(POSTGRES_USER, &[])
        };
        let dir = tempfile::Builder::new()
            .prefix("aw-postgres-")
            .tempdir()
            .unwrap();
        nix::unistd::chown(
            dir.path(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .unwrap();
        let data = dir.path().join("data");
        let socket_dir = dir.path().join("socket");
        let log = dir.path().join("postgres.log");
        let as_server_user = |command: &mut Command| {
            command
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .env("LANG", "C.UTF-8")
                .current_dir(dir.path())
                .uid(uid)
                .gid(gid)
                .stdin(Stdio::null());
        };
        let mut initdb = Command::new(bin.join("initdb"));
        as_server_user(&mut initdb);
        let output = initdb
            .arg("--pgdata")
            .arg(&data)
            .args(["--username", POSTGRES_ROLE])
            .args(["--auth", "trust", "--encoding", "UTF8", "--locale", "C"])
            // A test's database never outlives the test: no need to wait for the disk.
            .arg("--no-sync")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.join("initdb").display()));
        assert!(
            output.status.success(),
            "initdb failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::create_dir(&socket_dir).unwrap();
        nix::unistd::chown(
            &socket_dir,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .unwrap();
        let mut ssl_args = Vec::new();
        let ca = tls.then(|| {
            let certificates = TestCertificates::generate(dir.path());
            // postgres refuses a key that others may read or that it does not own.
            nix::unistd::chown(
                &certificates.key,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .unwrap();
            for (name, path) in [
                ("ssl_cert_file", &certificates.cert),
                ("ssl_key_file", &certificates.key),
            ] {
                ssl_args.extend(["-c".to_owned(), format!("{name}={}", path.display())]);
            }
            ssl_args.extend(["-c".to_owned(), "ssl=on".to_owned()]);
            certificates.ca
        });
        let port = reserve_ports(1)[0];
        let mut args: Vec<std::ffi::OsString> = ssl_args.into_iter().map(Into::into).collect();
        args.extend(["-D".into(), data.into()]);
        for setting in [
            format!("port={port}"),
            "listen_addresses=127.0.0.1".to_owned(),
            format!("unix_socket_directories={}", socket_dir.display()),
            // The disk's durability is not what these tests measure (no fsync); a commit is
            // still written before it is acknowledged, so a process crash (a restart test's
            // SIGQUIT) loses nothing acknowledged, as on a real server.
            "fsync=off".to_owned(),
            "full_page_writes=off".to_owned(),
        ] {
            args.extend(["-c".into(), setting.into()]);
        }
        let child = postmaster(&args, (uid, gid), dir.path(), &log, port);
        let server = Postgres {
            child,
            port,
            ca,
            args,
            owner: (uid, gid),
            log,
            _dir: dir,
        };
        server.create_database(POSTGRES_ROLE);
        server
    }

    /// Stops the server at once (SIGQUIT) and reaps it; [`Postgres::start_again`] brings it
    /// back.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = send_signal(&self.child, Signal::SIGQUIT);
            let _ = self.child.wait();
        }
    }

    /// Starts the stopped server again on the same data and port.
    pub fn start_again(&mut self) {
        let dir = self._dir.path().to_owned();
        self.child = postmaster(&self.args, self.owner, &dir, &self.log, self.port);
    }

    /// Runs `sql` with `psql` on database `database` as the `agentworks` role; panics with
    /// psql's output if it fails.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let output = Command::new(postgres_bin_dir().join("psql"))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", POSTGRES_ROLE, "-d", database, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Every row of the tables in `namespace` of database `database`, as `pg_dump --data-only`
    /// writes them (text as it is, `BYTEA` as `\x` and hex digits).
    pub fn dump(&self, database: &str, namespace: &str) -> String {
        let output = Command::new(postgres_bin_dir().join("pg_dump"))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .args(["--data-only", "-n", namespace])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", POSTGRES_ROLE, "-d", database])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "pg_dump failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Creates an empty database `name` (the server starts with `agentworks` made).
    pub fn create_database(&self, name: &str) {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
    }

    /// The URL of database `agentworks` over TCP on loopback.
    pub fn url(&self) -> String {
        self.url_of(POSTGRES_ROLE)
    }

    /// The URL of database `database` over TCP on loopback.
    pub fn url_of(&self, database: &str) -> String {
        format!(
            "postgres://{POSTGRES_ROLE}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// Its process id (the postmaster).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Starts `postgres` with `args` as `owner` in `dir`, its stderr appended to `log`; returns once
/// it accepts connections on `port`.
fn postmaster(
    args: &[std::ffi::OsString],
    owner: (u32, u32),
    dir: &std::path::Path,
    log: &std::path::Path,
    port: u16,
) -> Child {
    let bin = postgres_bin_dir();
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut child = Command::new(bin.join("postgres"))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LANG", "C.UTF-8")
        .current_dir(dir)
        .uid(owner.0)
        .gid(owner.1)
        .stdin(Stdio::null())
        .args(args)
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.join("postgres").display()));
    let pg_isready = bin.join("pg_isready");
    wait_answering(&mut child, "postgres", log, || {
        Command::new(&pg_isready)
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", POSTGRES_ROLE, "-d", POSTGRES_ROLE])
            .status()
            .is_ok_and(|s| s.success())
    });
    child
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SIGQUIT: immediate shutdown; the postmaster ends its backends and exits at once.
            let _ = send_signal(&self.child, Signal::SIGQUIT);
            let _ = self.child.wait();
        }
    }
}

/// A private `nats-server` for one test. Killed and reaped when dropped.
pub struct Nats {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Nats {
    /// `nats-server` on `127.0.0.1` and a reserved port; returns once it greets a client.
    pub fn start() -> Nats {
        Nats::start_on(reserve_ports(1)[0])
    }

    /// `nats-server` on `127.0.0.1:port`; returns once it greets a client, panics with what the
    /// server said if it exits first (the port taken, say) or does not answer in time.
    pub fn start_on(port: u16) -> Nats {
        Nats::start_serving(port, None)
    }

    /// [`Nats::start`] with `config` as its configuration file (users, permissions, a `tls`
    /// block); the address and port are still the harness's. The server greets in clear
    /// before any TLS, so the start is detected the same way.
    pub fn start_with_config(config: &str) -> Nats {
        Nats::start_serving(reserve_ports(1)[0], Some(config))
    }

    fn start_serving(port: u16, config: Option<&str>) -> Nats {
        let dir = tempfile::Builder::new()
            .prefix("aw-nats-")
            .tempdir()
            .unwrap();
        let log = dir.path().join("nats-server.log");
        let mut command = Command::new("nats-server");
        if let Some(config) = config {
            let path = dir.path().join("nats-server.conf");
            std::fs::write(&path, config).unwrap();
            command.arg("--config").arg(path);
        }
        let mut child = command
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .args(["--addr", "127.0.0.1", "--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start nats-server ({e}); apt-get install nats-server")
            });
        wait_answering(&mut child, "nats-server", &log, || greets(port));
        Nats {
            child,
            port,
            _dir: dir,
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server (SIGKILL) and starts a new one on the same port, as a restart would;
    /// returns once it greets a client. Subscriptions live in clients, so theirs must come back
    /// by reconnecting.
    pub fn restart(&mut self) {
        self.stop();
        let port = self.port;
        *self = Nats::start_on(port);
    }

    /// Kills the server and reaps it; [`Nats::restart`] brings one back on the port.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = send_signal(&self.child, Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }

    /// Publishes `payload` on `subject` (reply subject `_INBOX.test`), speaking the NATS text
    /// protocol itself (no client library between the test and the server); returns once the
    /// server has processed it (its `PONG` to the `PING` sent after the message).
    pub fn publish(&self, subject: &str, payload: &[u8]) {
        self.publish_with_headers(subject, &[], payload);
    }

    /// [`Nats::publish`] with NATS headers (`HPUB`), `(name, value)` each, and a reply subject
    /// (`_INBOX.test`, which nothing reads), as a request would have.
    pub fn publish_with_headers(&self, subject: &str, headers: &[(&str, &str)], payload: &[u8]) {
        use std::io::{BufRead, Write};
        let stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("INFO "), "not a NATS greeting: {line:?}");
        let mut writer = stream;
        write!(
            writer,
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"name\":\"test\"}}\r\n"
        )
        .unwrap();
        if headers.is_empty() {
            write!(writer, "PUB {subject} _INBOX.test {}\r\n", payload.len()).unwrap();
        } else {
            let mut block = String::from("NATS/1.0\r\n");
            for (name, value) in headers {
                block.push_str(&format!("{name}: {value}\r\n"));
            }
            block.push_str("\r\n");
            let total = block.len() + payload.len();
            write!(
                writer,
                "HPUB {subject} _INBOX.test {} {total}\r\n{block}",
                block.len()
            )
            .unwrap();
        }
        writer.write_all(payload).unwrap();
        writer.write_all(b"\r\nPING\r\n").unwrap();
        loop {
            line.clear();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "nats-server closed"
            );
            assert!(!line.starts_with("-ERR"), "nats-server refused: {line}");
            if line.starts_with("PONG") {
                return;
            }
        }
    }
}

/// A NATS server greets every client with an `INFO {…}` line before anything else.
fn greets(port: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut first = [0u8; 5];
    stream.read_exact(&mut first).is_ok() && &first == b"INFO "
}

impl Drop for Nats {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = send_signal(&self.child, Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A second (third, …) gatewayd host beside `stack`: the stack's config with its `[gatewayd]`
/// WebSocket port `stack_port` replaced by `port` and its own `gatewayd.sock` (`<name>.sock` in
/// the runtime directory), then `replace` applied as (from, to) pairs (a host id, say),
/// written to `<root>/<name>.toml`. The daemon shares the stack's agentd and state root;
/// returns once its socket and port answer, with its stderr in the test's output.
pub fn start_gatewayd_host(
    stack: &super::Stack,
    stack_port: u16,
    port: u16,
    name: &str,
    replace: &[(&str, &str)],
) -> super::Gatewayd {
    let root = stack.state.root();
    let socket = root.join("run").join(format!("{name}.sock"));
    let mut config = std::fs::read_to_string(root.join("agentworks.toml")).unwrap();
    let listen = format!("listen = \"127.0.0.1:{stack_port}\"");
    assert!(
        config.contains(&listen),
        "no gatewayd listen line: {config}"
    );
    config = config.replace(
        &listen,
        &format!("listen = \"127.0.0.1:{port}\"\nsocket = {socket:?}"),
    );
    for (from, to) in replace {
        config = config.replace(from, to);
    }
    let path = root.join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentworks-gatewayd"));
    super::daemons::as_daemon_on(&mut command, root).env("AGENTWORKS_CONFIG", &path);
    let child = command.spawn().unwrap();
    let mut daemon = super::Gatewayd {
        child,
        socket: socket.clone(),
        port,
    };
    let client = agentworks_support::unix_http::UnixClient::new(&socket);
    super::block_on(super::daemons::wait_ready(
        &mut daemon.child,
        name,
        Duration::from_secs(20),
        || async {
            client.get::<serde_json::Value>("/v1/health").await.is_ok()
                && tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
        },
    ));
    daemon
}

/// Two gatewayd hosts on one PostgreSQL and one nats-server beside one agentd: `a` (host
/// `gw-a`, the stack's own gatewayd) and `b` (host `gw-b`, [`start_gatewayd_host`]), with the
/// heartbeat (and so the lease renewal) every second: a lease lasts 3 s unless renewed.
/// Fields drop in order: the daemons before the servers they use.
pub struct GatewayPair {
    pub a: super::Gatewayd,
    pub b: super::Gatewayd,
    pub stack: super::Stack,
    pub nats: Nats,
    pub postgres: Postgres,
}

impl GatewayPair {
    pub fn start() -> GatewayPair {
        GatewayPair::start_with_heartbeat(1)
    }

    /// [`GatewayPair::start`] with the heartbeat every `secs` seconds (a lease lasts three).
    pub fn start_with_heartbeat(secs: u64) -> GatewayPair {
        let nats = Nats::start();
        let url = nats.url();
        let heartbeat = format!("heartbeat_secs = {secs}\n");
        GatewayPair::start_on(nats, &heartbeat, &|_| format!("nats_url = \"{url}\"\n"))
    }

    /// [`GatewayPair::start`] on `nats`, with `gatewayd_keys` added to `[gatewayd]` (give
    /// `heartbeat_secs` there, or the default 30 s holds) and each
    /// host's NATS keys (`nats_url` and what goes with it) from `nats_keys(host_id)`.
    pub fn start_on(
        nats: Nats,
        gatewayd_keys: &str,
        nats_keys: &dyn Fn(&str) -> String,
    ) -> GatewayPair {
        let postgres = Postgres::start();
        let (stack, port_a) = super::Stack::start_with_embedded_gateway();
        let path = stack.state.root().join("agentworks.toml");
        let config = std::fs::read_to_string(&path).unwrap();
        let (nats_a, nats_b) = (nats_keys("gw-a"), nats_keys("gw-b"));
        std::fs::write(
            &path,
            format!(
                "{config}{gatewayd_keys}[cluster]\ndatabase_url = \"{}\"\n\
                 {nats_a}host_id = \"gw-a\"\n",
                postgres.url(),
            ),
        )
        .unwrap();
        let a = super::Gatewayd::start(&stack, port_a);
        let b = start_gatewayd_host(
            &stack,
            port_a,
            super::free_port(),
            "gatewayd-b",
            &[
                ("host_id = \"gw-a\"", "host_id = \"gw-b\""),
                (&nats_a, &nats_b),
            ],
        );
        GatewayPair {
            a,
            b,
            stack,
            nats,
            postgres,
        }
    }

    /// agentd host `origin` calling these gateways over NATS.
    pub fn agentd(&self, origin: &str) -> ClusterAgentd {
        ClusterAgentd::connect(&self.postgres, &self.nats.url(), origin)
    }

    /// The host holding `device_id`'s lease row, or "" when there is none.
    pub fn lease_holder(&self, device_id: &str) -> String {
        self.postgres.psql(
            "agentworks",
            &format!("SELECT host_id FROM gateway_leases WHERE device_id = '{device_id}'"),
        )
    }

    /// `"<host> <state>"` of `request_id`'s record, or "" when there is none.
    pub fn request_state(&self, request_id: &str) -> String {
        self.postgres.psql(
            "agentworks",
            &format!(
                "SELECT host_id || ' ' || state FROM gateway_requests \
                 WHERE request_id = '{request_id}'"
            ),
        )
    }
}

/// What agentd does to reach the gateways of a cluster, done from the test process: its
/// `GatewaydClient` over NATS as agentd host `origin`, calls sealed under the cluster's
/// gatewayd key read from `postgres`. Its NATS connection lives on its own runtime, so any
/// thread may call it.
pub struct ClusterAgentd {
    runtime: tokio::runtime::Runtime,
    gateways: agentworks_agent::clients::gatewayd::GatewaydClient,
}

impl ClusterAgentd {
    pub fn connect(postgres: &Postgres, nats_url: &str, origin: &str) -> ClusterAgentd {
        ClusterAgentd::connect_with(postgres, Default::default(), nats_url, origin)
    }

    /// [`ClusterAgentd::connect`] with `options` (a NATS user, TLS).
    pub fn connect_with(
        postgres: &Postgres,
        options: async_nats::ConnectOptions,
        nats_url: &str,
        origin: &str,
    ) -> ClusterAgentd {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let cluster = agentworks_daemon::config::ClusterConfig {
            database_url: Some(postgres.url()),
            ..Default::default()
        };
        let gateways = runtime.block_on(async {
            let client = options.connect(nats_url).await.expect("NATS answers");
            let key = agentworks_daemon::bus::cluster_key(
                &cluster,
                "agentworks-agentd",
                agentworks_contract::cluster::GATEWAYD_KEY,
            )
            .await
            .expect("the gatewayd key is readable");
            agentworks_agent::clients::gatewayd::GatewaydClient::cluster(client, key, origin)
        });
        ClusterAgentd { runtime, gateways }
    }

    /// POSTs `body` to `path` (a dispatch through `GatewaydClient::dispatch`): the answer, or
    /// the refusal's code and body; a transport failure is the error's text as the code.
    pub fn json(&self, path: &str, body: Value) -> Result<Value, (String, Value)> {
        use agentworks_support::unix_http::ClientError;
        let answer = self.runtime.block_on(async {
            if path == "/v1/dispatch" {
                let request = serde_json::from_value(body).expect("a dispatch request");
                let state = self.gateways.dispatch(&request).await?;
                Ok(serde_json::to_value(state).unwrap())
            } else {
                self.gateways.post::<_, Value>(path, &body).await
            }
        });
        answer.map_err(|error| match error {
            ClientError::Remote { body, .. } => {
                let details = serde_json::to_value(&body).unwrap();
                (body.code, details)
            }
            other => (other.to_string(), Value::Null),
        })
    }
}
