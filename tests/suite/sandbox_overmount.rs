//! Exclusions inside a writable folder without losing file creation (issue 42, item 5b), with a
//! real executor (`agentworks executor connect` against the in-test gateway) and the real
//! launcher, on this machine's kernel, which lets it make a user and mount namespace, and with
//! that forced off (`AGENTWORKS_TEST_NO_USERNS=1`, the fallback walk).
//!
//! Measured before: with `--write-folder proj --block proj/.env` (the console's own placeholder)
//! `echo a > new.txt` and `mkdir newdir` at the top of `proj` were refused (`Permission denied`),
//! since Landlock can only grant and the walk granted `proj`'s other entries, never `proj`.
//! Now each existing exclusion is covered by a mount in the command's own namespaces and `proj`
//! is granted whole; the covers are attacked here too: read, write, remove, rename the folder
//! above, unmount (the system call itself), a namespace of the command's own, and a second mount
//! of the same filesystem.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use agentworks_contract::executor::{ExecutorFrame, Operation, Outcome};
use agentworks_sandbox::{self as sandbox, SandboxPolicy, TEST_NO_USERNS_ENV};

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;
use super::harness::{Gateway, Laptop, ensure_user, request, runtime, users_lock};

const SECRET: &str = "ENV-SECRET-FIXTURE-5b41";
const VENDORED: &str = "vendored\n";

/// A laptop with `~/src/proj` holding `.env` (the secret), `vendor/lib.txt` and `src/main.c`.
fn laptop() -> Laptop {
    Laptop::new(
        "aw-overmount-",
        &[
            ("src/proj/.env", SECRET),
            ("src/proj/vendor/lib.txt", VENDORED),
            ("src/proj/src/main.c", "int main(void){return 0;}\n"),
        ],
    )
}

/// `agentworks executor connect` sharing `proj` writable with `.env` blocked and `vendor`
/// read-only (plus `extra` arguments), its stdout (the permissions text) kept in a file.
struct Connected {
    child: Child,
    stdout: PathBuf,
}

