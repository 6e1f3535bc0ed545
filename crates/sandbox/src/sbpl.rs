//! The macOS back end of the one [`SandboxPolicy`]: a `sandbox-exec` profile (SBPL) that
//! allows what the Landlock rules allow on Linux, generated here and checked on any machine.
//!
//! The profile denies by default, then allows: process fork and exec; reading (and mapping
//! executables from) the system paths; reading the read-only folders; reading and writing the
//! writable folders and the private scratch dir; the network (as on Linux); Mach lookups of the
//! two directory services user and group lookups need (`…opendirectoryd.libinfo` and
//! `…membership`) and nothing else. Then it denies, *after* the allows because SBPL's last
//! matching rule wins: `--block` paths (no access), `--read-only` paths inside a writable folder
//! (no writes), and the CLI's own config, credentials and receipts (no access). Nothing allows
//! `iokit-open`, `appleevent-send`, the pasteboard, launch services or the security services:
//! with `(deny default)` they stay denied, and a test keeps every such operation out of every
//! profile whatever the folders are.
//!
//! Paths: canonicalised as macOS names them (`/tmp`, `/var` and `/etc` are links into
//! `/private`), then written as SBPL string literals with `"` and `\` escaped and every byte
//! outside printable ASCII as `\xHH`, so no folder name can end the string and add a rule.
//!
//! [`Profile::decide`] evaluates the generated rules the way `sandbox-exec` does (default deny,
//! last match wins, `subpath` covers the path and everything beneath it), so tests can check
//! the profile's decisions here, where `sandbox-exec` does not exist.
//!
//! Must never: emit a path that was not escaped, put a deny before the allow it restricts, or
//! allow any operation outside the list above.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::{PinnedAccess, SandboxPolicy};

/// The macOS launcher runs every command through this program.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// `sandbox-exec`'s arguments for running `program args…` under `profile`: the profile text
/// as one argument (`-p`, never a file another process could change), then `--`, so a
/// program name starting with `-` is never read as an option.
pub fn sandbox_exec_args(profile: &Profile, program: &OsStr, args: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["-p".into(), profile.text.clone().into(), "--".into()];
    out.push(program.to_owned());
    out.extend(args.iter().cloned());
    out
}

/// System paths every command may read and execute on macOS.
pub const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/System",
    "/Library",
    "/private/etc",
    "/private/var/db/timezone",
    "/opt/homebrew",
    "/Applications/Xcode.app",
    "/Library/Developer/CommandLineTools",
];

/// Device files commands may read and write (never a terminal).
pub const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"];

/// The only Mach services a command may look up: user and group lookups.
pub const MACH_SERVICES: &[&str] = &[
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.system.opendirectoryd.membership",
];

/// Operations no profile ever allows (a test checks every generated profile).
pub const NEVER_ALLOWED: &[&str] = &[
    "iokit-open",
    "appleevent-send",
    "pasteboard",
    "lsopen",
    "launch-services",
    "com.apple.security",
    "securityd",
    "mach-register",
    "system-privilege",
];

/// What a file rule covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `file-read*` (and mapping executables).
    Read,
    /// `file-write*`.
    Write,
}

/// One file rule, in profile order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRule {
    pub allow: bool,
    pub access: Vec<Access>,
    /// `subpath` (the path and everything beneath) or `literal` (the path only).
    pub subpath: bool,
    pub path: PathBuf,
}

/// A generated profile: its file rules in order (for [`Profile::decide`]) and its text.
#[derive(Debug, Clone)]
pub struct Profile {
    pub rules: Vec<FileRule>,
    pub text: String,
}

/// How macOS names `path`: `/tmp`, `/var` and `/etc` are links into `/private`.
pub fn canonical(path: &Path) -> PathBuf {
    for link in ["/tmp", "/var", "/etc"] {
        if let Ok(rest) = path.strip_prefix(link) {
            return Path::new("/private").join(&link[1..]).join(rest);
        }
    }
    path.to_path_buf()
}

