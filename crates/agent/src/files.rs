//! The catalog's file operations, executed for one authenticated caller through workspaced.
//!
//! Shared by the public MCP endpoint and the agent loop's server-mode tools. Every call
//! re-reads the live rows (token, user, role, policy), resolves the caller's access with
//! `identity::authority`, and passes the resolved guard to workspaced, which re-applies it.
//! A project the caller cannot see is reported exactly like one that does not exist.
//!
//! This module never opens a document itself: workspaced does.

use crate::identity::authority::{self, Access, AccessInputs};
use crate::identity::{IdentityStore, Project};
use crate::mcp::{Caller, ToolError};
use agentworks_contract::workspaced::{
    ChangeResponse, Context, ListRequest, ListResponse, Principal, ReadRequest, ReadResponse,
    Receipt, ReceiptRequest, SearchRequest, SearchResponse, WriteRequest,
};
use agentworks_support::unix_http::{ClientError, UnixClient};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// Where a file operation came from, recorded on receipts.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    Mcp,
    Agent,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Mcp => "mcp",
            Source::Agent => "agent",
        }
    }
}

/// File operations against workspaced with live authority.
#[derive(Clone)]
pub struct FileTools {
    identity: IdentityStore,
    workspaced: UnixClient,
}

fn not_visible(workflow_id: &str) -> ToolError {
    ToolError::new(
        "not_found",
        format!("workflow {workflow_id:?} does not exist or is not visible to this token"),
    )
}

fn unavailable(what: impl std::fmt::Display) -> ToolError {
    ToolError::new("unavailable", format!("{what}; try again shortly"))
}

/// workspaced's envelope becomes the tool error as it is: same code, message and details.
fn from_workspaced(error: ClientError) -> ToolError {
    match error {
        ClientError::Remote { body, .. } => ToolError {
            code: body.code,
            message: body.message,
            details: body.details,
        },
        other => unavailable(format!("the file service is unavailable ({other})")),
    }
}

fn string_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ToolError> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| {
        ToolError::new(
            "invalid_arguments",
            format!("the argument {name:?} (a string) is required"),
        )
    })
}

fn optional_string_arg<'a>(
    args: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a str>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ToolError::new(
            "invalid_arguments",
            format!("the argument {name:?} must be a string"),
        )),
    }
}

impl FileTools {
    pub fn new(identity: IdentityStore, workspaced: UnixClient) -> FileTools {
        FileTools {
            identity,
            workspaced,
        }
    }

    /// Live access of `caller` to `workflow_id` (a project id or name).
    pub async fn access(
        &self,
        caller: &Caller,
        workflow_id: &str,
    ) -> Result<(Project, Access), ToolError> {
        let identity = self.identity.clone();
        let caller = caller.clone();
        let workflow = workflow_id.to_owned();
        tokio::task::spawn_blocking(move || -> Result<Option<(Project, Access)>, ToolError> {
            let store_err = |e: crate::identity::IdentityError| unavailable(e);
            let Some(token) = identity.token_by_id(&caller.token_id).map_err(store_err)? else {
                return Ok(None);
            };
            // Revoked or expired since the request was authenticated: counts now.
            if token.revoked_at_ms.is_some()
                || token
                    .expires_at_ms
                    .is_some_and(|t| t <= agentworks_support::clock::now_ms())
            {
                return Err(ToolError::new(
                    "unauthorized",
                    "the token was revoked or has expired",
                ));
            }
            let Some(user) = identity.user_by_id(&token.user_id).map_err(store_err)? else {
                return Ok(None);
            };
            let Some(project) = identity.find_project(&workflow).map_err(store_err)? else {
                return Ok(None);
            };
            let role = identity.role_of(&project.id, &user.id).map_err(store_err)?;
            let access = authority::resolve(&AccessInputs {
                scopes: &token.scopes,
                token_project: token.project_id.as_deref(),
                file_guard: &token.file_guard,
                user_disabled: user.disabled,
                project_id: &project.id,
                policy_json: Some(&project.policy),
                role,
            });
            Ok(access.can_read.then_some((project, access)))
        })
        .await
        .map_err(|e| unavailable(format!("the identity lookup failed ({e})")))??
        .ok_or_else(|| not_visible(workflow_id))
    }

    fn context(
        &self,
        caller: &Caller,
        project: &Project,
        access: &Access,
        source: Source,
    ) -> Context {
        Context {
            project: project.folder.clone(),
            principal: Principal {
                user_id: caller.user_id.clone(),
                user_name: caller.user_name.clone(),
                connection_id: Some(format!("token:{}", caller.token_id)),
                source: source.as_str().into(),
            },
            guard: access.guard.clone(),
        }
    }

