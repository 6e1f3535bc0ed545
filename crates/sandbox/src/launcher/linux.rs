//! The Linux launcher: the re-executed `<binary> __sandbox-exec` process that confines itself
//! and forks the command (the laptop's shell, a coding CLI).
//!
//! Owns: the security steps in their order (`launch`, each step with why it comes there),
//! applying the ruleset `plan.rs` planned and the nested scope ruleset, and the shell's fork.
//! Must never: reorder those steps, run the shell with a ruleset, scope or seccomp filter that
//! is not enforced, or with a controlling terminal; return once the shell was forked (it exits
//! through the reaper).

use std::convert::Infallible;
use std::io;
use std::os::unix::process::CommandExt;

use landlock::{
    CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr,
    RulesetStatus, Scope,
};
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::Pid;

use super::reaper::{end_command, wait_for_shell};
use super::{NO_TERMINAL_NOTICE, check_no_terminal, parse_launcher_args};
use crate::cgroup::CommandCgroupFds;
use crate::overmount::Terminals;
use crate::plan::{Plan, plan_rules};
use crate::{SandboxError, TEST_ABI_ENV, TEST_NO_USERNS_ENV, landlock_status};
use crate::{limits, overmount, privileges, seccomp};

/// The Linux launcher's steps ([`launcher_main`](super::launcher_main) is the entry).
pub(super) fn launch(args: &[String]) -> Result<Infallible, SandboxError> {
    // Block the stop signals first so that one arriving during setup stays pending and is
    // handled by the wait loop (killing the shell) instead of killing the launcher while
    // descendants run on. The shell gets no blocked signal and no ignored one
    // (default_signals_for_command): a child inherits its parent's mask across fork and exec
    // (std has not reset it since Rust 1.66), and a shell started with SIGCHLD blocked waits
    // for a background job forever, one with SIGTERM blocked cannot be stopped by `kill` or
    // `timeout`.
    let mut signals = SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        signals.add(signal);
    }
    signals
        .thread_block()
        .map_err(|e| SandboxError::setup("block signals")(e.into()))?;

    let (policy, program, program_args) = parse_launcher_args(args)?;

    // 1. Inherited descriptors above 2: a descriptor opened before the ruleset (a directory,
    // a socket, a terminal) would let the command reach outside it, since Landlock checks paths
    // at open time. We mark them close-on-exec rather than closing them, so the launcher never
    // closes a descriptor some part of this process might still own; the shell inherits only
    // 0-2 (the runner makes them /dev/null and pipes, never the person's terminal).
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it closes
    // nothing, touches no memory, and cannot invalidate a descriptor owned elsewhere.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        return Err(SandboxError::setup(
            "mark inherited descriptors close-on-exec",
        )(io::Error::last_os_error()));
    }

    // 2. A new session with no controlling terminal, before anything is forked: without a
    // controlling terminal `/dev/tty` cannot be opened and `TIOCSTI` (which needs one) cannot
    // push keystrokes into the person's shell. The runner already made us a session leader;
    // a launcher started otherwise makes its own session, and one that still has a terminal
    // (or cannot tell) refuses.
    let me = nix::unistd::getpid();
    if nix::unistd::getsid(None).ok() != Some(me) {
        nix::unistd::setsid().map_err(|e| SandboxError::Terminal(format!("setsid: {e}")))?;
    }
    check_no_terminal()?;

    // 3. Child subreaper: orphans of the command (a grandchild whose parent exited, one that
    // called setsid()) are re-parented to us rather than to init, so we can find and kill them.
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| SandboxError::setup("become a child subreaper")(e.into()))?;

    // 4. The command's cgroup (when the caller made one): its cgroup.procs (to move the shell
    // in) and cgroup.kill (to end it) are opened now, since the ruleset below grants /sys
    // read-only. The launcher itself stays outside, so cgroup.kill never kills it.
    let cgroup = match &policy.limits.cgroup {
        Some(path) => {
            Some(
                CommandCgroupFds::open(path).map_err(|source| SandboxError::Cgroup {
                    path: path.clone(),
                    source,
                })?,
            )
        }
        None => None,
    };

    // 5. no_new_privs before the ruleset: Landlock requires it for an unprivileged process,
    // and it keeps setuid binaries from gaining privileges inside the sandbox.
    nix::sys::prctl::set_no_new_privs()
        .map_err(|e| SandboxError::setup("set no_new_privs")(e.into()))?;

    // 6. The process limit: RLIMIT_NPROC counts every process of the user, so it is the count
    // now plus the command's allowance (see limits.rs); the shell and everything it starts
    // inherit it. Before the user namespace below, whose counts it also caps from outside.
    limits::set_process_limit(policy.limits.max_processes)
        .map_err(SandboxError::setup("set RLIMIT_NPROC"))?;

    // 7. The exclusions inside writable folders, covered by mounts in a user and mount
    // namespace of the command's own (overmount.rs), where the policy asks for it and the
    // kernel allows it; what is not covered is left to the rule walk below. In the same
    // namespace, the command's private terminals (a devpts instance of its own, terminals.rs)
    // when the policy asks for them; where they cannot be made the command gets no terminal,
    // and its stderr says so. Before Landlock, which forbids mounting to a sandboxed process.
    // Whether the launcher may give the shell a PID namespace is decided first: inside a new
    // user namespace every launcher holds CAP_SYS_ADMIN, so only one that held it before gets
    // one (privileges.rs).
    let may_own_pid_namespace = privileges::may_unshare_pid();
    let covered = if overmount::wanted(&policy) {
        overmount::cover(&policy)?
    } else {
        overmount::Covered::default()
    };
    if let Terminals::Refused(why) = &covered.terminals {
        eprintln!("{NO_TERMINAL_NOTICE}{why}");
    }
    let namespace_filters = if covered.in_namespace {
        Some(seccomp::namespace_filters()?)
    } else {
        None
    };

    // 8. The Landlock ruleset, applied to the launcher itself (single-threaded, so to the whole
    // process) and inherited by the shell. Fully enforced or refuse. From ABI 9 it also
    // governs connect() to named Unix sockets (only beneath the writable folders and the
    // scratch dir), unless the person allowed Unix sockets.
    let abi = landlock_status()?;
    let mut plan = plan_rules(&policy, abi, &covered.paths)?;
    if covered.terminals == Terminals::Private {
        plan.grant_private_terminals()?;
    }
    if policy.limits.allow_unix_sockets {
        plan.allow_unix_sockets();
    }
    apply_ruleset(plan)?;
    let scopes = scope_ruleset(abi)?;

    // 9. Below ABI 9, the seccomp filter refusing Unix sockets and io_uring (seccomp.rs),
    // unless the person allowed Unix sockets. Built and installed last, so nothing the
    // launcher still needs is refused; one that cannot be installed refuses.
    if seccomp::needs_unix_socket_filter(abi, policy.limits.allow_unix_sockets) {
        let filter = seccomp::unix_socket_filter()?;
        seccomp::install(&filter)?;
    }

    // 10. Fork the shell: it moves itself into the command's cgroup, enters the nested scope
    // ruleset (signals and abstract Unix sockets), drops every capability, takes the namespace
    // filters when it runs in the launcher's namespaces, then execs.
    let mut command = std::process::Command::new(&program);
    command
        .args(&program_args)
        .current_dir(&policy.cwd)
        .env_remove(TEST_ABI_ENV)
        .env_remove(TEST_NO_USERNS_ENV);
    let mut scopes = scopes;
    let child_cgroup = cgroup.as_ref().map(CommandCgroupFds::try_clone);
    let child_cgroup = child_cgroup
        .transpose()
        .map_err(|source| SandboxError::Cgroup {
            path: policy.limits.cgroup.clone().unwrap_or_default(),
            source,
        })?;
    // SAFETY: the closure runs in the forked child before exec. The launcher is
    // single-threaded (launcher_main runs first in main; nothing here spawns threads), so
    // no lock can be held by a thread that vanished in the fork and allocating is sound.
    // It only writes to a cgroup.procs descriptor opened before the fork, calls
    // landlock_restrict_self on a ruleset built before the fork, drops capabilities (prctl,
    // capset), installs seccomp filters compiled before the fork and resets the signals
    // (sigaction, sigprocmask).
    unsafe {
        command.pre_exec(move || {
            if let Some(fds) = &child_cgroup {
                fds.join_self()?;
            }
            restrict_to_scopes(&mut scopes)?;
            // A privileged launcher's command gets no capability (privileges.rs), nor does one
            // that holds them only in the launcher's own user namespace.
            privileges::drop_capabilities()?;
            // After the drop, which the filters would not hinder but the order keeps plain: no
            // namespace and no mount of the command's own.
            if let Some(filters) = &namespace_filters {
                for filter in filters {
                    seccomp::install(filter).map_err(io::Error::other)?;
                }
            }
            // Last: the shell starts with no signal blocked or ignored, not with the
            // launcher's mask (the stop signals and SIGCHLD blocked for its sigwait) nor with
            // what its caller ignored.
            super::default_signals_for_command()
        });
    }
    // A launcher with CAP_SYS_ADMIN (a root caller, which RLIMIT_NPROC does not bind) puts
    // the command in its own PID namespace: when the shell, its first process, is killed, the
    // kernel kills the rest, so a fork-hopping chain cannot outrun the reaper. Only now: the
    // first process forked after this is the namespace's, and the process-limit probe above
    // forks too.
    if may_own_pid_namespace {
        privileges::own_pid_namespace().map_err(SandboxError::setup("create a PID namespace"))?;
    }
    let child = command.spawn().map_err(|source| SandboxError::Spawn {
        program: program.to_string_lossy().into_owned(),
        source,
    })?;
    let shell = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    // We reap with waitpid(-1) below (orphans included), so std's handle is not used to wait.
    drop(child);

    // 11. Wait for the shell (or a stop signal), then end everything the command left.
    let status = wait_for_shell(shell, &signals);
    end_command(cgroup.as_ref());
    std::process::exit(status)
}

