//! The rule planning: which paths a command's Landlock ruleset grants, with which rights.
//!
//! Owns: resolving a [`SandboxPolicy`] into rules ([`plan_rules`]): the system paths and
//! devices, the toolchains, the granted roots (pinned descriptors checked against the directory
//! the caller pinned), and the exclusion walk described in the crate's module doc.
//! Must never: apply anything (the launcher does), follow a symlink when granting, grant `/`
//! or a terminal device (but the command's private ones, once the launcher made them), or skip
//! a granted folder it cannot open.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use landlock::{ABI, Access, AccessFs, BitFlags};
use rustix::fs::{FileType, Mode, OFlags};

use crate::resolve::resolve_lenient;
use crate::{PinnedAccess, PinnedGrant, SandboxError, SandboxPolicy};

/// System paths every command may read and execute (missing ones are skipped).
const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    // Configuration: resolver, certificates, passwd/group, alternatives. Secret files in /etc
    // are root-only by permission, and the caller runs as the person (or a daemon's user).
    "/etc",
    "/opt",
    "/nix",
    // Many tools need /proc (self/exe, cpuinfo, meminfo); see the module doc for what it shows.
    "/proc",
    "/sys",
    // Where /etc/resolv.conf points on systemd-resolved machines.
    "/run/systemd/resolve",
];

/// Device files commands may read and write: the null and random devices, and never a
/// terminal (`/dev/tty`, `/dev/ptmx`, `/dev/pts/*`, `/dev/console`): a command that could open
/// one could type into the person's shell with `TIOCSTI` or read and draw on their terminals.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// The terminal devices a command with private terminals gets (`terminals.rs`), granted only
/// once the launcher has put a devpts instance of the command's own on `/dev/pts` and
/// `/dev/ptmx`: the rules then hold that instance's inodes, never the machine's (another
/// instance's `/dev/pts/N` is not beneath them, whatever path reaches it). `/dev/tty` opens only
/// the caller's controlling terminal, and the command's session has none but a PTY it made.
const PRIVATE_TERMINALS: &[&str] = &["/dev/ptmx", "/dev/pts", "/dev/tty"];

/// Whether an excluded path loses all access or only write access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exclusion {
    NoAccess,
    ReadOnly,
}

/// One Landlock rule: an `O_PATH` descriptor opened without following symlinks, and its rights.
#[derive(Debug)]
pub(crate) struct PlannedRule {
    pub(crate) path: PathBuf,
    pub(crate) fd: OwnedFd,
    pub(crate) access: BitFlags<AccessFs>,
}

pub(crate) struct Plan {
    pub(crate) abi: ABI,
    pub(crate) handled: BitFlags<AccessFs>,
    read: BitFlags<AccessFs>,
    file: BitFlags<AccessFs>,
    exclusions: Vec<(PathBuf, Exclusion)>,
    /// Exclusions a mount covers already (`overmount.rs`): never granted when a walk meets them,
    /// but no reason to walk the folders above them.
    covered: Vec<PathBuf>,
    pub(crate) rules: Vec<PlannedRule>,
}

/// Resolves the policy into Landlock rules (the exclusion walk happens here). `covered` are the
/// exclusions a mount covers already: a folder above one of them is granted whole.
///
/// The order matters: every exclusion is known before the first grant, since a grant is cut
/// down by the exclusions present when it is made.
pub(crate) fn plan_rules(
    policy: &SandboxPolicy,
    abi_version: i32,
    covered: &[PathBuf],
) -> Result<Plan, SandboxError> {
    let mut plan = Plan::new(ABI::from(abi_version));
    plan.covered = covered.to_vec();

    let roots = collect_roots(policy)?;
    let scratch = resolve_existing(&policy.scratch, "scratch dir")?;
    refuse_whole_filesystem(&roots, &scratch)?;

    plan.exclude_policy_paths(policy, &roots)?;

    plan.grant_system(&policy.read_only_if_present)?;
    plan.grant_roots(roots)?;
    // The private scratch dir lies in the CLI's (denied) state dir: it is granted as itself,
    // past the exclusions.
    plan.grant_scratch(&scratch)?;
    Ok(plan)
}

