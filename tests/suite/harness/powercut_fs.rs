//! A test-only FUSE filesystem that can "cut the power": it keeps every written byte and every
//! directory change in memory, in a *live* layer that the processes see, and copies it into a
//! *durable* layer only when it is synced; a cut drops the live layer and brings the durable one
//! back, as LazyFS does for Jepsen. The power-cut suite (`suite::powercut`) runs workspaced's
//! state root and project folders, and the laptop executor's state dir and shared folder, on
//! it. A cut ([`PowercutFs::cut`]) fails every further request with EIO at once; the test then
//! kills the processes, and [`PowercutFs::restore_power`] unmounts, resets the live layer to the
//! durable one and mounts again.
//!
//! Why a real FUSE filesystem and not a mock of the product's file calls: the product's
//! durability depends on the exact system calls it makes (fsync of a staged file, rename,
//! fsync of the folder, SQLite's own WAL, `-shm` mmap and directory syncs), and on what the
//! kernel does with them. Only a filesystem under the kernel sees all of them, from every
//! library, as a disk would. A `kill -9` (the crash suite) keeps everything the kernel already
//! accepted; this keeps only what was synced.
//!
//! The model, per inode:
//! - `fsync(file)` makes its data, size, mode, owner, times and xattrs durable;
//!   `fdatasync(file)` its data and size only;
//! - `fsync(folder)` (FUSE's `fsyncdir`) makes the folder's entries durable (and, unless it is
//!   a data sync, its own metadata); an entry is durable only through a sync of the folder
//!   that holds it, so a rename or a new file without one is lost at a cut;
//! - an inode exists durably, empty, from its creation: a durable entry that points at a file
//!   whose data was never synced shows an empty file after a cut, the torn write the tests
//!   must never see;
//! - `syncfs(2)` and `sync(2)` make nothing durable here: Linux sends `FUSE_SYNCFS` only to
//!   virtiofs servers, not to a `/dev/fuse` one like this (and `fuser` has no handler for it),
//!   so the call succeeds without reaching the filesystem; the self-test shows it. The product
//!   calls neither. [`PowercutFs::sync_all`] is the test's own "everything durable", for set-up.
//!
//! What it leaves to the kernel, on purpose: byte-range and `flock` locks (the filesystem does
//! not ask for them at `INIT`, so the kernel keeps them locally, which is right for processes
//! on one machine), and permission checks: it is mounted without `default_permissions` and
//! checks nothing itself, since the suite runs every process as root; POSIX ACLs are stored as
//! the plain `system.posix_acl_access` xattr they are (no `FUSE_POSIX_ACL`), so they round-trip
//! byte for byte and are made durable with the rest of the inode's metadata. It mounts without
//! the writeback cache (every `write(2)` reaches it before the call returns), with zero entry
//! and attribute timeouts, and a cut remounts it, so no page or dentry cache outlives the power.
//! Shared writable mmap (SQLite's `-shm`) works through the page cache as on any FUSE
//! filesystem; its pages reach the filesystem as ordinary writes.

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation,
    INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, SessionACL, TimeOrNow, WriteFlags,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The kernel may cache nothing: entries and attributes are looked up again every time.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;

/// An inode's metadata: what `fsync` makes durable beside the data.
#[derive(Clone, Debug)]
struct Meta {
    perm: u16,
    uid: u32,
    gid: u32,
    rdev: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
}

/// A file's bytes in fixed chunks, each shared between the layers until one side writes to it
/// (copy on write): a sync copies a list of pointers, and a write after it copies only the
/// chunks it touches (SQLite's files grow to many megabytes over a long run). Bytes past `len`
/// in the last chunk are always zero, so growing a file shows zeros.
#[derive(Clone, Debug, Default)]
struct Data {
    len: usize,
    chunks: Vec<Arc<Vec<u8>>>,
}

const CHUNK: usize = 64 * 1024;

