//! Real system users and groups for the tests that run a daemon as another user or check
//! ownership: created once with `useradd`/`groupadd` (no home, no login) and left in place,
//! under one lock so that concurrent tests do not race on /etc/passwd.

use std::process::Command;

/// Ensure a system group exists; returns its gid.
pub fn ensure_group(name: &str) -> u32 {
    let _ = Command::new("groupadd").arg("-f").arg(name).status();
    nix::unistd::Group::from_name(name)
        .unwrap()
        .expect("group exists")
        .gid
        .as_raw()
}

/// Ensure a system user exists (no home, no login) with the given supplementary groups; returns (uid, primary gid).
pub fn ensure_user(name: &str, groups: &[&str]) -> (u32, u32) {
    if nix::unistd::User::from_name(name).unwrap().is_none() {
        let status = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
            ])
            .arg(name)
            .status()
            .unwrap();
        // Another test may have created it concurrently.
        assert!(status.success() || nix::unistd::User::from_name(name).unwrap().is_some());
    }
    for group in groups {
        ensure_group(group);
        let status = Command::new("usermod")
            .args(["-a", "-G", group, name])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let user = nix::unistd::User::from_name(name).unwrap().unwrap();
    (user.uid.as_raw(), user.gid.as_raw())
}

/// Serialize tests that create users (useradd/usermod lock /etc/passwd).
pub fn users_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