fn restrict_to_scopes(ruleset: &mut Option<RulesetCreated>) -> io::Result<()> {
    let Some(ruleset) = ruleset.take() else {
        return Ok(());
    };
    let status = ruleset.restrict_self().map_err(io::Error::other)?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(io::Error::other(
            "the Landlock signal and abstract-socket scopes are not enforced",
        ));
    }
    Ok(())
}

fn apply_ruleset(plan: Plan) -> Result<(), SandboxError> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(plan.handled)?
        .create()?
        .no_new_privs(true);
    for rule in plan.rules {
        let path = rule.path;
        ruleset = ruleset
            .add_rule(PathBeneath::new(rule.fd, rule.access))
            .map_err(|e| {
                SandboxError::NotEnforced(format!("rule for {} rejected: {e}", path.display()))
            })?;
    }
    let status = ruleset.restrict_self()?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(SandboxError::NotEnforced(format!(
            "kernel reported {:?} for ABI {:?}",
            status.ruleset, plan.abi
        )));
    }
    if !status.no_new_privs {
        return Err(SandboxError::NotEnforced(
            "no_new_privs is not set".to_owned(),
        ));
    }
    Ok(())
}

/// A second, nested ruleset for the shell alone (ABI 6+, whenever the kernel has it): it may
/// not signal processes outside its own domain (so neither the launcher nor its caller), nor
/// connect to an abstract Unix socket made outside it (a same-user service listening on one).
fn scope_ruleset(abi: i32) -> Result<Option<RulesetCreated>, SandboxError> {
    if abi < 6 {
        return Ok(None);
    }
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .scope(Scope::Signal | Scope::AbstractUnixSocket)?
        .create()?;
    Ok(Some(ruleset))
}
