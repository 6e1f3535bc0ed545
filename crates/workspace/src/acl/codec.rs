//! The codec of the kernel's `system.posix_acl_access` xattr value and the POSIX.1e access
//! check. Pure: bytes and entries in, bytes, entries and rights out.
//!
//! It must never accept what the kernel would refuse, and never panic, whatever the input.

use super::AclError;

/// `POSIX_ACL_XATTR_VERSION` in `include/uapi/linux/posix_acl_xattr.h`.
pub(super) const XATTR_VERSION: u32 = 2;
/// `ACL_UNDEFINED_ID`: the id the kernel stores for entries that have none.
pub(super) const UNDEFINED_ID: u32 = u32::MAX;
pub(super) const HEADER_LEN: usize = 4;
pub(super) const ENTRY_LEN: usize = 8;
/// r, w and x: the only permission bits an ACL entry may carry.
pub(super) const RWX: u8 = 0o7;

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
    pub(super) fn sort_key(&self) -> (Tag, Option<u32>) {
        (self.tag, self.id)
    }
}

/// A valid POSIX access ACL: entries sorted by tag then id, one USER_OBJ, GROUP_OBJ and OTHER,
/// at most one MASK, and a MASK whenever there is a named user or group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub(super) entries: Vec<AclEntry>,
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

    pub(super) fn perm_of(&self, tag: Tag) -> Option<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::test_support::*;

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
}
