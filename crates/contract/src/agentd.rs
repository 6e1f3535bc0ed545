//! `agentd.sock`: the operator endpoints `agentworksctl` calls, and the gateway endpoints
//! gatewayd calls to check executor tokens (`/v1/gateway/token-check`, `/v1/gateway/token-status`).
//!
//! Also the identity vocabulary those bodies carry: token scopes, project roles, project kinds.

use agentworks_core::guard::Guard;
use serde::{Deserialize, Serialize};

/// Token scopes. `devices:connect` and `devices:approve` are exclusive: a token with one of them
/// has no other scope.
///
/// `devices:approve` lets a bearer token approve a laptop's device login (`agentworks login`)
/// for its user: an account-level act, otherwise done only through the operator socket
/// (`agentworksctl login approve`). No token has it unless it is asked for by name when the
/// token is created; the device grant never mints it; it gives no MCP, chat or executor access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scope {
    #[serde(rename = "workflows:read")]
    WorkflowsRead,
    #[serde(rename = "workflows:run")]
    WorkflowsRun,
    #[serde(rename = "workflows:write")]
    WorkflowsWrite,
    #[serde(rename = "devices:connect")]
    DevicesConnect,
    #[serde(rename = "devices:approve")]
    DevicesApprove,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::WorkflowsRead => "workflows:read",
            Scope::WorkflowsRun => "workflows:run",
            Scope::WorkflowsWrite => "workflows:write",
            Scope::DevicesConnect => "devices:connect",
            Scope::DevicesApprove => "devices:approve",
        }
    }

    pub fn parse(raw: &str) -> Option<Scope> {
        match raw {
            "workflows:read" => Some(Scope::WorkflowsRead),
            "workflows:run" => Some(Scope::WorkflowsRun),
            "workflows:write" => Some(Scope::WorkflowsWrite),
            "devices:connect" => Some(Scope::DevicesConnect),
            "devices:approve" => Some(Scope::DevicesApprove),
            _ => None,
        }
    }

    /// Refuse a scope set that mixes `devices:connect` or `devices:approve` with anything, or
    /// is empty.
    pub fn validate_set(scopes: &[Scope]) -> Result<(), String> {
        if scopes.is_empty() {
            return Err("a token needs at least one scope".into());
        }
        for exclusive in [Scope::DevicesConnect, Scope::DevicesApprove] {
            if scopes.contains(&exclusive) && scopes.len() > 1 {
                return Err(format!(
                    "{} is exclusive: a token with it can have no other scope",
                    exclusive.as_str()
                ));
            }
        }
        Ok(())
    }
}

/// Roles on a project. Owners, co-owners and editors author; runners and viewers do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Owner,
    CoOwner,
    Editor,
    Runner,
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::CoOwner => "co-owner",
            Role::Editor => "editor",
            Role::Runner => "runner",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(raw: &str) -> Option<Role> {
        match raw {
            "owner" => Some(Role::Owner),
            "co-owner" => Some(Role::CoOwner),
            "editor" => Some(Role::Editor),
            "runner" => Some(Role::Runner),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }

    pub fn can_author(self) -> bool {
        matches!(self, Role::Owner | Role::CoOwner | Role::Editor)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProjectKind {
    Workflow,
    Code,
}

impl ProjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProjectKind::Workflow => "workflow",
            ProjectKind::Code => "code",
        }
    }
    pub fn parse(raw: &str) -> Option<ProjectKind> {
        match raw {
            "workflow" => Some(ProjectKind::Workflow),
            "code" => Some(ProjectKind::Code),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserRequest {
    pub name: String,
}

/// `users/{name}/password`: set a user's console password (8-1024 characters). No `Debug`,
/// so it is never logged.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasswordRequest {
    pub password: String,
}

/// The answer of `users/{name}/invites` and `users/{name}/sign-in-links`: a one-time console
/// link (`<public_url>/console/invite#code=…` or `…/console/sign-in#code=…`), shown once.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConsoleLink {
    pub url: String,
    pub expires_at_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectRequest {
    pub name: String,
    pub kind: ProjectKind,
    pub owner: String,
    /// The folder under the documents root; defaults to the project's name.
    #[serde(default)]
    pub folder: Option<String>,
    /// The project policy; defaults to "the whole project is writable" (protected files and
    /// dot-paths are never writable regardless).
    #[serde(default)]
    pub policy: Option<Guard>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberRequest {
    pub project: String,
    pub user: String,
    #[serde(default)]
    pub role: Option<Role>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRequest {
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    pub user: String,
    pub scopes: Vec<Scope>,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    #[serde(default)]
    pub write_folders: Option<Vec<String>>,
    #[serde(default)]
    pub read_only_folders: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptShowRequest {
    pub project: String,
    pub request_id: String,
    /// Whose request id it is (ids are scoped to the caller who sent them).
    pub user: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApproveLoginRequest {
    pub user_code: String,
    pub user: String,
}

/// Why a presented bearer token was refused. Its [`TokenRefusal::code`] is the error code
/// every agentd endpoint answers (MCP, chats, the device login, `token-check`), and gatewayd
/// passes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Unknown, malformed or not matching its secret (or its user is gone).
    Invalid,
    Expired,
    Revoked,
    /// The token's user is disabled.
    Disabled,
}

impl TokenRefusal {
    pub fn code(self) -> &'static str {
        match self {
            TokenRefusal::Invalid => "invalid_token",
            TokenRefusal::Expired => "token_expired",
            TokenRefusal::Revoked => "token_revoked",
            TokenRefusal::Disabled => "user_disabled",
        }
    }

    /// What a person is told.
    pub fn message(self) -> &'static str {
        match self {
            TokenRefusal::Invalid => "the bearer token is not valid",
            TokenRefusal::Expired => "the bearer token has expired",
            TokenRefusal::Revoked => "the bearer token has been revoked",
            TokenRefusal::Disabled => "the token's user is disabled",
        }
    }
}

/// gatewayd asks: is this presented token a live `devices:connect` token, and whose?
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCheckRequest {
    pub token: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCheckResponse {
    pub token_id: String,
    pub user_id: String,
    pub user_name: String,
}

/// gatewayd asks about every connected device's token at once: which are no longer valid?
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenStatusRequest {
    pub token_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenStatusResponse {
    /// Revoked, expired, unknown, or whose user is disabled.
    pub invalid: Vec<String>,
}
