//! A project's MCP connections in a server-mode turn: which remote tools the model is offered,
//! under which names, and how a call reaches the server.
//!
//! Resolution fails closed from durable facts: at the turn's start the connections are read
//! from the store for the chat's stored project, after the pinned person's live access to that
//! project is checked; at every call both are checked again (a connection removed mid-turn, or
//! a person who lost access, gets an error, never a call). Local-bound turns never come here
//! (the chat's tool executor asks only in server mode).
//!
//! This is the one way a chat turn reaches the connections: [`ConnectionTools`] (which the chat
//! service holds) opens a turn's [`TurnConnections`] for the turn's person and project and calls
//! their tools. It never calls back into the chats.
//!
//! A connection acts with the project's credentials (a secret header, an owner's sign-in), so
//! its tools are for people with an authoring role (owner, co-owner, editor), checked from live
//! rows at the turn's start and again at every call, as the laptop tools are: a viewer's or a
//! runner's turn gets none of them and its tool list and prompt say nothing about them.
//!
//! Names: the model sees `mcp_<display name>_<6 hex of the internal name>__<tool>` (see
//! [`tool_prefix`](super::store::tool_prefix)) and a description that starts with the server's display name. Everything
//! kept per connection (the session opened at the turn's start, its tool list) is keyed by the
//! internal name, so two connections named alike never share either.
//!
//! A server that is down, or that wants a sign-in, is left out of the turn and reported: the
//! model is told in its system prompt, the page gets a `connection_unavailable` event.

use crate::catalog::files::{FileTools, require_authoring_role_for};
use crate::connections::remote::{RemoteSession, RemoteTool};
use crate::connections::sealed::SealingKey;
use crate::connections::secrets::SecretStore;
use crate::connections::sign_in::{Credentials, store_credentials};
use crate::connections::store::{ConnectionStore, McpConnection, SecretHeader, tool_prefix};
use crate::identity::IdentityStore;
use crate::mcp::{Caller, ToolError};
use agentworks_support::outbound::GuardedClient;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Remote tools offered in one turn at most (over every connection).
pub const MAX_TOOLS_PER_TURN: usize = 64;
/// The longest description passed to the model, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// The most text of one call's result kept for the model and the chat, in bytes.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// A function name a model API takes: 1 to 64 of `[A-Za-z0-9_-]`.
fn is_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// One remote tool offered this turn.
#[derive(Debug, Clone)]
struct Offered {
    connection_id: String,
    connection_name: String,
    tool: String,
}

/// The connections' part of one turn: the tool definitions for the model, what each name
/// reaches, the sessions opened (by internal name), and the connections left out.
#[derive(Default)]
pub struct TurnConnections {
    pub tools: Vec<Value>,
    offered: HashMap<String, Offered>,
    sessions: HashMap<String, Arc<RemoteSession>>,
    /// `(display name, code, message)` of each connection left out of the turn.
    pub unavailable: Vec<(String, String, String)>,
}

impl TurnConnections {
    /// Whether `function` is one of this turn's remote tools.
    pub fn offers(&self, function: &str) -> bool {
        self.offered.contains_key(function)
    }

    /// The line added to the system prompt when some connection is left out.
    pub fn prompt_note(&self) -> Option<String> {
        if self.unavailable.is_empty() {
            return None;
        }
        let listed: Vec<String> = self
            .unavailable
            .iter()
            .map(|(name, code, message)| format!("\"{name}\" ({code}: {message})"))
            .collect();
        Some(format!(
            " These MCP servers of the project are unavailable this turn, so their tools are not offered: {}. Tell the person if they ask for them; a project owner can reconnect them in the console.",
            listed.join("; ")
        ))
    }
}

