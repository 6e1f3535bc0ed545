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

use std::io;
use std::os::fd::BorrowedFd;

use rustix::fs::{Mode, XattrFlags};
use rustix::io::Errno;
use rustix::process::{Gid, Uid};

/// The xattr that holds a file's POSIX access ACL.
const ACCESS_ACL_XATTR: &str = "system.posix_acl_access";
/// `POSIX_ACL_XATTR_VERSION` in `include/uapi/linux/posix_acl_xattr.h`.
const XATTR_VERSION: u32 = 2;
/// `ACL_UNDEFINED_ID`: the id the kernel stores for entries that have none.
const UNDEFINED_ID: u32 = u32::MAX;
const HEADER_LEN: usize = 4;
const ENTRY_LEN: usize = 8;
/// r, w and x: the only permission bits an ACL entry may carry.
const RWX: u8 = 0o7;
const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;

/// The tag of an ACL entry, in the kernel's canonical order (the order of its bit values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tag {
    /// `ACL_USER_OBJ` (0x01): the file's owner.
    UserObj,
    /// `ACL_USER` (0x02): a named user.
    User,
    /// `ACL_GROUP_OBJ` (0x04): the file's group.
    GroupObj,
    /// `ACL_GROUP` (0x08): a named group.
    Group,
    /// `ACL_MASK` (0x10): upper bound for the group class (named users, group, named groups).
    Mask,
    /// `ACL_OTHER` (0x20): everyone else.
    Other,
}

impl Tag {
    /// The tag's value in the xattr format.
    pub fn to_raw(self) -> u16 {
        match self {
            Tag::UserObj => 0x01,
            Tag::User => 0x02,
            Tag::GroupObj => 0x04,
            Tag::Group => 0x08,
            Tag::Mask => 0x10,
            Tag::Other => 0x20,
        }
    }

    /// The tag for a value in the xattr format, if it is one.
    pub fn from_raw(raw: u16) -> Option<Tag> {
        Some(match raw {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    /// Whether entries with this tag name a user or group (and so carry an id).
    pub fn has_id(self) -> bool {
        matches!(self, Tag::User | Tag::Group)
    }

    /// Whether the mask limits entries with this tag (named users, the owning group, named groups).
    pub fn is_group_class(self) -> bool {
        matches!(self, Tag::User | Tag::GroupObj | Tag::Group)
    }
}

/// One ACL entry. `perm` holds r=4, w=2, x=1; `id` is `Some` exactly for [`Tag::User`] and
/// [`Tag::Group`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: Tag,
    pub id: Option<u32>,
    pub perm: u8,
}

impl AclEntry {
    fn sort_key(&self) -> (Tag, Option<u32>) {
        (self.tag, self.id)
    }
}

/// A valid POSIX access ACL: entries sorted by tag then id, one USER_OBJ, GROUP_OBJ and OTHER,
/// at most one MASK, and a MASK whenever there is a named user or group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<AclEntry>,
}

/// Why bytes or entries do not form a valid ACL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclInvalid {
    #[error("{len} bytes is shorter than the 4-byte header")]
    Truncated { len: usize },
    #[error("version {0} is not the POSIX ACL xattr version 2")]
    Version(u32),
    #[error("{len} bytes is not a 4-byte header followed by whole 8-byte entries")]
    Length { len: usize },
    #[error("the ACL has no entries (the kernel reads that as \"remove the ACL\")")]
    Empty,
    #[error("entry {index} has unknown tag {tag:#06x}")]
    UnknownTag { index: usize, tag: u16 },
    #[error("entry {index} ({tag:?}) has permission bits {perm:#o}; only r, w and x (0o7) exist")]
    Perm { index: usize, tag: Tag, perm: u16 },
    #[error("entry {index} ({tag:?}) needs a user or group id")]
    MissingId { index: usize, tag: Tag },
    #[error("entry {index} ({tag:?}) has id {id} but entries of that tag have none")]
    UnexpectedId { index: usize, tag: Tag, id: u32 },
    #[error("entry {index} ({tag:?}) has id {id:#x}, which is not a valid user or group id")]
    InvalidId { index: usize, tag: Tag, id: u32 },
    #[error("entry {index} ({tag:?}) is out of order; entries must be sorted by tag, then id")]
    Unsorted { index: usize, tag: Tag },
    #[error("entry {index} ({tag:?}) duplicates an earlier entry")]
    Duplicate { index: usize, tag: Tag },
    #[error("the required {0:?} entry is missing")]
    Missing(Tag),
    #[error("named user or group entries need a mask entry")]
    MaskRequired,
}

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

