//! What the launcher does when it holds privileges (a caller run as root, or given
//! capabilities): Landlock confines paths, not what capabilities reach (`CAP_SYS_MODULE` loads
//! a module from memory, `CAP_BPF` and `CAP_SYS_ADMIN` reach the kernel, `CAP_DAC_OVERRIDE`
//! reads other users' files in a shared folder), and `RLIMIT_NPROC` never binds root.
//!
//! Owns: [`own_pid_namespace`], which puts the next process the launcher forks (the shell) in a
//! new PID namespace when the launcher may (`CAP_SYS_ADMIN`): the kernel kills every process
//! of a namespace when its first process dies, so a fork-hopping chain cannot outlive its
//! command even where neither a cgroup nor the process limit holds it; and
//! [`drop_capabilities`], run in the shell just before exec: no capability effective,
//! permitted, inheritable, ambient or in the bounding set, and the securebits that keep uid 0
//! from regaining them at exec, locked.
//!
//! Must never: leave a capability to a command; fail open (a drop that does not verify is an
//! error, and the command is not run).

use std::io;

use caps::{CapSet, Capability};

/// Whether this process may create a PID namespace (`CAP_SYS_ADMIN` effective).
pub fn may_unshare_pid() -> bool {
    caps::has_cap(None, CapSet::Effective, Capability::CAP_SYS_ADMIN).unwrap_or(false)
}

/// Makes the next child of this (single-threaded) process the first process of a new PID
/// namespace. Only with `CAP_SYS_ADMIN` (see [`may_unshare_pid`]).
pub fn own_pid_namespace() -> io::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID).map_err(io::Error::from)
}

/// Whether this process holds any capability (permitted or ambient).
fn holds_capabilities() -> io::Result<bool> {
    let permitted = caps::read(None, CapSet::Permitted).map_err(io::Error::other)?;
    let ambient = caps::read(None, CapSet::Ambient).map_err(io::Error::other)?;
    Ok(!permitted.is_empty() || !ambient.is_empty())
}

/// Drops every capability for good; a process without any (a person's ordinary executor, a
/// daemon without capabilities) is left as it is, since it has nothing to drop and the
/// bounding set is harmless under `no_new_privs`. Runs in the forked shell before exec (the launcher is single-threaded).
pub fn drop_capabilities() -> io::Result<()> {
    if !holds_capabilities()? {
        return Ok(());
    }
    // Securebits first, while CAP_SETPCAP is still held: uid 0 gets no capability at exec
    // (NOROOT), a uid change does not touch them (NO_SETUID_FIXUP), none can be raised into the
    // ambient set, and all of it is locked.
    let bits = libc::SECBIT_NOROOT
        | libc::SECBIT_NOROOT_LOCKED
        | libc::SECBIT_NO_SETUID_FIXUP
        | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
        | libc::SECBIT_KEEP_CAPS_LOCKED;
    // SAFETY: PR_SET_SECUREBITS takes an integer argument and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // The bounding set (also needs CAP_SETPCAP), then the ambient, inheritable, effective and
    // permitted sets.
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(io::Error::other)?;
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(io::Error::other)?;
    }
    // Verify: anything left refuses the command.
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
        CapSet::Bounding,
    ] {
        let left = caps::read(None, set).map_err(io::Error::other)?;
        if !left.is_empty() {
            return Err(io::Error::other(format!(
                "capabilities left in the {set:?} set after dropping them: {left:?}"
            )));
        }
    }
    Ok(())
}
