//! The catalog's file operations, executed for one authenticated caller through workspaced.
//!
//! Shared by the public MCP endpoint and the agent loop's server-mode tools. Every call
//! re-reads the live rows (token, user, role, policy), resolves the caller's access with
//! `identity::authority`, and passes the resolved guard to workspaced, which re-applies it.
//! A project the caller cannot see is reported exactly like one that does not exist.
//!
//! Every change (write, edit, move, delete) takes one path, [`FileTools::change_in_project`]:
//! live access, write authority, then workspaced, which re-applies the guard (protected files,
//! blocked and read-only paths, confinement), takes the project lock, checks the expected
//! revision and keeps the receipt that makes a request id idempotent.
//!
//! A tool that acts for the project (commands on a laptop folder, an MCP connection with the
//! project's secrets) also needs an authoring role ([`require_authoring_role_for`]).
//!
//! This module never opens a document itself: workspaced does.

use crate::catalog::{
    EDIT_FILE_MAX_EDITS, LIST_FILES_MAX_DEPTH, LIST_FILES_MAX_ENTRIES, LIST_FILES_MAX_EXCLUDES,
    READ_FILES_MAX_PATHS,
};
use crate::identity::authority::{self, Access, AccessInputs};
use crate::identity::{IdentityStore, Project};
use crate::mcp::{Caller, ToolError};
use agentworks_contract::workspaced::{
    ChangeResponse, Context, DeleteRequest, EditAnswer, EditRequest, ListRequest, ListResponse,
    MoveRequest, PatchSetRequest, PatchSetResponse, Principal, ReadRequest, ReadResponse,
    ReceiptAnswer, ReceiptRequest, ReceiptState, SearchRequest, SearchResponse, StatRequest,
    StatResponse, TextEdit, WriteRequest,
};
use agentworks_daemon::ipc::envelope::Refusal;
use agentworks_support::unix_http::ClientError;
use hyper::StatusCode;
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

/// Refuses `what` (a tool that acts for the project: a laptop folder, an MCP connection with
/// the project's secrets) unless the person's live role on the project is owner, co-owner or
/// editor: 403 `forbidden`, reason `no_authoring_role`, with the role.
pub fn require_authoring_role_for(access: &Access, what: &str) -> Result<(), ToolError> {
    if access.role.is_some_and(|role| role.can_author()) {
        return Ok(());
    }
    let role = access.role.map_or("none", |role| role.as_str());
    let mut error = ToolError::new(
        "forbidden",
        format!(
            "{what} needs an authoring role (owner, co-owner or editor) on the project; your role is {role}; nothing was run"
        ),
    );
    error
        .details
        .insert("reason".into(), json!("no_authoring_role"));
    error.details.insert("role".into(), json!(role));
    Err(error)
}

/// A file-tool refusal (from a live access check, [`FileTools::access`]) as the REST API's
/// refusal (the chats', the connections').
pub fn from_tool(error: ToolError) -> Refusal {
    let status = match error.code.as_str() {
        "not_found" => StatusCode::NOT_FOUND,
        "unauthorized" => StatusCode::UNAUTHORIZED,
        "forbidden" => StatusCode::FORBIDDEN,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    Refusal {
        status,
        code: error.code,
        message: error.message,
        details: error.details,
    }
}

/// File operations against workspaced with live authority.
#[derive(Clone)]
pub struct FileTools {
    identity: IdentityStore,
    workspaced: crate::clients::workspaced::WorkspacedClient,
}

fn not_visible(workflow_id: &str) -> ToolError {
    ToolError::new(
        "not_found",
        format!("workflow {workflow_id:?} does not exist or is not visible to this token"),
    )
}

/// The tool error for a patch set's answer whose `state` is not `applied` (only a replay of
/// a set that stopped part way, or whose files were changed since, answers so): the code says
/// what the recorded states add up to, the message names each file's, and the details are the
/// answer itself (`state`, `replayed`, `files`, …).
fn not_wholly_applied(answer: Map<String, Value>) -> ToolError {
    let files: Vec<(&str, &str)> = answer["files"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            (
                f["path"].as_str().unwrap_or("?"),
                f["state"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    let applied = files.iter().filter(|(_, s)| *s == "applied").count();
    let not_applied = files.iter().filter(|(_, s)| *s == "not_applied").count();
    let code = if applied > 0 && applied + not_applied == files.len() {
        "partially_applied"
    } else if not_applied == files.len() {
        "not_applied"
    } else {
        "uncertain"
    };
    let states: Vec<String> = files
        .iter()
        .map(|(path, state)| format!("{path}: {state}"))
        .collect();
    let message = format!(
        "request {} was sent before and is not wholly applied ({}; the set is {}); nothing was \
         done again: re-read the files and send what is still to change under a new request_id",
        answer["request_id"].as_str().unwrap_or("?"),
        states.join(", "),
        answer["state"].as_str().unwrap_or("?"),
    );
    ToolError {
        code: code.to_owned(),
        message,
        details: answer,
    }
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

fn invalid_argument(name: &str, message: String) -> ToolError {
    let mut error = ToolError::new("invalid_arguments", message);
    error.details.insert("field".into(), json!(name));
    error
}

/// An optional non-negative integer argument, at most `max`.
fn optional_count_arg(
    args: &Map<String, Value>,
    name: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(invalid_argument(
                name,
                format!("the argument {name:?} must be an integer from {min} to {max}"),
            )),
        },
    }
}

fn optional_bool_arg(args: &Map<String, Value>, name: &str) -> Result<bool, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid_argument(
            name,
            format!("the argument {name:?} must be a boolean"),
        )),
    }
}

