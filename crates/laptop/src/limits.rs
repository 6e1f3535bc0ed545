//! What the person is told at connect about the limits every command runs under: the terminal,
//! Unix sockets, processes, memory, and how commands are ended.
//!
//! Owns: [`limits_text`], printed after the folders' permissions, and the executor's cgroup layout
//! ([`EXECUTOR_CGROUPS`]). The limits themselves are the sandbox crate's
//! ([`agentworks_sandbox::limits`]). Must never: say a limit holds that the machine cannot
//! enforce (a missing memory controller or cgroup is named).

use agentworks_sandbox::cgroup::CgroupLayout;
use agentworks_sandbox::limits::Limits;
#[cfg(target_os = "linux")]
use agentworks_sandbox::seccomp;

/// The executor's leaf and its commands' cgroups in its delegated cgroup.
pub const EXECUTOR_CGROUPS: CgroupLayout = CgroupLayout {
    owner: "the executor",
    own_leaf: "agentworks-executor",
    command_prefix: "agentworks-command-",
};

/// Printed at connect after the folders' permissions: terminals, Unix sockets, process and
/// memory limits, and how commands are ended. `abi` is the kernel's Landlock ABI.
pub fn limits_text(limits: &Limits, abi: Option<i32>) -> String {
    let mut out = String::from("Each command also runs:\n");
    out.push_str(
        "  without a terminal: a new session with no controlling terminal, and no terminal device (/dev/tty, /dev/pts) is reachable, so commands cannot type into or read your terminals\n",
    );
    #[cfg(target_os = "linux")]
    unix_socket_text(limits, &mut out, abi.unwrap_or(0));
    #[cfg(target_os = "macos")]
    {
        // `abi` is Landlock's: None on macOS.
        let _ = abi;
        out.push_str(
            "  under a sandbox-exec profile: no access to the desktop (Apple Events, launching apps), the clipboard, the Keychain or other services, and Unix sockets are NOT restricted (the profile allows the network, as on Linux, and Unix sockets with it): local services such as ssh-agent stay reachable\n",
        );
    }
    process_text(limits, &mut out);
    out
}

/// Linux: what Landlock and seccomp do to Unix sockets, abstract sockets and signals.
#[cfg(target_os = "linux")]
fn unix_socket_text(limits: &Limits, out: &mut String, abi: i32) {
    if limits.allow_unix_sockets {
        out.push_str(
            "  Unix sockets ALLOWED (--allow-unix-sockets): commands can reach local services over Unix sockets, such as ssh-agent, D-Bus and docker.sock\n",
        );
    } else if seccomp::needs_unix_socket_filter(abi, false) {
        out.push_str(
            "  without Unix sockets: creating one is refused (seccomp), so local services such as ssh-agent, D-Bus, docker.sock and the agentworks daemons' sockets are out of reach; io_uring is refused too (--allow-unix-sockets lifts this)\n",
        );
    } else {
        out.push_str(
            "  with Unix sockets only inside the shared folders and the scratch dir (Landlock): ssh-agent, D-Bus, docker.sock and the agentworks daemons' sockets are out of reach (--allow-unix-sockets lifts this)\n",
        );
    }
    if abi >= 6 {
        out.push_str(
            "  without access to abstract Unix sockets or signals of processes outside its sandbox\n",
        );
    }
}

/// The process and memory limits, and how commands are ended.
fn process_text(limits: &Limits, out: &mut String) {
    let root = rustix::process::getuid().is_root();
    out.push_str(&format!(
        "  with at most {} more processes than your user runs when it starts (RLIMIT_NPROC{}){}\n",
        limits.max_processes,
        if root {
            "; NOT enforced, since the executor runs as root"
        } else {
            ""
        },
        match &limits.cgroups {
            Ok(tree) if tree.has_pids() => format!(
                " and at most {} in its own cgroup (pids.max)",
                limits.max_processes
            ),
            _ => String::new(),
        }
    ));
    match &limits.cgroups {
        Ok(tree) => {
            match tree.memory_unavailable() {
                None => out.push_str(&format!(
                    "  with at most {} of memory (memory.max)\n",
                    human_size(limits.max_memory)
                )),
                Some(reason) => out.push_str(&format!("  with NO memory limit: {reason}\n")),
            }
            out.push_str(&format!(
                "  in a cgroup of its own under {}, ended with cgroup.kill\n",
                tree.base().display()
            ));
        }
        Err(reason) => {
            out.push_str(&format!(
                "  with NO memory limit and no cgroup of its own: {reason}; commands are ended by the launcher, which waits for every process it finds\n"
            ));
            #[cfg(target_os = "linux")]
            out.push_str(
                "    (for both, start the executor in a delegated cgroup: systemd-run --user --scope -p Delegate=yes agentworks executor connect …)\n",
            );
        }
    }
}

/// `4.0 GiB`, `512.0 MiB`, or bytes.
fn human_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if bytes >= size {
            return format!("{:.1} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_names_what_is_missing() {
        let limits = Limits::without_cgroup("the executor runs in the root cgroup");
        let text = limits_text(&limits, Some(7));
        assert!(text.contains("NO memory limit"), "{text}");
        assert!(text.contains("root cgroup"), "{text}");
        assert!(text.contains("without Unix sockets"), "{text}");
        assert!(
            text.contains("systemd-run --user --scope -p Delegate=yes"),
            "{text}"
        );
        let allowed = Limits {
            allow_unix_sockets: true,
            ..Limits::without_cgroup("x")
        };
        assert!(
            limits_text(&allowed, Some(7))
                .contains("commands can reach local services over Unix sockets, such as ssh-agent, D-Bus and docker.sock")
        );
        assert!(limits_text(&limits, Some(9)).contains("only inside the shared folders"));
    }
}
