//! POSIX access ACLs and ownership carry-over for atomic replacement, on file descriptors only.
//!
//! This module owns two things:
//!
//! - the codec of the kernel's `system.posix_acl_access` xattr value ([`Acl::decode`],
//!   [`Acl::encode`]), which validates exactly as strictly as the kernel does (and a little more:
//!   see [`Acl::decode`]), plus the POSIX.1e access check ([`Acl::effective_rights`],
//!   [`Acl::permits`]) used to reason about who can do what;
//! - [`carry_over`]: giving a staged replacement file the original's owner, group, access ACL and
//!   mode before workspaced renames it over the original, and [`rootless_acl`], the ACL a
//!   replacement gets when the service cannot give the file back to its former owner.
//!
//! What it must never do:
//!
//! - **Never touch a path.** Every metadata and ACL call acts on a file descriptor the caller
//!   opened (`fstat`, `fchown`, `fchmod`, `fgetxattr`, `fsetxattr`, `fremovexattr`), so a
//!   concurrent rename or symlink swap in the documents tree cannot redirect it.
//! - **Never widen anyone's effective access.** The only identity whose rights may change is the
//!   service itself, which becomes the owner of a rootless replacement and gets the former
//!   owner's rights. Masked permissions are normalised before the mask is enlarged, so no ACL
//!   entry gains a bit it could not use before.
//! - **Never degrade silently.** If the group or the ACL cannot be kept, or the result read back
//!   from the kernel is not exactly what was intended, [`carry_over`] returns an error and the
//!   caller must refuse the replacement before the rename.
//!
//! The calls block on the filesystem; async callers run them on `spawn_blocking`.
//!
//! Layout: `codec.rs` is the xattr value's codec and the access check (pure),
//! `xattr.rs` reads, writes and removes the xattr on an fd, `carry.rs` is the carry-over onto a
//! replacement; [`AclError`], shared by all three, is here.

mod carry;
mod codec;
#[cfg(test)]
mod test_support;
mod xattr;

pub use carry::{CarryOver, FileOwnership, carry_over, read_ownership, rootless_acl};
pub use codec::{Acl, AclEntry, AclInvalid, Tag};
pub use xattr::{read_access_acl, remove_access_acl, write_access_acl};

use rustix::io::Errno;
use std::io;

/// What went wrong, one variant per failed operation. Messages say what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    /// The bytes of a `system.posix_acl_access` value are not a valid ACL.
    #[error(
        "the access ACL xattr is malformed: {reason}; rewrite the file's ACL with setfacl (or remove it with setfacl -b)"
    )]
    Decode { reason: AclInvalid },
    /// [`Acl::from_entries`] was given entries that do not form a valid ACL.
    #[error("these ACL entries do not form a valid access ACL: {reason}")]
    Entries { reason: AclInvalid },
    /// `fstat` failed.
    #[error("could not fstat the file: {source}")]
    Stat { source: io::Error },
    /// `fgetxattr(system.posix_acl_access)` failed for a reason other than "no ACL".
    #[error("could not read the file's access ACL: {source}; {hint}")]
    ReadAcl {
        source: io::Error,
        hint: &'static str,
    },
    /// `fsetxattr(system.posix_acl_access)` failed.
    #[error("could not write the file's access ACL: {source}; {hint}")]
    WriteAcl {
        source: io::Error,
        hint: &'static str,
    },
    /// `fremovexattr(system.posix_acl_access)` failed for a reason other than "no ACL".
    #[error("could not remove the file's access ACL: {source}; {hint}")]
    RemoveAcl {
        source: io::Error,
        hint: &'static str,
    },
    /// `fchown` to the original owner and group failed for a reason other than missing privilege.
    #[error("could not give the staged file owner {uid} and group {gid}: {source}")]
    Chown {
        uid: u32,
        gid: u32,
        source: io::Error,
    },
    /// The staged file cannot get the original's group, so the replacement is refused.
    #[error(
        "workspaced is not a member of group {gid} that owns the file; add it to the group or grant CAP_CHOWN ({source})"
    )]
    GroupNotKept { gid: u32, source: io::Error },
    /// The staged file cannot get the original's access ACL (or lose an inherited one), so the
    /// replacement is refused.
    #[error("could not give the staged file the original's access ACL: {source}; {hint}")]
    AclNotKept {
        source: io::Error,
        hint: &'static str,
    },
    /// `fchmod` failed.
    #[error("could not set mode {mode:#o} on the staged file: {source}; {hint}")]
    Chmod {
        mode: u32,
        source: io::Error,
        hint: &'static str,
    },
    /// The metadata read back from the staged file is not what was intended.
    #[error(
        "the staged file's metadata is not what was intended ({what}); the replacement is refused, check the filesystem's ACL support and the service's privileges"
    )]
    VerifyFailed { what: String },
}

pub(super) fn io_err(errno: Errno) -> io::Error {
    io::Error::from(errno)
}