/// The headers a connection sends: each names a project secret, read (unsealed) now and put
/// where its format says; the value is marked sensitive so it is never logged. A secret the
/// project does not have, or no usable sealing key, leaves the connection out.
fn resolve_headers(
    secrets: Option<&SecretStore>,
    project_id: &str,
    headers: &BTreeMap<String, SecretHeader>,
) -> Result<HeaderMap, ToolError> {
    let mut map = HeaderMap::new();
    map.insert(
        HeaderName::from_static("user-agent"),
        HeaderValue::from_static("agentworks-agentd"),
    );
    for (header, wanted) in headers {
        let secrets = secrets.ok_or_else(|| {
            ToolError::new(
                "unavailable",
                "project secrets are unavailable (agentd's sealing key is unusable; see its log)",
            )
        })?;
        let value = secrets
            .reveal(project_id, &wanted.secret)
            .map_err(|e| ToolError::new("unavailable", e.to_string()))?
            .ok_or_else(|| {
                ToolError::new(
                    "secret_missing",
                    format!(
                        "header {header} needs the project secret {}, and the project has no secret by that name",
                        wanted.secret
                    ),
                )
            })?;
        let name = HeaderName::from_bytes(header.as_bytes())
            .map_err(|e| ToolError::new("invalid_header", e.to_string()))?;
        let mut value =
            HeaderValue::from_str(&wanted.format.replacen("{}", &value, 1)).map_err(|_| {
                ToolError::new(
                    "invalid_header",
                    format!(
                        "header {header} with the secret {} is not a valid header value",
                        wanted.secret
                    ),
                )
            })?;
        value.set_sensitive(true);
        map.insert(name, value);
    }
    Ok(map)
}

/// What a chat turn may use of a project's connections: their tools, opened for the turn's
/// person and project and called with every check made again. Cheap to clone.
#[derive(Clone)]
pub struct ConnectionTools {
    pub identity: IdentityStore,
    /// The person's live access to the project, checked at the turn's start and every call.
    pub files: FileTools,
    pub store: ConnectionStore,
    /// The guarded client the servers are called through (`None`: connections are not used).
    pub client: Option<GuardedClient>,
    /// The secrets headers name (`None`: the sealing key is unusable).
    pub secrets: Option<SecretStore>,
    /// The key sign-ins are sealed with (`None`: unusable; no sign-in is used).
    pub sealing: Option<Arc<SealingKey>>,
}

