//! The write authority, as one pure function of live identity rows:
//!
//! `token scope ∩ the user's live role on the project ∩ the token's file_guard ∩ project policy`
//!
//! with blocked, read-only and protected paths taking precedence (those are enforced by the
//! guard, which workspaced re-applies). Anything that does not parse refuses: a project policy
//! that cannot be read gives no access at all, because its blocked paths are unknown.

use agentworks_core::guard::{Guard, RelPath};
use serde::{Deserialize, Serialize};

pub use agentworks_contract::agentd::{Role, Scope};

/// Folder caps persisted on a token; they can only narrow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileGuard {
    /// `None`: no narrowing of the project's write paths. `Some([])`: nothing writable.
    #[serde(default)]
    pub write_folders: Option<Vec<String>>,
    #[serde(default)]
    pub read_only_folders: Vec<String>,
}

/// What one caller may do in one project right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub can_read: bool,
    pub can_write: bool,
    /// The user's live role on the project (`None` when nothing is allowed). Running commands
    /// or patches on a laptop folder needs a role that [`Role::can_author`], whatever the
    /// token's workflows scope.
    pub role: Option<Role>,
    /// The guard workspaced re-applies; `write_paths` is empty unless `can_write`.
    pub guard: Guard,
    /// Why writes (or everything) are refused, for the error message.
    pub denial: Option<String>,
}

impl Access {
    fn none(reason: impl Into<String>) -> Access {
        Access {
            can_read: false,
            can_write: false,
            role: None,
            guard: Guard::default(),
            denial: Some(reason.into()),
        }
    }
}

/// The inputs, read from live rows by the caller.
pub struct AccessInputs<'a> {
    pub scopes: &'a [Scope],
    /// The projects the token is restricted to (`None`: every project the user is in).
    pub token_projects: Option<&'a [String]>,
    pub file_guard: &'a FileGuard,
    pub user_disabled: bool,
    pub project_id: &'a str,
    /// The project's policy as stored (JSON of a [`Guard`]); `None` if missing.
    pub policy_json: Option<&'a str>,
    pub role: Option<Role>,
}