fn chmod_hint(errno: Errno, mode: u32) -> &'static str {
    if errno == Errno::PERM && mode & (S_ISUID | S_ISGID) != 0 {
        "the file carries a setuid/setgid bit; the packaged unit forbids setting those (RestrictSUIDSGID=yes: lift it with a drop-in), otherwise the service needs CAP_FOWNER or the file's group"
    } else if errno == Errno::PERM {
        "only the file's owner or a process with CAP_FOWNER may change its mode; grant CAP_FOWNER alongside CAP_CHOWN"
    } else {
        "see the error for the cause"
    }
}

fn io_err(errno: Errno) -> io::Error {
    io::Error::from(errno)
}

impl Acl {
    /// Decode a `system.posix_acl_access` value: a little-endian u32 version 2, then entries of
    /// {u16 tag, u16 perm, u32 id}.
    ///
    /// Validation follows the kernel's `posix_acl_from_xattr` and `posix_acl_valid`: known tags,
    /// perm within rwx, a valid id (not `0xFFFFFFFF`) for named entries, one USER_OBJ, GROUP_OBJ
    /// and OTHER, at most one MASK, a MASK when there are named entries, tags in order. Like the
    /// kernel, the id field of USER_OBJ, GROUP_OBJ, MASK and OTHER is ignored. Stricter than the
    /// kernel: named entries must be sorted by id without duplicates (the kernel's
    /// `posix_acl_valid` does not look at the order of ids, but `setfacl` and libacl always
    /// write them sorted), and a header with no entries is rejected (the kernel reads it as
    /// "remove the ACL"). Never panics, whatever the input.
    pub fn decode(bytes: &[u8]) -> Result<Acl, AclError> {
        decode_entries(bytes).map_err(|reason| AclError::Decode { reason })
    }