impl ConnectionTools {
    /// The connections a turn in `project_id` may use now, for `caller`, each opened and listed.
    pub async fn for_turn(&self, caller: &Caller, project_id: &str) -> TurnConnections {
        let mut turn = TurnConnections::default();
        let Some(client) = self.client.clone() else {
            return turn;
        };
        let connections = match self.live_connections(caller, project_id).await {
            Ok(connections) => connections,
            Err(error) => {
                tracing::info!(code = %error.code, "no MCP connections this turn: {}", error.message);
                return turn;
            }
        };
        let mut opening = tokio::task::JoinSet::new();
        for connection in connections {
            let opener = Opener {
                identity: self.identity.clone(),
                client: client.clone(),
                secrets: self.secrets.clone(),
                sealing: self.sealing.clone(),
                store: self.store.clone(),
            };
            opening.spawn(async move {
                let opened = opener.open(&connection).await;
                (connection, opened)
            });
        }
        let mut opened = Vec::new();
        while let Some(joined) = opening.join_next().await {
            if let Ok(result) = joined {
                opened.push(result);
            }
        }
        // The order the connections were added in, so the model sees a stable list.
        opened.sort_by(|(a, _), (b, _)| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        for (connection, result) in opened {
            let (session, tools) = match result {
                Ok(found) => found,
                Err(error) => {
                    turn.unavailable
                        .push((connection.name.clone(), error.code, error.message));
                    continue;
                }
            };
            let prefix = tool_prefix(&connection);
            for tool in tools {
                let function = format!("{prefix}{}", tool.name);
                if !is_function_name(&function) || turn.offered.contains_key(&function) {
                    tracing::info!(connection = %connection.id, tool = %tool.name, "a remote tool's name cannot be offered; skipped");
                    continue;
                }
                if turn.offered.len() >= MAX_TOOLS_PER_TURN {
                    break;
                }
                let description: String =
                    format!("[MCP server \"{}\"] {}", connection.name, tool.description)
                        .chars()
                        .take(MAX_DESCRIPTION_CHARS)
                        .collect();
                turn.tools.push(json!({"type": "function", "function": {
                "name": function, "description": description, "parameters": tool.input_schema}}));
                turn.offered.insert(
                    function,
                    Offered {
                        connection_id: connection.id.clone(),
                        connection_name: connection.name.clone(),
                        tool: tool.name,
                    },
                );
            }
            turn.sessions
                .insert(connection.id.clone(), Arc::new(session));
        }
        turn
    }
}

/// What opening a connection needs.
struct Opener {
    identity: IdentityStore,
    client: GuardedClient,
    secrets: Option<SecretStore>,
    sealing: Option<Arc<SealingKey>>,
    store: ConnectionStore,
}

fn remote_error(error: crate::connections::remote::RemoteError) -> ToolError {
    ToolError::new(error.code(), error.to_string())
}

fn sign_in_error(error: crate::connections::sign_in::SignInError) -> ToolError {
    ToolError::new(
        "sign_in_required",
        format!(
            "the sign-in could not be refreshed ({error}); an owner signs in again in the project's settings"
        ),
    )
}

impl Opener {
    /// Open `connection` and list its tools: with its headers, and with its stored sign-in
    /// (refreshed first when it is expiring, or once when the server answers 401).
    async fn open(
        &self,
        connection: &McpConnection,
    ) -> Result<(RemoteSession, Vec<RemoteTool>), ToolError> {
        let (secrets, project, wanted) = (
            self.secrets.clone(),
            connection.project_id.clone(),
            connection.headers.clone(),
        );
        let headers = tokio::task::spawn_blocking(move || {
            resolve_headers(secrets.as_ref(), &project, &wanted)
        })
        .await
        .map_err(|e| ToolError::new("unavailable", e.to_string()))??;
        let mut credentials = self.credentials(connection).await?;
        if let Some(current) = &credentials
            && current.expiring(agentworks_support::clock::now_ms())
            && current.refresh_token.is_some()
        {
            credentials = Some(self.refreshed(&connection.id, current).await?);
        }
        let mut refreshed = false;
        loop {
            let mut headers = headers.clone();
            if let Some(credentials) = &credentials {
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {}", credentials.access_token))
                        .map_err(|_| {
                            ToolError::new(
                                "sign_in_required",
                                "the stored access token is not a header value; sign in again",
                            )
                        })?;
                value.set_sensitive(true);
                headers.insert(hyper::header::AUTHORIZATION, value);
            }
            match RemoteSession::open(
                self.client.clone(),
                &connection.url,
                headers,
                connection.transport,
            )
            .await
            {
                Ok(session) => {
                    let tools = session.list_tools().await.map_err(remote_error)?;
                    return Ok((session, tools));
                }
                Err(crate::connections::remote::RemoteError::Unauthorized { .. })
                    if !refreshed
                        && credentials
                            .as_ref()
                            .is_some_and(|c| c.refresh_token.is_some()) =>
                {
                    refreshed = true;
                    let current = credentials.take().unwrap_or_else(|| unreachable!());
                    credentials = Some(self.refreshed(&connection.id, &current).await?);
                }
                Err(error) => return Err(remote_error(error)),
            }
        }
    }

    /// The connection's sign-in, if it has one that opens and whose person is still a member
    /// of the project with a live account; one whose person is not is forgotten here (the
    /// project stops acting as them on the server).
    async fn credentials(
        &self,
        connection: &McpConnection,
    ) -> Result<Option<Credentials>, ToolError> {
        let Some(key) = self.sealing.clone() else {
            return Ok(None);
        };
        let (store, identity) = (self.store.clone(), self.identity.clone());
        let (id, project) = (connection.id.clone(), connection.project_id.clone());
        let unavailable = |e: String| ToolError::new("unavailable", e);
        tokio::task::spawn_blocking(move || {
            let blob = store.credentials(&id).map_err(|e| unavailable(e.to_string()))?;
            let Some(credentials) = blob.and_then(|blob| Credentials::unseal(&key, &id, &blob))
            else {
                return Ok(None);
            };
            let person = identity
                .user_by_id(&credentials.signed_in_by)
                .map_err(|e| unavailable(e.to_string()))?;
            let member = identity
                .role_of(&project, &credentials.signed_in_by)
                .map_err(|e| unavailable(e.to_string()))?
                .is_some();
            match person {
                Some(person) if member && !person.disabled => Ok(Some(credentials)),
                person => {
                    store
                        .remove_credentials(&id)
                        .map_err(|e| unavailable(e.to_string()))?;
                    let who = person.map_or_else(|| "a deleted account".to_owned(), |p| p.name);
                    tracing::info!(connection = %id, %who, "an MCP connection's sign-in was forgotten: its person left the project or was disabled");
                    Err(ToolError::new(
                        "sign_in_required",
                        format!("the sign-in was made by {who}, who is no longer a member of the project (or is disabled), so it was removed; an owner signs in again"),
                    ))
                }
            }
        })
        .await
        .map_err(|e| unavailable(e.to_string()))?
    }