/// `path` as an SBPL string literal: `"` and `\` escaped, every byte outside printable ASCII
/// (newlines, controls, non-ASCII UTF-8) as `\xHH`.
pub fn literal(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::from("\"");
    for &byte in path.as_os_str().as_bytes() {
        match byte {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(byte)),
            other => out.push_str(&format!("\\x{other:02x}")),
        }
    }
    out.push('"');
    out
}

impl Profile {
    /// The profile for `policy`.
    pub fn generate(policy: &SandboxPolicy) -> Profile {
        let mut rules = Vec::new();
        let mut allow = |access: &[Access], subpath: bool, path: &Path| {
            rules.push(FileRule {
                allow: true,
                access: access.to_vec(),
                subpath,
                path: canonical(path),
            });
        };
        for system in SYSTEM_READ {
            allow(&[Access::Read], true, Path::new(system));
        }
        for device in DEVICES {
            allow(&[Access::Read, Access::Write], false, Path::new(device));
        }
        for path in &policy.read_only_if_present {
            allow(&[Access::Read], true, path);
        }
        for grant in &policy.pinned {
            match grant.access {
                PinnedAccess::ReadOnly => allow(&[Access::Read], true, &grant.path),
                PinnedAccess::ReadWrite => allow(&[Access::Read, Access::Write], true, &grant.path),
            }
        }
        for path in &policy.read_only {
            allow(&[Access::Read], true, path);
        }
        for path in &policy.read_write {
            allow(&[Access::Read, Access::Write], true, path);
        }
        // The denies, after every allow: the last matching rule wins.
        let mut deny = |access: &[Access], path: &Path| {
            rules.push(FileRule {
                allow: false,
                access: access.to_vec(),
                subpath: true,
                path: canonical(path),
            });
        };
        for path in &policy.read_only_within {
            deny(&[Access::Write], path);
        }
        for path in &policy.blocked {
            deny(&[Access::Read, Access::Write], path);
        }
        for path in &policy.denied {
            deny(&[Access::Read, Access::Write], path);
        }
        // The scratch dir is always the command's, whatever `denied` says of the state dir it
        // lies in: last, so it wins.
        rules.push(FileRule {
            allow: true,
            access: vec![Access::Read, Access::Write],
            subpath: true,
            path: canonical(&policy.scratch),
        });
        let text = render(&rules);
        Profile { rules, text }
    }

    /// Whether the profile lets a command `access` `path` (an absolute, canonical path): the
    /// last matching rule decides, and no rule means no.
    pub fn decide(&self, path: &Path, access: Access) -> bool {
        let path = canonical(path);
        self.rules
            .iter()
            .rfind(|rule| {
                rule.access.contains(&access)
                    && if rule.subpath {
                        path.starts_with(&rule.path)
                    } else {
                        path == rule.path
                    }
            })
            .is_some_and(|rule| rule.allow)
    }
}

