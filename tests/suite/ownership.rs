//! Ownership and POSIX ACLs kept across workspaced's atomic replacement: real users, real files,
//! the real daemon through its socket, running as an unprivileged service user.
//!
//! Every verdict on who may do what comes from the kernel: `test -r/-w/-x` (access(2)) run as
//! each user through setpriv, before and after the write. Our own ACL code is never asked.
//! ACL state is read with `getfacl -n`, owner/group/mode with `stat -c`.

use super::harness::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A test user: its ids and every group it is in (primary group first).
#[derive(Debug)]
struct User {
    name: &'static str,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

struct Ids {
    /// The files' group; the service is a member.
    team: u32,
    /// A group named in the files' ACLs.
    other: u32,
    /// Owns the files.
    owner: User,
    /// Named in the files' ACLs.
    named: User,
    /// A plain member of `team`.
    member: User,
    /// A member of `other` only.
    other_member: User,
    /// In no group of interest.
    out: User,
    /// workspaced runs as this user: a member of `team`.
    svc: User,
    /// workspaced runs as this user in the refusal test: NOT a member of `team`.
    stranger: User,
}

fn ids() -> &'static Ids {
    static IDS: OnceLock<Ids> = OnceLock::new();
    IDS.get_or_init(|| {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the ownership suite needs root: it creates users (useradd) and starts workspaced as them (setpriv)"
        );
        for tool in ["setpriv", "getfacl", "setfacl", "stat", "useradd"] {
            let found = Command::new("sh")
                .args(["-c", "command -v \"$1\"", "sh", tool])
                .output()
                .is_ok_and(|o| o.status.success());
            assert!(found, "the ownership suite needs `{tool}`, which is not installed");
        }
        let _users = users_lock();
        let team = ensure_group("awtest-own-team");
        let other = ensure_group("awtest-own-other");
        let user = |name: &'static str, groups: &[&str]| {
            let (uid, gid) = ensure_user(name, groups);
            let mut all = vec![gid];
            all.extend(groups.iter().map(|g| ensure_group(g)));
            User {
                name,
                uid,
                gid,
                groups: all,
            }
        };
        let ids = Ids {
            team,
            other,
            owner: user("awtest-own-owner", &["awtest-own-team"]),
            named: user("awtest-own-named", &[]),
            member: user("awtest-own-member", &["awtest-own-team"]),
            other_member: user("awtest-own-othermem", &["awtest-own-other"]),
            out: user("awtest-own-out", &[]),
            svc: user("awtest-own-svc", &["awtest-own-team"]),
            stranger: user("awtest-own-stranger", &[]),
        };
        // `--user-group` gives each user a primary group of its own; check nobody is in `team`
        // or `other` by accident, or the access checks below would prove nothing.
        for u in [&ids.named, &ids.out, &ids.stranger] {
            assert!(
                !u.groups.contains(&team) && !u.groups.contains(&other),
                "{} must not be in awtest-own-team or awtest-own-other",
                u.name
            );
        }
        ids
    })
}

fn p(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// Run a command as root; its stdout. Panics with stderr on failure.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `setpriv` as `user` with exactly its groups and no capabilities, then `cmd`.
fn as_user(user: &User) -> Command {
    let groups: Vec<String> = user.groups.iter().map(u32::to_string).collect();
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .arg(format!("--groups={}", groups.join(",")))
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"]);
    c
}

/// The kernel's verdict: `test -r|-w|-x path` (access(2)) as `user`.
fn kernel_allows(user: &User, flag: &str, path: &Path) -> bool {
    let status = as_user(user)
        .args(["test", flag])
        .arg(path)
        .status()
        .expect("run setpriv");
    match status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!(
            "setpriv … test {flag} {} as {}: {status}",
            path.display(),
            user.name
        ),
    }
}