impl Data {
    fn from_bytes(bytes: &[u8]) -> Data {
        let mut data = Data::default();
        data.write(0, bytes);
        data
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Up to `size` bytes from `offset`.
    fn read(&self, offset: usize, size: usize) -> Vec<u8> {
        let end = offset.saturating_add(size).min(self.len);
        let mut out = Vec::with_capacity(end.saturating_sub(offset));
        let mut at = offset;
        while at < end {
            let (chunk, within) = (at / CHUNK, at % CHUNK);
            let take = (CHUNK - within).min(end - at);
            out.extend_from_slice(&self.chunks[chunk][within..within + take]);
            at += take;
        }
        out
    }

    fn write(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset + bytes.len();
        self.cover(end);
        let mut at = offset;
        while at < end {
            let (chunk, within) = (at / CHUNK, at % CHUNK);
            let take = (CHUNK - within).min(end - at);
            Arc::make_mut(&mut self.chunks[chunk])[within..within + take]
                .copy_from_slice(&bytes[at - offset..at - offset + take]);
            at += take;
        }
        self.len = self.len.max(end);
    }

    /// Enough (zeroed) chunks for `end` bytes.
    fn cover(&mut self, end: usize) {
        while self.chunks.len() * CHUNK < end {
            self.chunks.push(Arc::new(vec![0; CHUNK]));
        }
    }

    fn set_len(&mut self, len: usize) {
        if len < self.len {
            self.chunks.truncate(len.div_ceil(CHUNK));
            let within = len % CHUNK;
            if within != 0 {
                Arc::make_mut(&mut self.chunks[len / CHUNK])[within..].fill(0);
            }
        } else {
            self.cover(len);
        }
        self.len = len;
    }
}

/// One inode in one layer. The data, entries and xattrs are shared between the layers until
/// one side changes them (copy on write), so a sync is cheap.
#[derive(Clone, Debug)]
struct Node {
    kind: FileType,
    /// A file's content or a symlink's target.
    data: Data,
    /// A directory's entries.
    entries: Arc<BTreeMap<OsString, u64>>,
    xattrs: Arc<BTreeMap<OsString, Vec<u8>>>,
    meta: Meta,
    /// Names that point at it (live layer only; recounted after a cut).
    nlink: u32,
}

impl Node {
    fn new(kind: FileType, perm: u16, uid: u32, gid: u32, rdev: u32) -> Node {
        let now = SystemTime::now();
        Node {
            kind,
            data: Data::default(),
            entries: Arc::default(),
            xattrs: Arc::default(),
            meta: Meta {
                perm,
                uid,
                gid,
                rdev,
                atime: now,
                mtime: now,
                ctime: now,
            },
            nlink: 1,
        }
    }
}

/// What the filesystem counted since it was created (across cuts).
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncCounts {
    pub fsync: u64,
    pub fdatasync: u64,
    pub fsyncdir: u64,
    pub cuts: u64,
    /// Requests refused with EIO because the power was off.
    pub refused: u64,
}

/// Both layers and the power switch.
#[derive(Debug)]
struct Store {
    live: HashMap<u64, Node>,
    durable: HashMap<u64, Node>,
    next_ino: u64,
    powered: bool,
    counts: SyncCounts,
}

impl Store {
    fn new() -> Store {
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let mut root = Node::new(FileType::Directory, 0o755, uid, gid, 0);
        root.nlink = 2;
        let live = HashMap::from([(ROOT, root)]);
        Store {
            durable: live.clone(),
            live,
            next_ino: ROOT + 1,
            powered: true,
            counts: SyncCounts::default(),
        }
    }

    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.live.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.live.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn dir(&self, ino: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        let node = self.node(ino)?;
        if node.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok(&node.entries)
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        let node = self.node_mut(ino)?;
        if node.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let now = SystemTime::now();
        node.meta.mtime = now;
        node.meta.ctime = now;
        Ok(Arc::make_mut(&mut node.entries))
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir(parent)?.get(name).copied().ok_or(Errno::ENOENT)
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.node(ino)?;
        let (size, nlink) = match node.kind {
            FileType::Directory => {
                let subdirs = node
                    .entries
                    .values()
                    .filter(|c| {
                        self.live
                            .get(c)
                            .is_some_and(|n| n.kind == FileType::Directory)
                    })
                    .count();
                (4096, 2 + subdirs as u32)
            }
            _ => (node.data.len() as u64, node.nlink),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: node.meta.atime,
            mtime: node.meta.mtime,
            ctime: node.meta.ctime,
            crtime: UNIX_EPOCH,
            kind: node.kind,
            perm: node.meta.perm,
            nlink,
            uid: node.meta.uid,
            gid: node.meta.gid,
            rdev: node.meta.rdev,
            blksize: 4096,
            flags: 0,
        })
    }