    /// A refresh grant, its result sealed and stored before it is used. A sign-in made with an
    /// operator's app is refreshed with the app as it is now (still pinned to the sign-in's
    /// issuer, or not at all).
    async fn refreshed(&self, id: &str, current: &Credentials) -> Result<Credentials, ToolError> {
        let app = match current.app_key.clone() {
            None => None,
            Some(key) => {
                let (store, sealing) = (self.store.clone(), self.sealing.clone());
                tokio::task::spawn_blocking(move || {
                    super::apps::load_app(&store, sealing.as_deref(), &key)
                })
                .await
                .map_err(|e| ToolError::new("unavailable", e.to_string()))?
                .map_err(|e| ToolError::new("unavailable", e.to_string()))?
            }
        };
        let fresh = crate::connections::sign_in::refresh(&self.client, current, app)
            .await
            .map_err(sign_in_error)?;
        store_credentials(self.sealing.as_ref(), &self.store, id, &fresh).await?;
        Ok(fresh)
    }
}

/// What a connection's tools are, for the authoring-role refusal.
const CONNECTION_TOOLS: &str = "using the project's MCP connections";

impl ConnectionTools {
    /// The project's connections, if `caller` may see the project now with an authoring role.
    async fn live_connections(
        &self,
        caller: &Caller,
        project_id: &str,
    ) -> Result<Vec<McpConnection>, ToolError> {
        let (project, access) = self.files.access(caller, project_id).await?;
        require_authoring_role_for(&access, CONNECTION_TOOLS)?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.list(&project.id))
            .await
            .map_err(|e| ToolError::new("unavailable", e.to_string()))?
            .map_err(|e| ToolError::new("unavailable", e.to_string()))
    }

    /// Call the remote tool `function` for `caller`, after checking again that the person's live
    /// role on the project authors and the project still has the connection.
    pub async fn call(
        &self,
        turn: &TurnConnections,
        caller: &Caller,
        project_id: &str,
        function: &str,
        arguments: Value,
    ) -> Result<Value, ToolError> {
        let Some(offered) = turn.offered.get(function) else {
            return Err(ToolError::new(
                "unknown_tool",
                format!("there is no tool {function:?} in this turn"),
            ));
        };
        let (project, access) = self.files.access(caller, project_id).await?;
        require_authoring_role_for(&access, CONNECTION_TOOLS)?;
        let store = self.store.clone();
        let id = offered.connection_id.clone();
        let still_there = tokio::task::spawn_blocking(move || store.get(&project.id, &id))
            .await
            .map_err(|e| ToolError::new("unavailable", e.to_string()))?
            .map_err(|e| ToolError::new("unavailable", e.to_string()))?;
        if still_there.is_none() {
            return Err(ToolError::new(
                "connection_removed",
                format!(
                    "the MCP connection \"{}\" was removed from the project; its tools cannot be called",
                    offered.connection_name
                ),
            ));
        }
        let Some(session) = turn.sessions.get(&offered.connection_id) else {
            return Err(ToolError::new(
                "unavailable",
                "the connection has no session this turn",
            ));
        };
        let arguments = match arguments {
            Value::Object(_) => arguments,
            Value::Null => json!({}),
            _ => {
                return Err(ToolError::new(
                    "invalid_arguments",
                    "the arguments must be a JSON object",
                ));
            }
        };
        let result = session
            .call_tool(&offered.tool, arguments)
            .await
            .map_err(|e| ToolError::new(e.code(), e.to_string()))?;
        let text = bounded_text(&result);
        if result["isError"] == Value::Bool(true) {
            return Err(ToolError::new("tool_error", text));
        }
        Ok(json!({
            "server": offered.connection_name,
            "tool": offered.tool,
            "content": text,
            "structured": result.get("structuredContent").cloned().unwrap_or(Value::Null),
        }))
    }
}

