//! The chat REST API on agentd's public listener (`Authorization: Bearer <token>` of a person,
//! a token with a `workflows:*` scope):
//!
//! | request | answer |
//! | --- | --- |
//! | `POST /v1/chats {project, agent?, mode?}` | 201 chat: `{chat_id, project_id, owner, owner_name, created_at_ms, binding, turns, title, agent, mode}` ([`super::agents`] checks `agent` and `mode`) |
//! | `GET /v1/chats[?project=P]` | `{chats: [chat]}`: the caller's own chats |
//! | `GET /v1/chats/{id}` | chat + `messages: [{seq, turn, created_at_ms, role, content, …}]` (tool messages with `state` and `summary`) + `usage: {turns: [{turn, prompt_tokens, completion_tokens, total_tokens}], total}` (owner only, else 404) |
//! | `POST /v1/chats/{id}/attachments?name=N` (the file's bytes as the body) | 201 attachment: `{attachment_id, name, kind, media_type, size, …}`, pending until a message names it (owner only) |
//! | `POST /v1/chats/{id}/turns {message, attachments?}` | `text/event-stream`: `text`, `tool_call`, `tool_result` (with `state` `done`/`failed` and a one-line `summary`), `error`, `end` (`reason`, `usage`) |
//! | `POST /v1/chats/{id}/cancel` | 202 `{chat_id, turn}`: the running turn stops (409 `no_turn_running`) |
//! | `PUT /v1/chats/{id}/binding {device_id, folder, confirm}` | chat (409 `turn_running` while a turn runs) |
//! | `DELETE /v1/chats/{id}/binding` | chat, back in server mode (409 while a turn runs) |
//! | `GET /v1/devices` | `{devices: [...]}`: the caller's devices, folders, access and online state |
//! | `GET /v1/projects` | `{projects: [{id, name, kind, role}]}`: the projects the caller's token may see |
//! | `GET /v1/models` | `{configured, model, base_url}`: the model turns use (never its key) |
//! | `GET /v1/agents` | `{agents: [{name, kind, driver?, model?, available, unavailable?, modes}], runnerd: {running, message?}}`: what a new chat may have as its agent |
//!
//! A project's MCP connections and secrets (`/v1/projects/{id}/mcp-connections…`, `…/secrets…`)
//! are [`crate::connections::api`]'s, beside these on the same listener and the same callers.
//!
//! A chat is pinned to its creator: a turn from anyone else is refused with 403
//! `chat_not_yours` (a person who cannot see the project gets 404). Only `code` projects have
//! chats. One turn at a time per chat (409 `turn_running`). Binding needs `confirm` to be
//! exactly [`CONFIRMATION`] and an authoring role (owner, co-owner, editor) on the project
//! (403 `forbidden`, reason `no_authoring_role`): a bound chat runs commands. Cancelling stops the turn at its next step: a model request is
//! abandoned, a command running on the laptop is cancelled through gatewayd (its process group
//! is killed and its result recorded), tool calls not yet started are answered "not run", and
//! the stream ends with `end {reason: "cancelled"}`.
//!
//! A chat's agent and mode are given when it is created and never change. A chat whose agent is
//! a coding CLI runs its turns through runnerd ([`crate::chat::turn::cli`]); bound to a laptop
//! folder, like any chat, its CLI's hands are the bridge's tools on that folder.
//!
//! A turn stores the person's message first; the first message sent in a chat titles it (its
//! first line, [`crate::chat::store::title_of`]), and the title stays. Without a configured model
//! the message is still stored and the turn's events are `error` (`model_not_configured`,
//! naming both ways to configure one) and `end {reason: "error"}`: nothing the person sent is
//! lost, and a later turn goes on from it.
//!
//! The turn's events are the SSE lines `event: <kind>` / `data: <json>`, each sent as the turn
//! produces it (a streaming body); the turn itself runs in its own task and ends (and is
//! stored) even if the client goes away.

