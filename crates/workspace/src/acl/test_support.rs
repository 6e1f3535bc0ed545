//! What the ACL unit tests share: entry and xattr builders, and the probes and helpers of the
//! tests that run on real files (`getfacl`, root, a filesystem with ACL support).
//!
//! Test-only; it must never be compiled into the daemon.

use super::codec::UNDEFINED_ID;
use super::*;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::Command;

pub(super) const R: u8 = 4;
pub(super) const W: u8 = 2;
pub(super) const X: u8 = 1;

pub(super) fn e(tag: Tag, id: Option<u32>, perm: u8) -> AclEntry {
    AclEntry { tag, id, perm }
}

/// Raw xattr bytes: version 2, then (tag, perm, id) triples as given.
pub(super) fn raw(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    raw_with_version(2, entries)
}

pub(super) fn raw_with_version(version: u32, entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = version.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

pub(super) const U: u32 = UNDEFINED_ID;

pub(super) fn extended() -> Acl {
    Acl::from_entries(vec![
        e(Tag::Other, None, 0),
        e(Tag::Group, Some(2001), R | W),
        e(Tag::User, Some(1001), R | W | X),
        e(Tag::GroupObj, None, R | X),
        e(Tag::Mask, None, R),
        e(Tag::UserObj, None, R | W),
    ])
    .unwrap()
}

// ---------------------------------------------------------------- real files

pub(super) fn getfacl(path: &Path) -> Vec<String> {
    let out = Command::new("getfacl")
        .args(["-n", "-c", "-E", "-p", "--"])
        .arg(path)
        .output()
        .expect("run getfacl");
    assert!(
        out.status.success(),
        "getfacl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `uid gid octal-mode` as stat(1) prints them.
pub(super) fn stat_line(path: &Path) -> String {
    let out = Command::new("stat")
        .args(["-c", "%u %g %a", "--"])
        .arg(path)
        .output()
        .expect("run stat");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub(super) fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(super) fn lines(s: &[&str]) -> Vec<String> {
    s.iter().map(|l| (*l).to_owned()).collect()
}

/// A temp dir whose filesystem stores ACLs, or why not.
pub(super) fn acl_dir() -> Result<tempfile::TempDir, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("no temp dir: {e}"))?;
    let probe = File::create(dir.path().join("probe")).map_err(|e| e.to_string())?;
    match write_access_acl(probe.as_fd(), &extended()) {
        Ok(()) => Ok(dir),
        Err(err) => Err(format!(
            "the filesystem of {} does not take POSIX ACLs: {err}",
            dir.path().display()
        )),
    }
}

/// What a test needs from the machine (root, ACL support), or fail with why: a test that
/// cannot run must not pass.
macro_rules! require {
    ($test:literal, $check:expr) => {
        match $check {
            Ok(v) => v,
            Err(why) => panic!("acl test `{}` cannot run on this machine: {}", $test, why),
        }
    };
}
pub(super) use require;

pub(super) fn require_root() -> Result<(), String> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err("needs root (CAP_CHOWN, and useradd for test users)".into())
    }
}