    /// Encode in the xattr format, ids of entries without one written as `0xFFFFFFFF`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN * self.entries.len());
        out.extend_from_slice(&XATTR_VERSION.to_le_bytes());
        for entry in &self.entries {
            out.extend_from_slice(&entry.tag.to_raw().to_le_bytes());
            out.extend_from_slice(&u16::from(entry.perm).to_le_bytes());
            out.extend_from_slice(&entry.id.unwrap_or(UNDEFINED_ID).to_le_bytes());
        }
        out
    }

    /// The minimal (three-entry) ACL equivalent to the permission bits of `mode`.
    pub fn from_mode(mode: u32) -> Acl {
        let perm = |shift: u32| ((mode >> shift) & 0o7) as u8;
        Acl {
            entries: vec![
                AclEntry {
                    tag: Tag::UserObj,
                    id: None,
                    perm: perm(6),
                },
                AclEntry {
                    tag: Tag::GroupObj,
                    id: None,
                    perm: perm(3),
                },
                AclEntry {
                    tag: Tag::Other,
                    id: None,
                    perm: perm(0),
                },
            ],
        }
    }

    /// Sort `entries` into canonical order and validate them like [`Acl::decode`] does.
    pub fn from_entries(mut entries: Vec<AclEntry>) -> Result<Acl, AclError> {
        entries.sort_by_key(AclEntry::sort_key);
        validate(&entries).map_err(|reason| AclError::Entries { reason })?;
        Ok(Acl { entries })
    }

    /// The entries, sorted by tag then id.
    pub fn entries(&self) -> &[AclEntry] {
        &self.entries
    }

    /// Whether this ACL says no more than the mode bits do (USER_OBJ, GROUP_OBJ, OTHER only).
    pub fn is_minimal(&self) -> bool {
        self.entries.len() == 3
    }

    fn perm_of(&self, tag: Tag) -> Option<u8> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    /// The MASK entry's permissions, if there is one.
    pub fn mask(&self) -> Option<u8> {
        self.perm_of(Tag::Mask)
    }

    /// Effective rights (r/w/x bits) of a user with `uid` in groups `gids` (its effective gid and
    /// supplementary groups) on a file owned by `owner_uid`/`owner_gid`, by the POSIX.1e
    /// access-check algorithm (owner → named user & mask → union of matching group entries &
    /// mask if any matched → other).
    ///
    /// A bit is in the result if requesting that bit alone would be granted. Linux grants a
    /// request for several bits through the group class only if one matching entry holds all of
    /// them; use [`Acl::permits`] for that exact check. Privilege (root, CAP_DAC_OVERRIDE) is not
    /// modelled.
    pub fn effective_rights(&self, owner_uid: u32, owner_gid: u32, uid: u32, gids: &[u32]) -> u8 {
        let mask = self.mask().unwrap_or(RWX);
        if uid == owner_uid {
            return self.perm_of(Tag::UserObj).unwrap_or(0);
        }
        if let Some(named) = self
            .entries
            .iter()
            .find(|e| e.tag == Tag::User && e.id == Some(uid))
        {
            return named.perm & mask;
        }
        let mut matched = false;
        let mut union = 0;
        for entry in &self.entries {
            let matches = match entry.tag {
                Tag::GroupObj => gids.contains(&owner_gid),
                Tag::Group => entry.id.is_some_and(|id| gids.contains(&id)),
                _ => false,
            };
            if matches {
                matched = true;
                union |= entry.perm;
            }
        }
        if matched {
            union & mask
        } else {
            self.perm_of(Tag::Other).unwrap_or(0)
        }
    }

    /// Whether a request for all bits in `want` (r=4, w=2, x=1) is granted, exactly as the
    /// kernel's `posix_acl_permission` decides it (without privilege).
    pub fn permits(
        &self,
        owner_uid: u32,
        owner_gid: u32,
        uid: u32,
        gids: &[u32],
        want: u8,
    ) -> bool {
        let want = want & RWX;
        let mask = self.mask().unwrap_or(RWX);
        let grants = |perm: u8| perm & want == want;
        if uid == owner_uid {
            return grants(self.perm_of(Tag::UserObj).unwrap_or(0));
        }
        if let Some(named) = self
            .entries
            .iter()
            .find(|e| e.tag == Tag::User && e.id == Some(uid))
        {
            return grants(named.perm & mask);
        }
        let mut found = false;
        for entry in &self.entries {
            let matches = match entry.tag {
                Tag::GroupObj => gids.contains(&owner_gid),
                Tag::Group => entry.id.is_some_and(|id| gids.contains(&id)),
                _ => false,
            };
            if matches {
                found = true;
                if grants(entry.perm) {
                    return grants(entry.perm & mask);
                }
            }
        }
        if found {
            return false;
        }
        grants(self.perm_of(Tag::Other).unwrap_or(0))
    }

    /// Mode permission bits (0o777) this ACL implies: user=USER_OBJ, group=MASK if present else
    /// GROUP_OBJ, other=OTHER.
    pub fn mode_bits(&self) -> u32 {
        let bits = |tag| u32::from(self.perm_of(tag).unwrap_or(0));
        let group = self.mask().map_or_else(|| bits(Tag::GroupObj), u32::from);
        (bits(Tag::UserObj) << 6) | (group << 3) | bits(Tag::Other)
    }
}