use crate::catalog::files::from_tool;
use crate::chat::agents;
use crate::chat::attachments::{self, AttachmentInfo};
use crate::chat::peers::RunningTurns;
use crate::chat::service::{ChatService, Running, blocking};
use crate::chat::store::{Chat, ChatStoreError};
use crate::chat::tools;
use crate::chat::turn::{self, TurnSpec};
use crate::identity::ProjectKind;
use crate::mcp::Caller;
use agentworks_daemon::ipc::envelope::{Body, Refusal, decode_json, json_response};
use agentworks_support::clock::now_ms;
use bytes::Bytes;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Largest body of `POST /v1/chats/{id}/turns` (one message; the model sees at most
/// `max_history_bytes` of earlier ones anyway).
pub const MAX_TURN_BODY_BYTES: usize = 1024 * 1024;
/// Largest body of every other chat endpoint (a project name, a binding).
pub const MAX_REQUEST_BODY_BYTES: usize = 64 * 1024;

pub use agentworks_contract::public_api::CONFIRMATION;

impl ChatService {
    async fn authenticate(&self, parts: &Parts) -> Result<Caller, Refusal> {
        self.sessions.person(&self.identity, parts).await
    }

    /// The chat, if the caller created it; anyone else gets the same 404 as for no chat.
    async fn own_chat(&self, caller: &Caller, chat_id: &str) -> Result<Chat, Refusal> {
        let store = self.chats.clone();
        let id = chat_id.to_owned();
        let chat = blocking(move || store.get(&id)).await?;
        chat.filter(|c| c.owner == caller.user_id)
            .ok_or_else(|| no_chat(chat_id))
    }

    /// What the public listener may do with a request's body before the handler runs, from
    /// the head alone: `None` if it is not a chat endpoint (or not with this method, which
    /// [`ChatService::handle`] answers 405 without authenticating); else the largest body the
    /// endpoint takes once the bearer token checks out, or the 401/403 the request gets anyway.
    pub async fn screen(&self, parts: &Parts) -> Option<Result<usize, Response<Body>>> {
        let Ok(route) = route(parts)? else {
            return None;
        };
        Some(match self.authenticate(parts).await {
            Ok(_) => Ok(match route {
                Route::Turn(_) => MAX_TURN_BODY_BYTES,
                // One more than the limit, so a larger file gets the attachment's own refusal.
                Route::Attach(_) => attachments::MAX_FILE_BYTES + 1,
                _ => MAX_REQUEST_BODY_BYTES,
            }),
            Err(error) => Err(error.into_response()),
        })
    }

    /// Serves a chat endpoint, or `None` if the path is not one.
    pub async fn handle(&self, parts: &Parts, body: &Bytes) -> Option<Response<Body>> {
        let route = match route(parts)? {
            Ok(route) => route,
            Err(refusal) => return Some(refusal.into_response()),
        };
        let result = async {
            let caller = self.authenticate(parts).await?;
            match route {
                Route::Create => self.create(&caller, body).await,
                Route::List => self.list(&caller, parts.uri.query()).await,
                Route::Get(id) => self.get(&caller, &id).await,
                Route::Turn(id) => self.turn(&caller, &id, body).await,
                Route::Attach(id) => self.attach(&caller, &id, parts.uri.query(), body).await,
                Route::Cancel(id) => self.cancel(&caller, &id).await,
                Route::Bind(id) => self.bind(&caller, &id, body).await,
                Route::Unbind(id) => self.unbind(&caller, &id).await,
                Route::Devices => self
                    .devices(&caller)
                    .await
                    .map(|d| json_response(StatusCode::OK, &json!({"devices": d}))),
                Route::Projects => self.projects(&caller).await,
                Route::Models => Ok(json_response(StatusCode::OK, &self.models())),
                Route::Agents => Ok(json_response(StatusCode::OK, &agents::options(self).await)),
            }
        }
        .await;
        Some(result.unwrap_or_else(Refusal::into_response))
    }

    async fn create(&self, caller: &Caller, body: &Bytes) -> Result<Response<Body>, Refusal> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct CreateChat {
            project: String,
            /// `api` (the default) or a provider's name.
            #[serde(default)]
            agent: Option<String>,
            /// `run` (the default) or `builder`.
            #[serde(default)]
            mode: Option<String>,
        }
        let request: CreateChat = decode_json(body)?;
        let (project, access) = self
            .files
            .access(caller, &request.project)
            .await
            .map_err(from_tool)?;
        if project.kind != ProjectKind::Code {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "not_a_code_project",
                format!(
                    "chats are for code projects only (a code project's chat can be bound to a laptop folder); {:?} is a {} project",
                    project.name,
                    project.kind.as_str()
                ),
            ));
        }
        let requested = agents::Requested {
            agent: request.agent,
            mode: request.mode,
        };
        let agent = agents::choose(self, &access, requested).await?;
        let store = self.chats.clone();
        let (user_id, user_name) = (caller.user_id.clone(), caller.user_name.clone());
        let chat =
            blocking(move || store.create_with(&project.id, &user_id, &user_name, &agent)).await?;
        tracing::info!(chat = %chat.chat_id, agent = %chat.agent, mode = chat.mode.as_str(), user = %caller.user_id, "chat created");
        Ok(json_response(StatusCode::CREATED, &chat))
    }

    async fn list(&self, caller: &Caller, query: Option<&str>) -> Result<Response<Body>, Refusal> {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(query.unwrap_or("")).unwrap_or_default();
        let project = match pairs.iter().find(|(k, _)| k == "project") {
            Some((_, p)) => Some(self.files.access(caller, p).await.map_err(from_tool)?.0.id),
            None => None,
        };
        let store = self.chats.clone();
        let user_id = caller.user_id.clone();
        let chats = blocking(move || store.list(&user_id, project.as_deref())).await?;
        Ok(json_response(StatusCode::OK, &json!({"chats": chats})))
    }

    async fn get(&self, caller: &Caller, chat_id: &str) -> Result<Response<Body>, Refusal> {
        let chat = self.own_chat(caller, chat_id).await?;
        let store = self.chats.clone();
        let id = chat.chat_id.clone();
        let (messages, usage) =
            blocking(move || Ok::<_, ChatStoreError>((store.messages(&id)?, store.usage(&id)?)))
                .await?;
        let messages: Vec<Value> = messages
            .into_iter()
            .map(|m| {
                let mut out =
                    json!({"seq": m.seq, "turn": m.turn, "created_at_ms": m.created_at_ms});
                if m.message["role"] == "tool" {
                    // The same rule as the turn's tool_result event, from the stored content.
                    let content = m.message["content"]
                        .as_str()
                        .and_then(|c| serde_json::from_str::<Value>(c).ok())
                        .unwrap_or(Value::Null);
                    let (state, summary) = tools::call_state(&content);
                    out["state"] = json!(state);
                    out["summary"] = json!(summary);
                }
                if let (Some(out), Value::Object(fields)) = (out.as_object_mut(), m.message) {
                    out.extend(fields);
                }
                out
            })
            .collect();
        let mut total = crate::chat::model::Usage::default();
        for turn in &usage {
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            total.add(crate::chat::model::Usage {
                prompt_tokens: count(turn.prompt_tokens),
                completion_tokens: count(turn.completion_tokens),
                total_tokens: count(turn.total_tokens),
            });
        }
        let mut value = serde_json::to_value(&chat).map_err(|e| {
            Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })?;
        value["messages"] = Value::Array(messages);
        value["usage"] = json!({"turns": usage, "total": total});
        Ok(json_response(StatusCode::OK, &value))
    }

    /// `GET /v1/projects`: the projects the caller may see (the token's restriction, scopes
    /// and the live role all apply, as for MCP's `list_workflows`), with the caller's role.
    async fn projects(&self, caller: &Caller) -> Result<Response<Body>, Refusal> {
        let listed = self.files.list_workflows(caller).await.map_err(from_tool)?;
        let projects: Vec<Value> = listed["workflows"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| json!({"id": w["workflow_id"], "name": w["name"], "kind": w["kind"], "role": w["role"]}))
            .collect();
        Ok(json_response(
            StatusCode::OK,
            &json!({"projects": projects}),
        ))
    }

    /// `GET /v1/models`: whether turns have a model, its name and base URL as it may be shown
    /// (no key, no user-info, no query string).
    fn models(&self) -> Value {
        match &self.model {
            Some(model) => json!({
                "configured": true,
                "model": model.model_name(),
                "base_url": model.shown_base_url(),
            }),
            None => json!({"configured": false, "model": null, "base_url": null}),
        }
    }

    async fn turn(
        &self,
        caller: &Caller,
        chat_id: &str,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct TurnRequest {
            message: String,
            /// Uploads of this chat (`POST …/attachments`) this message carries.
            #[serde(default)]
            attachments: Vec<String>,
        }
        let chat = self.chat_to_run(caller, chat_id).await?;
        let request: TurnRequest = decode_json(body)?;
        if request.message.trim().is_empty() {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "message must not be empty",
            ));
        }
        if request.attachments.len() > attachments::MAX_FILES_PER_MESSAGE {
            return Err(attachments::AttachmentError::TooMany {
                count: request.attachments.len(),
            }
            .into());
        }
        let (project, _) = self
            .files
            .access(caller, &chat.project_id)
            .await
            .map_err(from_tool)?;
        let cancel = CancellationToken::new();
        let (chat, turn) = self.claim_turn(chat_id, &cancel).await?;
        let attachments = match self
            .claim_attachments(caller, chat_id, request.attachments, turn)
            .await
        {
            Ok(attachments) => attachments,
            Err(refusal) => {
                // The turn never started: the chat is free again (its number is not reused).
                if let Some(running) = self.running.lock().await.remove(chat_id) {
                    self.release_claim(chat_id, &running.claim).await;
                }
                return Err(refusal);
            }
        };
        tracing::info!(chat = %chat_id, turn, user = %caller.user_id, bound = chat.binding.is_some(), "turn started");
        let spec = TurnSpec {
            caller: caller.clone(),
            chat,
            project_name: project.name,
            turn,
            message: request.message,
            attachments,
        };
        let events = self.spawn_turn(chat_id, spec, cancel);
        Ok(event_stream(events))
    }

    /// `POST /v1/chats/{id}/attachments?name=N`: stores the body as an upload of the chat's
    /// owner, pending until a message names it. The type comes from the bytes, never from the
    /// request; the name is only a display name.
    async fn attach(
        &self,
        caller: &Caller,
        chat_id: &str,
        query: Option<&str>,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        let chat = self.chat_to_run(caller, chat_id).await?;
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
            .map_err(|_| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "the query string is not form-encoded; send ?name=<file name>",
                )
            })?;
        let name = pairs
            .into_iter()
            .find(|(k, _)| k == "name")
            .map(|(_, v)| v)
            .unwrap_or_default();
        let store = self.attachments.clone();
        let owner = caller.user_id.clone();
        let bytes = body.clone();
        let info = blocking(move || store.add(&chat.chat_id, &owner, &name, &bytes)).await?;
        tracing::info!(chat = %chat_id, attachment = %info.attachment_id, size = info.size, kind = ?info.kind, "attachment stored");
        Ok(json_response(StatusCode::CREATED, &info))
    }

    /// Gives the message's uploads to its turn: all of them, of this chat and its owner, or the
    /// turn does not start.
    async fn claim_attachments(
        &self,
        caller: &Caller,
        chat_id: &str,
        ids: Vec<String>,
        turn: i64,
    ) -> Result<Vec<AttachmentInfo>, Refusal> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.attachments.clone();
        let (chat_id, owner) = (chat_id.to_owned(), caller.user_id.clone());
        blocking(move || store.claim_for_turn(&chat_id, &owner, &ids, turn)).await
    }

    /// The chat, if `caller` may run a turn in it: only its creator may. Anyone else who can
    /// see the project gets 403 `chat_not_yours`; who cannot does not learn the chat exists.
    async fn chat_to_run(&self, caller: &Caller, chat_id: &str) -> Result<Chat, Refusal> {
        let store = self.chats.clone();
        let id = chat_id.to_owned();
        let chat = blocking(move || store.get(&id))
            .await?
            .ok_or_else(|| no_chat(chat_id))?;
        if chat.owner != caller.user_id {
            // Someone who cannot see the project does not learn the chat exists.
            self.files
                .access(caller, &chat.project_id)
                .await
                .map_err(|_| no_chat(chat_id))?;
            // Never who owns it: a member who guesses an id learns only that it is not theirs.
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "chat_not_yours",
                "not your chat: only the person who created a chat can run turns in it",
            ));
        }
        Ok(chat)
    }

    /// Marks a turn running in the chat (409 if one already is) and answers the chat as it is
    /// now with the turn's number. One turn at a time; its binding is read under the same lock
    /// binding changes take.
    async fn claim_turn(
        &self,
        chat_id: &str,
        cancel: &CancellationToken,
    ) -> Result<(Chat, i64), Refusal> {
        let mut running = self.running.lock().await;
        if running.contains_key(chat_id) {
            return Err(turn_running(chat_id));
        }
        // Then in the store, for the other agentd hosts: the claim first, the number after, so
        // a refused turn takes no number.
        let store = self.chats.clone();
        let (id, host) = (chat_id.to_owned(), self.host_id.clone());
        let claim = new_claim();
        let mine = claim.clone();
        let claimed = blocking(move || {
            let now = now_ms();
            if let Some(holder) = store.claim_turn(&id, &mine, &host, now, now + TURN_CLAIM_MS)? {
                return Ok::<_, ChatStoreError>(Err(holder));
            }
            let numbered = store
                .next_turn(&id)
                .and_then(|turn| Ok((store.get(&id)?, turn)));
            if numbered.is_err() {
                let _ = store.release_turn_claim(&id, &mine);
            }
            Ok(Ok(numbered?))
        })
        .await?;
        let (chat, turn) = match claimed {
            Ok(numbered) => numbered,
            Err(holder) => return Err(turn_running_on(chat_id, &holder)),
        };
        let Some(chat) = chat else {
            self.release_claim(chat_id, &claim).await;
            return Err(no_chat(chat_id));
        };
        running.insert(
            chat_id.to_owned(),
            Running {
                turn,
                cancel: cancel.clone(),
                claim,
            },
        );
        Ok((chat, turn))
    }

    /// Keeps the running turn's claim on its chat for another [`TURN_CLAIM_MS`].
    async fn renew_claim(&self, chat_id: &str) {
        let Some(claim) = self
            .running
            .lock()
            .await
            .get(chat_id)
            .map(|r| r.claim.clone())
        else {
            return;
        };
        let store = self.chats.clone();
        let id = chat_id.to_owned();
        let renewed =
            blocking(move || store.renew_turn_claim(&id, &claim, now_ms() + TURN_CLAIM_MS)).await;
        match renewed {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(chat = %chat_id, "the running turn's claim on its chat was lost (it expired)")
            }
            Err(error) => {
                tracing::warn!(chat = %chat_id, error = %error.message, "cannot renew the running turn's claim")
            }
        }
    }

    /// Lets go of a turn's claim on its chat in the store; a failure is logged (the claim then
    /// expires by itself within [`TURN_CLAIM_MS`]).
    async fn release_claim(&self, chat_id: &str, claim: &str) {
        let store = self.chats.clone();
        let (id, claim) = (chat_id.to_owned(), claim.to_owned());
        let released = blocking(move || store.release_turn_claim(&id, &claim)).await;
        if let Err(error) = released {
            tracing::warn!(chat = %chat_id, error = %error.message, "cannot release the turn's claim; it expires by itself");
        }
    }

    /// Runs the turn in its own task and answers its events. A watcher frees the chat when the
    /// task ends (turning a panic into `error` + `end`), and only then ends the events.
    fn spawn_turn(
        &self,
        chat_id: &str,
        spec: TurnSpec,
        cancel: CancellationToken,
    ) -> tokio::sync::mpsc::UnboundedReceiver<turn::Event> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let service = self.clone();
        let finished = sender.clone();
        let chat_key = chat_id.to_owned();
        let mut task = tokio::spawn(turn::run(service, spec, cancel, sender));
        let running = self.running.clone();
        let this = self.clone();
        tokio::spawn(async move {
            // The claim is renewed while the turn runs, so other hosts keep out of the chat.
            let mut renew = tokio::time::interval(TURN_CLAIM_RENEW);
            renew.tick().await;
            let ended = loop {
                tokio::select! {
                    ended = &mut task => break ended,
                    _ = renew.tick() => this.renew_claim(&chat_key).await,
                }
            };
            if let Err(error) = ended {
                tracing::error!(%error, chat = %chat_key, "turn task failed");
                let _ = finished.send((
                    "error",
                    json!({"code": "internal", "message": "the turn failed unexpectedly"}),
                ));
                let _ = finished.send(("end", json!({"reason": "error"})));
            }
            let freed = running.lock().await.remove(&chat_key);
            if let Some(freed) = freed {
                this.release_claim(&chat_key, &freed.claim).await;
            }
            // Dropping the last sender ends the response: only after the chat is free again.
            drop(finished);
        });
        receiver
    }

    /// `POST /v1/chats/{id}/cancel`: the owner stops the running turn. The answer comes at once;
    /// the turn's own stream says when it has stopped.
    async fn cancel(&self, caller: &Caller, chat_id: &str) -> Result<Response<Body>, Refusal> {
        self.own_chat(caller, chat_id).await?;
        if let Some(turn) = self.cancel_running(chat_id).await {
            tracing::info!(chat = %chat_id, turn, user = %caller.user_id, "turn cancel requested");
            return Ok(cancel_accepted(chat_id, turn));
        }
        // Not here: in a cluster, the host whose claim holds the chat runs it.
        let Some(peers) = self.peers.clone() else {
            return Err(no_turn_running(chat_id));
        };
        let store = self.chats.clone();
        let id = chat_id.to_owned();
        let holder = blocking(move || store.turn_claim_holder(&id, now_ms())).await?;
        let Some(holder) = holder.filter(|host| host != peers.host()) else {
            return Err(no_turn_running(chat_id));
        };
        let unreachable = |reason: String| {
            tracing::warn!(chat = %chat_id, host = %holder, %reason, "cannot ask another agentd host to stop a turn");
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!(
                    "the turn in chat {chat_id} runs on agentd host {holder:?}, which cannot be \
                     reached ({reason}); try again shortly"
                ),
            )
        };
        match peers.cancel_on(&holder, chat_id).await {
            Ok((StatusCode::ACCEPTED, body)) => {
                tracing::info!(chat = %chat_id, host = %holder, user = %caller.user_id, "turn cancel requested on another agentd host");
                let turn = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|answer| answer["turn"].as_i64())
                    .ok_or_else(|| unreachable("its answer names no turn".into()))?;
                Ok(cancel_accepted(chat_id, turn))
            }
            Ok((StatusCode::CONFLICT, _)) => Err(no_turn_running(chat_id)),
            Ok((status, _)) => Err(unreachable(format!("it answered {status}"))),
            Err(error) => Err(unreachable(error.to_string())),
        }
    }

    async fn bind(
        &self,
        caller: &Caller,
        chat_id: &str,
        body: &Bytes,
    ) -> Result<Response<Body>, Refusal> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct BindRequest {
            device_id: String,
            folder: String,
            #[serde(default)]
            confirm: Option<String>,
        }
        let chat = self.own_chat(caller, chat_id).await?;
        let request: BindRequest = decode_json(body)?;
        if request.confirm.as_deref() != Some(CONFIRMATION) {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "consequences_not_confirmed",
                format!(
                    "binding a chat to a laptop folder needs the confirmation \"{CONFIRMATION}\" as `confirm`, exactly"
                ),
            )
            .with_detail("confirmation", CONFIRMATION));
        }
        let (project, access) = self
            .files
            .access(caller, &chat.project_id)
            .await
            .map_err(from_tool)?;
        if project.kind != ProjectKind::Code {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "not_a_code_project",
                "only chats of code projects can be bound to a laptop folder",
            ));
        }
        // A bound chat runs commands: only an authoring role binds (and every call re-checks).
        tools::laptop::require_authoring_role(&access).map_err(from_tool)?;
        if self.running.lock().await.contains_key(chat_id) {
            return Err(turn_running(chat_id));
        }
        let devices = self.devices(caller).await?;
        let Some(device) = devices.iter().find(|d| d.device_id == request.device_id) else {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "device_not_found",
                format!(
                    "you have no device {:?}; GET /v1/devices lists yours",
                    request.device_id
                ),
            ));
        };
        if !device.folders.iter().any(|f| f.alias == request.folder) {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "folder_not_shared",
                format!(
                    "the device {:?} does not share a folder named {:?}",
                    device.name, request.folder
                ),
            ));
        }
        self.set_binding(chat_id, Some((request.device_id, request.folder)))
            .await
    }

    async fn unbind(&self, caller: &Caller, chat_id: &str) -> Result<Response<Body>, Refusal> {
        self.own_chat(caller, chat_id).await?;
        self.set_binding(chat_id, None).await
    }

    /// Changes the binding under the running-turns lock: never while a turn runs.
    async fn set_binding(
        &self,
        chat_id: &str,
        binding: Option<(String, String)>,
    ) -> Result<Response<Body>, Refusal> {
        let running = self.running.lock().await;
        if running.contains_key(chat_id) {
            return Err(turn_running(chat_id));
        }
        // Across hosts too: the change holds the chat's claim while it writes, as a turn does,
        // so it is refused while a turn runs on another host and no turn starts there
        // meanwhile.
        let store = self.chats.clone();
        let (id, host) = (chat_id.to_owned(), self.host_id.clone());
        let claim = new_claim();
        let changed = blocking(move || {
            let now = now_ms();
            if let Some(holder) = store.claim_turn(&id, &claim, &host, now, now + TURN_CLAIM_MS)? {
                return Ok::<_, ChatStoreError>(Err(holder));
            }
            let chat =
                store.set_binding(&id, binding.as_ref().map(|(d, f)| (d.as_str(), f.as_str())));
            let released = store.release_turn_claim(&id, &claim);
            let chat = chat?;
            released?;
            Ok(Ok(chat))
        })
        .await?;
        drop(running);
        let chat = match changed {
            Ok(chat) => chat.ok_or_else(|| no_chat(chat_id))?,
            Err(holder) => return Err(turn_running_on(chat_id, &holder)),
        };
        tracing::info!(chat = %chat_id, bound = chat.binding.is_some(), "chat binding changed");
        Ok(json_response(StatusCode::OK, &chat))
    }
}

