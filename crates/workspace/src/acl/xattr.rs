//! Reading, writing and removing the `system.posix_acl_access` xattr of an open file.
//!
//! It must never touch a path: every call takes a file descriptor the caller opened.

use super::{Acl, AclError, io_err};
use rustix::fs::XattrFlags;
use rustix::io::Errno;
use std::os::fd::BorrowedFd;

/// The xattr that holds a file's POSIX access ACL.
const ACCESS_ACL_XATTR: &str = "system.posix_acl_access";

fn xattr_hint(errno: Errno) -> &'static str {
    if errno == Errno::OPNOTSUPP {
        "the filesystem does not support POSIX ACLs (mounted with noacl?); keep the workspace on a filesystem with ACL support"
    } else if errno == Errno::PERM || errno == Errno::ACCESS {
        "only the file's owner or a process with CAP_FOWNER may change its ACL (a service that has CAP_CHOWN needs CAP_FOWNER too)"
    } else if errno == Errno::NOSPC || errno == Errno::TOOBIG || errno == Errno::RANGE {
        "the ACL does not fit in the file's xattr space; shorten the ACL"
    } else if errno == Errno::INVAL {
        "the kernel rejected the ACL (an id outside the user namespace?)"
    } else if errno == Errno::ROFS {
        "the filesystem is read-only"
    } else {
        "see the error for the cause"
    }
}

/// Read the access ACL of the open file. `Ok(None)` when it has none (ENODATA): its mode bits
/// are the whole story.
pub fn read_access_acl(fd: BorrowedFd<'_>) -> Result<Option<Acl>, AclError> {
    let read_err = |errno: Errno| AclError::ReadAcl {
        source: io_err(errno),
        hint: xattr_hint(errno),
    };
    // The ACL can change between asking for its size and reading it; ERANGE means try again.
    for _ in 0..4 {
        let size = match rustix::fs::fgetxattr_query(fd, ACCESS_ACL_XATTR) {
            Ok(size) => size,
            Err(Errno::NODATA) => return Ok(None),
            Err(errno) => return Err(read_err(errno)),
        };
        let mut buf = vec![0u8; size];
        match rustix::fs::fgetxattr(fd, ACCESS_ACL_XATTR, &mut buf[..]) {
            Ok(len) => {
                buf.truncate(len);
                return Acl::decode(&buf).map(Some);
            }
            Err(Errno::NODATA) => return Ok(None),
            Err(Errno::RANGE) => continue,
            Err(errno) => return Err(read_err(errno)),
        }
    }
    Err(read_err(Errno::RANGE))
}

/// Write `acl` as the open file's access ACL. The kernel also sets the mode's permission bits
/// from it, and stores no xattr at all for a minimal ACL.
pub fn write_access_acl(fd: BorrowedFd<'_>, acl: &Acl) -> Result<(), AclError> {
    rustix::fs::fsetxattr(fd, ACCESS_ACL_XATTR, &acl.encode(), XattrFlags::empty()).map_err(
        |errno| AclError::WriteAcl {
            source: io_err(errno),
            hint: xattr_hint(errno),
        },
    )
}

