//! How agentd reaches runnerd (`runnerd.sock` on this host: `[runnerd] socket`, else
//! `<runtime_dir>/runnerd.sock`), which runs a chat's turn with a coding CLI: the providers it
//! has, a turn as a stream of [`TurnEvent`]s, and a turn's cancel.
//!
//! runnerd is optional: without it the only agent is `api`. A socket nobody listens on is
//! [`RunnerdError::NotRunning`], with the sentence a person acts on. Never decides who may
//! run what: the chat API and the turn check the person first.

use agentworks_contract::runnerd::{BridgeAnswer, ProvidersAnswer, TurnEvent, TurnRequest};
use agentworks_support::unix_http::{ClientError, LineStream, UnixClient};
use std::path::Path;

/// The longest line of a turn's stream runnerd may send (a tool's output is bounded there).
pub const MAX_EVENT_LINE_BYTES: usize = 4 * 1024 * 1024;

/// What a person is told when runnerd does not answer.
pub const NOT_RUNNING: &str = "runnerd is not running: start agentworks-runnerd";

#[derive(Debug, thiserror::Error)]
pub enum RunnerdError {
    /// Nothing listens on the socket (or it is missing): runnerd is not running.
    #[error("{NOT_RUNNING} (nothing answers on {socket})")]
    NotRunning { socket: String },
    /// runnerd refused the call with its own code and sentence.
    #[error("{message}")]
    Refused { code: String, message: String },
    /// The exchange failed otherwise (a broken connection, an answer that is not runnerd's).
    #[error("runnerd failed: {0}")]
    Failed(ClientError),
    /// A line of the turn's stream is not a turn event.
    #[error("runnerd sent a line that is not a turn event: {0}")]
    BadEvent(serde_json::Error),
}

impl RunnerdError {
    /// The stable code a turn's `error` event carries.
    pub fn code(&self) -> &str {
        match self {
            RunnerdError::NotRunning { .. } => "runnerd_not_running",
            RunnerdError::Refused { code, .. } => code,
            RunnerdError::Failed(_) | RunnerdError::BadEvent(_) => "runnerd_failed",
        }
    }
}

impl From<ClientError> for RunnerdError {
    fn from(error: ClientError) -> RunnerdError {
        match error {
            ClientError::Connect { path, .. } => RunnerdError::NotRunning {
                socket: path.display().to_string(),
            },
            ClientError::Remote { body, .. } => RunnerdError::Refused {
                code: body.code,
                message: body.message,
            },
            other => RunnerdError::Failed(other),
        }
    }
}

/// A cheap-to-clone client for runnerd's socket.
#[derive(Debug, Clone)]
pub struct RunnerdClient {
    client: UnixClient,
}

impl RunnerdClient {
    pub fn new(socket: impl AsRef<Path>) -> RunnerdClient {
        RunnerdClient {
            client: UnixClient::new(socket.as_ref()),
        }
    }

    /// `GET /v1/providers`: the providers runnerd has, and whether each can run.
    pub async fn providers(&self) -> Result<ProvidersAnswer, RunnerdError> {
        Ok(self.client.get("/v1/providers").await?)
    }

    /// `POST /v1/turns`: starts a turn; its events follow on the stream.
    pub async fn start_turn(&self, request: &TurnRequest) -> Result<TurnStream, RunnerdError> {
        let lines = self
            .client
            .post_lines("/v1/turns", request, MAX_EVENT_LINE_BYTES)
            .await?;
        Ok(TurnStream { lines })
    }

    /// `POST /v1/turns/{id}/bridge/{call_id}`: agentd's answer to a bridge call of the turn.
    pub async fn answer_bridge(
        &self,
        turn_id: &str,
        call_id: &str,
        answer: &BridgeAnswer,
    ) -> Result<(), RunnerdError> {
        let path = format!(
            "/v1/turns/{}/bridge/{}",
            url_segment(turn_id),
            url_segment(call_id)
        );
        match self
            .client
            .post::<_, serde_json::Value>(&path, answer)
            .await
        {
            Ok(_) | Err(ClientError::Decode { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// `POST /v1/turns/{id}/cancel`: ends the turn's CLI and its process tree.
    pub async fn cancel(&self, turn_id: &str) -> Result<(), RunnerdError> {
        // The id is runnerd's own; it goes in the path, so it must stay one segment.
        let id: String = url_segment(turn_id);
        let path = format!("/v1/turns/{id}/cancel");
        match self
            .client
            .post::<_, serde_json::Value>(&path, &serde_json::json!({}))
            .await
        {
            // An answer that is not JSON still means runnerd took the cancel.
            Ok(_) | Err(ClientError::Decode { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

/// `turn_id` with every byte outside `[A-Za-z0-9_-]` percent-encoded.
fn url_segment(turn_id: &str) -> String {
    turn_id
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A running turn's events, in order. Dropping it closes the stream, which does not stop the
/// turn: [`RunnerdClient::cancel`] does.
pub struct TurnStream {
    lines: LineStream,
}

impl TurnStream {
    /// The next event; `None` when runnerd closed the stream. Blank lines are skipped.
    pub async fn next(&mut self) -> Result<Option<TurnEvent>, RunnerdError> {
        loop {
            let Some(line) = self.lines.next_line().await? else {
                return Ok(None);
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return serde_json::from_slice(&line)
                .map(Some)
                .map_err(RunnerdError::BadEvent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_nobody_listens_on_means_runnerd_is_not_running() {
        let tmp = tempfile::tempdir().unwrap();
        let error = RunnerdClient::new(tmp.path().join("runnerd.sock"))
            .providers()
            .await
            .unwrap_err();
        assert_eq!(error.code(), "runnerd_not_running");
        assert!(error.to_string().starts_with(NOT_RUNNING), "{error}");
    }

    #[test]
    fn a_turn_id_stays_one_path_segment() {
        assert_eq!(url_segment("t-1_a"), "t-1_a");
        assert_eq!(url_segment("../x y"), "%2E%2E%2Fx%20y");
    }
}