/// The roots: pinned directories (their descriptors checked) and path grants (resolved now).
fn collect_roots(policy: &SandboxPolicy) -> Result<Vec<Root>, SandboxError> {
    let mut roots: Vec<Root> = Vec::new();
    for pinned in &policy.pinned {
        check_absolute(&pinned.path)?;
        roots.push(Root {
            path: pinned.path.clone(),
            writable: pinned.access == PinnedAccess::ReadWrite,
            fd: Some(open_pinned(pinned)?),
        });
    }
    for (paths, writable, what) in [
        (&policy.read_write, true, "writable folder"),
        (&policy.read_only, false, "read-only path"),
    ] {
        for path in paths {
            roots.push(Root {
                path: resolve_existing(path, what)?,
                writable,
                fd: None,
            });
        }
    }
    Ok(roots)
}

/// No root, nor the scratch dir, may be `/`.
fn refuse_whole_filesystem(roots: &[Root], scratch: &Path) -> Result<(), SandboxError> {
    for path in roots.iter().map(|r| r.path.as_path()).chain([scratch]) {
        if path == Path::new("/") {
            return Err(SandboxError::Policy(
                "refusing to grant the whole filesystem".to_owned(),
            ));
        }
    }
    Ok(())
}

/// One granted root, before the exclusion walk.
struct Root {
    path: PathBuf,
    writable: bool,
    /// The pinned descriptor, for a pinned root; path roots are opened during the walk.
    fd: Option<OwnedFd>,
}

/// Where [`Plan::grant_resolved`] gets the descriptor of the path it grants.
enum Source<'a> {
    /// Open the (resolved) path itself, without following a symlink.
    Path,
    /// A root pinned at connect: its descriptor, never its path.
    Pinned(&'a OwnedFd),
    /// An entry of a directory being walked: its name in that directory.
    Entry(&'a OwnedFd, &'a OsStr),
}

/// Takes over a pinned descriptor the launcher inherited, after checking it still is the
/// directory the caller pinned (same device and inode, a directory). The launcher owns it from
/// here (it marked every inherited descriptor close-on-exec at start, so the command never has
/// it).
fn open_pinned(pinned: &PinnedGrant) -> Result<OwnedFd, SandboxError> {
    let refuse = |reason: String| SandboxError::Pinned {
        fd: pinned.fd,
        path: pinned.path.clone(),
        reason,
    };
    if pinned.fd < 3 {
        return Err(refuse("not a pinned descriptor number".to_owned()));
    }
    // SAFETY: the number was passed by the caller, which keeps that descriptor open for its
    // life and let this process inherit it (inherit_pinned); nothing else in the launcher owns
    // or closes it, so borrowing it for the duplication below is sound. An unexpected number is
    // caught by the checks that follow (fstat fails, or it is not the recorded directory).
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(pinned.fd) };
    let fd = rustix::io::fcntl_dupfd_cloexec(borrowed, 3)
        .map_err(|e| refuse(format!("not open: {e}")))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| refuse(format!("fstat failed: {e}")))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Err(refuse("not a directory".to_owned()));
    }
    // st_dev and st_ino are unsigned on Linux; the casts only widen.
    #[allow(clippy::unnecessary_cast)]
    let (dev, ino) = (stat.st_dev as u64, stat.st_ino as u64);
    if (dev, ino) != (pinned.dev, pinned.ino) {
        return Err(refuse(format!(
            "device/inode {dev}/{ino}, pinned {}/{}",
            pinned.dev, pinned.ino
        )));
    }
    Ok(fd)
}

