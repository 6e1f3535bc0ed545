//! The executor's sandbox and shell runner, with real processes under a real Landlock ruleset:
//! every escape attempt here must fail, and every legitimate use (git, a C build, loopback
//! network, toolchains) must work.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentworks_laptop::grants::{HOME_TOOLCHAIN_SECRETS, HOME_TOOLCHAINS};
use agentworks_laptop::shell::{self, ShellError, ShellOutcome, ShellRequest};
use agentworks_sandbox::{self as sandbox, SandboxPolicy};
use tokio_util::sync::CancellationToken;

use super::harness::processes_with;

const SSH_KEY: &str = "FAKE-PRIVATE-KEY-FIXTURE-d41f";
const OUTSIDE: &str = "OUTSIDE-SECRET-FIXTURE-77ab";
const CARGO_TOKEN: &str = "CARGO-REGISTRY-TOKEN-FIXTURE-19c2";
const STATE: &str = "CLI-STATE-FIXTURE-5e0a";

fn launcher() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_agentworks"))
}

/// A fake person: home with an SSH key, a cargo toolchain (and its credentials), the CLI's
/// state; a writable project, a read-only folder, a private scratch dir and an outside file.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
    project: PathBuf,
    ro: PathBuf,
    scratch: PathBuf,
    state: PathBuf,
}

fn write(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let home = root.join("home");
        write(&home.join(".ssh/id_ed25519"), SSH_KEY);
        let tool = home.join(".cargo/bin/tool");
        write(&tool, "#!/bin/sh\necho tool-ran\n");
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        write(&home.join(".cargo/credentials.toml"), CARGO_TOKEN);
        let state = home.join(".local/state/agentworks");
        write(&state.join("receipts.db"), STATE);
        let project = home.join("project");
        write(&project.join("README.md"), "hello\n");
        let ro = home.join("docs");
        write(&ro.join("notes.txt"), "read me\n");
        let scratch = root.join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        write(&root.join("outside/secret.txt"), OUTSIDE);
        Fixture {
            _dir: dir,
            root,
            home,
            project,
            ro,
            scratch,
            state,
        }
    }

    fn policy(&self) -> SandboxPolicy {
        SandboxPolicy {
            pinned: vec![],
            read_write: vec![self.project.clone()],
            read_only: vec![self.ro.clone()],
            blocked: vec![],
            read_only_within: vec![],
            // The laptop's toolchains under home where present, their credentials denied.
            read_only_if_present: HOME_TOOLCHAINS.iter().map(|t| self.home.join(t)).collect(),
            denied: std::iter::once(self.state.clone())
                .chain(HOME_TOOLCHAIN_SECRETS.iter().map(|s| self.home.join(s)))
                .collect(),
            scratch: self.scratch.clone(),
            cwd: self.project.clone(),
            limits: Default::default(),
            overmount_exclusions: false,
            private_terminals: false,
        }
    }

    fn request(&self, command: &str) -> ShellRequest {
        self.request_with(command, self.policy())
    }

    fn request_with(&self, command: &str, policy: SandboxPolicy) -> ShellRequest {
        ShellRequest {
            command: command.to_owned(),
            timeout: Some(Duration::from_secs(60)),
            policy,
            env_extra: vec![
                ("HOME".to_owned(), self.home.display().to_string()),
                (
                    "OUTSIDE".to_owned(),
                    self.root.join("outside").display().to_string(),
                ),
            ],
        }
    }
}

async fn run(request: ShellRequest) -> ShellOutcome {
    shell::run(launcher(), request, CancellationToken::new())
        .await
        .unwrap()
}

