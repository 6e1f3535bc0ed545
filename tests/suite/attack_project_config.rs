//! Persistence through the project's own config (issue 42, item 5), performed for real: a
//! sandboxed command in a `--write-folder` (a real executor, the real launcher, real `git`)
//! plants what makes the person's own tools run a program — a hook, `core.fsmonitor`,
//! `core.hooksPath`, an `include.path`, an `.envrc`, a `.vscode/tasks.json` — in the folder's
//! repository and in a nested one; then the person runs `git status` and `git commit` outside
//! every sandbox, as they would. Before the fix those ran the planted program (checked: the
//! marker file appeared). Now each change is undone once the command is gone and the result says
//! so, while ordinary git work (`init`, `add`, `commit`, `branch`, `checkout`, `remote add`,
//! upstream and `user.name`) stays.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use agentworks_contract::executor::{Operation, Outcome, UndoneChange};

use super::harness::{Gateway, KillOnDrop, Laptop, patch, request, runtime, spawn_executor};

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// What a planted program leaves when it runs.
const MARKER: &str = "PWNED";

/// Runs `command` in `proj` through the executor; its exit code, stdout and undone changes.
async fn run(ws: &mut Ws, id: &str, command: &str) -> (Option<i32>, String, Vec<UndoneChange>) {
    let operation = Operation::ExecuteShellCommand {
        command: command.to_owned(),
        timeout: Some(60),
    };
    match request(ws, id, "proj", operation).await {
        Outcome::Completed {
            exit_code,
            stdout,
            stderr,
            undone,
            ..
        } => {
            assert_eq!(exit_code, Some(0), "`{command}`: {stdout} {stderr}");
            (exit_code, stdout, undone)
        }
        other => panic!("{command}: {other:?}"),
    }
}