impl Plan {
    /// A plan handling every right `abi` knows, with no exclusion and no rule yet.
    fn new(abi: ABI) -> Plan {
        Plan {
            abi,
            handled: AccessFs::from_all(abi),
            read: AccessFs::from_read(abi),
            file: AccessFs::from_file(abi),
            exclusions: Vec::new(),
            covered: Vec::new(),
            rules: Vec::new(),
        }
    }

    /// The policy's exclusions, and a read-only root nested in a writable one.
    ///
    /// Exclusions are matched by path. Both the path as given (the laptop's are canonical
    /// from connect) and its resolution now are excluded: a component turned into a symlink
    /// since can only add an exclusion, never drop one.
    fn exclude_policy_paths(
        &mut self,
        policy: &SandboxPolicy,
        roots: &[Root],
    ) -> Result<(), SandboxError> {
        for path in policy.blocked.iter().chain(&policy.denied) {
            self.exclude(path, Exclusion::NoAccess)?;
        }
        for path in &policy.read_only_within {
            self.exclude(path, Exclusion::ReadOnly)?;
        }
        // A read-only root nested in a writable one (a project inside a shared Downloads) stays
        // read-only.
        let nested_read_only: Vec<PathBuf> = roots
            .iter()
            .filter(|r| !r.writable)
            .filter(|r| {
                roots
                    .iter()
                    .any(|w| w.writable && r.path != w.path && r.path.starts_with(&w.path))
            })
            .map(|r| r.path.clone())
            .collect();
        for path in nested_read_only {
            self.exclusions.push((path, Exclusion::ReadOnly));
        }
        Ok(())
    }

    /// The system paths (read), the devices (read/write, never a terminal) and the policy's
    /// `read_only_if_present` paths (read); missing ones are skipped.
    fn grant_system(&mut self, if_present: &[PathBuf]) -> Result<(), SandboxError> {
        let read = self.read;
        for path in SYSTEM_READ {
            self.grant_optional(Path::new(path), read)?;
        }
        let device = self.device_access();
        for path in DEVICES {
            self.grant_optional(Path::new(path), device)?;
        }
        for path in if_present {
            check_absolute(path)?;
            self.grant_optional(path, read)?;
        }
        Ok(())
    }

    /// What a device gets: read, write, truncate (`> /dev/null` opens with `O_TRUNC`), its
    /// ioctls (ABI 5+), and listing where it is a directory (`/dev/pts`).
    fn device_access(&self) -> BitFlags<AccessFs> {
        (AccessFs::ReadFile
            | AccessFs::WriteFile
            | AccessFs::Truncate
            | AccessFs::IoctlDev
            | AccessFs::ReadDir)
            & self.handled
    }

    /// The command's private terminals ([`PRIVATE_TERMINALS`]), as devices. Only for a
    /// launcher that made them (`terminals.rs`): on the machine's devpts this would open every
    /// terminal of the user.
    pub(crate) fn grant_private_terminals(&mut self) -> Result<(), SandboxError> {
        let device = self.device_access();
        for path in PRIVATE_TERMINALS {
            self.grant_optional(Path::new(path), device)?;
        }
        Ok(())
    }

    /// Every root: all handled rights when writable, read otherwise; a pinned root through its
    /// descriptor, never its path.
    fn grant_roots(&mut self, roots: Vec<Root>) -> Result<(), SandboxError> {
        let all = self.handled;
        let read = self.read;
        for root in roots {
            let access = if root.writable { all } else { read };
            let source = match &root.fd {
                Some(fd) => Source::Pinned(fd),
                None => Source::Path,
            };
            self.grant_resolved(source, &root.path, access)?;
        }
        Ok(())
    }