/// What each user may do to `path`, by the kernel: `name:rwx` with `-` for a refusal.
fn rights(users: &[&User], path: &Path) -> Vec<String> {
    users
        .iter()
        .map(|u| {
            let bit = |flag: &str, c: char| if kernel_allows(u, flag, path) { c } else { '-' };
            format!(
                "{}:{}{}{}",
                u.name,
                bit("-r", 'r'),
                bit("-w", 'w'),
                bit("-x", 'x')
            )
        })
        .collect()
}

/// `getfacl -n --omit-header`: the entries (with `#effective:` remarks), no comment lines.
fn getfacl(path: &Path) -> Vec<String> {
    run("getfacl", &["-n", "--omit-header", "-p", "--", p(path)])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `uid gid octal-mode`, as `stat -c '%u %g %a'` prints them.
fn stat(path: &Path) -> String {
    run("stat", &["-c", "%u %g %a", "--", p(path)])
        .trim()
        .to_owned()
}

/// Fail loudly, rather than pass, if the state root's filesystem does not store POSIX ACLs.
fn require_acls(state: &StateRoot) {
    let probe = state.root().join("acl-probe");
    std::fs::write(&probe, "").unwrap();
    let out = Command::new("setfacl")
        .args(["-m", "u:0:r--", "--", p(&probe)])
        .output()
        .expect("run setfacl");
    assert!(
        out.status.success(),
        "the filesystem of {} does not take POSIX ACLs ({}); the ownership tests cannot run here — \
         run them on a filesystem mounted with ACL support",
        state.root().display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    assert!(
        getfacl(&probe).iter().any(|l| l.starts_with("user:0:")),
        "setfacl succeeded but the ACL entry did not stick on {}",
        probe.display()
    );
    std::fs::remove_file(&probe).unwrap();
}

/// A project `name` of `files`, its folder `root:team` mode 2775: the team (and so the service)
/// may create the staged file beside the target, and new files get the team as their group.
fn team_project(state: &StateRoot, name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = state.project(name, files);
    run("chown", &[&format!("0:{}", ids().team), p(&dir)]);
    run("chmod", &["2775", p(&dir)]);
    dir
}

/// chown, chmod (after chown, which clears set-id bits), then add ACL entries if any.
fn prepare(path: &Path, uid: u32, gid: u32, mode: &str, acl_entries: &str) {
    run("chown", &[&format!("{uid}:{gid}"), p(path)]);
    run("chmod", &[mode, p(path)]);
    if !acl_entries.is_empty() {
        run("setfacl", &["-m", acl_entries, "--", p(path)]);
    }
}

/// workspaced as `user` (exactly its groups) with `caps`, its state root handed to it.
fn start_as(state: &StateRoot, user: &User, caps: Vec<&'static str>) -> Workspaced {
    state.give_state_to(user.uid, user.gid);
    Workspaced::start_with(
        state,
        Options {
            user: Some((user.uid, user.gid, user.groups.clone())),
            caps,
            ..Options::default()
        },
    )
}

fn temp_files(dir: &Path) -> Vec<String> {
    all_files(dir)
        .into_iter()
        .filter(|f| f.contains(".agentworks-tmp-"))
        .collect()
}

fn show(lines: &[String]) -> String {
    lines.join("\n")
}

#[test]
fn rootless_write_keeps_group_acl_and_everyones_rights() {
    let ids = ids();
    let state = StateRoot::new();
    require_acls(&state);
    let dir = team_project(&state, "demo", &[("notes.txt", "old\n")]);
    let file = dir.join("notes.txt");
    prepare(
        &file,
        ids.owner.uid,
        ids.team,
        "0640",
        &format!("u:{}:r--,g:{}:r--", ids.named.uid, ids.other),
    );
    let stat_before = stat(&file);
    assert_eq!(stat_before, format!("{} {} 640", ids.owner.uid, ids.team));
    let acl_before = getfacl(&file);
    let people = [
        &ids.owner,
        &ids.named,
        &ids.member,
        &ids.other_member,
        &ids.out,
    ];
    let rights_before = rights(&people, &file);
    // What the setup grants, by the kernel (so the comparison after the write means something).
    assert_eq!(
        rights_before,
        [
            "awtest-own-owner:rw-",
            "awtest-own-named:r--",
            "awtest-own-member:r--",
            "awtest-own-othermem:r--",
            "awtest-own-out:---"
        ]
    );
    assert!(
        !kernel_allows(&ids.svc, "-w", &file),
        "svc starts without write access"
    );

    let daemon = start_as(&state, &ids.svc, vec![]);
    let written = daemon
        .client()
        .write(
            &ctx("demo", "alice"),
            "notes.txt",
            "new\n",
            &revision("old\n"),
            "own-a",
        )
        .unwrap();
    assert_eq!(written["state"], "applied");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "new\n");

    let acl_after = getfacl(&file);
    let stat_after = stat(&file);
    eprintln!(
        "rootless write, before ({stat_before}):\n{}\nafter ({stat_after}):\n{}",
        show(&acl_before),
        show(&acl_after)
    );

    // Without CAP_CHOWN the service owns the replacement; the group is the original's.
    let fields: Vec<&str> = stat_after.split(' ').collect();
    assert_eq!(fields[0], ids.svc.uid.to_string(), "{stat_after}");
    assert_eq!(fields[1], ids.team.to_string(), "group kept: {stat_after}");

    // The ACL: the same entries but the owner line and the mask, plus the former owner, named.
    let former_owner = format!("user:{}:rw-", ids.owner.uid);
    let others = |acl: &[String]| -> Vec<String> {
        let mut v: Vec<String> = acl
            .iter()
            .filter(|l| !l.starts_with("user::") && !l.starts_with("mask::"))
            .filter(|l| **l != former_owner)
            .cloned()
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        others(&acl_after),
        others(&acl_before),
        "before:\n{}\nafter:\n{}",
        show(&acl_before),
        show(&acl_after)
    );
    assert!(acl_after.contains(&former_owner), "{}", show(&acl_after));
    assert!(
        acl_after.contains(&"user::rw-".to_owned()),
        "{}",
        show(&acl_after)
    );
    // The smallest mask that lets the former owner keep rw-; nobody else gains from it (the
    // kernel checks below), because every other entry was at most r-- under the old mask.
    assert!(acl_before.contains(&"mask::r--".to_owned()));
    assert!(
        acl_after.contains(&"mask::rw-".to_owned()),
        "{}",
        show(&acl_after)
    );

    // Mode: other bits as before, no set-id bits. The group bits of an ACL'd file *are* the
    // mask, so they follow it from r-- to rw-; the owning group's own entry (`group::r--`,
    // compared above) is what still limits the team.
    let mode = u32::from_str_radix(fields[2], 8).unwrap();
    assert_eq!(mode & 0o7, 0o640 & 0o7, "{stat_after}");
    assert_eq!(mode & 0o7000, 0, "{stat_after}");
    assert_eq!(
        (mode >> 3) & 0o7,
        0o6,
        "group bits = the mask: {stat_after}"
    );

    // The kernel's verdict: nobody's access changed, the former owner included.
    assert_eq!(rights(&people, &file), rights_before);
    assert!(kernel_allows(&ids.owner, "-r", &file));
    assert!(kernel_allows(&ids.owner, "-w", &file));
    // Only the service's own rights changed: it now has the former owner's.
    assert_eq!(rights(&[&ids.svc], &file), ["awtest-own-svc:rw-"]);
    assert!(temp_files(&dir).is_empty(), "{:?}", all_files(&dir));
}

/// With CAP_CHOWN the replacement goes back to its owner. CAP_CHOWN alone is not enough: once
/// the staged file belongs to the owner, only the owner or CAP_FOWNER may set its ACL and mode,
/// so the service needs CAP_FOWNER too.
#[test]
fn with_cap_chown_the_owner_itself_is_kept() {
    let ids = ids();
    let state = StateRoot::new();
    require_acls(&state);
    let cases = [
        (
            "plain.txt",
            "0640",
            format!("u:{}:r--,g:{}:r--", ids.named.uid, ids.other),
        ),
        (
            "setgid.sh",
            "2750",
            format!("u:{}:r-x,g:{}:r--", ids.named.uid, ids.other),
        ),
        (
            "setuid.sh",
            "4750",
            format!("u:{}:r-x,g:{}:r--", ids.named.uid, ids.other),
        ),
    ];
    let files: Vec<(&str, &str)> = cases.iter().map(|(name, _, _)| (*name, "old\n")).collect();
    let dir = team_project(&state, "demo", &files);
    let people = [
        &ids.owner,
        &ids.named,
        &ids.member,
        &ids.other_member,
        &ids.out,
    ];
    let mut before = Vec::new();
    for (name, mode, acl) in &cases {
        let file = dir.join(name);
        prepare(&file, ids.owner.uid, ids.team, mode, acl);
        assert_eq!(
            stat(&file),
            format!(
                "{} {} {}",
                ids.owner.uid,
                ids.team,
                mode.trim_start_matches('0')
            )
        );
        before.push((stat(&file), getfacl(&file), rights(&people, &file)));
    }

    let daemon = start_as(&state, &ids.svc, vec!["chown", "fowner"]);
    let alice = ctx("demo", "alice");
    for ((name, _, _), (stat_before, acl_before, rights_before)) in cases.iter().zip(&before) {
        let file = dir.join(name);
        let written = daemon
            .client()
            .write(
                &alice,
                name,
                "new\n",
                &revision("old\n"),
                &format!("own-b-{name}"),
            )
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(written["state"], "applied", "{name}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new\n", "{name}");
        assert_eq!(&stat(&file), stat_before, "{name}: owner, group and mode");
        assert_eq!(
            &getfacl(&file),
            acl_before,
            "{name}: the full ACL\nbefore:\n{}\nafter:\n{}",
            show(acl_before),
            show(&getfacl(&file))
        );
        assert_eq!(&rights(&people, &file), rights_before, "{name}");
    }
    assert!(temp_files(&dir).is_empty(), "{:?}", all_files(&dir));
}

#[test]
fn service_outside_the_group_refuses_and_leaves_the_file() {
    let ids = ids();
    let state = StateRoot::new();
    require_acls(&state);
    let dir = team_project(
        &state,
        "demo",
        &[("notes.txt", "old\n"), ("mine.txt", "mine\n")],
    );
    // The folder lets the stranger create the staged file (a named ACL entry), so only the
    // file's group can stop the replacement. Not setgid: in a setgid folder of the file's group
    // the staged file is born in that group, and the kernel lets its owner "change" it to the
    // group it already has, so there the group is kept without membership (and nothing refuses).
    run("chmod", &["g-s", p(&dir)]);
    run(
        "setfacl",
        &["-m", &format!("u:{}:rwx", ids.stranger.uid), "--", p(&dir)],
    );
    assert_eq!(stat(&dir), format!("0 {} 775", ids.team));
    assert!(kernel_allows(&ids.stranger, "-w", &dir));
    assert!(kernel_allows(&ids.stranger, "-x", &dir));
    let notes = dir.join("notes.txt");
    // Readable by the stranger, so the daemon gets as far as replacing it.
    prepare(
        &notes,
        ids.owner.uid,
        ids.team,
        "0640",
        &format!(
            "u:{}:r--,u:{}:r--,g:{}:r--",
            ids.named.uid, ids.stranger.uid, ids.other
        ),
    );
    // The stranger's own file, in a group it has left: it keeps the owner without privilege,
    // but not the group, so this is refused too.
    let mine = dir.join("mine.txt");
    prepare(&mine, ids.stranger.uid, ids.team, "0640", "");

    let snapshot = |file: &Path| {
        (
            std::fs::read_to_string(file).unwrap(),
            stat(file),
            getfacl(file),
        )
    };
    let before = [snapshot(&notes), snapshot(&mine)];
    let daemon = start_as(&state, &ids.stranger, vec![]);
    let alice = ctx("demo", "alice");
    for (name, old) in [("notes.txt", "old\n"), ("mine.txt", "mine\n")] {
        let (code, details) = daemon
            .client()
            .write(
                &alice,
                name,
                "new\n",
                &revision(old),
                &format!("own-c-{name}"),
            )
            .unwrap_err();
        assert_eq!(code, "ownership_not_kept", "{name}: {details}");
        let message = details["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("not a member of group {}", ids.team)),
            "{name}: {message}"
        );
    }
    assert_eq!([snapshot(&notes), snapshot(&mine)], before);
    assert!(temp_files(&dir).is_empty(), "{:?}", all_files(&dir));
    assert_eq!(all_files(&dir), ["mine.txt", "notes.txt"]);
}

#[test]
fn new_files_get_the_folders_default_acl_like_any_new_file() {
    let ids = ids();
    let state = StateRoot::new();
    require_acls(&state);
    let with_default = team_project(&state, "acl", &[]);
    run(
        "setfacl",
        &[
            "-d",
            "-m",
            &format!("u:{}:rw,g::r,o::-", ids.named.uid),
            "--",
            p(&with_default),
        ],
    );
    // And a folder without a default ACL, where the umask decides.
    let plain = team_project(&state, "plain", &[]);

    let daemon = start_as(&state, &ids.svc, vec![]);
    for (project, dir) in [("acl", &with_default), ("plain", &plain)] {
        daemon
            .client()
            .write(
                &ctx(project, "alice"),
                "made.txt",
                "new\n",
                "missing",
                &format!("own-d-{project}"),
            )
            .unwrap();
        let reference = dir.join("ref.txt");
        let out = as_user(&ids.svc)
            .args(["sh", "-c", ": > \"$1\"", "sh"])
            .arg(&reference)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let made = dir.join("made.txt");
        assert_eq!(std::fs::read_to_string(&made).unwrap(), "new\n");
        assert_eq!(
            getfacl(&made),
            getfacl(&reference),
            "{project}: made by workspaced vs by the same user's shell"
        );
        assert_eq!(stat(&made), stat(&reference), "{project}");
        assert!(temp_files(dir).is_empty(), "{:?}", all_files(dir));
    }
    // The default ACL did apply (the comparison above is not between two plain files).
    let made = getfacl(&with_default.join("made.txt"));
    assert!(
        made.contains(&format!("user:{}:rw-", ids.named.uid)),
        "{}",
        show(&made)
    );
}

/// A mask that restricts a named user must go on restricting it: normalised, not enlarged over.
#[test]
fn a_restricting_mask_stays_restricting() {
    let ids = ids();
    let state = StateRoot::new();
    require_acls(&state);
    let dir = team_project(&state, "demo", &[("notes.txt", "old\n")]);
    let file = dir.join("notes.txt");
    prepare(&file, ids.owner.uid, ids.team, "0640", "");
    run(
        "setfacl",
        &[
            "--set",
            &format!(
                "u::rw-,u:{}:rwx,g::r--,g:{}:rw-,m::r--,o::---",
                ids.named.uid, ids.other
            ),
            "--",
            p(&file),
        ],
    );
    let people = [
        &ids.owner,
        &ids.named,
        &ids.member,
        &ids.other_member,
        &ids.out,
    ];
    let rights_before = rights(&people, &file);
    assert_eq!(
        rights_before,
        [
            "awtest-own-owner:rw-",
            "awtest-own-named:r--",
            "awtest-own-member:r--",
            "awtest-own-othermem:r--",
            "awtest-own-out:---"
        ]
    );
    let acl_before = getfacl(&file);

    let daemon = start_as(&state, &ids.svc, vec![]);
    daemon
        .client()
        .write(
            &ctx("demo", "alice"),
            "notes.txt",
            "new\n",
            &revision("old\n"),
            "own-e",
        )
        .unwrap();
    let acl_after = getfacl(&file);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "new\n");
    assert!(
        !kernel_allows(&ids.named, "-w", &file),
        "{}",
        show(&acl_after)
    );
    assert!(
        !kernel_allows(&ids.named, "-x", &file),
        "{}",
        show(&acl_after)
    );
    assert!(
        !kernel_allows(&ids.other_member, "-w", &file),
        "{}",
        show(&acl_after)
    );
    assert_eq!(
        rights(&people, &file),
        rights_before,
        "before:\n{}\nafter:\n{}",
        show(&acl_before),
        show(&acl_after)
    );
}