/// Runs and asserts exit 0, returning stdout.
async fn ok(request: ShellRequest) -> String {
    let command = request.command.clone();
    let out = run(request).await;
    assert_eq!(
        out.exit_code,
        Some(0),
        "`{command}` failed: stdout {:?} stderr {:?}",
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// Runs and asserts a non-zero exit, returning the outcome.
async fn fails(request: ShellRequest) -> ShellOutcome {
    let command = request.command.clone();
    let out = run(request).await;
    assert_ne!(
        out.exit_code,
        Some(0),
        "`{command}` must fail: stdout {:?} stderr {:?}",
        out.stdout,
        out.stderr
    );
    out
}

fn require_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{name}` is not installed: the sandbox tests need it (apt-get install {name})"
    );
}

#[test]
fn landlock_status_reports_abi() {
    let abi = sandbox::landlock_status().unwrap();
    assert!(abi >= sandbox::MIN_ABI, "ABI {abi}");
}

#[tokio::test]
async fn outside_ssh_key_is_unreadable() {
    let f = Fixture::new();
    // Control: the key is readable without the sandbox.
    assert_eq!(
        std::fs::read_to_string(f.home.join(".ssh/id_ed25519")).unwrap(),
        SSH_KEY
    );
    for command in [
        "cat \"$HOME/.ssh/id_ed25519\"",
        "ls \"$HOME/.ssh\"",
        "cat \"$OUTSIDE/secret.txt\"",
        "ls \"$HOME\"",
    ] {
        let out = fails(f.request(command)).await;
        assert!(!out.stdout.contains(SSH_KEY) && !out.stdout.contains(OUTSIDE));
        assert!(
            !out.stdout.contains("id_ed25519"),
            "{command}: {}",
            out.stdout
        );
    }
}

#[tokio::test]
async fn toolchain_runs_but_its_credentials_do_not_read() {
    let f = Fixture::new();
    assert_eq!(
        ok(f.request("\"$HOME/.cargo/bin/tool\"")).await,
        "tool-ran\n"
    );
    let out = fails(f.request("cat \"$HOME/.cargo/credentials.toml\"")).await;
    assert!(!out.stdout.contains(CARGO_TOKEN));
}

#[tokio::test]
async fn cli_state_is_denied() {
    let f = Fixture::new();
    let out = fails(f.request("cat \"$HOME/.local/state/agentworks/receipts.db\"")).await;
    assert!(!out.stdout.contains(STATE));

    // Also when the denied dir lies inside a granted folder.
    let inner_state = f.ro.join(".agentworks");
    write(&inner_state.join("token"), STATE);
    let mut policy = f.policy();
    policy.denied.push(inner_state.clone());
    let cat = format!("cat {}/token", inner_state.display());
    let out = fails(f.request_with(&cat, policy.clone())).await;
    assert!(!out.stdout.contains(STATE));
    let read = format!("cat {}/notes.txt", f.ro.display());
    assert_eq!(ok(f.request_with(&read, policy)).await, "read me\n");
}

#[tokio::test]
async fn read_only_folder_is_unwritable() {
    let f = Fixture::new();
    let ro = f.ro.display().to_string();
    assert_eq!(
        ok(f.request(&format!("cat {ro}/notes.txt"))).await,
        "read me\n"
    );
    for command in [
        format!("echo x > {ro}/new.txt"),
        format!("echo x >> {ro}/notes.txt"),
        format!("rm {ro}/notes.txt"),
        format!("mkdir {ro}/sub"),
        format!("truncate -s 0 {ro}/notes.txt"),
        format!("mv {ro}/notes.txt {}/moved.txt", f.project.display()),
    ] {
        fails(f.request(&command)).await;
    }
    assert_eq!(
        std::fs::read_to_string(f.ro.join("notes.txt")).unwrap(),
        "read me\n"
    );
    assert!(!f.ro.join("new.txt").exists() && !f.ro.join("sub").exists());
    assert!(!f.project.join("moved.txt").exists());
}

/// Both ways of enforcing exclusions: the rule walk, and covers in the command's own
/// namespaces (which leave the missing paths here to the walk).
#[tokio::test]
async fn blocked_paths_are_unreadable_unwritable_and_uncreatable() {
    for overmount in [false, true] {
        blocked_paths_hold(overmount).await;
    }
}

async fn blocked_paths_hold(overmount: bool) {
    let f = Fixture::new();
    write(&f.project.join(".env"), "BLOCKED-ENV");
    write(&f.project.join("keys/private/key.pem"), "BLOCKED-PEM");
    write(&f.project.join("keys/public.pem"), "public");
    write(&f.project.join("src/main.c"), "int main(void){return 0;}\n");
    let mut policy = f.policy();
    policy.overmount_exclusions = overmount;
    policy.blocked = vec![
        f.project.join(".env"),
        f.project.join("keys/private"),
        f.project.join("gen/secret"),
        f.project.join("missing.txt"),
    ];
    std::fs::create_dir_all(f.project.join("gen")).unwrap();
    let req = |c: &str| f.request_with(c, policy.clone());

    for command in [
        "cat .env",
        "echo x > .env",
        "rm .env",
        "cat keys/private/key.pem",
        "echo x > keys/private/new",
        "mv keys/private keys/moved",
        "mkdir gen/secret",
        "echo x > gen/secret",
        "echo x > missing.txt",
        "ln -s /etc/passwd missing.txt",
    ] {
        let out = fails(req(command)).await;
        assert!(!out.stdout.contains("BLOCKED"), "{command}: {}", out.stdout);
    }
    assert_eq!(
        std::fs::read_to_string(f.project.join(".env")).unwrap(),
        "BLOCKED-ENV"
    );
    assert!(f.project.join("keys/private/key.pem").exists());
    assert!(!f.project.join("keys/private/new").exists());
    assert!(!f.project.join("gen/secret").exists());
    assert!(!f.project.join("missing.txt").exists());

    // The rest of the folder stays usable: siblings readable and writable, the folder listable.
    assert_eq!(ok(req("cat keys/public.pem")).await, "public");
    ok(req("echo more >> README.md && echo new > src/new.c && ls")).await;
    assert_eq!(
        std::fs::read_to_string(f.project.join("src/new.c")).unwrap(),
        "new\n"
    );
}

#[tokio::test]
async fn read_only_within_a_writable_folder() {
    for overmount in [false, true] {
        read_only_within_holds(overmount).await;
    }
}

async fn read_only_within_holds(overmount: bool) {
    let f = Fixture::new();
    write(&f.project.join("vendor/lib.txt"), "vendored\n");
    write(&f.project.join("src/a.txt"), "a\n");
    let mut policy = f.policy();
    policy.overmount_exclusions = overmount;
    policy.read_only_within = vec![f.project.join("vendor")];
    let req = |c: &str| f.request_with(c, policy.clone());
    assert_eq!(ok(req("cat vendor/lib.txt")).await, "vendored\n");
    for command in [
        "echo x > vendor/lib.txt",
        "touch vendor/new",
        "rm vendor/lib.txt",
    ] {
        fails(req(command)).await;
    }
    assert_eq!(
        std::fs::read_to_string(f.project.join("vendor/lib.txt")).unwrap(),
        "vendored\n"
    );
    ok(req("echo b > src/b.txt && echo more >> README.md")).await;
    assert!(f.project.join("src/b.txt").exists());
}

#[tokio::test]
async fn git_and_a_c_build_work_in_the_writable_folder() {
    require_tool("git");
    require_tool("cc");
    let f = Fixture::new();
    let log = ok(f.request(
        "git init -q . && git add README.md && \
         git -c user.email=t@example.com -c user.name=Tester commit -q -m first && \
         git log --oneline",
    ))
    .await;
    assert!(log.contains("first"), "{log}");

    write(
        &f.project.join("hello.c"),
        "#include <stdio.h>\nint main(void){puts(\"built-and-ran\");return 0;}\n",
    );
    let out = ok(f.request("cc -o hello hello.c && ./hello")).await;
    assert_eq!(out, "built-and-ran\n");
}

#[tokio::test]
async fn loopback_network_works() {
    require_tool("curl");
    let f = Fixture::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = [0u8; 1024];
        let _ = stream.read(&mut buf).unwrap();
        stream
            .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\npong")
            .unwrap();
    });
    let out = ok(f.request(&format!("curl -sS --max-time 20 http://127.0.0.1:{port}/"))).await;
    assert_eq!(out, "pong");
    server.join().unwrap();
}

#[tokio::test]
async fn secrets_in_the_environment_are_not_passed() {
    let f = Fixture::new();
    let mut parent: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (key, value) in [
        ("AWS_SECRET_ACCESS_KEY", "aws-fixture"),
        ("GITHUB_TOKEN", "gh-fixture"),
        ("OPENAI_API_KEY", "openai-fixture"),
        ("AGENTWORKS_TOKEN", "aw-fixture"),
        ("SSH_AUTH_SOCK", "/tmp/agent.sock"),
        ("LC_ALL", "C"),
    ] {
        parent.push((key.into(), value.into()));
    }
    let out = shell::run_with_env(
        launcher(),
        f.request("env"),
        CancellationToken::new(),
        parent,
    )
    .await
    .unwrap();
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr);
    for secret in [
        "aws-fixture",
        "gh-fixture",
        "openai-fixture",
        "aw-fixture",
        "agent.sock",
    ] {
        assert!(
            !out.stdout.contains(secret),
            "{secret} leaked:\n{}",
            out.stdout
        );
    }
    assert!(out.stdout.contains("LC_ALL=C"), "{}", out.stdout);
    let tmpdir = format!("TMPDIR={}", f.scratch.display());
    assert!(out.stdout.contains(&tmpdir), "{}", out.stdout);
}

#[tokio::test]
async fn output_is_truncated_at_one_mebibyte() {
    let f = Fixture::new();
    let out = run(f.request("head -c 2097152 /dev/zero | tr '\\0' a; echo done >&2")).await;
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout.len(), shell::MAX_CAPTURE);
    assert!(out.stdout_truncated);
    assert_eq!(out.stderr, "done\n");
    assert!(!out.stderr_truncated);
}

/// Commands that leave `setsid` grandchildren named after `marker` behind them.
fn escaping_sleepers(marker: &str) -> String {
    format!(
        "ln -s \"$(command -v sleep)\" \"$TMPDIR/{marker}\" || exit 9; \
         setsid \"$TMPDIR/{marker}\" 300 & \
         ( setsid \"$TMPDIR/{marker}\" 301 & ) ; \
         \"$TMPDIR/{marker}\" 302"
    )
}

#[tokio::test]
async fn timeout_leaves_no_process_behind() {
    let f = Fixture::new();
    let marker = format!("sleeper-timeout-{}", std::process::id());
    let mut request = f.request(&escaping_sleepers(&marker));
    request.timeout = Some(Duration::from_secs(1));
    let out = run(request).await;
    assert!(out.timed_out, "{out:?}");
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}

#[tokio::test]
async fn shell_exit_kills_background_descendants() {
    let f = Fixture::new();
    let marker = format!("sleeper-exit-{}", std::process::id());
    let command = format!(
        "ln -s \"$(command -v sleep)\" \"$TMPDIR/{marker}\" && \
         ( setsid \"$TMPDIR/{marker}\" 300 & ) ; \"$TMPDIR/{marker}\" 300 & exit 3"
    );
    let out = run(f.request(&command)).await;
    assert_eq!(out.exit_code, Some(3), "{out:?}");
    assert!(!out.timed_out);
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}

#[tokio::test]
async fn cancel_kills_the_command() {
    let f = Fixture::new();
    let marker = format!("sleeper-cancel-{}", std::process::id());
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let request = f.request(&format!("touch started; {}", escaping_sleepers(&marker)));
        let cancel = cancel.clone();
        async move { shell::run(launcher(), request, cancel).await }
    });
    let started = f.project.join("started");
    for _ in 0..200 {
        if started.exists() && processes_with(&marker).len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.exists(), "the command never started");
    cancel.cancel();
    let out = task.await.unwrap().unwrap();
    assert!(out.cancelled && !out.timed_out, "{out:?}");
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}

#[tokio::test]
async fn no_new_privs_is_set() {
    let f = Fixture::new();
    let out = ok(f.request("grep NoNewPrivs /proc/self/status")).await;
    assert_eq!(out.trim(), "NoNewPrivs:\t1");
}

#[tokio::test]
async fn symlinks_out_of_the_folder_give_no_access() {
    let f = Fixture::new();
    // One made before the ruleset is built (it must not be followed when granting)...
    std::os::unix::fs::symlink(f.home.join(".ssh"), f.project.join("ssh-link")).unwrap();
    let out = fails(f.request("cat ssh-link/id_ed25519")).await;
    assert!(!out.stdout.contains(SSH_KEY));
    // ...and one made by the command.
    let out = fails(f.request("ln -s \"$OUTSIDE/secret.txt\" link && cat link")).await;
    assert!(!out.stdout.contains(OUTSIDE));
}

#[tokio::test]
async fn hardlinks_to_outside_files_cannot_be_made() {
    let f = Fixture::new();
    // Control: same filesystem, so only the sandbox can make it fail.
    std::fs::hard_link(
        f.root.join("outside/secret.txt"),
        f.root.join("outside/control-link"),
    )
    .unwrap();
    fails(f.request("ln \"$OUTSIDE/secret.txt\" hardlink")).await;
    assert!(!f.project.join("hardlink").exists());
    fails(f.request("ln \"$HOME/.ssh/id_ed25519\" key")).await;
    assert!(!f.project.join("key").exists());
}

#[tokio::test]
async fn unavailable_landlock_refuses_every_command() {
    let f = Fixture::new();
    for abi in ["0", "2"] {
        let mut request = f.request("touch ran-unsandboxed");
        request
            .env_extra
            .push((sandbox::TEST_ABI_ENV.to_owned(), abi.to_owned()));
        let error = shell::run(launcher(), request, CancellationToken::new())
            .await
            .unwrap_err();
        assert!(matches!(error, ShellError::SandboxRefused(_)), "{error}");
        assert!(error.to_string().contains("Landlock"), "{error}");
        assert!(!f.project.join("ran-unsandboxed").exists());
    }
}

#[tokio::test]
async fn a_grant_that_cannot_be_opened_refuses() {
    let f = Fixture::new();
    let mut policy = f.policy();
    policy.read_only.push(f.root.join("does-not-exist"));
    let request = f.request_with("touch ran-anyway", policy);
    let error = shell::run(launcher(), request, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, ShellError::SandboxRefused(_)), "{error}");
    assert!(error.to_string().contains("does-not-exist"), "{error}");
    assert!(!f.project.join("ran-anyway").exists());
}

#[tokio::test]
async fn timeouts_above_the_maximum_are_refused() {
    let f = Fixture::new();
    let mut request = f.request("touch ran");
    request.timeout = Some(Duration::from_secs(301));
    let error = shell::run(launcher(), request, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(error, ShellError::TimeoutTooLong { .. }),
        "{error}"
    );
    assert!(!f.project.join("ran").exists());
}

#[tokio::test]
async fn the_command_cannot_signal_the_launcher() {
    // Landlock's signal scope (ABI 6) keeps the command from killing the launcher, which would
    // leave its setsid() descendants to init.
    let abi = sandbox::landlock_status().unwrap();
    assert!(
        abi >= 6,
        "this machine's Landlock ABI {abi} has no signal scope"
    );
    let f = Fixture::new();
    // The launcher's pid as /proc (the machine's) shows the shell's parent: $PPID is 0 when the
    // command has its own PID namespace (a root launcher's).
    let out = ok(f.request(
        "read -r _ _ _ launcher _ < /proc/self/stat; [ \"$launcher\" -gt 1 ] || exit 9; \
         if kill -KILL \"$launcher\" 2>/dev/null; then echo escaped; else echo refused; fi",
    ))
    .await;
    assert_eq!(out, "refused\n");
}

/// An `O_PATH` descriptor of `dir` with its device and inode, as the executor pins a folder.
fn pin(dir: &Path, access: sandbox::PinnedAccess) -> (std::os::fd::OwnedFd, sandbox::PinnedGrant) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let fd: std::os::fd::OwnedFd = std::fs::File::open(dir).unwrap().into();
    let meta = std::fs::metadata(dir).unwrap();
    let grant = sandbox::PinnedGrant {
        fd: fd.as_raw_fd(),
        dev: meta.dev(),
        ino: meta.ino(),
        path: dir.to_owned(),
        access,
    };
    (fd, grant)
}

#[tokio::test]
async fn a_pinned_folder_is_granted_through_its_descriptor_not_its_path() {
    let f = Fixture::new();
    let (_fd, grant) = pin(&f.project, sandbox::PinnedAccess::ReadWrite);
    let mut policy = f.policy();
    policy.read_write.clear();
    policy.pinned = vec![grant];
    let ok_request = |c: &str| f.request_with(c, policy.clone());
    assert_eq!(ok(ok_request("cat README.md")).await, "hello\n");

    // The folder moves away and its path becomes a symlink to the outside: the rule still
    // covers the directory it was made from, wherever it is, and nothing the path names now.
    let moved = f.home.join("project-moved");
    std::fs::rename(&f.project, &moved).unwrap();
    std::os::unix::fs::symlink(f.root.join("outside"), &f.project).unwrap();
    // Control: without the sandbox, the old path now reads the outside.
    assert_eq!(
        std::fs::read_to_string(f.project.join("secret.txt")).unwrap(),
        OUTSIDE
    );
    let through_old_path = format!("cat {}/secret.txt", f.project.display());
    let mut request = ok_request(&through_old_path);
    request.policy.cwd = moved.clone();
    let out = fails(request).await;
    assert!(!out.stdout.contains(OUTSIDE), "{out:?}");
    let mut request = ok_request("echo more >> README.md && cat README.md");
    request.policy.cwd = moved.clone();
    assert_eq!(ok(request).await, "hello\nmore\n");
}

#[tokio::test]
async fn a_pinned_descriptor_that_is_not_the_recorded_directory_is_refused() {
    let f = Fixture::new();
    let (_fd, mut grant) = pin(&f.project, sandbox::PinnedAccess::ReadWrite);
    grant.ino += 1;
    let mut policy = f.policy();
    policy.read_write.clear();
    policy.pinned = vec![grant];
    let error = shell::run(
        launcher(),
        f.request_with("touch ran-anyway", policy),
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ShellError::SandboxRefused(_)), "{error}");
    assert!(error.to_string().contains("pinned descriptor"), "{error}");
    assert!(!f.project.join("ran-anyway").exists());
}
