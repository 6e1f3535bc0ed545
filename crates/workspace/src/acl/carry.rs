//! Carry-over: giving a staged replacement file the original's owner, group, access ACL and
//! mode, fd-only, before workspaced renames it over the original; and the ACL a replacement
//! gets when the service cannot give the file back to its former owner ([`rootless_acl`]).
//!
//! It must never widen anyone's effective access and never degrade silently: anything it
//! cannot keep is an error, and the caller refuses the replacement before the rename.

use super::codec::RWX;
use super::{
    Acl, AclEntry, AclError, Tag, io_err, read_access_acl, remove_access_acl, write_access_acl,
};
use rustix::fs::Mode;
use rustix::io::Errno;
use rustix::process::{Gid, Uid};
use std::os::fd::BorrowedFd;

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;

fn chmod_hint(errno: Errno, mode: u32) -> &'static str {
    if errno == Errno::PERM && mode & (S_ISUID | S_ISGID) != 0 {
        "the file carries a setuid/setgid bit; the packaged unit forbids setting those (RestrictSUIDSGID=yes: lift it with a drop-in), otherwise the service needs CAP_FOWNER or the file's group"
    } else if errno == Errno::PERM {
        "only the file's owner or a process with CAP_FOWNER may change its mode; grant CAP_FOWNER alongside CAP_CHOWN"
    } else {
        "see the error for the cause"
    }
}

/// Ownership, mode (st_mode & 0o7777) and access ACL of the original file, read from its fd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOwnership {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub acl: Option<Acl>,
}

impl FileOwnership {
    /// The access rules this ownership amounts to, ACL or not.
    fn effective_acl(&self) -> Acl {
        self.acl
            .clone()
            .unwrap_or_else(|| Acl::from_mode(self.mode))
    }
}

fn stat_ids_mode(fd: BorrowedFd<'_>) -> Result<(u32, u32, u32), AclError> {
    let st = rustix::fs::fstat(fd).map_err(|errno| AclError::Stat {
        source: io_err(errno),
    })?;
    let mode: u32 = st.st_mode;
    Ok((st.st_uid, st.st_gid, mode & 0o7777))
}

/// Read the open file's owner, group, mode and access ACL.
pub fn read_ownership(fd: BorrowedFd<'_>) -> Result<FileOwnership, AclError> {
    let (uid, gid, mode) = stat_ids_mode(fd)?;
    let acl = read_access_acl(fd)?;
    Ok(FileOwnership {
        uid,
        gid,
        mode,
        acl,
    })
}

/// Pure: the ACL a rootless replacement gets. Start from `original.acl` (or
/// `Acl::from_mode(original.mode)`); normalise masked permissions first (every group-class
/// entry — named users, GROUP_OBJ, named groups — becomes perm & mask), replace any named USER
/// entry for original.uid, add a named USER entry for the former owner (original.uid) with the
/// USER_OBJ perms, keep USER_OBJ perms for the new owner (the service), then set MASK to the
/// union of the group-class entries. Nobody's effective rights change except the new owner's
/// (the service), which gets the former owner's; no other entry gains access.
///
/// `original.uid` must be a valid uid (not `0xFFFFFFFF`); [`read_ownership`] never returns
/// another.
pub fn rootless_acl(original: &FileOwnership) -> Acl {
    let base = original.effective_acl();
    let mask = base.mask().unwrap_or(RWX);
    let owner_perm = base.perm_of(Tag::UserObj).unwrap_or(0);
    let mut entries: Vec<AclEntry> = base
        .entries
        .iter()
        .filter(|e| e.tag != Tag::Mask)
        .filter(|e| !(e.tag == Tag::User && e.id == Some(original.uid)))
        .map(|e| {
            if e.tag.is_group_class() {
                // Normalise first: what the old mask took away must stay away under the new one.
                AclEntry {
                    perm: e.perm & mask,
                    ..*e
                }
            } else {
                *e
            }
        })
        .collect();
    entries.push(AclEntry {
        tag: Tag::User,
        id: Some(original.uid),
        perm: owner_perm,
    });
    let union = entries
        .iter()
        .filter(|e| e.tag.is_group_class())
        .fold(0, |acc, e| acc | e.perm);
    entries.push(AclEntry {
        tag: Tag::Mask,
        id: None,
        perm: union,
    });
    entries.sort_by_key(AclEntry::sort_key);
    Acl { entries }
}