/// A service that already owns the file keeps everything without any capability, setuid and
/// setgid included (it is a member of the file's group).
#[test]
fn unprivileged_owner_keeps_everything() {
    let ids = ids();
    let state = StateRoot::new();
    require_acls(&state);
    let cases = [
        (
            "run.sh",
            "6750",
            format!("u:{}:r-x,g:{}:r--", ids.named.uid, ids.other),
        ),
        (
            "data.txt",
            "0660",
            format!("u:{}:rw-,g:{}:r--", ids.named.uid, ids.other),
        ),
        ("bare.txt", "0604", String::new()),
    ];
    let files: Vec<(&str, &str)> = cases.iter().map(|(name, _, _)| (*name, "old\n")).collect();
    let dir = team_project(&state, "demo", &files);
    let people = [
        &ids.svc,
        &ids.owner,
        &ids.named,
        &ids.member,
        &ids.other_member,
        &ids.out,
    ];
    let mut before = Vec::new();
    for (name, mode, acl) in &cases {
        let file = dir.join(name);
        prepare(&file, ids.svc.uid, ids.team, mode, acl);
        assert_eq!(
            stat(&file),
            format!(
                "{} {} {}",
                ids.svc.uid,
                ids.team,
                mode.trim_start_matches('0')
            )
        );
        before.push((stat(&file), getfacl(&file), rights(&people, &file)));
    }

    let daemon = start_as(&state, &ids.svc, vec![]);
    let alice = ctx("demo", "alice");
    for ((name, _, _), (stat_before, acl_before, rights_before)) in cases.iter().zip(&before) {
        let file = dir.join(name);
        daemon
            .client()
            .write(
                &alice,
                name,
                "new\n",
                &revision("old\n"),
                &format!("own-f-{name}"),
            )
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new\n", "{name}");
        assert_eq!(&stat(&file), stat_before, "{name}: owner, group and mode");
        assert_eq!(&getfacl(&file), acl_before, "{name}: the full ACL");
        assert_eq!(&rights(&people, &file), rights_before, "{name}");
    }
    assert!(temp_files(&dir).is_empty(), "{:?}", all_files(&dir));
}

