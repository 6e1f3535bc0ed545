//! Installing the laptop CLI as a newcomer does (issue 43, item 4): a real quickstart's agentd
//! offers the CLI it was built with (`GET /v1/cli`, what the console's setup step shows), and
//! the exact install line of that manifest runs in `sh` as a user without root whose HOME is a
//! temp dir; `~/.local/bin/agentworks --version` then answers as that user. A download that
//! does not match the SHA-256 in the line is refused and installs nothing (the attack: the
//! served file replaced after the line was shown). The quickstart banner's commands run as
//! printed, with a PATH that does not hold the build folder.

use super::harness::*;
use serde_json::Value;
use sha2::Digest;
use std::io::BufRead;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A PATH without the build folder and without `~/.local/bin`, as on a fresh machine.
const PLAIN_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A quickstart (`agentworksctl quickstart`) stopped as Ctrl-C stops it, SIGTERM, and waited
/// for when dropped, also when the test fails: its daemons stop with it (a SIGKILL would leave
/// them running).
struct StopOnDrop<'a>(&'a mut std::process::Child);

impl StopOnDrop<'_> {
    /// Stops it now; its exit status.
    fn stop(&mut self) -> std::process::ExitStatus {
        if let Ok(Some(status)) = self.0.try_wait() {
            return status;
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.0.wait().unwrap()
    }
}

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn quickstart(state: &Path, extra: &[&str]) -> QuickstartRun {
    let ports = reserve_ports(2);
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentworksctl"));
    command
        .args(quickstart_args(state, [ports[0], ports[1]]))
        .args(extra)
        .env_remove("AGENTWORKS_STATE_ROOT")
        .env_remove("AGENTWORKS_CONFIG");
    QuickstartRun::spawn(command)
}

fn port_of(started: &Value) -> u16 {
    let api = started["api_url"].as_str().unwrap();
    api.rsplit(':').next().unwrap().parse().unwrap()
}

