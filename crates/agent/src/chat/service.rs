//! The chats' service handle: the stores and clients a chat endpoint and a running turn share,
//! and the few operations both use (append and read messages, check that a turn is still the
//! running one, list the caller's devices). It knows nothing of HTTP routing: [`super::api`]
//! serves the endpoints on it and [`super::turn`] runs turns with it, so neither imports the
//! other.

use crate::catalog::files::FileTools;
use crate::chat::attachments::{AttachmentError, AttachmentStore};
use crate::chat::model::ModelClient;
use crate::chat::store::{ChatStore, ChatStoreError, StoredMessage};
use crate::clients::gatewayd::GatewaydClient;
use crate::connections::ConnectionTools;
use crate::identity::IdentityStore;
use crate::mcp::{Caller, ToolError};
use agentworks_contract::gatewayd::{DeviceInfo, DevicesRequest};
use agentworks_daemon::ipc::envelope::{Refusal, run_blocking};
use agentworks_support::unix_http::ClientError;
use hyper::StatusCode;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The chat API's refusal for a chat store failure: 503, try again (and the failure logged).
impl From<ChatStoreError> for Refusal {
    fn from(error: ChatStoreError) -> Refusal {
        tracing::error!(%error, "chat store failed");
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("{error}; try again shortly"),
        )
    }
}

/// Which turn is running in a chat, and how to cancel it.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) turn: i64,
    pub(crate) cancel: CancellationToken,
    /// Its claim on the chat in the store ([`ChatStore::claim_turn`]), which keeps other agentd
    /// hosts from running a turn of the same chat meanwhile.
    pub(crate) claim: String,
}

/// Everything the chat endpoints and the turns need. Cheap to clone.
#[derive(Clone)]
pub struct ChatService {
    pub identity: IdentityStore,
    pub files: FileTools,
    pub chats: ChatStore,
    pub attachments: AttachmentStore,
    /// The projects' MCP connections, as a server-mode turn uses them: the one way from the
    /// chats to the connections.
    pub connection_tools: ConnectionTools,
    pub gatewayd: GatewaydClient,
    pub model: Option<ModelClient>,
    /// runnerd, which runs the turns of chats whose agent is a coding CLI (`None`: no runnerd,
    /// so `api` is the only agent).
    pub runnerd: Option<crate::clients::runnerd::RunnerdClient>,
    /// The console's sessions, accepted beside bearer tokens (none unless agentd sets them).
    pub sessions: crate::console::session::Sessions,
    pub(crate) running: Arc<tokio::sync::Mutex<HashMap<String, Running>>>,
    /// This agentd's `cluster.host_id` ("-" on one host), named in its turn claims.
    pub host_id: String,
    /// In a cluster, the way to the other agentd hosts: a turn one of them runs is stopped
    /// there ([`super::peers`]).
    pub peers: Option<crate::chat::peers::TurnPeers>,
}

/// The chat API's refusal for an attachment the store refused, with the status that fits.
impl From<AttachmentError> for Refusal {
    fn from(error: AttachmentError) -> Refusal {
        let status = match &error {
            AttachmentError::Open { .. }
            | AttachmentError::OpenShared(_)
            | AttachmentError::Sql(_) => {
                tracing::error!(%error, "attachment store failed");
                StatusCode::SERVICE_UNAVAILABLE
            }
            AttachmentError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            AttachmentError::Unsupported { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            AttachmentError::TooMany { .. } | AttachmentError::Empty { .. } => {
                StatusCode::BAD_REQUEST
            }
            AttachmentError::NotFound { .. } => StatusCode::NOT_FOUND,
        };
        Refusal::new(status, error.code(), error.to_string())
    }
}

/// A chat or attachment store call on a blocking thread, its error answered as a refusal.
pub(crate) async fn blocking<T, E>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, Refusal>
where
    T: Send + 'static,
    E: Send + 'static,
    Refusal: From<E>,
{
    run_blocking(f, Refusal::from).await
}

pub(crate) fn to_tool(error: Refusal) -> ToolError {
    ToolError::new(error.code, error.message)
}

impl ChatService {
    pub fn new(
        identity: IdentityStore,
        files: FileTools,
        chats: ChatStore,
        attachments: AttachmentStore,
        connection_tools: ConnectionTools,
        gatewayd: GatewaydClient,
        model: Option<ModelClient>,
    ) -> ChatService {
        ChatService {
            identity,
            files,
            chats,
            attachments,
            connection_tools,
            gatewayd,
            model,
            runnerd: None,
            sessions: Default::default(),
            running: Default::default(),
            host_id: "-".to_owned(),
            peers: None,
        }
    }

    /// Stops the turn running in `chat_id` on this host: its number, or `None` if none runs
    /// here. Its stream says when it has stopped.
    pub(crate) async fn cancel_running(&self, chat_id: &str) -> Option<i64> {
        let running = self.running.lock().await.get(chat_id).cloned()?;
        running.cancel.cancel();
        Some(running.turn)
    }

    pub(crate) async fn append(
        &self,
        chat_id: &str,
        turn: i64,
        message: Value,
    ) -> Result<(), ToolError> {
        let store = self.chats.clone();
        let chat_id = chat_id.to_owned();
        blocking(move || store.append(&chat_id, turn, &message))
            .await
            .map_err(to_tool)
    }

    pub(crate) async fn messages(&self, chat_id: &str) -> Result<Vec<StoredMessage>, ToolError> {
        let store = self.chats.clone();
        let chat_id = chat_id.to_owned();
        blocking(move || store.messages(&chat_id))
            .await
            .map_err(to_tool)
    }

    /// Refuses a tool call whose turn is no longer the chat's running turn, or whose chat's
    /// binding changed since the turn started.
    pub(crate) async fn check_current(
        &self,
        chat_id: &str,
        turn: i64,
        binding_generation: i64,
    ) -> Result<(), ToolError> {
        let stale =
            |why: &str| ToolError::new("stale_turn", format!("{why}; the call was not run"));
        let running = self.running.lock().await.get(chat_id).map(|r| r.turn);
        if running.is_none_or(|r| r != turn) {
            return Err(stale("this turn is no longer running"));
        }
        let store = self.chats.clone();
        let id = chat_id.to_owned();
        let chat = blocking(move || store.get(&id)).await.map_err(to_tool)?;
        if chat.is_none_or(|c| c.binding_generation != binding_generation) {
            return Err(stale(
                "the chat's folder binding changed since this turn started",
            ));
        }
        Ok(())
    }

    /// The caller's devices, from gatewayd (only that person's).
    pub(crate) async fn devices(&self, caller: &Caller) -> Result<Vec<DeviceInfo>, Refusal> {
        let request = DevicesRequest {
            user_id: caller.user_id.clone(),
        };
        match self.gatewayd.post("/v1/devices", &request).await {
            Ok(devices) => Ok(devices),
            Err(ClientError::Remote { status, body }) => Err(Refusal::relayed(status, body)),
            Err(error) => Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway_unavailable",
                format!(
                    "the device gateway (agentworks-gatewayd) is not reachable at {}: {error}; laptop folders are unavailable until it runs",
                    self.gatewayd.target()
                ),
            )),
        }
    }
}