fn render(rules: &[FileRule]) -> String {
    let mut text = String::from(
        ";; agentworks executor: generated from the command's sandbox policy.\n\
         (version 1)\n\
         (deny default)\n\
         (allow process-fork)\n\
         (allow process-exec)\n\
         (allow signal (target same-sandbox))\n\
         (allow sysctl-read)\n\
         ;; Reading a path's metadata (stat, realpath) everywhere, as lookups walk the tree.\n\
         (allow file-read-metadata)\n\
         (allow network*)\n",
    );
    text.push_str("(allow mach-lookup");
    for service in MACH_SERVICES {
        text.push_str(&format!(" (global-name {})", literal(Path::new(service))));
    }
    text.push_str(")\n");
    for rule in rules {
        let verb = if rule.allow { "allow" } else { "deny" };
        let operations: Vec<&str> = rule
            .access
            .iter()
            .flat_map(|a| match a {
                Access::Read => ["file-read*", "file-map-executable"].as_slice(),
                Access::Write => ["file-write*"].as_slice(),
            })
            .copied()
            .filter(|op| rule.allow || *op != "file-map-executable")
            .collect();
        let filter = if rule.subpath { "subpath" } else { "literal" };
        text.push_str(&format!(
            "({verb} {} ({filter} {}))\n",
            operations.join(" "),
            literal(&rule.path)
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PinnedGrant;
    use crate::limits::CommandLimits;

    fn policy() -> SandboxPolicy {
        SandboxPolicy {
            pinned: vec![
                PinnedGrant {
                    fd: 3,
                    dev: 1,
                    ino: 2,
                    path: "/Users/ann/src/app".into(),
                    access: PinnedAccess::ReadWrite,
                },
                PinnedGrant {
                    fd: 4,
                    dev: 1,
                    ino: 3,
                    path: "/Users/ann/docs".into(),
                    access: PinnedAccess::ReadOnly,
                },
            ],
            read_write: vec![],
            read_only: vec!["/Applications/agentworks.app/Contents/MacOS/agentworks".into()],
            blocked: vec!["/Users/ann/src/app/secrets".into()],
            read_only_within: vec!["/Users/ann/src/app/vendor".into()],
            denied: vec![
                "/Users/ann/Library/Application Support/agentworks".into(),
                "/Users/ann/src/app/.agentworks".into(),
            ],
            read_only_if_present: vec![],
            scratch: "/Users/ann/Library/Application Support/agentworks/scratch/1".into(),
            cwd: "/Users/ann/src/app".into(),
            limits: CommandLimits::default(),
            overmount_exclusions: false,
            private_terminals: false,
        }
    }

    /// The toolchain folders and their credential files the laptop grants and denies under a
    /// home (its `grants::HOME_TOOLCHAINS` and `HOME_TOOLCHAIN_SECRETS`).
    const TOOLCHAINS: &[&str] = &[
        ".rustup",
        ".cargo",
        ".nvm",
        ".pyenv",
        ".volta",
        ".bun",
        ".deno",
        ".local/bin",
        ".local/lib",
        "go/bin",
        "go/pkg/mod",
    ];
    const TOOLCHAIN_SECRETS: &[&str] = &[".cargo/credentials", ".cargo/credentials.toml"];

    /// `policy` with the toolchains under `home` read/execute where present and their
    /// credentials denied, as the laptop grants them.
    fn with_toolchains(mut policy: SandboxPolicy, home: &str) -> SandboxPolicy {
        let home = Path::new(home);
        policy.read_only_if_present = TOOLCHAINS.iter().map(|t| home.join(t)).collect();
        let secrets = TOOLCHAIN_SECRETS.iter().map(|s| home.join(s));
        policy.denied = secrets.chain(policy.denied).collect();
        policy
    }

    /// The golden profile, reviewed by hand once: compare, never regenerate blindly.
    const GOLDEN: &str = r#";; agentworks executor: generated from the command's sandbox policy.
(version 1)
(deny default)
(allow process-fork)
(allow process-exec)
(allow signal (target same-sandbox))
(allow sysctl-read)
;; Reading a path's metadata (stat, realpath) everywhere, as lookups walk the tree.
(allow file-read-metadata)
(allow network*)
(allow mach-lookup (global-name "com.apple.system.opendirectoryd.libinfo") (global-name "com.apple.system.opendirectoryd.membership"))
(allow file-read* file-map-executable (subpath "/usr"))
(allow file-read* file-map-executable (subpath "/bin"))
(allow file-read* file-map-executable (subpath "/sbin"))
(allow file-read* file-map-executable (subpath "/System"))
(allow file-read* file-map-executable (subpath "/Library"))
(allow file-read* file-map-executable (subpath "/private/etc"))
(allow file-read* file-map-executable (subpath "/private/var/db/timezone"))
(allow file-read* file-map-executable (subpath "/opt/homebrew"))
(allow file-read* file-map-executable (subpath "/Applications/Xcode.app"))
(allow file-read* file-map-executable (subpath "/Library/Developer/CommandLineTools"))
(allow file-read* file-map-executable file-write* (literal "/dev/null"))
(allow file-read* file-map-executable file-write* (literal "/dev/zero"))
(allow file-read* file-map-executable file-write* (literal "/dev/random"))
(allow file-read* file-map-executable file-write* (literal "/dev/urandom"))
(allow file-read* file-map-executable (subpath "/Users/ann/.rustup"))
(allow file-read* file-map-executable (subpath "/Users/ann/.cargo"))
(allow file-read* file-map-executable (subpath "/Users/ann/.nvm"))
(allow file-read* file-map-executable (subpath "/Users/ann/.pyenv"))
(allow file-read* file-map-executable (subpath "/Users/ann/.volta"))
(allow file-read* file-map-executable (subpath "/Users/ann/.bun"))
(allow file-read* file-map-executable (subpath "/Users/ann/.deno"))
(allow file-read* file-map-executable (subpath "/Users/ann/.local/bin"))
(allow file-read* file-map-executable (subpath "/Users/ann/.local/lib"))
(allow file-read* file-map-executable (subpath "/Users/ann/go/bin"))
(allow file-read* file-map-executable (subpath "/Users/ann/go/pkg/mod"))
(allow file-read* file-map-executable file-write* (subpath "/Users/ann/src/app"))
(allow file-read* file-map-executable (subpath "/Users/ann/docs"))
(allow file-read* file-map-executable (subpath "/Applications/agentworks.app/Contents/MacOS/agentworks"))
(deny file-write* (subpath "/Users/ann/src/app/vendor"))
(deny file-read* file-write* (subpath "/Users/ann/src/app/secrets"))
(deny file-read* file-write* (subpath "/Users/ann/.cargo/credentials"))
(deny file-read* file-write* (subpath "/Users/ann/.cargo/credentials.toml"))
(deny file-read* file-write* (subpath "/Users/ann/Library/Application Support/agentworks"))
(deny file-read* file-write* (subpath "/Users/ann/src/app/.agentworks"))
(allow file-read* file-map-executable file-write* (subpath "/Users/ann/Library/Application Support/agentworks/scratch/1"))
"#;

    #[test]
    fn the_profile_matches_the_reviewed_golden_one() {
        let profile = Profile::generate(&with_toolchains(policy(), "/Users/ann"));
        assert_eq!(profile.text, GOLDEN);
    }

    #[test]
    fn exclusions_inside_granted_folders_win_because_they_come_after() {
        let profile = Profile::generate(&with_toolchains(policy(), "/Users/ann"));
        let read = |p: &str| profile.decide(Path::new(p), Access::Read);
        let write = |p: &str| profile.decide(Path::new(p), Access::Write);
        // The writable folder.
        assert!(read("/Users/ann/src/app/main.rs") && write("/Users/ann/src/app/main.rs"));
        // --read-only inside it: readable, not writable.
        assert!(read("/Users/ann/src/app/vendor/lib.rs"));
        assert!(!write("/Users/ann/src/app/vendor/lib.rs"));
        // --block inside it: nothing; a sibling with the same prefix is not blocked.
        assert!(!read("/Users/ann/src/app/secrets/key") && !write("/Users/ann/src/app/secrets"));
        assert!(read("/Users/ann/src/app/secrets-public/readme"));
        // The CLI's own state inside a shared folder, and its config dir.
        assert!(!read("/Users/ann/src/app/.agentworks/receipts.db"));
        assert!(!read(
            "/Users/ann/Library/Application Support/agentworks/credentials"
        ));
        // …but the scratch dir inside that config dir is the command's.
        let scratch = "/Users/ann/Library/Application Support/agentworks/scratch/1/tmpfile";
        assert!(read(scratch) && write(scratch));
        // Read-only folder, toolchains, system; nothing else (default deny).
        assert!(read("/Users/ann/docs/a.md") && !write("/Users/ann/docs/a.md"));
        assert!(read("/Users/ann/.cargo/bin/cargo") && !read("/Users/ann/.cargo/credentials.toml"));
        assert!(read("/usr/bin/git") && !write("/usr/bin/git"));
        assert!(read("/etc/hosts"), "/etc is /private/etc on macOS");
        assert!(!read("/Users/ann/.ssh/id_ed25519") && !read("/Users/ann/Desktop/a.png"));
        assert!(
            !read("/tmp/x"),
            "/tmp is not granted: TMPDIR is the scratch dir"
        );
        // Swapping the order would let the allow win: the evaluator follows the order.
        let mut swapped = profile.clone();
        let deny = swapped
            .rules
            .iter()
            .position(|r| !r.allow && r.path.ends_with("secrets"))
            .unwrap();
        let rule = swapped.rules.remove(deny);
        swapped.rules.insert(0, rule);
        assert!(swapped.decide(Path::new("/Users/ann/src/app/secrets/key"), Access::Read));
    }

    #[test]
    fn hostile_folder_names_stay_inside_their_string() {
        for name in [
            "a\")(allow file-write* (subpath \"/\"))",
            "back\\slash\\\")(allow default)",
            "new\nline (allow network*)",
            "ünïcode 😀",
            "paren)(",
        ] {
            let mut hostile = policy();
            let folder = PathBuf::from("/Users/ann/src").join(name);
            hostile.pinned[0].path = folder.clone();
            let profile = Profile::generate(&hostile);
            // Read as SBPL reads it (strings with their escapes), every line is still one rule
            // with one path: the name added no rule and no parenthesis outside its string.
            for line in profile.text.lines().filter(|l| !l.starts_with(";;")) {
                let shape = skeleton(line);
                assert!(!shape.contains("(allow default)"), "{line}");
                assert_eq!(
                    shape.matches('(').count(),
                    shape.matches(')').count(),
                    "{line}"
                );
                assert!(
                    shape.matches("(subpath").count() + shape.matches("(literal").count() <= 1,
                    "{line} reads as {shape}"
                );
            }
            assert_eq!(
                profile.text.lines().count(),
                Profile::generate(&policy()).text.lines().count(),
                "{name:?}"
            );
            assert!(profile.text.contains(&literal(&folder)));
            assert!(literal(&folder).is_ascii());
            assert!(profile.decide(&folder.join("f"), Access::Write));
            assert!(!profile.decide(Path::new("/Users/ann/other"), Access::Write));
        }
        assert_eq!(
            literal(Path::new("/a\"b\\c\nd é")),
            r#""/a\"b\\c\x0ad \xc3\xa9""#
        );
    }

    /// A line with every string literal's content removed, reading escapes as SBPL does: what
    /// is left is the line's structure.
    fn skeleton(line: &str) -> String {
        let mut out = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            out.push(c);
            if c == '"' {
                loop {
                    match chars.next() {
                        Some('\\') => {
                            chars.next();
                        }
                        Some('"') | None => break,
                        Some(_) => {}
                    }
                }
                out.push('"');
            }
        }
        out
    }

    #[test]
    fn no_profile_allows_a_denied_service_whatever_the_folders() {
        let mut broad = policy();
        broad.read_write = vec!["/".into(), "/System".into(), "/Users/ann".into()];
        for profile in [
            Profile::generate(&policy()),
            Profile::generate(&with_toolchains(broad, "/Users/ann")),
        ] {
            for line in profile.text.lines().filter(|l| l.starts_with("(allow")) {
                for service in NEVER_ALLOWED {
                    assert!(!line.contains(service), "{service} in {line}");
                }
                if line.contains("mach-lookup") {
                    assert_eq!(
                        line.matches("global-name").count(),
                        MACH_SERVICES.len(),
                        "{line}"
                    );
                }
            }
            assert!(profile.text.contains("\n(deny default)\n"));
        }
    }

    /// A hostile folder name cannot smuggle a denied service into a profile either: outside
    /// its string literals, no line of any profile names one.
    #[test]
    fn hostile_names_add_no_denied_service() {
        for name in [
            "a\")(allow file-write* (subpath \"/\"))",
            "x\")(allow iokit-open)(allow appleevent-send)(allow mach-lookup (global-name \"com.apple.pasteboard.1\"))",
            "y\")(allow lsopen)(allow mach-lookup (global-name \"com.apple.SecurityServer\"))",
        ] {
            let mut hostile = policy();
            hostile.pinned[0].path = PathBuf::from("/Users/ann/src").join(name);
            hostile
                .blocked
                .push(PathBuf::from("/Users/ann/src").join(name).join("b"));
            let profile = Profile::generate(&with_toolchains(hostile, "/Users/ann"));
            for line in profile.text.lines().filter(|l| !l.starts_with(";;")) {
                let shape = skeleton(line);
                for service in NEVER_ALLOWED {
                    assert!(!shape.contains(service), "{service} in {line}");
                }
                if shape.contains("mach-lookup") {
                    assert_eq!(shape.matches("global-name").count(), MACH_SERVICES.len());
                }
            }
            // "/" is never writable: the hostile folder is one folder, not a rule.
            assert!(!profile.decide(Path::new("/etc/passwd"), Access::Write));
            assert!(!profile.decide(Path::new("/Users/ann/.ssh/id_ed25519"), Access::Read));
        }
    }

    /// The command line the macOS launcher runs: the profile as one argument, then `--`, then
    /// the program and its arguments untouched (a name starting with `-` stays a program).
    #[test]
    fn sandbox_exec_gets_the_profile_then_the_program() {
        let profile = Profile::generate(&policy());
        let args = sandbox_exec_args(
            &profile,
            OsStr::new("/bin/sh"),
            &["-c".into(), "echo \"$HOME\"; -rf".into()],
        );
        assert_eq!(args.len(), 6);
        assert_eq!(args[0], "-p");
        assert_eq!(args[1], OsString::from(profile.text.clone()));
        assert_eq!(args[2], "--");
        assert_eq!(args[3], "/bin/sh");
        assert_eq!(args[4], "-c");
        assert_eq!(args[5], "echo \"$HOME\"; -rf");
    }

    /// Paths below `/tmp` and `/var` are written and decided as macOS names them, in rules and
    /// in questions alike.
    #[test]
    fn private_tmp_and_var_grants_decide_under_both_names() {
        let mut p = policy();
        p.pinned[0].path = "/tmp/project".into();
        p.blocked = vec!["/var/folders/zz/secret".into()];
        p.read_write = vec!["/var/folders/zz".into()];
        let profile = Profile::generate(&p);
        assert!(profile.text.contains("(subpath \"/private/tmp/project\")"));
        assert!(
            profile
                .text
                .contains("(subpath \"/private/var/folders/zz/secret\")")
        );
        assert!(!profile.text.contains("(subpath \"/tmp/"));
        for (path, write) in [
            ("/tmp/project/a", true),
            ("/private/tmp/project/a", true),
            ("/var/folders/zz/x", true),
            ("/private/var/folders/zz/x", true),
            ("/var/folders/zz/secret/k", false),
            ("/private/var/folders/zz/secret/k", false),
            ("/private/tmp/other", false),
        ] {
            assert_eq!(
                profile.decide(Path::new(path), Access::Write),
                write,
                "{path}"
            );
        }
    }

    #[test]
    fn macos_names_are_canonical() {
        assert_eq!(canonical(Path::new("/tmp/x")), Path::new("/private/tmp/x"));
        assert_eq!(
            canonical(Path::new("/var/folders/ab")),
            Path::new("/private/var/folders/ab")
        );
        assert_eq!(canonical(Path::new("/etc")), Path::new("/private/etc"));
        assert_eq!(canonical(Path::new("/tmpfoo")), Path::new("/tmpfoo"));
        assert_eq!(canonical(Path::new("/Users/ann")), Path::new("/Users/ann"));
    }
}