/// Which way [`carry_over`] kept the original's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CarryOver {
    /// The replacement has the original's owner, group, ACL and mode.
    OwnerKept,
    /// The replacement is owned by the service, keeps the original's group, and names the former
    /// owner in an ACL entry with the owner's rights ([`rootless_acl`]).
    FormerOwnerAsAclEntry,
}

/// Give the staged replacement (`staged`, a regular file we created and own) the original's
/// metadata, fd-only, in this order:
/// 1. owner/group: fchown(staged, original.uid, original.gid). If that fails with EPERM and
///    original.uid != our euid, fall back to rootless: fchown(staged, None, original.gid) —
///    EPERM there → Err(GroupNotKept) (refuse; never degrade).
/// 2. ACL: owner kept → write original.acl if it is non-minimal, else remove any access ACL the
///    temp file inherited from the directory's default ACL; rootless → write
///    rootless_acl(original) (an error, e.g. EOPNOTSUPP → Err(AclNotKept)).
/// 3. mode: fchmod with the permission bits the ACL implies (owner kept: original.mode & 0o777)
///    plus set-id/sticky bits: setuid only when the owner was kept, setgid only when the group
///    was kept (it always is once we get here), sticky as original.
/// 4. Verify by reading back fstat + the ACL xattr: owner/group/ACL/mode exactly as intended,
///    else Err(VerifyFailed).
///
/// Returns which way it went. On an error the caller must not rename the staged file; the
/// staged file may be left half-done (e.g. chowned) and should be unlinked.
///
/// Privilege: the owner-kept way needs CAP_CHOWN *and* CAP_FOWNER (after step 1 the file belongs
/// to someone else, and only its owner or CAP_FOWNER may then set its ACL and mode); with
/// CAP_CHOWN alone step 2 or 3 fails with EPERM and the replacement is refused. A service that
/// already owns the original (original.uid == euid) keeps the owner without any capability.
/// The rootless way drops setuid: the file now belongs to the service.
pub fn carry_over(staged: BorrowedFd<'_>, original: &FileOwnership) -> Result<CarryOver, AclError> {
    // Step 1, owner and group, comes first: chown clears the set-id bits, and the ACL and mode
    // written afterwards must be the final ones.
    let (way, expected_uid) = match chown_ids(staged, Some(original.uid), original.gid) {
        Ok(()) => (CarryOver::OwnerKept, original.uid),
        Err(Errno::PERM) if original.uid != rustix::process::geteuid().as_raw() => {
            // No CAP_CHOWN: we cannot give the file away, but we must keep its group.
            match chown_ids(staged, None, original.gid) {
                Ok(()) => {}
                Err(Errno::PERM) => return Err(group_not_kept(original, Errno::PERM)),
                Err(errno) => return Err(chown_failed(original, errno)),
            }
            // The staged file is ours and stays ours.
            let service = rustix::process::geteuid().as_raw();
            (CarryOver::FormerOwnerAsAclEntry, service)
        }
        // We already are the owner, so only the group can be refused.
        Err(Errno::PERM) => return Err(group_not_kept(original, Errno::PERM)),
        Err(errno) => return Err(chown_failed(original, errno)),
    };

    // Step 2, the access ACL. It also rewrites the mode's permission bits, which step 3 then
    // sets to exactly what the ACL implies, so the two agree.
    let acl_not_kept = |err: AclError| match err {
        AclError::WriteAcl { source, hint } | AclError::RemoveAcl { source, hint } => {
            AclError::AclNotKept { source, hint }
        }
        other => other,
    };
    let (intended_acl, permission_bits) = match way {
        CarryOver::OwnerKept => {
            match &original.acl {
                Some(acl) if !acl.is_minimal() => {
                    write_access_acl(staged, acl).map_err(acl_not_kept)?;
                }
                // Drop what the directory's default ACL gave the temp file. A filesystem without
                // ACL support cannot have given it one.
                _ => match remove_access_acl(staged) {
                    Ok(()) => {}
                    Err(AclError::RemoveAcl { source, .. })
                        if source.raw_os_error() == Some(Errno::OPNOTSUPP.raw_os_error()) => {}
                    Err(err) => return Err(acl_not_kept(err)),
                },
            }
            (original.effective_acl(), original.mode & 0o777)
        }
        CarryOver::FormerOwnerAsAclEntry => {
            let acl = rootless_acl(original);
            write_access_acl(staged, &acl).map_err(acl_not_kept)?;
            let bits = acl.mode_bits();
            (acl, bits)
        }
    };

    // Step 3, the mode. setuid would hand the service's identity to whoever runs the file, so it
    // survives only with the original owner; setgid only with the original group.
    let mut mode = permission_bits | (original.mode & S_ISVTX) | (original.mode & S_ISGID);
    if way == CarryOver::OwnerKept {
        mode |= original.mode & S_ISUID;
    }
    rustix::fs::fchmod(staged, Mode::from_raw_mode(mode)).map_err(|errno| AclError::Chmod {
        mode,
        source: io_err(errno),
        hint: chmod_hint(errno, mode),
    })?;

    // Step 4, verify: the kernel can quietly drop bits (setgid when not in the group, ACL
    // entries on some filesystems); read everything back and compare.
    let actual = read_ownership(staged)?;
    let mut wrong = Vec::new();
    if actual.uid != expected_uid {
        wrong.push(format!("owner {} instead of {}", actual.uid, expected_uid));
    }
    if actual.gid != original.gid {
        wrong.push(format!("group {} instead of {}", actual.gid, original.gid));
    }
    if actual.mode != mode {
        wrong.push(format!("mode {:#o} instead of {:#o}", actual.mode, mode));
    }
    let actual_acl = actual.effective_acl();
    if actual_acl != intended_acl {
        wrong.push(format!("ACL {actual_acl:?} instead of {intended_acl:?}"));
    }
    if !wrong.is_empty() {
        return Err(AclError::VerifyFailed {
            what: wrong.join(", "),
        });
    }
    Ok(way)
}