/// The text of a `CallToolResult`'s content, at most [`MAX_RESULT_BYTES`] (cut on a character
/// boundary, saying so); other content kinds are named, not passed on.
fn bounded_text(result: &Value) -> String {
    let mut text = String::new();
    for item in result["content"].as_array().into_iter().flatten() {
        if !text.is_empty() {
            text.push('\n');
        }
        match item["type"].as_str() {
            Some("text") => text.push_str(item["text"].as_str().unwrap_or_default()),
            Some(kind) => text.push_str(&format!("[{kind} content not shown]")),
            None => text.push_str("[content of no type]"),
        }
    }
    if text.len() > MAX_RESULT_BYTES {
        let mut cut = MAX_RESULT_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n[cut: the result was longer than 64 KiB]");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connections::store::Transport;

    fn connection(id: &str, name: &str) -> McpConnection {
        McpConnection {
            id: id.into(),
            project_id: "p".into(),
            name: name.into(),
            url: "https://example.com/mcp".into(),
            transport: Transport::StreamableHttp,
            headers: BTreeMap::new(),
            created_by: "u".into(),
            created_at_ms: 0,
        }
    }

    #[test]
    fn prefixes_say_the_server_and_keep_alike_names_apart() {
        let a = tool_prefix(&connection("mcpc_0123456789abcdef", "Linear (work)"));
        let b = tool_prefix(&connection("mcpc_fedcba9876543210", "Linear (work)"));
        assert_eq!(a, "mcp_linear_work_012345__");
        assert_eq!(b, "mcp_linear_work_fedcba__");
        assert_eq!(
            tool_prefix(&connection("mcpc_aaaaaa0000000000", "日本")),
            "mcp_server_aaaaaa__"
        );
        assert!(is_function_name(&format!("{a}create_issue")));
        assert!(!is_function_name(&format!("{a}{}", "x".repeat(64))));
        assert!(!is_function_name(&format!("{a}bad name")));
    }

    #[test]
    fn headers_are_filled_from_sealed_secrets_and_a_missing_one_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(SealingKey::load_or_create(dir.path(), None).unwrap());
        let secrets = SecretStore::open(&dir.path().join("s.db"), key).unwrap();
        let mut headers = BTreeMap::new();
        headers.insert(
            "authorization".into(),
            SecretHeader {
                secret: "LINEAR_API_KEY".into(),
                format: "Bearer {}".into(),
            },
        );
        let error = resolve_headers(Some(&secrets), "p", &headers).unwrap_err();
        assert_eq!(error.code, "secret_missing");
        assert!(error.message.contains("LINEAR_API_KEY"));
        let error = resolve_headers(None, "p", &headers).unwrap_err();
        assert_eq!(error.code, "unavailable");
        secrets
            .set("p", "LINEAR_API_KEY", "lin_123", "u")
            .unwrap()
            .unwrap();
        let map = resolve_headers(Some(&secrets), "p", &headers).unwrap();
        assert_eq!(map["authorization"], "Bearer lin_123");
        assert!(map["authorization"].is_sensitive());
        // Another project's secret of the same name is not this one's.
        assert_eq!(
            resolve_headers(Some(&secrets), "q", &headers)
                .unwrap_err()
                .code,
            "secret_missing"
        );
        assert!(resolve_headers(None, "p", &BTreeMap::new()).is_ok());
    }

    #[test]
    fn results_are_text_bounded_on_a_character_boundary() {
        let long = "é".repeat(MAX_RESULT_BYTES);
        let text = bounded_text(&json!({"content": [{"type": "text", "text": long}]}));
        assert!(text.len() <= MAX_RESULT_BYTES + 64);
        assert!(text.ends_with("longer than 64 KiB]"));
        let mixed = bounded_text(&json!({"content": [
            {"type": "text", "text": "a"}, {"type": "image", "data": "…"}]}));
        assert_eq!(mixed, "a\n[image content not shown]");
    }
}