    async fn workspaced<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        endpoint: &str,
        body: &Req,
    ) -> Result<Resp, ToolError> {
        self.workspaced
            .post(endpoint, body)
            .await
            .map_err(from_workspaced)
    }

    /// The workflows (projects) this caller may see, with what it may do in each.
    pub async fn list_workflows(&self, caller: &Caller) -> Result<Value, ToolError> {
        let identity = self.identity.clone();
        let user_id = caller.user_id.clone();
        let projects = tokio::task::spawn_blocking(move || identity.projects_of(&user_id))
            .await
            .map_err(|e| unavailable(format!("the identity lookup failed ({e})")))?
            .map_err(unavailable)?;
        let mut workflows = Vec::new();
        for (project, role) in projects {
            // Re-resolve per project: token restriction, scopes and policy all apply.
            if let Ok((project, access)) = self.access(caller, &project.id).await {
                workflows.push(json!({
                    "workflow_id": project.id,
                    "name": project.name,
                    "kind": project.kind.as_str(),
                    "role": role.as_str(),
                    "can_write": access.can_write,
                }));
            }
        }
        Ok(json!({ "workflows": workflows }))
    }

    /// A read in the caller's project: resolve live access to `workflow_id`, send the request
    /// `make` builds from the context to workspaced's `endpoint`, and tag the answer with the
    /// workflow id.
    async fn read_in_project<Req: Serialize, Resp: Serialize + DeserializeOwned>(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
        endpoint: &str,
        make: impl FnOnce(Context) -> Req,
    ) -> Result<Value, ToolError> {
        let workflow = string_arg(args, "workflow_id")?;
        let (project, access) = self.access(caller, workflow).await?;
        let request = make(self.context(caller, &project, &access, source));
        let answer: Resp = self.workspaced(endpoint, &request).await?;
        let mut answer = serde_json::to_value(answer)
            .map_err(|e| unavailable(format!("workspaced's answer does not encode ({e})")))?;
        answer["workflow_id"] = json!(project.id);
        Ok(answer)
    }

    pub async fn list_files(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let path = optional_string_arg(args, "path")?.unwrap_or("").to_owned();
        self.read_in_project::<_, ListResponse>(caller, args, source, "/v1/list", |context| {
            ListRequest {
                context,
                path,
                recursive: true,
                depth: None,
                exclude: Vec::new(),
                max_entries: None,
            }
        })
        .await
    }

    pub async fn read_file(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let path = string_arg(args, "path")?.to_owned();
        self.read_in_project::<_, ReadResponse>(caller, args, source, "/v1/read", |context| {
            ReadRequest {
                context,
                path,
                offset: None,
                limit: None,
            }
        })
        .await
    }

    pub async fn search_files(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let query = string_arg(args, "query")?.to_owned();
        let path = optional_string_arg(args, "path")?.unwrap_or("").to_owned();
        self.read_in_project::<_, SearchResponse>(caller, args, source, "/v1/search", |context| {
            SearchRequest {
                context,
                query,
                path,
                max_results: None,
            }
        })
        .await
    }

    pub async fn write_file(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let workflow = string_arg(args, "workflow_id")?;
        let path = string_arg(args, "path")?;
        let content = string_arg(args, "content")?;
        let expected = string_arg(args, "expected_revision")?;
        let request_id = string_arg(args, "request_id")?;
        let (project, access) = self.access(caller, workflow).await?;
        if !access.can_write {
            let mut error = ToolError::new(
                "forbidden",
                format!(
                    "writing is not allowed here: {}",
                    access.denial.as_deref().unwrap_or("no write authority")
                ),
            );
            error
                .details
                .insert("reason".into(), json!("no_write_authority"));
            return Err(error);
        }
        let request = WriteRequest {
            context: self.context(caller, &project, &access, source),
            path: path.to_owned(),
            content: content.to_owned(),
            expected_revision: expected.to_owned(),
            request_id: request_id.to_owned(),
        };
        let written: ChangeResponse = self.workspaced("/v1/write", &request).await?;
        Ok(json!({
            "workflow_id": project.id,
            "path": path,
            "state": written.state,
            "replayed": written.replayed,
            "revision": written.revision,
            "previous_revision": written.previous_revision,
            "receipt_id": written.receipt.receipt_id,
            "receipt": written.receipt,
        }))
    }

    pub async fn get_write_receipt(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let workflow = string_arg(args, "workflow_id")?;
        let request_id = string_arg(args, "request_id")?;
        let (project, access) = self.access(caller, workflow).await?;
        // The lookup is keyed by the caller's own user id: another user's request id never
        // finds (or replays) their receipt.
        let request = ReceiptRequest {
            context: self.context(caller, &project, &access, source),
            request_id: request_id.to_owned(),
        };
        let receipt: Receipt = self.workspaced("/v1/receipt", &request).await?;
        Ok(json!({ "workflow_id": project.id, "receipt": receipt }))
    }
}