/// Another agentd host's cancel ([`crate::chat::peers`]) is answered as this host's own cancel
/// endpoint answers its owner, who that host has checked.
impl RunningTurns for ChatService {
    async fn cancel_for_peer(&self, chat_id: &str, origin: &str) -> Response<Body> {
        match self.cancel_running(chat_id).await {
            Some(turn) => {
                tracing::info!(chat = %chat_id, turn, %origin, "turn cancel requested by another agentd host");
                cancel_accepted(chat_id, turn)
            }
            None => no_turn_running(chat_id).into_response(),
        }
    }
}

/// The chat endpoint a request names: `None` for another path, `Err` (405) for a chat path
/// with a method it does not serve.
fn route(parts: &Parts) -> Option<Result<Route, Refusal>> {
    let path = parts.uri.path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Some(Ok(match (segments.as_slice(), &parts.method) {
        (["v1", "chats"], m) if *m == Method::POST => Route::Create,
        (["v1", "chats"], m) if *m == Method::GET => Route::List,
        (["v1", "chats", id], m) if *m == Method::GET => Route::Get(id.to_string()),
        (["v1", "chats", id, "turns"], m) if *m == Method::POST => Route::Turn(id.to_string()),
        (["v1", "chats", id, "cancel"], m) if *m == Method::POST => Route::Cancel(id.to_string()),
        (["v1", "chats", id, "attachments"], m) if *m == Method::POST => {
            Route::Attach(id.to_string())
        }
        (["v1", "chats", id, "binding"], m) if *m == Method::PUT => Route::Bind(id.to_string()),
        (["v1", "chats", id, "binding"], m) if *m == Method::DELETE => {
            Route::Unbind(id.to_string())
        }
        (["v1", "devices"], m) if *m == Method::GET => Route::Devices,
        (["v1", "projects"], m) if *m == Method::GET => Route::Projects,
        (["v1", "models"], m) if *m == Method::GET => Route::Models,
        (["v1", "agents"], m) if *m == Method::GET => Route::Agents,
        (["v1", "chats", ..], _)
        | (["v1", "devices"], _)
        | (["v1", "projects"], _)
        | (["v1", "models"], _)
        | (["v1", "agents"], _) => {
            return Some(Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} is not served on {path}", parts.method),
            )));
        }
        _ => return None,
    }))
}