/// Intersect two folder lists component-wise: the result allows exactly what both allow.
fn intersect(a: &[String], b: &[String]) -> Result<Vec<String>, String> {
    let parse = |s: &String| RelPath::parse_folder(s).map_err(|e| e.to_string());
    let mut out = Vec::new();
    for x in a {
        let px = parse(x)?;
        for y in b {
            let py = parse(y)?;
            let narrower = match (&px, &py) {
                (None, _) => py.clone(),
                (_, None) => px.clone(),
                (Some(p), Some(q)) if p.is_within(q) => Some(p.clone()),
                (Some(p), Some(q)) if q.is_within(p) => Some(q.clone()),
                _ => continue,
            };
            let s = narrower
                .map(|p| p.to_string())
                .unwrap_or_else(|| ".".into());
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    Ok(out)
}

pub fn resolve(input: &AccessInputs<'_>) -> Access {
    if input.user_disabled {
        return Access::none("the user is disabled");
    }
    if input
        .token_projects
        .is_some_and(|projects| !projects.iter().any(|p| p == input.project_id))
    {
        return Access::none("the token is restricted to other projects");
    }
    let Some(role) = input.role else {
        return Access::none("the user is not a member of this project");
    };
    let reads = [
        Scope::WorkflowsRead,
        Scope::WorkflowsRun,
        Scope::WorkflowsWrite,
    ];
    if !input.scopes.iter().any(|s| reads.contains(s)) {
        return Access::none("the token has no workflows scope");
    }
    let policy = match input.policy_json.map(serde_json::from_str::<Guard>) {
        Some(Ok(policy)) if policy.resolve().is_ok() => policy,
        _ => return Access::none("the project's policy is missing or unreadable; refusing"),
    };
    let mut guard = Guard {
        write_paths: Vec::new(),
        blocked_paths: policy.blocked_paths.clone(),
        blocked_write_paths: policy.blocked_write_paths.clone(),
        read_only_paths: policy.read_only_paths.clone(),
    };
    guard
        .read_only_paths
        .extend(input.file_guard.read_only_folders.iter().cloned());
    let mut denial = None;
    let can_write = if !input.scopes.contains(&Scope::WorkflowsWrite) {
        denial = Some("the token lacks the workflows:write scope".to_string());
        false
    } else if !role.can_author() {
        denial = Some(format!("the role {} cannot author files", role.as_str()));
        false
    } else {
        let narrowed = match &input.file_guard.write_folders {
            None => Ok(policy.write_paths.clone()),
            Some(caps) => intersect(&policy.write_paths, caps),
        };
        match narrowed {
            Ok(paths) if !paths.is_empty() => {
                guard.write_paths = paths;
                true
            }
            Ok(_) => {
                denial = Some(
                    "no folder is writable under the token's folder caps and the project's policy"
                        .into(),
                );
                false
            }
            Err(e) => {
                denial = Some(format!(
                    "the token's folder caps do not parse ({e}); refusing"
                ));
                false
            }
        }
    };
    if guard.resolve().is_err() {
        return Access::none("the token's folder caps do not parse; refusing");
    }
    Access {
        can_read: true,
        can_write,
        role: Some(role),
        guard,
        denial,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs<'a>(
        scopes: &'a [Scope],
        role: Option<Role>,
        fg: &'a FileGuard,
        policy: Option<&'a str>,
    ) -> AccessInputs<'a> {
        AccessInputs {
            scopes,
            token_projects: None,
            file_guard: fg,
            user_disabled: false,
            project_id: "p1",
            policy_json: policy,
            role,
        }
    }

    const OPEN: &str = r#"{"write_paths":["."],"blocked_paths":["secret"]}"#;

    #[test]
    fn the_matrix() {
        let fg = FileGuard::default();
        let w = [Scope::WorkflowsWrite];
        let r = [Scope::WorkflowsRead];
        let run = [Scope::WorkflowsRun];
        let dev = [Scope::DevicesConnect];
        let approve = [Scope::DevicesApprove];
        let a = resolve(&inputs(&w, Some(Role::Editor), &fg, Some(OPEN)));
        assert!(a.can_read && a.can_write);
        assert_eq!(a.guard.write_paths, vec!["."]);
        assert_eq!(a.guard.blocked_paths, vec!["secret"]);
        for scopes in [&r[..], &run[..]] {
            let a = resolve(&inputs(scopes, Some(Role::Owner), &fg, Some(OPEN)));
            assert!(a.can_read && !a.can_write);
            assert!(
                a.guard.write_paths.is_empty(),
                "read/run tokens never acquire writes"
            );
        }
        for role in [Role::Runner, Role::Viewer] {
            let a = resolve(&inputs(&w, Some(role), &fg, Some(OPEN)));
            assert!(a.can_read && !a.can_write, "{role:?}");
            assert_eq!(a.role, Some(role));
            assert!(!role.can_author());
        }
        assert!(!resolve(&inputs(&dev, Some(Role::Owner), &fg, Some(OPEN))).can_read);
        assert!(!resolve(&inputs(&approve, Some(Role::Owner), &fg, Some(OPEN))).can_read);
        assert!(!resolve(&inputs(&w, None, &fg, Some(OPEN))).can_read);
        assert!(
            !resolve(&inputs(&w, Some(Role::Owner), &fg, None)).can_read,
            "missing policy refuses"
        );
        assert!(!resolve(&inputs(&w, Some(Role::Owner), &fg, Some("{not json"))).can_read);
        let mut restricted = inputs(&w, Some(Role::Owner), &fg, Some(OPEN));
        let elsewhere = ["p2".to_string()];
        restricted.token_projects = Some(&elsewhere);
        assert!(!resolve(&restricted).can_read);
        let mut disabled = inputs(&w, Some(Role::Owner), &fg, Some(OPEN));
        disabled.user_disabled = true;
        assert!(!resolve(&disabled).can_read);
    }

    #[test]
    fn folder_caps_only_narrow() {
        let w = [Scope::WorkflowsWrite];
        let caps = FileGuard {
            write_folders: Some(vec!["code".into(), "other".into()]),
            read_only_folders: vec!["code/vendor".into()],
        };
        let policy = r#"{"write_paths":["code/steps","docs"]}"#;
        let a = resolve(&inputs(&w, Some(Role::Owner), &caps, Some(policy)));
        assert!(a.can_write);
        assert_eq!(a.guard.write_paths, vec!["code/steps"]);
        assert_eq!(a.guard.read_only_paths, vec!["code/vendor"]);
        let none = FileGuard {
            write_folders: Some(vec![]),
            read_only_folders: vec![],
        };
        let a = resolve(&inputs(&w, Some(Role::Owner), &none, Some(OPEN)));
        assert!(a.can_read && !a.can_write);
        let wider = FileGuard {
            write_folders: Some(vec![".".into()]),
            read_only_folders: vec![],
        };
        let a = resolve(&inputs(&w, Some(Role::Owner), &wider, Some(policy)));
        assert_eq!(
            a.guard.write_paths,
            vec!["code/steps", "docs"],
            "a cap never widens the policy"
        );
    }

    #[test]
    fn devices_connect_and_devices_approve_are_exclusive() {
        assert!(Scope::validate_set(&[Scope::DevicesConnect]).is_ok());
        assert!(Scope::validate_set(&[Scope::DevicesApprove]).is_ok());
        assert!(Scope::validate_set(&[Scope::DevicesConnect, Scope::WorkflowsRead]).is_err());
        assert!(Scope::validate_set(&[Scope::DevicesApprove, Scope::WorkflowsWrite]).is_err());
        assert!(Scope::validate_set(&[Scope::DevicesApprove, Scope::DevicesConnect]).is_err());
        assert!(Scope::validate_set(&[]).is_err());
        assert_eq!(
            Scope::parse("devices:approve").map(Scope::as_str),
            Some("devices:approve")
        );
    }
}