impl Drop for Connected {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(laptop: &Laptop, gateway: &str, extra: &[&str], env: &[(&str, &str)]) -> Connected {
    let proj = laptop.folder("proj");
    let stdout = laptop.root().join("connect-stdout");
    let p = |rel: &str| proj.join(rel).to_str().unwrap().to_owned();
    let mut args: Vec<String> = [
        "executor",
        "connect",
        "--name",
        "t",
        "--gateway",
        gateway,
        "--write-folder",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend([
        p(""),
        "--block".into(),
        p(".env"),
        "--read-only".into(),
        p("vendor"),
    ]);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = laptop
        .command(&args)
        .envs(env.iter().copied())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Connected { child, stdout }
}

/// Runs `command` in `proj`; its exit code, stdout and stderr.
async fn run(ws: &mut Ws, id: &str, command: &str) -> (Option<i32>, String, String) {
    let operation = Operation::ExecuteShellCommand {
        command: command.to_owned(),
        timeout: Some(30),
    };
    match request(ws, id, "proj", operation).await {
        Outcome::Completed {
            exit_code,
            stdout,
            stderr,
            ..
        } => (exit_code, stdout, stderr),
        other => panic!("{command}: {other:?}"),
    }
}

/// The attacks on the covers: each must fail and never show the secret. Python makes the
/// `umount2` system call itself (the `umount` program would stop at its own uid check).
const ATTACKS: &[&str] = &[
    "cat .env",
    "echo x > .env",
    "rm -f .env",
    "mv .env moved",
    "ln .env linked",
    "cp .env copied",
    "echo x > vendor/lib.txt",
    "touch vendor/new",
    "rm vendor/lib.txt",
    "mv vendor vendor2",
    "python3 -c 'import ctypes,os,sys; r=ctypes.CDLL(None,use_errno=True).umount2(b\".env\",2); \
     sys.exit(0 if r==0 else 1)'",
    "python3 -c 'import ctypes,os,sys; r=ctypes.CDLL(None,use_errno=True).umount2(b\"vendor\",2); \
     sys.exit(0 if r==0 else 1)'",
    "unshare -Urm sh -c 'umount -l .env; cat .env'",
];

fn assert_folder_untouched(proj: &Path) {
    assert_eq!(std::fs::read_to_string(proj.join(".env")).unwrap(), SECRET);
    assert_eq!(
        std::fs::read_to_string(proj.join("vendor/lib.txt")).unwrap(),
        VENDORED
    );
    for gone in ["moved", "linked", "copied", "vendor2", "vendor/new"] {
        assert!(!proj.join(gone).exists(), "{gone} exists");
    }
}

/// The measured case: `--block proj/.env` (and `--read-only proj/vendor`) no longer cost `proj`
/// its file creation, and the covers hold against every attack.
#[test]
fn a_block_costs_its_folder_no_file_creation_and_its_cover_holds() {
    let laptop = laptop();
    let proj = laptop.folder("proj");
    runtime().block_on(async {
        let gateway = Gateway::new().await;
        laptop.write_credentials("device-token");
        let connected = connect(&laptop, &gateway.url(), &[], &[]);
        let (mut ws, _, hello) = gateway.accept().await;
        assert!(matches!(hello, ExecutorFrame::Hello { .. }));
        let created = run(
            &mut ws,
            "create",
            "echo a > new.txt && mkdir newdir && mkdir -p target/debug && \
             echo b > target/debug/out && mv new.txt renamed.txt && cat renamed.txt",
        )
        .await;
        assert_eq!(created, (Some(0), "a\n".to_owned(), String::new()));
        assert!(proj.join("renamed.txt").exists() && proj.join("target/debug/out").exists());
        for (n, attack) in ATTACKS.iter().enumerate() {
            let (code, stdout, stderr) = run(&mut ws, &format!("attack-{n}"), attack).await;
            assert_ne!(code, Some(0), "`{attack}` succeeded: {stdout} {stderr}");
            assert!(
                !stdout.contains(SECRET) && !stderr.contains(SECRET),
                "{attack}"
            );
        }
        assert_folder_untouched(&proj);
        // Nothing is mounted outside the command's namespace, and nothing was left in proj.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(proj.to_str().unwrap()), "{mounts}");
        let text = std::fs::read_to_string(&connected.stdout).unwrap();
        assert!(!text.contains("cannot create"), "{text}");
    });
}

/// Forced off: the walk enforces the same exclusions, `proj` loses file creation directly in
/// it (its subfolders keep it), and connect names the folder and the reason.
#[test]
fn without_namespaces_the_walk_holds_and_connect_says_which_folders_lose_file_creation() {
    let laptop = laptop();
    let proj = laptop.folder("proj");
    runtime().block_on(async {
        let gateway = Gateway::new().await;
        laptop.write_credentials("device-token");
        let connected = connect(&laptop, &gateway.url(), &[], &[(TEST_NO_USERNS_ENV, "1")]);
        let (mut ws, _, _) = gateway.accept().await;
        let (code, _, stderr) = run(&mut ws, "top", "echo a > new.txt").await;
        assert_ne!(code, Some(0));
        assert!(stderr.contains("Permission denied"), "{stderr}");
        let sub = run(&mut ws, "sub", "echo a > src/new.c && cat src/new.c").await;
        assert_eq!(sub, (Some(0), "a\n".to_owned(), String::new()));
        for (n, attack) in ATTACKS.iter().enumerate() {
            let (code, stdout, _) = run(&mut ws, &format!("attack-{n}"), attack).await;
            assert_ne!(code, Some(0), "`{attack}` succeeded");
            assert!(!stdout.contains(SECRET), "{attack}");
        }
        assert_folder_untouched(&proj);
        let text = std::fs::read_to_string(&connected.stdout).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("--block") && l.contains(".env"))
            .unwrap_or_else(|| panic!("no line for the block in:\n{text}"));
        assert!(
            line.trim_start()
                .starts_with(&format!("{}:", proj.display())),
            "{line}"
        );
        assert!(line.contains(TEST_NO_USERNS_ENV), "{line}");
        assert!(
            text.contains("cannot create new files or folders"),
            "{text}"
        );
    });
}

/// A blocked path that does not exist cannot be covered (a mount needs a mount point): its
/// folder loses file creation while it is missing, connect says so and how to lift it, and the
/// next command after it was created has file creation back.
#[test]
fn a_missing_blocked_path_is_named_at_connect_and_creating_it_lifts_the_limit() {
    let laptop = laptop();
    let proj = laptop.folder("proj");
    std::fs::remove_file(proj.join(".env")).unwrap();
    runtime().block_on(async {
        let gateway = Gateway::new().await;
        laptop.write_credentials("device-token");
        let connected = connect(&laptop, &gateway.url(), &[], &[]);
        let (mut ws, _, _) = gateway.accept().await;
        let (code, _, _) = run(&mut ws, "planted", "echo x > .env").await;
        assert_ne!(code, Some(0));
        assert!(!proj.join(".env").exists());
        let (code, _, _) = run(&mut ws, "top", "echo a > new.txt").await;
        assert_ne!(code, Some(0));
        let text = std::fs::read_to_string(&connected.stdout).unwrap();
        assert!(text.contains("create it (even empty)"), "{text}");

        std::fs::write(proj.join(".env"), SECRET).unwrap();
        let created = run(&mut ws, "again", "echo a > new.txt && cat new.txt").await;
        assert_eq!(created, (Some(0), "a\n".to_owned(), String::new()));
        let (code, stdout, _) = run(&mut ws, "read", "cat .env").await;
        assert!(code != Some(0) && !stdout.contains(SECRET));
    });
}

/// Unmounts its bind mount when dropped.
struct BindMount(PathBuf);

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A second mount of the folder's filesystem shows the blocked file under another path; a cover
/// on one path only would leave it readable there (Landlock decides by inode and grants `proj`
/// whole). The launcher covers every view it finds in its mountinfo.
#[test]
fn a_second_mount_of_the_folder_does_not_show_the_covered_file() {
    let laptop = laptop();
    let home = laptop.home();
    let view = laptop.root().join("view");
    std::fs::create_dir_all(&view).unwrap();
    let status = Command::new("mount")
        .arg("--bind")
        .arg(&home)
        .arg(&view)
        .status()
        .unwrap();
    assert!(status.success(), "mount --bind failed");
    let _mount = BindMount(view.clone());
    let through_view = view.join("src/proj/.env");
    assert_eq!(std::fs::read_to_string(&through_view).unwrap(), SECRET);
    runtime().block_on(async {
        let gateway = Gateway::new().await;
        laptop.write_credentials("device-token");
        let _connected = connect(&laptop, &gateway.url(), &[], &[]);
        let (mut ws, _, _) = gateway.accept().await;
        let created = run(&mut ws, "create", "echo a > new.txt").await;
        assert_eq!(created.0, Some(0), "{created:?}");
        for (n, attack) in [
            format!("cat {}", through_view.display()),
            format!("echo x > {}", through_view.display()),
            format!("echo x > {}/src/proj/vendor/lib.txt", view.display()),
        ]
        .iter()
        .enumerate()
        {
            let (code, stdout, stderr) = run(&mut ws, &format!("view-{n}"), attack).await;
            assert_ne!(code, Some(0), "`{attack}` succeeded: {stdout} {stderr}");
            assert!(!stdout.contains(SECRET), "{attack}");
        }
    });
    assert_folder_untouched(&laptop.folder("proj"));
}

/// The same covers for an unprivileged person (the launcher's own uid and gid mapped in its user
/// namespace, no PID namespace), straight through `agentworks __sandbox-exec`.
#[test]
fn an_unprivileged_launcher_covers_the_exclusions_and_keeps_file_creation() {
    let (uid, gid) = {
        let _lock = users_lock();
        ensure_user("awtest-overmount", &[])
    };
    let laptop = laptop();
    let proj = laptop.folder("proj");
    let scratch = laptop.root().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(laptop.root())
        .status()
        .unwrap();
    assert!(status.success());
    let policy = SandboxPolicy {
        pinned: vec![],
        read_write: vec![proj.clone()],
        read_only: vec![],
        blocked: vec![proj.join(".env")],
        read_only_within: vec![proj.join("vendor")],
        denied: vec![],
        read_only_if_present: vec![],
        scratch: scratch.clone(),
        cwd: proj.clone(),
        limits: Default::default(),
        overmount_exclusions: true,
        private_terminals: false,
    };
    let policy = serde_json::to_string(&policy).unwrap();
    let run = |command: &str| {
        let out = Command::new("timeout")
            .arg("30")
            .arg(env!("CARGO_BIN_EXE_agentworks"))
            .args([sandbox::SUBCOMMAND, &policy, "--", "/bin/sh", "-c", command])
            .current_dir(&proj)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("TMPDIR", &scratch)
            .stdin(Stdio::null())
            .uid(uid)
            .gid(gid)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(
        run("echo a > new.txt && mkdir newdir && id -u"),
        (Some(0), format!("{uid}\n"))
    );
    for attack in ATTACKS {
        let (code, stdout) = run(attack);
        assert_ne!(code, Some(0), "`{attack}` succeeded: {stdout}");
        assert!(!stdout.contains(SECRET), "{attack}");
    }
    assert_folder_untouched(&proj);
    // The probe agrees for this user.
    let probe = Command::new(env!("CARGO_BIN_EXE_agentworks"))
        .arg(sandbox::PROBE_SUBCOMMAND)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    assert!(
        probe.status.success(),
        "{}",
        String::from_utf8_lossy(&probe.stdout)
    );
}