fn decode_entries(bytes: &[u8]) -> Result<Acl, AclInvalid> {
    let (header, body) = bytes
        .split_first_chunk::<HEADER_LEN>()
        .ok_or(AclInvalid::Truncated { len: bytes.len() })?;
    let version = u32::from_le_bytes(*header);
    if version != XATTR_VERSION {
        return Err(AclInvalid::Version(version));
    }
    if body.len() % ENTRY_LEN != 0 {
        return Err(AclInvalid::Length { len: bytes.len() });
    }
    let mut entries = Vec::with_capacity(body.len() / ENTRY_LEN);
    for (index, raw) in body.chunks_exact(ENTRY_LEN).enumerate() {
        let tag_raw = u16::from_le_bytes([raw[0], raw[1]]);
        let perm_raw = u16::from_le_bytes([raw[2], raw[3]]);
        let id_raw = u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]);
        let tag = Tag::from_raw(tag_raw).ok_or(AclInvalid::UnknownTag {
            index,
            tag: tag_raw,
        })?;
        let perm = u8::try_from(perm_raw)
            .ok()
            .filter(|p| p & !RWX == 0)
            .ok_or(AclInvalid::Perm {
                index,
                tag,
                perm: perm_raw,
            })?;
        // Like the kernel: the id of an entry that has none is ignored, not checked.
        let id = tag.has_id().then_some(id_raw);
        entries.push(AclEntry { tag, id, perm });
    }
    validate(&entries)?;
    Ok(Acl { entries })
}