    /// A new inode named `name` in `parent`. It exists durably (empty, with these attributes)
    /// from now on, but only a sync of `parent` makes its name durable.
    fn create(&mut self, parent: u64, name: &OsStr, node: Node) -> Result<u64, Errno> {
        if self.dir(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.durable.insert(ino, node.clone());
        self.live.insert(ino, node);
        self.dir_mut(parent)?.insert(name.to_owned(), ino);
        Ok(ino)
    }

    /// One name fewer for `ino` (the inode itself stays until the next cut collects it).
    fn drop_link(&mut self, ino: u64) {
        if let Some(node) = self.live.get_mut(&ino) {
            node.nlink = node.nlink.saturating_sub(1);
            node.meta.ctime = SystemTime::now();
        }
    }

    fn is_empty_dir(&self, ino: u64) -> bool {
        self.live
            .get(&ino)
            .is_some_and(|n| n.kind == FileType::Directory && n.entries.is_empty())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let source = self.child(parent, name)?;
        let target = self.dir(new_parent)?.get(new_name).copied();
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let target = target.ok_or(Errno::ENOENT)?;
            self.dir_mut(parent)?.insert(name.to_owned(), target);
            self.dir_mut(new_parent)?
                .insert(new_name.to_owned(), source);
            return Ok(());
        }
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return Err(Errno::EINVAL);
        }
        if let Some(target) = target {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if target == source {
                return Ok(());
            }
            let source_is_dir = self.node(source)?.kind == FileType::Directory;
            let target_is_dir = self.node(target)?.kind == FileType::Directory;
            match (source_is_dir, target_is_dir) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !self.is_empty_dir(target) => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
            self.drop_link(target);
        }
        self.dir_mut(parent)?.remove(name);
        self.dir_mut(new_parent)?
            .insert(new_name.to_owned(), source);
        self.node_mut(source)?.meta.ctime = SystemTime::now();
        Ok(())
    }

    fn fsync(&mut self, ino: u64, datasync: bool) -> Result<(), Errno> {
        let live = self.node(ino)?.clone();
        if datasync {
            self.counts.fdatasync += 1;
        } else {
            self.counts.fsync += 1;
        }
        let durable = self.durable.entry(ino).or_insert_with(|| live.clone());
        durable.data = live.data;
        if !datasync {
            durable.meta = live.meta;
            durable.xattrs = live.xattrs;
        }
        Ok(())
    }

    fn fsyncdir(&mut self, ino: u64, datasync: bool) -> Result<(), Errno> {
        let live = self.node(ino)?.clone();
        self.counts.fsyncdir += 1;
        let durable = self.durable.entry(ino).or_insert_with(|| live.clone());
        durable.entries = live.entries;
        if !datasync {
            durable.meta = live.meta;
            durable.xattrs = live.xattrs;
        }
        Ok(())
    }

    /// Everything live becomes durable (the test's own `sync`, for set-up).
    fn sync_all(&mut self) {
        self.durable = self.live.clone();
    }

    /// The power comes back: the live layer is what was durable, limited to what can be
    /// reached from the root, with its link counts recounted.
    fn restore_power(&mut self) {
        let mut reachable: HashMap<u64, Node> = HashMap::new();
        let mut links: HashMap<u64, u32> = HashMap::new();
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if reachable.contains_key(&ino) {
                continue;
            }
            let Some(node) = self.durable.get(&ino) else {
                continue;
            };
            for child in node.entries.values() {
                *links.entry(*child).or_default() += 1;
                stack.push(*child);
            }
            reachable.insert(ino, node.clone());
        }
        for (ino, node) in reachable.iter_mut() {
            node.nlink = links.get(ino).copied().unwrap_or(1);
        }
        self.durable = reachable.clone();
        self.live = reachable;
        self.powered = true;
    }
}

/// The filesystem the FUSE session serves: a handle on the shared [`Store`].
struct Served {
    store: Arc<Mutex<Store>>,
}