fn chown_ids(fd: BorrowedFd<'_>, uid: Option<u32>, gid: u32) -> Result<(), Errno> {
    // 0xFFFFFFFF means "leave unchanged" to the kernel; never let it slip through as an id.
    if uid == Some(u32::MAX) || gid == u32::MAX {
        return Err(Errno::INVAL);
    }
    rustix::fs::fchown(fd, uid.map(Uid::from_raw), Some(Gid::from_raw(gid)))
}

fn chown_failed(original: &FileOwnership, errno: Errno) -> AclError {
    AclError::Chown {
        uid: original.uid,
        gid: original.gid,
        source: io_err(errno),
    }
}

fn group_not_kept(original: &FileOwnership, errno: Errno) -> AclError {
    AclError::GroupNotKept {
        gid: original.gid,
        source: io_err(errno),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::test_support::*;
    use std::fs::{File, OpenOptions};
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;
    use std::process::Command;
    use std::sync::OnceLock;

    // ---------------------------------------------------------------- rootless_acl

    const SERVICE: u32 = 900;

    fn originals() -> Vec<(&'static str, FileOwnership)> {
        vec![
            (
                "0640 with named user, named group and a restrictive mask",
                FileOwnership {
                    uid: 500,
                    gid: 600,
                    mode: 0o640,
                    acl: Some(extended()),
                },
            ),
            (
                "no ACL",
                FileOwnership {
                    uid: 500,
                    gid: 600,
                    mode: 0o640,
                    acl: None,
                },
            ),
            (
                "setgid, no ACL",
                FileOwnership {
                    uid: 500,
                    gid: 600,
                    mode: 0o2750,
                    acl: None,
                },
            ),
            (
                "other has more than group",
                FileOwnership {
                    uid: 500,
                    gid: 600,
                    mode: 0o604,
                    acl: None,
                },
            ),
            (
                "owner already a named user",
                FileOwnership {
                    uid: 500,
                    gid: 600,
                    mode: 0o764,
                    acl: Some(
                        Acl::from_entries(vec![
                            e(Tag::UserObj, None, 7),
                            e(Tag::User, Some(500), R),
                            e(Tag::User, Some(1001), R | W),
                            e(Tag::GroupObj, None, R | X),
                            e(Tag::Mask, None, R | W),
                            e(Tag::Other, None, R),
                        ])
                        .unwrap(),
                    ),
                },
            ),
            (
                "service is a named user and group member",
                FileOwnership {
                    uid: 500,
                    gid: 600,
                    mode: 0o750,
                    acl: Some(
                        Acl::from_entries(vec![
                            e(Tag::UserObj, None, R | W | X),
                            e(Tag::User, Some(SERVICE), R),
                            e(Tag::GroupObj, None, 0),
                            e(Tag::Group, Some(2001), R | W | X),
                            e(Tag::Mask, None, R | X),
                            e(Tag::Other, None, 0),
                        ])
                        .unwrap(),
                    ),
                },
            ),
            (
                "mask without named entries",
                FileOwnership {
                    uid: 500,
                    gid: 600,
                    mode: 0o644,
                    acl: Some(
                        Acl::decode(&raw(&[(1, 6, U), (4, 6, U), (0x10, 4, U), (0x20, 4, U)]))
                            .unwrap(),
                    ),
                },
            ),
        ]
    }

    #[test]
    fn rootless_acl_changes_nobody_but_the_service() {
        let uids = [500, 1001, 1234, 0, SERVICE];
        let gid_sets: [&[u32]; 6] = [&[], &[600], &[2001], &[600, 2001], &[777], &[2001, 777]];
        for (name, original) in originals() {
            let before = original.effective_acl();
            let after = rootless_acl(&original);
            // valid, and survives the codec
            assert_eq!(
                Acl::from_entries(after.entries().to_vec()).unwrap(),
                after,
                "{name}"
            );
            assert_eq!(Acl::decode(&after.encode()).unwrap(), after, "{name}");
            assert!(!after.is_minimal(), "{name}");
            for &uid in &uids {
                for &gids in &gid_sets {
                    let was = before.effective_rights(original.uid, original.gid, uid, gids);
                    let now = after.effective_rights(SERVICE, original.gid, uid, gids);
                    if uid == SERVICE {
                        assert_eq!(
                            now,
                            before.effective_rights(original.uid, original.gid, original.uid, gids),
                            "{name}: the service gets the former owner's rights"
                        );
                        continue;
                    }
                    assert_eq!(was, now, "{name}: uid {uid} gids {gids:?}");
                    for want in 0..=7 {
                        assert_eq!(
                            before.permits(original.uid, original.gid, uid, gids, want),
                            after.permits(SERVICE, original.gid, uid, gids, want),
                            "{name}: uid {uid} gids {gids:?} want {want:o}"
                        );
                    }
                }
            }
            // the mask never lets an entry use more than it could before
            let old_mask = before.mask().unwrap_or(RWX);
            let new_mask = after.mask().unwrap_or(RWX);
            for entry in after.entries().iter().filter(|e| e.tag.is_group_class()) {
                if entry.tag == Tag::User && entry.id == Some(original.uid) {
                    assert_eq!(entry.perm, before.perm_of(Tag::UserObj).unwrap(), "{name}");
                    continue;
                }
                let old = before
                    .entries()
                    .iter()
                    .find(|o| o.tag == entry.tag && o.id == entry.id)
                    .unwrap_or_else(|| panic!("{name}: {entry:?} is new"));
                assert_eq!(
                    entry.perm & new_mask & !(old.perm & old_mask),
                    0,
                    "{name}: {entry:?} gained access"
                );
            }
            assert_eq!(
                after.perm_of(Tag::Other),
                before.perm_of(Tag::Other),
                "{name}"
            );
            assert_eq!(
                after.perm_of(Tag::UserObj),
                before.perm_of(Tag::UserObj),
                "{name}"
            );
        }
    }

    #[test]
    fn rootless_acl_of_a_masked_acl_is_exactly_this() {
        let original = &originals()[0].1;
        let expected = Acl::from_entries(vec![
            e(Tag::UserObj, None, R | W),
            e(Tag::User, Some(500), R | W),
            e(Tag::User, Some(1001), R),
            e(Tag::GroupObj, None, R),
            e(Tag::Group, Some(2001), R),
            e(Tag::Mask, None, R | W),
            e(Tag::Other, None, 0),
        ])
        .unwrap();
        assert_eq!(rootless_acl(original), expected);
        assert_eq!(rootless_acl(original).mode_bits(), 0o660);
        // an existing entry for the former owner is replaced, not duplicated
        let acl = rootless_acl(&originals()[4].1);
        let named_owner: Vec<_> = acl.entries().iter().filter(|e| e.id == Some(500)).collect();
        assert_eq!(named_owner, [&e(Tag::User, Some(500), 7)]);
    }

    // ---------------------------------------------------------------- carry_over, privileged

    struct TestIds {
        grp: u32,
        ngrp: u32,
        owner: u32,
        named: u32,
    }

    fn getent(db: &str, name: &str) -> Option<Vec<String>> {
        let out = Command::new("getent").args([db, name]).output().ok()?;
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .split(':')
                .map(str::to_owned)
                .collect()
        })
    }

    /// Run useradd/groupadd, retrying while another process holds the passwd lock; "already
    /// exists" (exit 9) is fine.
    fn add(cmd: &str, args: &[&str]) -> Result<(), String> {
        for _ in 0..20 {
            let out = Command::new(cmd)
                .args(args)
                .output()
                .map_err(|e| format!("{cmd}: {e}"))?;
            match out.status.code() {
                Some(0) | Some(9) => return Ok(()),
                Some(10) => std::thread::sleep(std::time::Duration::from_millis(250)),
                _ => {
                    return Err(format!(
                        "{cmd} {args:?}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
            }
        }
        Err(format!("{cmd} {args:?}: /etc/passwd stayed locked"))
    }

    fn group(name: &str) -> Result<u32, String> {
        if getent("group", name).is_none() {
            add("groupadd", &[name])?;
        }
        let fields = getent("group", name).ok_or(format!("group {name} not found"))?;
        fields[2].parse().map_err(|e| format!("gid of {name}: {e}"))
    }

    /// (uid, primary gid)
    fn user(name: &str, groups: &str) -> Result<(u32, u32), String> {
        if getent("passwd", name).is_none() {
            let mut args = vec!["-M", "-N", "-s", "/usr/sbin/nologin"];
            if !groups.is_empty() {
                args.extend(["-G", groups]);
            }
            args.push(name);
            add("useradd", &args)?;
        }
        let fields = getent("passwd", name).ok_or(format!("user {name} not found"))?;
        let uid = fields[2]
            .parse()
            .map_err(|e| format!("uid of {name}: {e}"))?;
        let gid = fields[3]
            .parse()
            .map_err(|e| format!("gid of {name}: {e}"))?;
        Ok((uid, gid))
    }

    fn test_ids() -> Result<&'static TestIds, String> {
        static IDS: OnceLock<Result<TestIds, String>> = OnceLock::new();
        require_root()?;
        IDS.get_or_init(|| {
            let grp = group("awtest-acl-grp")?;
            let ngrp = group("awtest-acl-ngrp")?;
            let (owner, _) = user("awtest-acl-owner", "awtest-acl-grp")?;
            let (named, _) = user("awtest-acl-named", "")?;
            Ok(TestIds {
                grp,
                ngrp,
                owner,
                named,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    fn create_new(path: &Path) -> File {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap()
    }

    #[test]
    fn carry_over_as_root_keeps_owner_group_acl_and_set_id_bits() {
        let ids = require!(
            "carry_over_as_root_keeps_owner_group_acl_and_set_id_bits",
            test_ids()
        );
        let dir = require!(
            "carry_over_as_root_keeps_owner_group_acl_and_set_id_bits",
            acl_dir()
        );
        let d = dir.path().to_str().unwrap();
        // The directory's default ACL gives new files an ACL that must not survive.
        run(
            "setfacl",
            &["-d", "-m", "u::rwx,g::rwx,o::rwx,u:12345:rwx", d],
        );
        let orig = dir.path().join("orig");
        drop(create_new(&orig));
        let o = orig.to_str().unwrap();
        run("chown", &[&format!("{}:{}", ids.owner, ids.grp), o]);
        let spec = format!(
            "u::rwx,u:{}:r-x,g::r-x,g:{}:r--,m::r-x,o::---",
            ids.named, ids.ngrp
        );
        run("setfacl", &["--set", &spec, o]);
        run("chmod", &["6750", o]);
        let original = read_ownership(File::open(&orig).unwrap().as_fd()).unwrap();
        assert_eq!(original.mode, 0o6750);

        let staged_path = dir.path().join("staged");
        let staged = create_new(&staged_path);
        assert!(
            getfacl(&staged_path)
                .iter()
                .any(|l| l.starts_with("user:12345"))
        );
        assert_eq!(
            carry_over(staged.as_fd(), &original).unwrap(),
            CarryOver::OwnerKept
        );
        assert_eq!(
            stat_line(&staged_path),
            format!("{} {} 6750", ids.owner, ids.grp)
        );
        assert_eq!(stat_line(&staged_path), stat_line(&orig));
        assert_eq!(getfacl(&staged_path), getfacl(&orig));
        assert_eq!(
            getfacl(&staged_path),
            lines(&[
                "user::rwx",
                &format!("user:{}:r-x", ids.named),
                "group::r-x",
                &format!("group:{}:r--", ids.ngrp),
                "mask::r-x",
                "other::---"
            ])
        );
    }

    #[test]
    fn carry_over_as_root_removes_an_inherited_acl_from_a_plain_file() {
        let ids = require!("carry_over_as_root_removes_an_inherited_acl", test_ids());
        let dir = require!("carry_over_as_root_removes_an_inherited_acl", acl_dir());
        run(
            "setfacl",
            &[
                "-d",
                "-m",
                "u::rwx,g::rwx,o::rwx,u:12345:rwx",
                dir.path().to_str().unwrap(),
            ],
        );
        let orig = dir.path().join("orig");
        let file = create_new(&orig);
        rustix::fs::fchown(
            &file,
            Some(Uid::from_raw(ids.owner)),
            Some(Gid::from_raw(ids.grp)),
        )
        .unwrap();
        remove_access_acl(file.as_fd()).unwrap();
        rustix::fs::fchmod(&file, Mode::from_raw_mode(0o1640)).unwrap();
        let original = read_ownership(file.as_fd()).unwrap();
        assert_eq!(original.acl, None);

        let staged_path = dir.path().join("staged");
        let staged = create_new(&staged_path);
        assert_eq!(
            carry_over(staged.as_fd(), &original).unwrap(),
            CarryOver::OwnerKept
        );
        assert_eq!(
            stat_line(&staged_path),
            format!("{} {} 1640", ids.owner, ids.grp)
        );
        assert_eq!(
            getfacl(&staged_path),
            lines(&["user::rw-", "group::r--", "other::---"])
        );
    }
}