/// CAP_CHOWN without CAP_FOWNER: the staged file can be given to its owner, but then only the
/// owner (or CAP_FOWNER) may set its ACL and mode, so the replacement is refused, not degraded.
#[test]
fn cap_chown_without_fowner_refuses_and_leaves_the_file() {
    let ids = ids();
    let state = StateRoot::new();
    require_acls(&state);
    let dir = team_project(&state, "demo", &[("notes.txt", "old\n")]);
    let file = dir.join("notes.txt");
    prepare(
        &file,
        ids.owner.uid,
        ids.team,
        "0640",
        &format!("u:{}:r--,g:{}:r--", ids.named.uid, ids.other),
    );
    let before = (stat(&file), getfacl(&file));
    let daemon = start_as(&state, &ids.svc, vec!["chown"]);
    let (code, details) = daemon
        .client()
        .write(
            &ctx("demo", "alice"),
            "notes.txt",
            "new\n",
            &revision("old\n"),
            "own-g",
        )
        .unwrap_err();
    assert_eq!(code, "ownership_not_kept", "{details}");
    assert!(
        details["message"]
            .as_str()
            .unwrap_or_default()
            .contains("CAP_FOWNER"),
        "{details}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "old\n");
    assert_eq!((stat(&file), getfacl(&file)), before);
    assert_eq!(all_files(&dir), ["notes.txt"]);
}