impl Served {
    /// The store, or EIO when the power is off (and the refusal counted).
    fn powered(&self) -> Result<MutexGuard<'_, Store>, Errno> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if !store.powered {
            store.counts.refused += 1;
            return Err(Errno::EIO);
        }
        Ok(store)
    }

    fn entry(&self, reply: ReplyEntry, f: impl FnOnce(&mut Store) -> Result<u64, Errno>) {
        let result = self.powered().and_then(|mut s| {
            let ino = f(&mut s)?;
            s.attr(ino)
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn empty(&self, reply: ReplyEmpty, f: impl FnOnce(&mut Store) -> Result<(), Errno>) {
        match self.powered().and_then(|mut s| f(&mut s)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn new_node(req: &Request, kind: FileType, mode: u32, rdev: u32) -> Node {
        Node::new(kind, (mode & 0o7777) as u16, req.uid(), req.gid(), rdev)
    }
}

fn kind_of(mode: u32) -> Result<FileType, Errno> {
    Ok(match mode & libc::S_IFMT {
        libc::S_IFREG => FileType::RegularFile,
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => return Err(Errno::EINVAL),
    })
}

fn time_of(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl fuser::Filesystem for Served {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(reply, |s| s.child(parent.0, name));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.powered().and_then(|s| s.attr(ino.0)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = self.powered().and_then(|mut s| {
            let node = s.node_mut(ino.0)?;
            if let Some(size) = size {
                if node.kind == FileType::Directory {
                    return Err(Errno::EISDIR);
                }
                let size = usize::try_from(size).map_err(|_| Errno::EFBIG)?;
                node.data.set_len(size);
                node.meta.mtime = SystemTime::now();
            }
            if let Some(mode) = mode {
                node.meta.perm = (mode & 0o7777) as u16;
            }
            if let Some(uid) = uid {
                node.meta.uid = uid;
            }
            if let Some(gid) = gid {
                node.meta.gid = gid;
            }
            if let Some(atime) = atime {
                node.meta.atime = time_of(atime);
            }
            if let Some(mtime) = mtime {
                node.meta.mtime = time_of(mtime);
            }
            node.meta.ctime = ctime.unwrap_or_else(SystemTime::now);
            s.attr(ino.0)
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let result = self.powered().and_then(|s| {
            let node = s.node(ino.0)?;
            if node.kind != FileType::Symlink {
                return Err(Errno::EINVAL);
            }
            Ok(node.data.read(0, node.data.len()))
        });
        match result {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.entry(reply, |s| {
            let kind = kind_of(mode)?;
            if kind == FileType::Directory || kind == FileType::Symlink {
                return Err(Errno::EINVAL);
            }
            s.create(parent.0, name, Served::new_node(req, kind, mode, rdev))
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(reply, |s| {
            let mut node = Served::new_node(req, FileType::Directory, mode, 0);
            node.nlink = 2;
            s.create(parent.0, name, node)
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |s| {
            let ino = s.child(parent.0, name)?;
            if s.node(ino)?.kind == FileType::Directory {
                return Err(Errno::EISDIR);
            }
            s.dir_mut(parent.0)?.remove(name);
            s.drop_link(ino);
            Ok(())
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |s| {
            let ino = s.child(parent.0, name)?;
            if s.node(ino)?.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            if !s.is_empty_dir(ino) {
                return Err(Errno::ENOTEMPTY);
            }
            s.dir_mut(parent.0)?.remove(name);
            s.drop_link(ino);
            Ok(())
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.entry(reply, |s| {
            let mut node = Served::new_node(req, FileType::Symlink, 0o777, 0);
            node.data = Data::from_bytes(target.as_os_str().as_bytes());
            s.create(parent.0, link_name, node)
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |s| {
            s.rename(parent.0, name, newparent.0, newname, flags)
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(reply, |s| {
            if s.node(ino.0)?.kind == FileType::Directory {
                return Err(Errno::EPERM);
            }
            if s.dir(newparent.0)?.contains_key(newname) {
                return Err(Errno::EEXIST);
            }
            s.dir_mut(newparent.0)?.insert(newname.to_owned(), ino.0);
            let node = s.node_mut(ino.0)?;
            node.nlink += 1;
            node.meta.ctime = SystemTime::now();
            Ok(ino.0)
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // O_TRUNC reaches us as a setattr of the size (no FUSE_ATOMIC_O_TRUNC).
        match self.powered().and_then(|s| s.node(ino.0).map(|_| ())) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let result = self.powered().and_then(|s| {
            let offset = usize::try_from(offset).unwrap_or(usize::MAX);
            Ok(s.node(ino.0)?.data.read(offset, size as usize))
        });
        match result {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = self.powered().and_then(|mut s| {
            let node = s.node_mut(ino.0)?;
            if node.kind != FileType::RegularFile {
                return Err(Errno::EINVAL);
            }
            let offset = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
            node.data.write(offset, data);
            let now = SystemTime::now();
            node.meta.mtime = now;
            node.meta.ctime = now;
            Ok(data.len() as u32)
        });
        match result {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Closing a file makes nothing durable (as on a disk).
        self.empty(reply, |_| Ok(()));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |s| s.fsync(ino.0, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.powered().and_then(|s| s.dir(ino.0).map(|_| ())) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.powered().and_then(|s| {
            let mut listing = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (ino.0, FileType::Directory, OsString::from("..")),
            ];
            for (name, child) in s.dir(ino.0)?.iter() {
                let kind = s.node(*child)?.kind;
                listing.push((*child, kind, name.clone()));
            }
            Ok(listing)
        });
        match result {
            Ok(listing) => {
                for (i, (child, kind, name)) in
                    listing.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |s| s.fsyncdir(ino.0, datasync));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.powered() {
            Ok(s) => {
                let files = s.live.len() as u64;
                reply.statfs(
                    1 << 20,
                    1 << 19,
                    1 << 19,
                    files + (1 << 20),
                    1 << 20,
                    4096,
                    255,
                    4096,
                );
            }
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |s| {
            let node = s.node_mut(ino.0)?;
            let exists = node.xattrs.contains_key(name);
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(Errno::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(Errno::ENODATA);
            }
            Arc::make_mut(&mut node.xattrs).insert(name.to_owned(), value.to_vec());
            node.meta.ctime = SystemTime::now();
            Ok(())
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let result = self.powered().and_then(|s| {
            s.node(ino.0)?
                .xattrs
                .get(name)
                .cloned()
                .ok_or(Errno::ENODATA)
        });
        match result {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(value) => reply.data(&value),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let result = self.powered().and_then(|s| {
            let mut names = Vec::new();
            for name in s.node(ino.0)?.xattrs.keys() {
                names.extend_from_slice(name.as_bytes());
                names.push(0);
            }
            Ok(names)
        });
        match result {
            Ok(names) if size == 0 => reply.size(names.len() as u32),
            Ok(names) if names.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(names) => reply.data(&names),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |s| {
            let node = s.node_mut(ino.0)?;
            if Arc::make_mut(&mut node.xattrs).remove(name).is_none() {
                return Err(Errno::ENODATA);
            }
            node.meta.ctime = SystemTime::now();
            Ok(())
        });
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // No permission checks (see the module doc): the node only has to exist.
        self.empty(reply, |s| s.node(ino.0).map(|_| ()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.powered().and_then(|mut s| {
            let ino = match s.dir(parent.0)?.get(name).copied() {
                Some(_) if flags & libc::O_EXCL != 0 => return Err(Errno::EEXIST),
                Some(existing) => {
                    if flags & libc::O_TRUNC != 0 {
                        let node = s.node_mut(existing)?;
                        node.data = Data::default();
                        node.meta.mtime = SystemTime::now();
                    }
                    existing
                }
                None => s.create(
                    parent.0,
                    name,
                    Served::new_node(req, FileType::RegularFile, mode, 0),
                )?,
            };
            s.attr(ino)
        });
        match result {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |s| {
            if mode != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            let end = usize::try_from(offset.saturating_add(length)).map_err(|_| Errno::EFBIG)?;
            let node = s.node_mut(ino.0)?;
            if node.data.len() < end {
                node.data.set_len(end);
            }
            Ok(())
        });
    }
}

/// Why the filesystem could not be mounted or unmounted.
#[derive(Debug)]
pub enum PowercutError {
    /// `/dev/fuse` is not there: no FUSE on this machine (or not in this container).
    NoFuseDevice,
    Mount {
        mountpoint: PathBuf,
        source: std::io::Error,
    },
    Unmount {
        mountpoint: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for PowercutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PowercutError::NoFuseDevice => write!(
                f,
                "/dev/fuse is missing: the power-cut tests need FUSE (load the `fuse` kernel \
                 module; in a container, pass the device with --device /dev/fuse)"
            ),
            PowercutError::Mount { mountpoint, source } => write!(
                f,
                "mounting the power-cut FUSE filesystem on {}: {source} (this needs root or \
                 fusermount3, and /dev/fuse)",
                mountpoint.display()
            ),
            PowercutError::Unmount { mountpoint, source } => {
                write!(f, "unmounting {}: {source}", mountpoint.display())
            }
        }
    }
}

impl std::error::Error for PowercutError {}

/// The power-cut filesystem mounted on a folder. Dropping it unmounts it.
pub struct PowercutFs {
    store: Arc<Mutex<Store>>,
    mountpoint: PathBuf,
    session: Option<BackgroundSession>,
}

impl PowercutFs {
    /// An empty filesystem mounted on `mountpoint` (an existing, empty folder).
    pub fn mount(mountpoint: &Path) -> Result<PowercutFs, PowercutError> {
        if !Path::new("/dev/fuse").exists() {
            return Err(PowercutError::NoFuseDevice);
        }
        let mut fs = PowercutFs {
            store: Arc::new(Mutex::new(Store::new())),
            mountpoint: mountpoint.to_owned(),
            session: None,
        };
        fs.session = Some(fs.start_session()?);
        Ok(fs)
    }

    fn start_session(&self) -> Result<BackgroundSession, PowercutError> {
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("powercut".into()),
            MountOption::Subtype("powercut".into()),
            MountOption::RW,
        ];
        // Processes of other users (a daemon under setpriv) may use it too.
        config.acl = SessionACL::All;
        let served = Served {
            store: self.store.clone(),
        };
        fuser::spawn_mount(served, &self.mountpoint, &config).map_err(|source| {
            PowercutError::Mount {
                mountpoint: self.mountpoint.clone(),
                source,
            }
        })
    }

    /// Cut the power: from now on every request fails with EIO, and nothing more becomes
    /// durable. Kill the processes using the filesystem, then [`PowercutFs::restore_power`].
    pub fn cut(&self) {
        let mut store = self.lock();
        store.powered = false;
        store.counts.cuts += 1;
    }

    /// Unmount (so that no kernel cache survives), drop everything that was not durable, and
    /// mount again. Every process that used the filesystem must be gone or going (a process
    /// still exiting keeps it busy for a moment: the unmount waits up to 20 s for it).
    pub fn restore_power(&mut self) -> Result<(), PowercutError> {
        self.unmount(Duration::from_secs(20))?;
        self.lock().restore_power();
        self.session = Some(self.start_session()?);
        Ok(())
    }

    /// Unmount, retrying while the mount is busy for up to `patience`, then wait for the
    /// session thread to end (it ends when the kernel closes the connection).
    fn unmount(&mut self, patience: Duration) -> Result<(), PowercutError> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_bytes())
            .expect("a mount point has no NUL");
        let deadline = std::time::Instant::now() + patience;
        loop {
            // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
            if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
                break;
            }
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EBUSY) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            // Put the session back so that Drop can still detach the mount.
            self.session = Some(session);
            return Err(PowercutError::Unmount {
                mountpoint: self.mountpoint.clone(),
                source: error,
            });
        }
        match session.join() {
            // The kernel ends the session with ENODEV, or ECONNABORTED when it aborted the
            // connection at the unmount (requests were still queued): both mean it is over.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::ENODEV)) => Ok(()),
            other => other.map_err(|source| PowercutError::Unmount {
                mountpoint: self.mountpoint.clone(),
                source,
            }),
        }
    }

    /// Make everything durable now (the test's set-up; see the module doc on `sync(2)`).
    pub fn sync_all(&self) {
        self.lock().sync_all();
    }

    pub fn counts(&self) -> SyncCounts {
        self.lock().counts
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for PowercutFs {
    fn drop(&mut self) {
        if let Err(e) = self.unmount(Duration::from_secs(5)) {
            eprintln!("powercut fs: {e}; detaching it");
            let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_bytes())
                .expect("a mount point has no NUL");
            // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