/// `git <args>` as the person runs it in `dir`, outside every sandbox (no global or system
/// config of this machine).
fn person_git(home: &Path, dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Person")
        .env("GIT_AUTHOR_EMAIL", "p@example.com")
        .env("GIT_COMMITTER_NAME", "Person")
        .env("GIT_COMMITTER_EMAIL", "p@example.com")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The markers a planted program left anywhere under `dir`.
fn markers(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with(MARKER) {
                found.push(path.clone());
            }
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    found
}

fn connect(laptop: &Laptop, gateway: &str, extra: &[&str]) -> KillOnDrop {
    let proj = laptop.folder("proj");
    let mut args = vec!["--write-folder", proj.to_str().unwrap()];
    args.extend(extra);
    spawn_executor(laptop, gateway, &args)
}

/// The attacks, each one command in the repository at `repo` (`.` or `nested`), with the path
/// its undone change names.
fn attacks(repo: &str) -> Vec<(String, String)> {
    let hook = format!(
        "printf '#!/bin/sh\\ntouch {MARKER}-hook\\n' > .git/hooks/pre-commit && \
         chmod +x .git/hooks/pre-commit"
    );
    vec![
        (hook, ".git/hooks/pre-commit".to_owned()),
        (
            format!(
                "git config core.fsmonitor 'touch {MARKER}-fsmonitor' && \
                 git config user.email changed@example.com"
            ),
            ".git/config".to_owned(),
        ),
        (
            format!(
                "mkdir -p evil-hooks && printf '#!/bin/sh\\ntouch {MARKER}-hookspath\\n' > \
                 evil-hooks/pre-commit && chmod +x evil-hooks/pre-commit && \
                 git config core.hooksPath evil-hooks"
            ),
            ".git/config".to_owned(),
        ),
        (
            format!(
                "printf '[core]\\n\\tfsmonitor = touch {MARKER}-include\\n' > evil.cfg && \
                 git config include.path ../evil.cfg"
            ),
            ".git/config".to_owned(),
        ),
        (
            format!("echo 'touch {MARKER}-envrc' > .envrc"),
            ".envrc".to_owned(),
        ),
        (
            "mkdir -p .vscode && echo '{\"tasks\":[{\"runOn\":\"folderOpen\"}]}' > \
             .vscode/tasks.json"
                .to_owned(),
            ".vscode/tasks.json".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(command, path)| {
        let shown = if repo == "." {
            format!("proj/{path}")
        } else {
            format!("proj/{repo}/{path}")
        };
        (format!("cd {repo} && {command}"), shown)
    })
    .collect()
}

#[test]
fn planted_hooks_and_git_config_are_undone_and_git_work_stays() {
    let laptop = Laptop::new("aw-project-config-", &[("src/proj/README.md", "hello\n")]);
    let home = laptop.home();
    let proj = laptop.folder("proj");
    runtime().block_on(async {
        let gateway = Gateway::new().await;
        laptop.write_credentials("device-token");
        let _executor = connect(&laptop, &gateway.url(), &[]);
        let (mut ws, _, _) = gateway.accept().await;

        // Ordinary git work, in the folder's repository and a nested one: it all stays.
        let (_, _, undone) = run(
            &mut ws,
            "work",
            "export GIT_CONFIG_NOSYSTEM=1 HOME=\"$TMPDIR\" && git init -q . && \
             git add README.md && git -c user.email=a@example.com -c user.name=A commit -q -m one && \
             git branch feature && git checkout -q feature && \
             git remote add origin https://example.com/r.git && \
             git config branch.feature.remote origin && \
             git config branch.feature.merge refs/heads/main && git config user.name Tester && \
             mkdir nested && cd nested && git init -q . && echo n > n.txt && git add n.txt && \
             git -c user.email=a@example.com -c user.name=A commit -q -m nested",
        )
        .await;
        assert!(undone.is_empty(), "ordinary git work was undone: {undone:?}");
        let config = |key: &str| {
            String::from_utf8(person_git(&home, &proj, &["config", "--get", key]).stdout).unwrap()
        };
        assert_eq!(config("remote.origin.url"), "https://example.com/r.git\n");
        assert_eq!(config("branch.feature.merge"), "refs/heads/main\n");
        assert_eq!(config("user.name"), "Tester\n");
        let head = person_git(&home, &proj, &["rev-parse", "--abbrev-ref", "HEAD"]);
        assert_eq!(String::from_utf8_lossy(&head.stdout), "feature\n");

        // Each attack, in each repository: undone, reported, and the person's git runs nothing.
        let mut n = 0;
        for repo in [".", "nested"] {
            for (attack, shown) in attacks(repo) {
                n += 1;
                let (_, _, undone) = run(&mut ws, &format!("attack-{n}"), &attack).await;
                let dir = proj.join(repo);
                let status = person_git(&home, &dir, &["status", "--short"]);
                assert!(status.status.success(), "{status:?}");
                let commit = person_git(&home, &dir, &["commit", "--allow-empty", "-q", "-m", "p"]);
                assert!(commit.status.success(), "{commit:?}");
                assert_eq!(markers(&proj), Vec::<PathBuf>::new(), "after `{attack}`");
                assert!(
                    undone.iter().any(|u| u.path == shown && u.undone),
                    "`{attack}`: {undone:?}"
                );
            }
        }
        // What was undone was only the protected part: the e-mail set beside core.fsmonitor
        // stays, the planted files are gone, the rest of the work too.
        assert_eq!(config("user.email"), "changed@example.com\n");
        assert_eq!(config("core.fsmonitor"), "");
        assert!(!proj.join(".envrc").exists() && !proj.join(".vscode/tasks.json").exists());
        assert!(!proj.join(".git/hooks/pre-commit").exists());
        assert!(!proj.join("nested/.git/hooks/pre-commit").exists());
        assert_eq!(config("remote.origin.url"), "https://example.com/r.git\n");

    });
}

/// A protected key the person set is put back when a command changes it, and a patch may not
/// touch a file in the protected set (here the person's own `core.hooksPath` folder, which has
/// no dot in its path).
#[test]
fn the_persons_own_config_is_put_back_and_patches_are_refused_there() {
    let laptop = Laptop::new(
        "aw-project-config-own-",
        &[
            ("src/proj/README.md", "hello\n"),
            ("src/proj/githooks/pre-commit", "#!/bin/sh\nexit 0\n"),
        ],
    );
    let home = laptop.home();
    let proj = laptop.folder("proj");
    for args in [
        vec!["init", "-q", "."],
        vec!["config", "core.hooksPath", "githooks"],
    ] {
        assert!(person_git(&home, &proj, &args).status.success());
    }
    runtime().block_on(async {
        let gateway = Gateway::new().await;
        laptop.write_credentials("device-token");
        let _executor = connect(&laptop, &gateway.url(), &[]);
        let (mut ws, _, _) = gateway.accept().await;
        let (_, _, undone) = run(
            &mut ws,
            "change",
            "git config core.hooksPath elsewhere && \
             printf '#!/bin/sh\\ntouch PWNED\\n' > githooks/pre-commit",
        )
        .await;
        assert!(
            undone.iter().any(|u| u.path == "proj/.git/config"),
            "{undone:?}"
        );
        assert!(
            undone.iter().any(|u| u.path == "proj/githooks/pre-commit"),
            "{undone:?}"
        );
        let hooks_path = person_git(&home, &proj, &["config", "core.hooksPath"]);
        assert_eq!(String::from_utf8_lossy(&hooks_path.stdout), "githooks\n");
        assert_eq!(
            std::fs::read_to_string(proj.join("githooks/pre-commit")).unwrap(),
            "#!/bin/sh\nexit 0\n"
        );
        let diff = "--- a/githooks/pre-commit\n+++ b/githooks/pre-commit\n@@ -1,2 +1,2 @@\n \
                    #!/bin/sh\n-exit 0\n+touch PWNED\n";
        let outcome = request(&mut ws, "patch", "proj", patch("githooks/pre-commit", diff)).await;
        assert!(
            matches!(&outcome, Outcome::Refused { code, .. } if code == "protected_project_config"),
            "{outcome:?}"
        );
        assert_eq!(
            std::fs::read_to_string(proj.join("githooks/pre-commit")).unwrap(),
            "#!/bin/sh\nexit 0\n"
        );
    });
}

/// `--allow-project-config` lifts it: the change stays and nothing is reported.
#[test]
fn allow_project_config_keeps_the_changes() {
    let laptop = Laptop::new(
        "aw-project-config-allow-",
        &[("src/proj/README.md", "hello\n")],
    );
    let home = laptop.home();
    let proj = laptop.folder("proj");
    assert!(
        person_git(&home, &proj, &["init", "-q", "."])
            .status
            .success()
    );
    runtime().block_on(async {
        let gateway = Gateway::new().await;
        laptop.write_credentials("device-token");
        let _executor = connect(&laptop, &gateway.url(), &["--allow-project-config"]);
        let (mut ws, _, _) = gateway.accept().await;
        let (_, _, undone) = run(
            &mut ws,
            "allowed",
            "git config core.pager cat && echo 'export A=1' > .envrc",
        )
        .await;
        assert!(undone.is_empty(), "{undone:?}");
        let pager = person_git(&home, &proj, &["config", "core.pager"]);
        assert_eq!(String::from_utf8_lossy(&pager.stdout), "cat\n");
        assert!(proj.join(".envrc").exists());
    });
}