    /// A system or toolchain path: skipped when missing, an error when it exists but cannot be
    /// opened.
    fn grant_optional(
        &mut self,
        path: &Path,
        access: BitFlags<AccessFs>,
    ) -> Result<(), SandboxError> {
        match std::fs::canonicalize(path) {
            Ok(resolved) => self.grant_resolved(Source::Path, &resolved, access),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SandboxError::GrantPath {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Adds `path` (absolute) as an exclusion, and its resolution now if that differs.
    fn exclude(&mut self, path: &Path, kind: Exclusion) -> Result<(), SandboxError> {
        check_absolute(path)?;
        let resolved = resolve_lenient(path)?;
        if resolved != path {
            self.exclusions.push((resolved, kind));
        }
        self.exclusions.push((path.to_owned(), kind));
        Ok(())
    }

    /// The private scratch dir: read/write, no exclusion applies.
    fn grant_scratch(&mut self, scratch: &Path) -> Result<(), SandboxError> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd =
            rustix::fs::open(scratch, flags, Mode::empty()).map_err(|e| grant_error(scratch, e))?;
        self.push(scratch, fd, self.handled);
        Ok(())
    }

    /// Grants `access` on `path` (already resolved), minus the exclusions: an excluded path is
    /// skipped or downgraded; a directory with exclusions beneath it is replaced by its entries.
    /// `source` says where its descriptor comes from.
    fn grant_resolved(
        &mut self,
        source: Source<'_>,
        path: &Path,
        access: BitFlags<AccessFs>,
    ) -> Result<(), SandboxError> {
        let Some(access) = self.access_after_exclusions(path, access) else {
            return Ok(());
        };
        let Some(fd) = open_source(&source, path)? else {
            return Ok(());
        };
        let kind = rustix::fs::fstat(&fd)
            .map(|st| FileType::from_raw_mode(st.st_mode))
            .map_err(|e| grant_error(path, e))?;
        match kind {
            // Never follow a symlink when granting: its target is governed by its own rules.
            FileType::Symlink => Ok(()),
            FileType::Directory => self.grant_directory(fd, path, access),
            _ => {
                self.push(path, fd, access & self.file);
                Ok(())
            }
        }
    }

    /// `access` on `path` as the exclusions leave it: `None` under a no-access exclusion, only
    /// the read rights under a read-only one.
    fn access_after_exclusions(
        &self,
        path: &Path,
        access: BitFlags<AccessFs>,
    ) -> Option<BitFlags<AccessFs>> {
        if self
            .exclusions
            .iter()
            .any(|(e, kind)| *kind == Exclusion::NoAccess && path.starts_with(e))
        {
            return None;
        }
        let mut access = access;
        if self
            .exclusions
            .iter()
            .any(|(e, kind)| *kind == Exclusion::ReadOnly && path.starts_with(e))
        {
            access &= self.read;
        }
        Some(access)
    }

    /// A directory: whole when no exclusion lies beneath it (or only covered ones), else entry by
    /// entry (recursively) with the folder itself getting listing (or reading, when nothing
    /// beneath it is unreadable).
    fn grant_directory(
        &mut self,
        fd: OwnedFd,
        path: &Path,
        access: BitFlags<AccessFs>,
    ) -> Result<(), SandboxError> {
        let inner: Vec<Exclusion> = self
            .exclusions
            .iter()
            .filter(|(e, _)| e != path && e.starts_with(path) && !self.covered.contains(e))
            .map(|(_, kind)| *kind)
            .collect();
        if inner.is_empty() {
            self.push(path, fd, access);
            return Ok(());
        }
        // On the path to an exclusion: the folder itself gets listing (or reading, when nothing
        // beneath it is unreadable), its entries are granted one by one.
        let own = if inner.contains(&Exclusion::NoAccess) {
            access & AccessFs::ReadDir
        } else {
            access & self.read
        };
        let names = entry_names(&fd, path)?;
        for name in &names {
            self.grant_resolved(Source::Entry(&fd, name), &path.join(name), access)?;
        }
        if !own.is_empty() {
            self.push(path, fd, own);
        }
        Ok(())
    }

    /// `--allow-unix-sockets` from ABI 9: `connect()` to named Unix sockets is not handled, so
    /// allowed everywhere (below ABI 9 the right does not exist and this changes nothing).
    pub(crate) fn allow_unix_sockets(&mut self) {
        self.handled.remove(AccessFs::ResolveUnix);
        for rule in &mut self.rules {
            rule.access.remove(AccessFs::ResolveUnix);
        }
        self.rules.retain(|rule| !rule.access.is_empty());
    }

    fn push(&mut self, path: &Path, fd: OwnedFd, access: BitFlags<AccessFs>) {
        let access = access & self.handled;
        if !access.is_empty() {
            self.rules.push(PlannedRule {
                path: path.to_owned(),
                fd,
                access,
            });
        }
    }
}

/// The `O_PATH` descriptor of what `source` names, never following a symlink; `None` for a
/// walked entry that vanished meanwhile (it grants nothing).
fn open_source(source: &Source<'_>, path: &Path) -> Result<Option<OwnedFd>, SandboxError> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let opened = match source {
        Source::Entry(parent, name) => rustix::fs::openat(parent, *name, flags, Mode::empty()),
        Source::Path => rustix::fs::open(path, flags, Mode::empty()),
        Source::Pinned(fd) => rustix::io::fcntl_dupfd_cloexec(fd, 3),
    };
    match opened {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) if matches!(source, Source::Entry(..)) => Ok(None),
        Err(e) => Err(grant_error(path, e)),
    }
}