/// `GET /v1/cli`, parsed.
fn manifest(port: u16) -> Value {
    let (status, _, body) = http(port, "GET", "/v1/cli", &[], "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The manifest's binary for this machine.
fn own_binary(manifest: &Value) -> &Value {
    manifest["binaries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["os"] == "linux" && b["arch"] == std::env::consts::ARCH)
        .unwrap_or_else(|| panic!("no binary for this machine in {manifest}"))
}

fn sha256_hex(path: &Path) -> String {
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// A user without root, and a fresh home of theirs (0700) in a temp dir.
struct Person {
    uid: u32,
    gid: u32,
    home: tempfile::TempDir,
}

impl Person {
    fn new() -> Person {
        let (uid, gid) = {
            let _lock = users_lock();
            ensure_user("awtest-cli", &[])
        };
        assert_ne!(uid, 0);
        let home = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(home.path(), Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        Person { uid, gid, home }
    }

    fn bin(&self) -> PathBuf {
        self.home.path().join(".local/bin")
    }

    /// `program args…` as this person, in their home, with only HOME and `path` set.
    fn run(&self, path: &str, program: &str, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", path)
            .env("LANG", "C.UTF-8")
            .current_dir(self.home.path())
            .uid(self.uid)
            .gid(self.gid)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The line, as a person pastes it into their shell (sh).
    fn paste(&self, path: &str, line: &str) -> Output {
        self.run(path, "sh", &["-c", line])
    }

    /// The names in `~/.local/bin`.
    fn installed(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.bin())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_consoles_install_line_installs_the_cli_for_a_user_without_root() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = quickstart(&dir.path().join("qs"), &[]);
    let port = port_of(&run.started);
    let mut running = StopOnDrop(run.child());
    let manifest = manifest(port);
    let binary = own_binary(&manifest);
    // The build folder's CLI: the one quickstart runs beside.
    let built = Path::new(env!("CARGO_BIN_EXE_agentworks"));
    assert_eq!(binary["sha256"], sha256_hex(built), "{manifest}");
    assert_eq!(binary["size"], std::fs::metadata(built).unwrap().len());
    let line = binary["install"].as_str().expect("an install line");

    let person = Person::new();
    let first = person.paste(PLAIN_PATH, line);
    let (stdout, stderr) = (text(&first.stdout), text(&first.stderr));
    assert!(first.status.success(), "{stdout}\n{stderr}");
    let installed = person.bin().join("agentworks");
    assert!(
        stdout.contains(&format!(
            "installed {}: agentworks {}",
            installed.display(),
            manifest["version"].as_str().unwrap()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("is not on your PATH"), "{stdout}");
    let metadata = std::fs::metadata(&installed).unwrap();
    assert_eq!(
        (metadata.uid(), metadata.mode() & 0o7777),
        (person.uid, 0o755)
    );
    assert_eq!(sha256_hex(&installed), sha256_hex(built));
    assert_eq!(person.installed(), ["agentworks"], "no temp file left");

    let version = person.run(PLAIN_PATH, installed.to_str().unwrap(), &["--version"]);
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        text(&version.stdout).trim(),
        format!("agentworks {}", manifest["version"].as_str().unwrap())
    );

    // Again (an upgrade), pasted into bash, with ~/.local/bin on PATH: replaced, and no advice
    // about PATH.
    let with_bin = format!("{}:{PLAIN_PATH}", person.bin().display());
    let again = person.run(&with_bin, "bash", &["-c", line]);
    assert!(again.status.success(), "{again:?}");
    assert!(
        !text(&again.stdout).contains("not on your PATH"),
        "{again:?}"
    );
    let version = person.run(&with_bin, "agentworks", &["--version"]);
    assert!(version.status.success(), "{version:?}");
    assert_eq!(person.installed(), ["agentworks"]);
    assert!(running.stop().success());
}

/// The attack: the file the server serves is replaced after the person was shown the line (a
/// compromised mirror or proxy would do the same to the download) by one that even answers
/// `--version` as the real one does. The line's SHA-256 check refuses it: exit 1, the
/// earlier install untouched, no temp file left. The other architecture's line refuses this
/// machine. Then the binaries removed: the manifest says they are not offered and why, and the
/// URL is 404 saying what to do.
#[test]
fn a_download_that_does_not_match_the_published_sha256_is_refused_and_installs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cli_dir = dir.path().join("cli");
    std::fs::create_dir(&cli_dir).unwrap();
    let file = format!("agentworks-linux-{}", std::env::consts::ARCH);
    std::fs::copy(env!("CARGO_BIN_EXE_agentworks"), cli_dir.join(&file)).unwrap();
    // The other architecture's line, for a machine it is not for (any bytes will do: the line
    // refuses before it downloads).
    let other_arch = if std::env::consts::ARCH == "x86_64" {
        "aarch64"
    } else {
        "x86_64"
    };
    let other_file = format!("agentworks-linux-{other_arch}");
    std::fs::copy(env!("CARGO_BIN_EXE_agentworks"), cli_dir.join(&other_file)).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[agentd]\ncli_dir = \"{}\"\n", cli_dir.display()),
    )
    .unwrap();
    let mut run = quickstart(
        &dir.path().join("qs"),
        &["--config", config.to_str().unwrap()],
    );
    let port = port_of(&run.started);
    let mut running = StopOnDrop(run.child());
    let manifest = manifest(port);
    let line = own_binary(&manifest)["install"]
        .as_str()
        .unwrap()
        .to_owned();
    let other_line = manifest["binaries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["arch"] == other_arch)
        .and_then(|b| b["install"].as_str())
        .unwrap_or_else(|| panic!("no {other_arch} line in {manifest}"))
        .to_owned();
    let version = manifest["version"].as_str().unwrap();

    let person = Person::new();
    std::fs::create_dir_all(person.bin()).unwrap();
    let earlier = person.bin().join("agentworks");
    std::fs::write(&earlier, "#!/bin/sh\necho the earlier install\n").unwrap();
    for path in [
        person.home.path().join(".local"),
        person.bin(),
        earlier.clone(),
    ] {
        std::os::unix::fs::chown(&path, Some(person.uid), Some(person.gid)).unwrap();
    }
    std::fs::set_permissions(&earlier, std::fs::Permissions::from_mode(0o755)).unwrap();

    let elsewhere = person.paste(PLAIN_PATH, &other_line);
    assert_eq!(elsewhere.status.code(), Some(1), "{elsewhere:?}");
    assert!(
        text(&elsewhere.stderr).contains(&format!(
            "this line is for Linux {other_arch}, not Linux {}",
            std::env::consts::ARCH
        )),
        "{elsewhere:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&earlier).unwrap(),
        "#!/bin/sh\necho the earlier install\n"
    );

    let tampered = format!("#!/bin/sh\necho agentworks {version}\n");
    let staged = cli_dir.join("staged");
    std::fs::write(&staged, &tampered).unwrap();
    std::fs::rename(&staged, cli_dir.join(&file)).unwrap();
    let (status, _, served) = http(port, "GET", &format!("/v1/cli/{file}"), &[], "");
    assert_eq!((status, served.as_str()), (200, tampered.as_str()));

    let refused = person.paste(PLAIN_PATH, &line);
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        stderr.contains("does not match the SHA-256 this server published"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&earlier).unwrap(),
        "#!/bin/sh\necho the earlier install\n",
        "the tampered file was installed"
    );
    assert_eq!(person.installed(), ["agentworks"], "no temp file left");

    std::fs::remove_file(cli_dir.join(&file)).unwrap();
    std::fs::remove_file(cli_dir.join(&other_file)).unwrap();
    let manifest = self::manifest(port);
    assert!(
        manifest["binaries"].as_array().unwrap().is_empty(),
        "{manifest}"
    );
    let reason = manifest["not_offered"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["os"] == "linux" && n["arch"] == std::env::consts::ARCH)
        .map(|n| n["reason"].as_str().unwrap().to_owned())
        .unwrap();
    assert!(reason.contains(&file), "{reason}");
    assert!(
        !reason.contains(&cli_dir.display().to_string()),
        "the public manifest names no path: {reason}"
    );
    let (status, _, body) = http(port, "GET", &format!("/v1/cli/{file}"), &[], "");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("agentworks package"), "{body}");
    assert!(running.stop().success());
}

/// The commands of quickstart's banner, run as printed by `sh` with a PATH that does not hold
/// the build folder (after `cargo build --bins` the binaries are in target/debug only).
#[test]
fn the_quickstart_banner_prints_commands_that_run_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let state_home = tempfile::tempdir().unwrap();
    let ports = reserve_ports(2);
    let mut args = quickstart_args(&dir.path().join("qs"), [ports[0], ports[1]]);
    args.retain(|a| a != "--json");
    let log = dir.path().join("quickstart.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(args)
        .env_clear()
        .env("PATH", PLAIN_PATH)
        .env("XDG_STATE_HOME", state_home.path())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut running = StopOnDrop(&mut child);
    let log = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut banner = Vec::new();
    // Kept open to the end: quickstart prints `stopped` when it stops.
    let mut stdout = std::io::BufReader::new(stdout).lines();
    for line in stdout.by_ref() {
        let line = line.unwrap();
        let last = line.starts_with("Administer it from another shell:");
        banner.push(line);
        if last {
            break;
        }
    }
    let banner = banner.join("\n");
    let in_banner = |start: &str, end: &str| -> String {
        let from = banner
            .find(start)
            .unwrap_or_else(|| panic!("{start}: {banner}\n{}", log()))
            + start.len();
        let rest = &banner[from..];
        rest[..rest.find(end).unwrap_or(rest.len())]
            .trim()
            .to_owned()
    };
    let sh = |command: &str| {
        Command::new("sh")
            .args(["-c", command])
            .env_clear()
            .env("PATH", PLAIN_PATH)
            .env("XDG_STATE_HOME", state_home.path())
            .output()
            .unwrap()
    };
    // `agentworks login --server …`: the laptop CLI, as printed, runs.
    let login = in_banner("Share a laptop folder with the server-side agent:\n", "\n");
    let cli = &login[..login.find(" login --server").expect(&login)];
    let version = sh(&format!("{cli} --version"));
    assert!(version.status.success(), "{cli}: {version:?}");
    assert!(text(&version.stdout).starts_with("agentworks "));
    // `agentworksctl status`, both ways the banner gives it (the first finds a system install
    // before this quickstart, as the banner says).
    let found = in_banner("Administer it from another shell:", " (it finds");
    let named = in_banner("unless a system install is there), or ", "\n");
    let system_install = Path::new("/etc/agentworks/agentworks.toml").exists()
        || Path::new("/run/agentworks/agentd.sock").exists();
    if system_install {
        println!("NOT RUN `{found}`: this machine has a system install, which it finds first");
    }
    let commands = if system_install {
        vec![named]
    } else {
        vec![found, named]
    };
    for command in commands {
        let status = sh(&command);
        assert!(status.status.success(), "{command}: {status:?}");
        assert!(
            text(&status.stdout).contains("agentworks-agentd"),
            "{command}: {status:?}"
        );
    }
    let stopped = running.stop();
    let rest: Vec<String> = stdout.map(Result::unwrap).collect();
    assert_eq!(rest, ["stopped"], "{}", log());
    assert!(stopped.success(), "{}", log());
}