/// A list of strings of at most `max` entries (absent: empty).
fn string_list_arg(
    args: &Map<String, Value>,
    name: &str,
    max: usize,
) -> Result<Vec<String>, ToolError> {
    let wrong = || {
        invalid_argument(
            name,
            format!("the argument {name:?} must be a list of at most {max} strings"),
        )
    };
    match args.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) if items.len() <= max => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or_else(wrong))
            .collect(),
        Some(_) => Err(wrong()),
    }
}

/// A tool error as a value inside a successful answer (`read_files`' per-path errors), in the
/// shape of a tool result's error: details, then `code` and `message` written last so a detail
/// cannot forge them.
fn error_value(error: ToolError) -> Value {
    let mut body = error.details;
    body.insert("code".into(), Value::String(error.code));
    body.insert("message".into(), Value::String(error.message));
    Value::Object(body)
}

/// The answer every change shares: which file, the outcome, the revisions and the receipt.
fn change_answer(project: &Project, path: &str, change: ChangeResponse) -> Map<String, Value> {
    let mut answer = Map::new();
    answer.insert("workflow_id".into(), json!(project.id));
    answer.insert("path".into(), json!(path));
    answer.insert("state".into(), json!(change.state));
    answer.insert("replayed".into(), json!(change.replayed));
    answer.insert("revision".into(), json!(change.revision));
    answer.insert("previous_revision".into(), json!(change.previous_revision));
    answer.insert("receipt_id".into(), json!(change.receipt.receipt_id));
    answer.insert("receipt".into(), json!(change.receipt));
    answer
}

/// The most bytes of file content one `read_files` answer carries in all; a file past it is
/// answered with a `too_large` error of its own (read it alone, or by line range).
pub const READ_FILES_MAX_CONTENT_BYTES: u64 = 8 * 1024 * 1024;