/// The names in the directory `fd` (`path`), without `.` and `..`, read through a descriptor
/// opened beneath `fd` and closed before the caller grants them.
fn entry_names(fd: &OwnedFd, path: &Path) -> Result<Vec<std::ffi::OsString>, SandboxError> {
    let dir = rustix::fs::openat(
        fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| grant_error(path, e))?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir).map_err(|e| grant_error(path, e))? {
        let entry = entry.map_err(|e| grant_error(path, e))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    }
    Ok(names)
}

fn grant_error(path: &Path, error: rustix::io::Errno) -> SandboxError {
    SandboxError::GrantPath {
        path: path.to_owned(),
        source: error.into(),
    }
}

fn check_absolute(path: &Path) -> Result<(), SandboxError> {
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(SandboxError::Policy(format!(
            "{} must be absolute and contain no `..`",
            path.display()
        )));
    }
    Ok(())
}

fn resolve_existing(path: &Path, what: &str) -> Result<PathBuf, SandboxError> {
    check_absolute(path)?;
    std::fs::canonicalize(path).map_err(|source| SandboxError::GrantPath {
        path: path.to_owned(),
        source: io::Error::new(source.kind(), format!("{what}: {source}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::CommandLimits;
    use crate::{MIN_ABI, landlock_status};

    fn policy(root: &Path) -> SandboxPolicy {
        SandboxPolicy {
            pinned: vec![],
            read_write: vec![root.join("w")],
            read_only: vec![],
            blocked: vec![root.join("w/a/b"), root.join("w/missing")],
            read_only_within: vec![root.join("w/ro")],
            denied: vec![],
            read_only_if_present: vec![],
            scratch: root.join("scratch"),
            cwd: root.join("w"),
            limits: CommandLimits::default(),
            overmount_exclusions: false,
            private_terminals: false,
        }
    }

    #[test]
    fn exclusions_grant_siblings_not_the_parent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for d in ["w/a/b", "w/a/c", "w/d", "w/ro", "scratch"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        std::fs::write(root.join("w/f"), "x").expect("write");
        std::os::unix::fs::symlink("/etc", root.join("w/link")).expect("symlink");
        let abi = landlock_status().expect("landlock");
        let plan = plan_rules(&policy(&root), abi, &[]).expect("plan");
        let find = |p: &str| {
            plan.rules
                .iter()
                .filter(|r| r.path == root.join(p))
                .map(|r| r.access)
                .collect::<Vec<_>>()
        };
        let all = AccessFs::from_all(ABI::from(abi));
        assert_eq!(find("w"), vec![BitFlags::from(AccessFs::ReadDir)]);
        assert_eq!(find("w/a"), vec![BitFlags::from(AccessFs::ReadDir)]);
        assert!(find("w/a/b").is_empty(), "blocked path granted");
        assert!(find("w/missing").is_empty());
        assert_eq!(find("w/a/c"), vec![all]);
        assert_eq!(find("w/d"), vec![all]);
        assert_eq!(find("w/ro"), vec![AccessFs::from_read(ABI::from(abi))]);
        assert_eq!(find("w/f"), vec![all & AccessFs::from_file(ABI::from(abi))]);
        assert!(find("w/link").is_empty(), "symlink followed");
        assert_eq!(find("scratch"), vec![all]);
    }

    /// One policy, two back ends: for a table of existing files, what the Landlock plan grants
    /// (a rule on the file or any folder above it) and what the macOS profile's own evaluator
    /// decides agree, for reading and for writing.
    #[test]
    fn the_landlock_plan_and_the_macos_profile_decide_alike() {
        use crate::sbpl::{Access as Sbpl, Profile};
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let files = [
            "w/f",
            "w/a/c/f",
            "w/a/b/secret",
            "w/a/bee/f",
            "w/d/deep/f",
            "w/ro/f",
            "w/ro/sub/f",
            "w/.agentworks/receipts.db",
            "r/f",
            "r/sub/f",
            "outside/f",
            "scratch/tmp",
        ];
        for file in files {
            let path = root.join(file);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, "x").expect("write");
        }
        let mut policy = policy(&root);
        policy.read_only = vec![root.join("r")];
        policy.denied = vec![root.join("w/.agentworks")];
        let abi = landlock_status().expect("landlock");
        let plan = plan_rules(&policy, abi, &[]).expect("plan");
        let profile = Profile::generate(&policy);
        let landlock = |path: &Path, right: AccessFs| {
            plan.rules
                .iter()
                .any(|r| path.starts_with(&r.path) && r.access.contains(right))
        };
        let mut table = Vec::new();
        for file in files {
            let path = root.join(file);
            let read = (
                landlock(&path, AccessFs::ReadFile),
                profile.decide(&path, Sbpl::Read),
            );
            let write = (
                landlock(&path, AccessFs::WriteFile),
                profile.decide(&path, Sbpl::Write),
            );
            assert_eq!(
                read.0, read.1,
                "reading {file}: Landlock {}, macOS {}",
                read.0, read.1
            );
            assert_eq!(
                write.0, write.1,
                "writing {file}: Landlock {}, macOS {}",
                write.0, write.1
            );
            table.push((file, read.0, write.0));
        }
        // And the table is the policy's: not everything allowed, not everything denied.
        let expect = [
            ("w/f", true, true),
            ("w/a/b/secret", false, false),
            ("w/a/bee/f", true, true),
            ("w/ro/sub/f", true, false),
            ("w/.agentworks/receipts.db", false, false),
            ("r/sub/f", true, false),
            ("outside/f", false, false),
            ("scratch/tmp", true, true),
        ];
        for row in expect {
            assert!(table.contains(&row), "{row:?} not in {table:?}");
        }
    }

    /// Landlock ABI 9 (not on this machine's kernel; the plan is only built, not applied):
    /// connecting to named Unix sockets is handled and granted only beneath the writable
    /// folders and the scratch dir, never the system paths; `--allow-unix-sockets` unhandles it.
    #[test]
    fn from_abi_9_unix_sockets_resolve_only_beneath_the_shared_folders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for d in ["w/a/b", "w/a/c", "w/d", "w/ro", "scratch"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        let mut plan = plan_rules(&policy(&root), 9, &[]).expect("plan");
        assert!(plan.handled.contains(AccessFs::ResolveUnix));
        let has = |plan: &Plan, path: &Path| {
            plan.rules
                .iter()
                .any(|r| r.path == path && r.access.contains(AccessFs::ResolveUnix))
        };
        assert!(has(&plan, &root.join("w/d")));
        assert!(has(&plan, &root.join("scratch")));
        assert!(!has(&plan, &root.join("w/ro")), "a read-only exclusion");
        for system in ["/usr", "/etc", "/proc", "/dev/null"] {
            if let Ok(path) = std::fs::canonicalize(system) {
                assert!(!has(&plan, &path), "{system}");
            }
        }
        plan.allow_unix_sockets();
        assert!(!plan.handled.contains(AccessFs::ResolveUnix));
        assert!(
            plan.rules
                .iter()
                .all(|r| !r.access.contains(AccessFs::ResolveUnix))
        );
    }

    #[test]
    fn no_terminal_device_is_granted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for d in ["w/a/b", "w/a/c", "w/d", "w/ro", "scratch"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        let plan = plan_rules(&policy(&root), MIN_ABI, &[]).expect("plan");
        for terminal in ["/dev/tty", "/dev/ptmx", "/dev/pts", "/dev/console"] {
            assert!(!DEVICES.contains(&terminal), "{terminal}");
        }
        for rule in &plan.rules {
            let path = rule.path.to_string_lossy();
            let under_dev = path == "/dev" || path.starts_with("/dev/");
            assert!(
                !under_dev || DEVICES.contains(&path.as_ref()),
                "{path} is granted"
            );
        }
    }

    /// The private terminals add exactly `/dev/ptmx`, `/dev/pts` and `/dev/tty`, as devices
    /// (their ioctls included from ABI 5); `/dev/console` and the rest of `/dev` stay out.
    #[test]
    fn private_terminals_grant_ptmx_pts_and_tty_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for d in ["w/a/b", "w/a/c", "w/d", "w/ro", "scratch"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        let mut plan = plan_rules(&policy(&root), 5, &[]).expect("plan");
        let before = plan.rules.len();
        plan.grant_private_terminals().expect("grant");
        let added: Vec<(String, BitFlags<AccessFs>)> = plan.rules[before..]
            .iter()
            .map(|r| (r.path.to_string_lossy().into_owned(), r.access))
            .collect();
        let device =
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
        for (path, access) in &added {
            assert!(
                PRIVATE_TERMINALS.iter().any(|t| path == t
                    || std::fs::canonicalize(t).is_ok_and(|c| c.to_string_lossy() == *path)),
                "{path} is granted"
            );
            assert!(access.contains(device), "{path}: {access:?}");
        }
        let pts = added.iter().find(|(p, _)| p == "/dev/pts");
        assert!(
            pts.is_some_and(|(_, a)| a.contains(AccessFs::ReadDir)),
            "{added:?}"
        );
        assert!(
            !added
                .iter()
                .any(|(p, _)| p == "/dev/console" || p == "/dev")
        );
    }

    #[test]
    fn missing_grant_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir_all(root.join("scratch")).expect("mkdir");
        let error = plan_rules(&policy(&root), MIN_ABI, &[])
            .err()
            .expect("must fail");
        assert!(matches!(error, SandboxError::GrantPath { .. }), "{error}");
    }

    #[test]
    fn lenient_resolution_keeps_missing_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        // Through `Plan::exclude`, which refuses relative paths and `..` before resolving.
        let mut plan = Plan::new(ABI::from(MIN_ABI));
        plan.exclude(&root.join("x/y"), Exclusion::NoAccess)
            .expect("resolve");
        assert_eq!(
            plan.exclusions,
            vec![(root.join("x/y"), Exclusion::NoAccess)]
        );
        assert!(
            plan.exclude(Path::new("relative"), Exclusion::NoAccess)
                .is_err()
        );
        assert!(
            plan.exclude(&root.join("../etc"), Exclusion::NoAccess)
                .is_err()
        );
    }
}