enum Route {
    Create,
    List,
    Get(String),
    Turn(String),
    Attach(String),
    Cancel(String),
    Bind(String),
    Unbind(String),
    Devices,
    Projects,
    Models,
    Agents,
}

fn no_chat(chat_id: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no chat {chat_id:?} of yours"),
    )
}

/// How long a turn's claim on its chat holds without renewal: another host may take the chat
/// this long after the host running its turn died.
pub const TURN_CLAIM_MS: i64 = 60_000;
/// How often a running turn renews its claim.
const TURN_CLAIM_RENEW: std::time::Duration = std::time::Duration::from_secs(20);

fn turn_running(chat_id: &str) -> Refusal {
    Refusal::new(
        StatusCode::CONFLICT,
        "turn_running",
        format!("a turn is running in chat {chat_id}; wait for it to end and try again"),
    )
}

/// [`turn_running`] for a turn another agentd host runs (its claim names `host`).
fn turn_running_on(chat_id: &str, host: &str) -> Refusal {
    Refusal::new(
        StatusCode::CONFLICT,
        "turn_running",
        format!(
            "a turn is running in chat {chat_id} on agentd host {host:?}; wait for it to end and \
             try again"
        ),
    )
}

/// The cancel endpoint's 409, here or asked by another host.
fn no_turn_running(chat_id: &str) -> Refusal {
    Refusal::new(
        StatusCode::CONFLICT,
        "no_turn_running",
        format!("no turn is running in chat {chat_id}"),
    )
}

/// The cancel endpoint's 202 for turn number `turn`.
fn cancel_accepted(chat_id: &str, turn: i64) -> Response<Body> {
    json_response(
        StatusCode::ACCEPTED,
        &json!({"chat_id": chat_id, "turn": turn}),
    )
}

/// A fresh id for a claim on a chat ([`crate::chat::store::ChatStore::claim_turn`]).
fn new_claim() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// The `text/event-stream` response carrying a turn's events, each sent to the caller as soon
/// as the turn emits it.
fn event_stream(mut events: tokio::sync::mpsc::UnboundedReceiver<turn::Event>) -> Response<Body> {
    let (chunks, body) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some((kind, data)) = events.recv().await {
            let event = Bytes::from(format!("event: {kind}\ndata: {data}\n\n"));
            if chunks.send(event).is_err() {
                // The caller went away; the turn goes on and is stored.
                continue;
            }
        }
    });
    let mut response = Response::new(agentworks_daemon::ipc::envelope::streaming(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