impl FileTools {
    pub fn new(
        identity: IdentityStore,
        workspaced: crate::clients::workspaced::WorkspacedClient,
    ) -> FileTools {
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
        self.identity
            .read_soon(move || -> Result<Option<(Project, Access)>, ToolError> {
                let store_err = |e: crate::identity::IdentityError| unavailable(e);
                let Some((token, user, project)) = identity
                    .project_access_rows(&caller.token_id, &workflow)
                    .map_err(store_err)?
                else {
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
                let Some((project, role)) = project else {
                    return Ok(None);
                };
                let restriction = token.project_restriction();
                let access = authority::resolve(&AccessInputs {
                    scopes: &token.scopes,
                    token_projects: restriction.as_deref(),
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

    /// Calls `endpoint` of the workspaced holding `project`.
    async fn workspaced<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        project: &Project,
        endpoint: &str,
        body: &Req,
    ) -> Result<Resp, ToolError> {
        self.workspaced
            .post(&project.folder, endpoint, body)
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
        let answer: Resp = self.workspaced(&project, endpoint, &request).await?;
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
        let depth = optional_count_arg(args, "depth", 1, LIST_FILES_MAX_DEPTH)?;
        let exclude = string_list_arg(args, "exclude", LIST_FILES_MAX_EXCLUDES)?;
        let max_entries = optional_count_arg(args, "max_entries", 1, LIST_FILES_MAX_ENTRIES)?;
        self.read_in_project::<_, ListResponse>(caller, args, source, "/v1/list", |context| {
            ListRequest {
                context,
                path,
                // Every level unless `depth` says otherwise (it wins over `recursive`).
                recursive: true,
                // Both bounds are at most 64 and 10 000 (checked above): they fit a usize.
                depth: depth.map(|d| d as usize),
                exclude,
                max_entries: max_entries.map(|m| m as usize),
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
        let offset = optional_count_arg(args, "offset", 0, u64::MAX)?;
        let limit = optional_count_arg(args, "limit", 1, u64::MAX)?;
        self.read_in_project::<_, ReadResponse>(caller, args, source, "/v1/read", |context| {
            ReadRequest {
                context,
                path,
                offset,
                limit,
            }
        })
        .await
    }

    /// Several whole files of one workflow: live access resolved once, then each path read on
    /// its own, so a refused, missing or oversized one is that path's error and the others
    /// still answer. Read one after another: at most [`READ_FILES_MAX_PATHS`] local reads, and
    /// the answer's content stays within [`READ_FILES_MAX_CONTENT_BYTES`].
    pub async fn read_files(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let workflow = string_arg(args, "workflow_id")?;
        let paths = string_list_arg(args, "paths", READ_FILES_MAX_PATHS)?;
        if paths.is_empty() {
            return Err(invalid_argument(
                "paths",
                "read_files needs at least one path".into(),
            ));
        }
        let (project, access) = self.access(caller, workflow).await?;
        let context = self.context(caller, &project, &access, source);
        let mut budget = READ_FILES_MAX_CONTENT_BYTES;
        let mut files = Vec::with_capacity(paths.len());
        let mut failed = 0;
        for path in paths {
            let request = ReadRequest {
                context: context.clone(),
                path: path.clone(),
                offset: None,
                limit: None,
            };
            let read: Result<ReadResponse, ToolError> =
                self.workspaced(&project, "/v1/read", &request).await;
            let entry = match read {
                Ok(read) if read.size <= budget => {
                    budget -= read.size;
                    json!({
                        "path": path,
                        "content": read.content,
                        "revision": read.revision,
                        "size": read.size,
                        "total_lines": read.total_lines,
                    })
                }
                Ok(read) => {
                    failed += 1;
                    let mut error = ToolError::new(
                        "too_large",
                        format!(
                            "{path} ({} bytes) does not fit in what is left of this answer ({budget} of {READ_FILES_MAX_CONTENT_BYTES} bytes); read it alone with read_file (offset/limit for a range of lines)",
                            read.size
                        ),
                    );
                    error.details.insert("size".into(), json!(read.size));
                    error
                        .details
                        .insert("limit".into(), json!(READ_FILES_MAX_CONTENT_BYTES));
                    json!({"path": path, "error": error_value(error)})
                }
                Err(error) => {
                    failed += 1;
                    json!({"path": path, "error": error_value(error)})
                }
            };
            files.push(entry);
        }
        Ok(json!({
            "workflow_id": project.id,
            "files": files,
            "read": files.len() - failed,
            "failed": failed,
        }))
    }

    /// What one path is (kind, size, revision, modification time), without its content.
    pub async fn get_file_info(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let path = string_arg(args, "path")?.to_owned();
        self.read_in_project::<_, StatResponse>(caller, args, source, "/v1/stat", |context| {
            StatRequest { context, path }
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

    /// The one path every change takes: live access to `workflow_id` (token scope ∩ the
    /// user's live role ∩ the token's folder caps ∩ project policy), refused without write
    /// authority, then the request `make` builds from the context, sent to workspaced's
    /// `endpoint`, which re-applies the guard (protected files, blocked and read-only paths,
    /// confinement) under the project lock and answers replays and reused request ids.
    async fn change_in_project<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
        endpoint: &str,
        make: impl FnOnce(Context) -> Req,
    ) -> Result<(Project, Resp), ToolError> {
        let workflow = string_arg(args, "workflow_id")?;
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
        let request = make(self.context(caller, &project, &access, source));
        let answer = self.workspaced(&project, endpoint, &request).await?;
        Ok((project, answer))
    }

    pub async fn write_file(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let path = string_arg(args, "path")?.to_owned();
        let content = string_arg(args, "content")?.to_owned();
        let expected_revision = string_arg(args, "expected_revision")?.to_owned();
        let request_id = string_arg(args, "request_id")?.to_owned();
        let (project, written) = self
            .change_in_project::<_, ChangeResponse>(caller, args, source, "/v1/write", |context| {
                WriteRequest {
                    context,
                    path: path.clone(),
                    content,
                    expected_revision,
                    request_id,
                }
            })
            .await?;
        Ok(Value::Object(change_answer(&project, &path, written)))
    }

    /// Exact-text edits: the change's answer plus the unified diff, or for `dry_run` the diff
    /// and the revision the edit would produce (nothing written or recorded).
    pub async fn edit_file(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let path = string_arg(args, "path")?.to_owned();
        let expected_revision = string_arg(args, "expected_revision")?.to_owned();
        let request_id = string_arg(args, "request_id")?.to_owned();
        let dry_run = optional_bool_arg(args, "dry_run")?;
        let edits: Vec<TextEdit> = match args.get("edits") {
            Some(edits @ Value::Array(items)) if items.len() <= EDIT_FILE_MAX_EDITS => {
                serde_json::from_value(edits.clone()).map_err(|e| {
                    invalid_argument(
                        "edits",
                        format!("each edit is {{old_text, new_text, replace_all?}} ({e})"),
                    )
                })?
            }
            _ => {
                return Err(invalid_argument(
                    "edits",
                    format!(
                        "the argument \"edits\" must be a list of at most {EDIT_FILE_MAX_EDITS} edits"
                    ),
                ));
            }
        };
        let (project, answer) = self
            .change_in_project::<_, EditAnswer>(caller, args, source, "/v1/edit", |context| {
                EditRequest {
                    context,
                    path: path.clone(),
                    edits,
                    expected_revision,
                    request_id,
                    dry_run,
                }
            })
            .await?;
        Ok(match answer {
            EditAnswer::Applied(edited) => {
                let mut answer = change_answer(&project, &path, edited.change);
                answer.insert("dry_run".into(), json!(false));
                answer.insert("diff".into(), json!(edited.diff));
                Value::Object(answer)
            }
            EditAnswer::Preview(preview) => json!({
                "workflow_id": project.id,
                "path": path,
                "dry_run": true,
                "diff": preview.diff,
                "previous_revision": preview.previous_revision,
                "revision": preview.revision,
            }),
        })
    }

    pub async fn move_file(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let path = string_arg(args, "path")?.to_owned();
        let to_path = string_arg(args, "to_path")?.to_owned();
        let expected_revision = string_arg(args, "expected_revision")?.to_owned();
        let request_id = string_arg(args, "request_id")?.to_owned();
        let (project, moved) = self
            .change_in_project::<_, ChangeResponse>(caller, args, source, "/v1/move", |context| {
                MoveRequest {
                    context,
                    path: path.clone(),
                    to_path: to_path.clone(),
                    expected_revision,
                    request_id,
                }
            })
            .await?;
        let mut answer = change_answer(&project, &path, moved);
        answer.insert("to_path".into(), json!(to_path));
        Ok(Value::Object(answer))
    }

    pub async fn delete_file(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let path = string_arg(args, "path")?.to_owned();
        let expected_revision = string_arg(args, "expected_revision")?.to_owned();
        let request_id = string_arg(args, "request_id")?.to_owned();
        let (project, deleted) = self
            .change_in_project::<_, ChangeResponse>(caller, args, source, "/v1/delete", |context| {
                DeleteRequest {
                    context,
                    path: path.clone(),
                    expected_revision,
                    request_id,
                }
            })
            .await?;
        Ok(Value::Object(change_answer(&project, &path, deleted)))
    }

    /// A multi-file unified diff as one request: workspaced checks every file before any
    /// changes and keeps one receipt per file under the request id. Its answer (each file's
    /// action, state, revisions and receipt) is passed through with the workflow id added; a
    /// refusal keeps workspaced's code and the file it names (`path`, `file_index`), and a
    /// set stopped part way is `partially_applied` with each file's state. A retry of a set
    /// that is not wholly applied is a tool error too ([`not_wholly_applied`]), never a
    /// success that a client could read as done.
    pub async fn apply_patch(
        &self,
        caller: &Caller,
        args: &Map<String, Value>,
        source: Source,
    ) -> Result<Value, ToolError> {
        let diff = string_arg(args, "diff")?.to_owned();
        let request_id = string_arg(args, "request_id")?.to_owned();
        // The catalog checked it is an object of strings (at most PATCH_MAX_FILES).
        let expected_revisions = args
            .get("expected_revisions")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| {
                ToolError::new(
                    "invalid_arguments",
                    format!("expected_revisions must be an object of path → revision ({e})"),
                )
            })?;
        let (project, applied) = self
            .change_in_project::<_, PatchSetResponse>(
                caller,
                args,
                source,
                "/v1/patch_set",
                |context| PatchSetRequest {
                    context,
                    diff,
                    request_id,
                    expected_revisions,
                },
            )
            .await?;
        let applied_whole = applied.state == ReceiptState::Applied;
        let mut answer = match serde_json::to_value(applied) {
            Ok(Value::Object(answer)) => answer,
            _ => return Err(unavailable("workspaced's patch answer could not be read")),
        };
        answer.insert("workflow_id".into(), json!(project.id));
        if !applied_whole {
            return Err(not_wholly_applied(answer));
        }
        Ok(Value::Object(answer))
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
        let answer: ReceiptAnswer = self.workspaced(&project, "/v1/receipt", &request).await?;
        let mut result = json!({ "workflow_id": project.id, "receipt": answer.receipt });
        // A patch set: each file's own receipt (the top one carries the set's state).
        if let Some(files) = answer.files {
            result["files"] = json!(files);
        }
        Ok(result)
    }
}
