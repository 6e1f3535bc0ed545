//! agentd's side of the public MCP endpoint: token authentication against the identity
//! store, the effective catalog from live permissions, and dispatch to [`FileTools`].
//!
//! It never trusts the MCP layer's word on authority beyond the token's scopes: every call
//! resolves the caller's live access again.

use crate::catalog::files::{FileTools, Source};
use crate::catalog::{Operation, OperationRunner};
use crate::identity::{IdentityStore, TokenCheckError, TokenInfo, User};
use crate::mcp::{AuthError, Caller, Reach, ToolError};
use serde_json::{Map, Value};

/// The caller a checked token names (its id, its user, its scopes).
pub fn caller_of(token: TokenInfo, user: User) -> Caller {
    Caller {
        token_id: token.id,
        user_id: user.id,
        user_name: user.name,
        scopes: token.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
        reach: None,
    }
}

/// agentd's MCP endpoint: the transport over the workflow-file catalog.
pub type AgentMcp = crate::mcp::McpService<crate::catalog::Catalog<AgentBackend>>;

pub struct AgentBackend {
    identity: IdentityStore,
    files: FileTools,
    /// `/mcp`'s URL: the one audience an OAuth access token is accepted for here.
    resource: String,
}

impl AgentBackend {
    pub fn new(identity: IdentityStore, files: FileTools, resource: String) -> AgentBackend {
        AgentBackend {
            identity,
            files,
            resource,
        }
    }
}

impl OperationRunner for AgentBackend {
    async fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, AuthError> {
        let Some(presented) = bearer else {
            return Err(AuthError::Missing);
        };
        match self
            .identity
            .check_bearer_and_reach(presented, &self.resource)
            .await
        {
            Ok((token, user, (member, author))) => {
                if let Some(grant) = token.grant_id.clone() {
                    // The connected-apps page shows when an app last used its access.
                    let identity = self.identity.clone();
                    tokio::task::spawn_blocking(move || {
                        let now = agentworks_support::clock::now_ms();
                        if let Err(error) = identity.touch_grant(&grant, now) {
                            tracing::warn!(%error, "cannot note an OAuth grant's use");
                        }
                    });
                }
                Ok(Caller {
                    reach: Some(Reach { member, author }),
                    ..caller_of(token, user)
                })
            }
            Err(TokenCheckError::Refused(refusal)) => Err(refusal.into()),
            // The store is unavailable: refuse rather than guess.
            Err(error) => {
                tracing::warn!(%error, "token check failed");
                Err(AuthError::Invalid)
            }
        }
    }

    async fn allowed_operations(&self, caller: &Caller) -> Vec<Operation> {
        // Is the user a member (an author) anywhere this token reaches? Read with the token in
        // `authenticate`, the only maker of this runner's callers; one without it is allowed
        // nothing. The call itself still resolves the project's full access (policy, caps).
        let Some(Reach { member, author }) = caller.reach else {
            return Vec::new();
        };
        Operation::ALL
            .into_iter()
            .filter(|op| match op {
                Operation::ListWorkflows => true,
                // Every change, and the receipt lookup that resolves one, needs an author.
                op if op.is_change() || *op == Operation::GetWriteReceipt => author,
                _ => member,
            })
            .collect()
    }

    async fn call(
        &self,
        caller: &Caller,
        operation: Operation,
        arguments: Map<String, Value>,
    ) -> Result<Value, ToolError> {
        let source = Source::Mcp;
        match operation {
            Operation::ListWorkflows => self.files.list_workflows(caller).await,
            Operation::ListFiles => self.files.list_files(caller, &arguments, source).await,
            Operation::ReadFile => self.files.read_file(caller, &arguments, source).await,
            Operation::ReadFiles => self.files.read_files(caller, &arguments, source).await,
            Operation::GetFileInfo => self.files.get_file_info(caller, &arguments, source).await,
            Operation::SearchFiles => self.files.search_files(caller, &arguments, source).await,
            Operation::WriteFile => self.files.write_file(caller, &arguments, source).await,
            Operation::EditFile => self.files.edit_file(caller, &arguments, source).await,
            Operation::MoveFile => self.files.move_file(caller, &arguments, source).await,
            Operation::DeleteFile => self.files.delete_file(caller, &arguments, source).await,
            Operation::ApplyPatch => self.files.apply_patch(caller, &arguments, source).await,
            Operation::GetWriteReceipt => {
                self.files
                    .get_write_receipt(caller, &arguments, source)
                    .await
            }
        }
    }
}
