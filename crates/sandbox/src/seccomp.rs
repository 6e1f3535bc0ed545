//! The launcher's seccomp filter: no Unix sockets and no io_uring for a command, on kernels whose
//! Landlock cannot govern `connect()` to a named Unix socket (below ABI 9).
//!
//! Owns: which system calls the filter refuses ([`unix_socket_filter`]), the decision whether a
//! command needs it ([`needs_unix_socket_filter`]) and installing it on the calling thread
//! ([`install`]), built with `seccompiler` (rust-vmm's pure-Rust BPF compiler, Firecracker's).
//!
//! Why: Landlock rules before ABI 9 only govern paths that are *opened*; `connect()` to a named
//! socket is not an open, so a command could reach the person's ssh-agent, D-Bus, docker.sock or
//! a same-user agentworks daemon's operator socket through a path it cannot even read. Refusing
//! the creation of the socket closes every one of those doors at once. What is refused, with
//! `EPERM` (the errno the kernel itself gives for a disabled io_uring):
//!
//! - `socket(AF_UNIX, …)` of every type (stream, datagram, seqpacket; raw is datagram);
//! - `socketpair(AF_UNIX, SOCK_DGRAM | SOCK_RAW, …)`: an unconnected datagram socket of a pair can
//!   be aimed at a named socket with `sendto()`/`connect()` (syslog, journald). Stream and
//!   seqpacket pairs, which cannot be re-aimed (`EISCONN`), stay allowed, so pipelines and build
//!   tools that use them keep working;
//! - `io_uring_setup`, `io_uring_enter`, `io_uring_register`: io_uring can create and connect
//!   sockets without the `socket()` system call the filter sees.
//!
//! Everything else is allowed. On x86-64 the x32 numbers of those calls are refused as well; a
//! system call of another architecture (a 32-bit i386 program, which could reach sockets through
//! `socketcall()` whose arguments a filter cannot read) kills the process: 32-bit programs do
//! not run in a sandbox that has this filter.
//!
//! A second filter, [`namespace_filters`], goes on every command that runs in the user and mount
//! namespace the launcher made to cover its exclusions (`overmount.rs`): the command may
//! not make or enter a namespace (`unshare`, `setns`, `clone` with a `CLONE_NEW*` flag; `clone3`,
//! whose flags a filter cannot read, answers `ENOSYS`, so the C library falls back to `clone`)
//! nor mount, unmount or move anything (`mount`, `umount2`, `pivot_root`, `open_tree`,
//! `move_mount`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr`), with `EPERM`.
//! Landlock already refuses every mount operation to a sandboxed process and the command holds no
//! capability; this is the third lock on the covers.
//!
//! Must never: be skipped when it is needed (a filter that cannot be built or installed is an
//! error, and the launcher refuses the command); refuse `socketpair` for stream sockets.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The first Landlock ABI that governs `connect()` to named Unix sockets
/// (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`); from it on, the filter is not needed.
pub const RESOLVE_UNIX_ABI: i32 = 9;

/// The x32 ABI's system call numbers are the x86-64 ones with this bit set.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("this architecture ({0}) has no seccomp filter, so commands are refused")]
    Architecture(&'static str),
    #[error("cannot build the seccomp filter: {0}")]
    Build(#[source] seccompiler::BackendError),
    #[error("cannot install the seccomp filter: {0}")]
    Install(#[source] seccompiler::Error),
}

/// Whether a command on a kernel with Landlock ABI `abi` must run under the Unix-socket filter:
/// below [`RESOLVE_UNIX_ABI`], unless the person allowed Unix sockets.
pub fn needs_unix_socket_filter(abi: i32, allow_unix_sockets: bool) -> bool {
    abi < RESOLVE_UNIX_ABI && !allow_unix_sockets
}

/// The filter described in the module doc, compiled to BPF for this architecture.
pub fn unix_socket_filter() -> Result<BpfProgram, SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::Architecture(std::env::consts::ARCH))?;
    let condition = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(SeccompError::Build)
    };
    let unix = || condition(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64);
    // The socket type's low bits; SOCK_CLOEXEC and SOCK_NONBLOCK are flags above them.
    let socket_type = |kind: i32| condition(1, SeccompCmpOp::MaskedEq(0xf), kind as u64);
    let rule = |conditions| SeccompRule::new(conditions).map_err(SeccompError::Build);

    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_socket, vec![rule(vec![unix()?])?]);
    rules.insert(
        libc::SYS_socketpair,
        vec![
            rule(vec![unix()?, socket_type(libc::SOCK_DGRAM)?])?,
            rule(vec![unix()?, socket_type(libc::SOCK_RAW)?])?,
        ],
    );
    // An empty rule list matches the call whatever its arguments.
    for call in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        rules.insert(call, Vec::new());
    }
    #[cfg(target_arch = "x86_64")]
    {
        let x32: Vec<(i64, Vec<SeccompRule>)> = rules
            .iter()
            .map(|(call, chain)| (call | X32_SYSCALL_BIT, chain.clone()))
            .collect();
        rules.extend(x32);
    }

    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(SeccompError::Build)?;
    BpfProgram::try_from(filter).map_err(SeccompError::Build)
}

/// The `CLONE_NEW*` flags `clone` may not be given (`CLONE_NEWTIME` is not a `clone` flag).
const CLONE_NEW: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// The namespace and mount filters of the module doc: the first refuses with `EPERM`, the
/// second answers `clone3` with `ENOSYS`. Both must be installed.
pub fn namespace_filters() -> Result<[BpfProgram; 2], SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::Architecture(std::env::consts::ARCH))?;
    let rule = |conditions| SeccompRule::new(conditions).map_err(SeccompError::Build);
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for call in [
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
    ] {
        refused.insert(call, Vec::new());
    }
    // clone's first argument holds its flags (on x86-64 and aarch64 alike).
    let mut clone_rules = Vec::new();
    for flag in CLONE_NEW {
        let condition = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(flag),
            flag,
        )
        .map_err(SeccompError::Build)?;
        clone_rules.push(rule(vec![condition])?);
    }
    refused.insert(libc::SYS_clone, clone_rules);
    let mut clone3: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, Vec::new());
    #[cfg(target_arch = "x86_64")]
    for rules in [&mut refused, &mut clone3] {
        let x32: Vec<(i64, Vec<SeccompRule>)> = rules
            .iter()
            .map(|(call, chain)| (call | X32_SYSCALL_BIT, chain.clone()))
            .collect();
        rules.extend(x32);
    }
    let compile = |rules, errno: i32| {
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch,
        )
        .map_err(SeccompError::Build)?;
        BpfProgram::try_from(filter).map_err(SeccompError::Build)
    };
    Ok([
        compile(refused, libc::EPERM)?,
        compile(clone3, libc::ENOSYS)?,
    ])
}

/// Installs `program` on the calling thread (the single-threaded launcher, so the whole
/// process); every process it forks afterwards inherits it. Needs `no_new_privs`.
pub fn install(program: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter(program).map_err(SeccompError::Install)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_below_abi_9_unless_allowed() {
        assert!(needs_unix_socket_filter(3, false));
        assert!(needs_unix_socket_filter(8, false));
        assert!(!needs_unix_socket_filter(8, true));
        assert!(!needs_unix_socket_filter(9, false));
        assert!(!needs_unix_socket_filter(10, false));
    }

    #[test]
    fn the_filter_compiles() {
        let program = unix_socket_filter().expect("filter");
        assert!(!program.is_empty());
        for program in namespace_filters().expect("namespace filters") {
            assert!(!program.is_empty());
        }
    }
}