/// The kernel's `posix_acl_valid` state machine, plus strictly increasing ids within named
/// users and named groups.
fn validate(entries: &[AclEntry]) -> Result<(), AclInvalid> {
    if entries.is_empty() {
        return Err(AclInvalid::Empty);
    }
    let mut prev: Option<&AclEntry> = None;
    let mut named = false;
    for (index, entry) in entries.iter().enumerate() {
        let tag = entry.tag;
        if entry.perm & !RWX != 0 {
            return Err(AclInvalid::Perm {
                index,
                tag,
                perm: u16::from(entry.perm),
            });
        }
        match (tag.has_id(), entry.id) {
            (true, None) => return Err(AclInvalid::MissingId { index, tag }),
            (true, Some(UNDEFINED_ID)) => {
                return Err(AclInvalid::InvalidId {
                    index,
                    tag,
                    id: UNDEFINED_ID,
                });
            }
            (false, Some(id)) => return Err(AclInvalid::UnexpectedId { index, tag, id }),
            _ => {}
        }
        if let Some(prev) = prev {
            match prev.sort_key().cmp(&entry.sort_key()) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Err(AclInvalid::Duplicate { index, tag }),
                std::cmp::Ordering::Greater => return Err(AclInvalid::Unsorted { index, tag }),
            }
        }
        named |= tag.has_id();
        prev = Some(entry);
    }
    let has = |tag| entries.iter().any(|e| e.tag == tag);
    for required in [Tag::UserObj, Tag::GroupObj, Tag::Other] {
        if !has(required) {
            return Err(AclInvalid::Missing(required));
        }
    }
    if named && !has(Tag::Mask) {
        return Err(AclInvalid::MaskRequired);
    }
    Ok(())
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
    use std::fs::{self, File, OpenOptions};
    use std::io::Write as _;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    use std::path::Path;
    use std::process::Command;
    use std::sync::OnceLock;

    const R: u8 = 4;
    const W: u8 = 2;
    const X: u8 = 1;

    fn e(tag: Tag, id: Option<u32>, perm: u8) -> AclEntry {
        AclEntry { tag, id, perm }
    }

    /// Raw xattr bytes: version 2, then (tag, perm, id) triples as given.
    fn raw(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        raw_with_version(2, entries)
    }

    fn raw_with_version(version: u32, entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut out = version.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&perm.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    const U: u32 = UNDEFINED_ID;

    fn extended() -> Acl {
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

    fn decode_reason(bytes: &[u8]) -> AclInvalid {
        match Acl::decode(bytes) {
            Err(AclError::Decode { reason }) => reason,
            other => panic!("expected a decode error, got {other:?}"),
        }
    }

    // ---------------------------------------------------------------- codec

    #[test]
    fn codec_round_trips_minimal_and_extended() {
        for acl in [Acl::from_mode(0o640), Acl::from_mode(0o7777), extended()] {
            let bytes = acl.encode();
            assert_eq!(Acl::decode(&bytes).unwrap(), acl);
            assert_eq!(Acl::decode(&bytes).unwrap().encode(), bytes);
        }
        let bytes = extended().encode();
        assert_eq!(
            bytes,
            raw(&[
                (0x01, 6, U),
                (0x02, 7, 1001),
                (0x04, 5, U),
                (0x08, 6, 2001),
                (0x10, 4, U),
                (0x20, 0, U)
            ])
        );
    }

    #[test]
    fn from_mode_mode_bits_and_minimality() {
        let acl = Acl::from_mode(0o100754);
        assert_eq!(
            acl.entries(),
            &[
                e(Tag::UserObj, None, 7),
                e(Tag::GroupObj, None, 5),
                e(Tag::Other, None, 4)
            ]
        );
        assert!(acl.is_minimal());
        assert_eq!(acl.mode_bits(), 0o754);
        let ext = extended();
        assert!(!ext.is_minimal());
        // group bits come from the mask, not GROUP_OBJ
        assert_eq!(ext.mode_bits(), 0o640);
        // a mask without named entries is valid and not minimal
        let masked =
            Acl::decode(&raw(&[(1, 6, U), (4, 6, U), (0x10, 4, U), (0x20, 4, U)])).unwrap();
        assert!(!masked.is_minimal());
        assert_eq!(masked.mode_bits(), 0o644);
    }

    #[test]
    fn from_entries_sorts_and_validates() {
        let acl = extended();
        let tags: Vec<Tag> = acl.entries().iter().map(|e| e.tag).collect();
        assert_eq!(
            tags,
            [
                Tag::UserObj,
                Tag::User,
                Tag::GroupObj,
                Tag::Group,
                Tag::Mask,
                Tag::Other
            ]
        );
        let reason = |entries: Vec<AclEntry>| match Acl::from_entries(entries) {
            Err(AclError::Entries { reason }) => reason,
            other => panic!("expected an entries error, got {other:?}"),
        };
        let base = || {
            vec![
                e(Tag::UserObj, None, 6),
                e(Tag::GroupObj, None, 4),
                e(Tag::Other, None, 0),
            ]
        };
        let mut v = base();
        v.push(e(Tag::User, None, 4));
        v.push(e(Tag::Mask, None, 4));
        assert!(matches!(
            reason(v),
            AclInvalid::MissingId { tag: Tag::User, .. }
        ));
        let mut v = base();
        v[0].id = Some(0);
        assert!(matches!(
            reason(v),
            AclInvalid::UnexpectedId {
                tag: Tag::UserObj,
                ..
            }
        ));
        let mut v = base();
        v[1].perm = 8;
        assert!(matches!(
            reason(v),
            AclInvalid::Perm {
                tag: Tag::GroupObj,
                ..
            }
        ));
        let mut v = base();
        v.push(e(Tag::Group, Some(3), 4));
        v.push(e(Tag::Group, Some(3), 2));
        v.push(e(Tag::Mask, None, 4));
        assert!(matches!(
            reason(v),
            AclInvalid::Duplicate {
                tag: Tag::Group,
                ..
            }
        ));
        assert_eq!(reason(vec![]), AclInvalid::Empty);
    }

    #[test]
    #[rustfmt::skip]
    fn decode_rejects_every_kernel_rule() {
        let ok = [(1, 6, U), (2, 4, 10), (4, 4, U), (8, 4, 20), (0x10, 4, U), (0x20, 0, U)];
        assert!(Acl::decode(&raw(&ok)).is_ok());
        // header
        assert_eq!(decode_reason(&[]), AclInvalid::Truncated { len: 0 });
        assert_eq!(decode_reason(&[2, 0, 0]), AclInvalid::Truncated { len: 3 });
        assert_eq!(decode_reason(&raw_with_version(1, &ok)), AclInvalid::Version(1));
        let mut long = raw(&ok);
        long.push(0);
        assert_eq!(decode_reason(&long), AclInvalid::Length { len: long.len() });
        assert_eq!(decode_reason(&raw(&[])), AclInvalid::Empty);
        // entries
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (0x40, 4, U), (0x20, 0, U)])),
            AclInvalid::UnknownTag { index: 1, tag: 0x40 }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (4, 8, U), (0x20, 0, U)])),
            AclInvalid::Perm { index: 1, perm: 8, .. }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 0x106, U), (4, 4, U), (0x20, 0, U)])),
            AclInvalid::Perm { index: 0, .. }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (2, 4, U), (4, 4, U), (0x10, 4, U), (0x20, 0, U)])),
            AclInvalid::InvalidId { tag: Tag::User, .. }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (4, 4, U), (8, 4, U), (0x10, 4, U), (0x20, 0, U)])),
            AclInvalid::InvalidId { tag: Tag::Group, .. }
        ));
        // required entries
        assert_eq!(decode_reason(&raw(&[(4, 4, U), (0x20, 0, U)])), AclInvalid::Missing(Tag::UserObj));
        assert_eq!(decode_reason(&raw(&[(1, 6, U), (0x20, 0, U)])), AclInvalid::Missing(Tag::GroupObj));
        assert_eq!(decode_reason(&raw(&[(1, 6, U), (4, 4, U)])), AclInvalid::Missing(Tag::Other));
        assert_eq!(
            decode_reason(&raw(&[(1, 6, U), (2, 4, 10), (4, 4, U), (0x20, 0, U)])),
            AclInvalid::MaskRequired
        );
        assert_eq!(
            decode_reason(&raw(&[(1, 6, U), (4, 4, U), (8, 4, 10), (0x20, 0, U)])),
            AclInvalid::MaskRequired
        );
        // order and duplicates
        assert!(matches!(
            decode_reason(&raw(&[(4, 4, U), (1, 6, U), (0x20, 0, U)])),
            AclInvalid::Unsorted { index: 1, .. }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (4, 4, U), (0x20, 0, U), (0x10, 4, U)])),
            AclInvalid::Unsorted { index: 3, .. }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (1, 6, U), (4, 4, U), (0x20, 0, U)])),
            AclInvalid::Duplicate { index: 1, .. }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (4, 4, U), (0x10, 4, U), (0x10, 4, U), (0x20, 0, U)])),
            AclInvalid::Duplicate { tag: Tag::Mask, .. }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (4, 4, U), (0x20, 0, U), (0x20, 0, U)])),
            AclInvalid::Duplicate { tag: Tag::Other, .. }
        ));
        // stricter than the kernel, see `decoder_agrees_with_the_kernel`
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (2, 4, 20), (2, 4, 10), (4, 4, U), (0x10, 4, U), (0x20, 0, U)])),
            AclInvalid::Unsorted { index: 2, .. }
        ));
        assert!(matches!(
            decode_reason(&raw(&[(1, 6, U), (2, 4, 10), (2, 2, 10), (4, 4, U), (0x10, 4, U), (0x20, 0, U)])),
            AclInvalid::Duplicate { index: 2, .. }
        ));
        // like the kernel, the id of an entry without one is ignored
        let odd_ids = Acl::decode(&raw(&[(1, 6, 0), (4, 4, 7), (0x20, 0, 9)])).unwrap();
        assert_eq!(odd_ids, Acl::from_mode(0o640));
    }

    /// xorshift64*: deterministic, good enough to throw bytes at the decoder.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn decode_never_panics_on_garbage_and_round_trips_what_it_accepts() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let tags = [1u16, 2, 4, 8, 0x10, 0x20, 0x40, 0];
        let ids = [U, 0, 10, 20, 1000];
        let mut accepted = 0;
        for round in 0..200_000 {
            let bytes: Vec<u8> = match round % 3 {
                // pure garbage
                0 => (0..rng.below(40)).map(|_| rng.next() as u8).collect(),
                // plausible entries in plausible order
                1 => {
                    let mut entries: Vec<(u16, u16, u32)> = (0..rng.below(8))
                        .map(|_| {
                            (
                                tags[rng.below(tags.len() as u64) as usize],
                                rng.below(9) as u16,
                                ids[rng.below(ids.len() as u64) as usize],
                            )
                        })
                        .collect();
                    if rng.below(2) == 0 {
                        entries.sort();
                    }
                    raw(&entries)
                }
                // a valid ACL with a byte flipped or cut short
                _ => {
                    let mut bytes = extended().encode();
                    let at = rng.below(bytes.len() as u64) as usize;
                    if rng.below(4) == 0 {
                        bytes.truncate(at);
                    } else {
                        bytes[at] ^= 1 << rng.below(8);
                    }
                    bytes
                }
            };
            if let Ok(acl) = Acl::decode(&bytes) {
                accepted += 1;
                let again = Acl::decode(&acl.encode()).unwrap();
                assert_eq!(again, acl, "decode→encode→decode changed {bytes:?}");
                assert!(Acl::from_entries(acl.entries().to_vec()).is_ok());
            }
        }
        assert!(
            accepted > 1000,
            "the generator must reach valid ACLs too ({accepted})"
        );
    }

    // ---------------------------------------------------------------- access checks

    #[test]
    fn effective_rights_follow_posix_1e() {
        let acl = extended(); // u::rw u:1001:rwx g::rx g:2001:rw m::r o::-
        let (ou, og) = (500, 600);
        assert_eq!(acl.effective_rights(ou, og, 500, &[]), R | W); // owner, not masked
        assert_eq!(acl.effective_rights(ou, og, 1001, &[600]), R); // named user & mask
        assert_eq!(acl.effective_rights(ou, og, 7, &[600]), R); // group & mask
        assert_eq!(acl.effective_rights(ou, og, 7, &[600, 2001]), R);
        assert_eq!(acl.effective_rights(ou, og, 7, &[8]), 0); // other
        let wide = Acl::from_entries(vec![
            e(Tag::UserObj, None, 0),
            e(Tag::GroupObj, None, R),
            e(Tag::Group, Some(2001), W),
            e(Tag::Mask, None, 7),
            e(Tag::Other, None, 7),
        ])
        .unwrap();
        // union over matching groups, and a matching group never falls through to other
        assert_eq!(wide.effective_rights(0, 600, 7, &[600, 2001]), R | W);
        assert_eq!(wide.effective_rights(0, 600, 7, &[2001]), W);
        assert_eq!(wide.effective_rights(0, 600, 7, &[]), 7);
        // the kernel wants one entry to hold every requested bit
        assert!(wide.permits(0, 600, 7, &[600, 2001], R));
        assert!(wide.permits(0, 600, 7, &[600, 2001], W));
        assert!(!wide.permits(0, 600, 7, &[600, 2001], R | W));
        assert!(!wide.permits(0, 600, 7, &[600], X));
        assert!(wide.permits(0, 600, 7, &[], R | W | X));
        assert!(!wide.permits(0, 600, 0, &[], R)); // owner with no rights
    }

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

    // ---------------------------------------------------------------- real files

    fn getfacl(path: &Path) -> Vec<String> {
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
    fn stat_line(path: &Path) -> String {
        let out = Command::new("stat")
            .args(["-c", "%u %g %a", "--"])
            .arg(path)
            .output()
            .expect("run stat");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn run(cmd: &str, args: &[&str]) {
        let out = Command::new(cmd).args(args).output().expect(cmd);
        assert!(
            out.status.success(),
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| (*l).to_owned()).collect()
    }

    /// A temp dir whose filesystem stores ACLs, or why not.
    fn acl_dir() -> Result<tempfile::TempDir, String> {
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

    fn require_root() -> Result<(), String> {
        if rustix::process::geteuid().is_root() {
            Ok(())
        } else {
            Err("needs root (CAP_CHOWN, and useradd for test users)".into())
        }
    }

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