/// Remove the open file's access ACL, leaving its mode bits as they are. No ACL is not an error.
pub fn remove_access_acl(fd: BorrowedFd<'_>) -> Result<(), AclError> {
    match rustix::fs::fremovexattr(fd, ACCESS_ACL_XATTR) {
        Ok(()) | Err(Errno::NODATA) => Ok(()),
        Err(errno) => Err(AclError::RemoveAcl {
            source: io_err(errno),
            hint: xattr_hint(errno),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::read_ownership;
    use crate::acl::test_support::*;
    use std::fs::{self, File};
    use std::io::{self, Write as _};
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn write_access_acl_is_what_getfacl_sees() {
        let dir = require!("write_access_acl_is_what_getfacl_sees", acl_dir());
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        write_access_acl(file.as_fd(), &extended()).unwrap();
        assert_eq!(
            getfacl(&path),
            lines(&[
                "user::rw-",
                "user:1001:rwx",
                "group::r-x",
                "group:2001:rw-",
                "mask::r--",
                "other::---"
            ])
        );
        // the kernel sets the mode's group bits from the mask
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert_eq!(read_access_acl(file.as_fd()).unwrap(), Some(extended()));
        let own = read_ownership(file.as_fd()).unwrap();
        assert_eq!((own.mode, own.acl), (0o640, Some(extended())));

        // a minimal ACL is stored as mode bits only
        write_access_acl(file.as_fd(), &Acl::from_mode(0o751)).unwrap();
        assert_eq!(read_access_acl(file.as_fd()).unwrap(), None);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o751
        );
        assert_eq!(
            getfacl(&path),
            lines(&["user::rwx", "group::r-x", "other::--x"])
        );
    }

    #[test]
    fn read_access_acl_reads_what_setfacl_wrote_and_remove_is_idempotent() {
        let dir = require!("read_access_acl_reads_what_setfacl_wrote", acl_dir());
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        assert_eq!(read_access_acl(file.as_fd()).unwrap(), None);
        remove_access_acl(file.as_fd()).unwrap(); // nothing to remove: fine
        let spec = "u::rw-,u:1001:rwx,g::r-x,g:2001:rw-,m::r--,o::---";
        run("setfacl", &["--set", spec, path.to_str().unwrap()]);
        assert_eq!(read_access_acl(file.as_fd()).unwrap(), Some(extended()));
        remove_access_acl(file.as_fd()).unwrap();
        assert_eq!(read_access_acl(file.as_fd()).unwrap(), None);
        assert_eq!(getfacl(&path).len(), 3);
        remove_access_acl(file.as_fd()).unwrap();
    }

    /// Our decoder and the kernel's setxattr agree on what an ACL is, except where the decoder
    /// is deliberately stricter.
    #[test]
    fn decoder_agrees_with_the_kernel() {
        let dir = require!("decoder_agrees_with_the_kernel", acl_dir());
        // (case, bytes, decoder is stricter than the kernel here)
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            ("minimal", raw(&[(1, 6, U), (4, 4, U), (0x20, 0, U)]), false),
            ("extended", extended().encode(), false),
            ("mask only", raw(&[(1, 6, U), (4, 6, U), (0x10, 4, U), (0x20, 4, U)]), false),
            ("ids on obj entries", raw(&[(1, 6, 3), (4, 4, 4), (0x20, 0, 5)]), false),
            ("version 1", raw_with_version(1, &[(1, 6, U), (4, 4, U), (0x20, 0, U)]), false),
            ("short header", vec![2, 0, 0], false),
            ("ragged", [raw(&[(1, 6, U), (4, 4, U), (0x20, 0, U)]), vec![0]].concat(), false),
            ("unknown tag", raw(&[(1, 6, U), (0x40, 4, U), (4, 4, U), (0x20, 0, U)]), false),
            ("perm 8", raw(&[(1, 6, U), (4, 8, U), (0x20, 0, U)]), false),
            ("named uid -1", raw(&[(1, 6, U), (2, 4, U), (4, 4, U), (0x10, 4, U), (0x20, 0, U)]), false),
            ("no user_obj", raw(&[(4, 4, U), (0x20, 0, U)]), false),
            ("no group_obj", raw(&[(1, 6, U), (0x20, 0, U)]), false),
            ("no other", raw(&[(1, 6, U), (4, 4, U)]), false),
            ("named, no mask", raw(&[(1, 6, U), (2, 4, 10), (4, 4, U), (0x20, 0, U)]), false),
            ("two user_obj", raw(&[(1, 6, U), (1, 6, U), (4, 4, U), (0x20, 0, U)]), false),
            ("two masks", raw(&[(1, 6, U), (4, 4, U), (0x10, 4, U), (0x10, 4, U), (0x20, 0, U)]), false),
            ("tags unsorted", raw(&[(4, 4, U), (1, 6, U), (0x20, 0, U)]), false),
            ("other before mask", raw(&[(1, 6, U), (2, 4, 10), (4, 4, U), (0x20, 0, U), (0x10, 4, U)]), false),
            ("named ids unsorted", raw(&[(1, 6, U), (2, 4, 20), (2, 4, 10), (4, 4, U), (0x10, 4, U), (0x20, 0, U)]), true),
            ("named ids duplicate", raw(&[(1, 6, U), (2, 4, 10), (2, 2, 10), (4, 4, U), (0x10, 4, U), (0x20, 0, U)]), true),
            ("header only", raw(&[]), true),
        ];
        let mut report = Vec::new();
        for (i, (case, bytes, stricter)) in cases.iter().enumerate() {
            let file = File::create(dir.path().join(format!("k{i}"))).unwrap();
            let kernel =
                rustix::fs::fsetxattr(file.as_fd(), ACCESS_ACL_XATTR, bytes, XattrFlags::empty());
            let ours = Acl::decode(bytes);
            report.push(format!(
                "{case}: kernel {kernel:?}, decoder ok={}",
                ours.is_ok()
            ));
            if *stricter {
                assert!(ours.is_err(), "{case}: decoder should refuse");
                if kernel.is_ok() {
                    continue; // the documented difference
                }
            }
            assert_eq!(
                kernel.is_ok(),
                ours.is_ok(),
                "{case}: kernel {kernel:?}, decoder {ours:?}"
            );
            if kernel.is_ok() {
                // what the kernel stored reads back as what we decoded
                let stored = read_access_acl(file.as_fd()).unwrap();
                let ours = ours.unwrap();
                assert_eq!(stored.unwrap_or_else(|| ours.clone()), ours, "{case}");
            }
        }
        let mut err = io::stderr();
        let _ = writeln!(err, "kernel vs decoder:\n  {}", report.join("\n  "));
    }
}
