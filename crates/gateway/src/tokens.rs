//! Asking agentd about executor tokens, over `agentd.sock`'s gateway endpoints.
//!
//! Owns the two questions gatewayd may ask: "is this presented token a live, exclusive
//! `devices:connect` token, and whose?" (`POST /v1/gateway/token-check`, on connect) and
//! "which of these token ids are no longer valid?" (`POST /v1/gateway/token-status`, on every
//! dispatch and every `token_recheck_ms`).
//!
//! Must never cache a positive answer, log or store a token, or treat "agentd unreachable" as
//! "valid": every failure here refuses.

use std::path::PathBuf;
use std::time::Duration;

use agentworks_contract::agentd::{
    TokenCheckRequest, TokenCheckResponse, TokenStatusRequest, TokenStatusResponse,
};
use agentworks_daemon::ipc::envelope::Refusal;
use agentworks_support::unix_http::{ClientError, UnixClient};

/// How long one question to agentd may take before gatewayd refuses.
const AGENTD_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a token was not accepted or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// agentd refused the token (unknown, revoked, expired, wrong scope): its status and code.
    #[error("{code}: {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// agentd could not be asked; fail closed.
    #[error("agentd at {socket} cannot check tokens right now: {detail}")]
    Unavailable { socket: PathBuf, detail: String },
}

impl TokenError {
    /// The HTTP status to answer with: agentd's 401/403, or 503 when agentd is unreachable.
    pub fn status(&self) -> hyper::StatusCode {
        match self {
            TokenError::Refused { status, .. } => {
                hyper::StatusCode::from_u16(*status).unwrap_or(hyper::StatusCode::UNAUTHORIZED)
            }
            TokenError::Unavailable { .. } => hyper::StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The envelope code: agentd's (`token_revoked`, `insufficient_scope`, …) or
    /// `agentd_unavailable`.
    pub fn code(&self) -> &str {
        match self {
            TokenError::Refused { code, .. } => code,
            TokenError::Unavailable { .. } => "agentd_unavailable",
        }
    }
}

/// The refusal a socket request gets for a token agentd refused or could not check: that
/// status and code, and the whole error as the message.
impl From<TokenError> for Refusal {
    fn from(error: TokenError) -> Refusal {
        Refusal::new(error.status(), error.code(), error.to_string())
    }
}

/// A client for agentd's gateway endpoints. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TokenAuthority {
    client: UnixClient,
}

impl TokenAuthority {
    pub fn new(agentd_socket: PathBuf) -> TokenAuthority {
        TokenAuthority {
            client: UnixClient::new(agentd_socket),
        }
    }

    fn unavailable(&self, detail: String) -> TokenError {
        TokenError::Unavailable {
            socket: self.client.socket().to_path_buf(),
            detail,
        }
    }

    fn map(&self, error: ClientError) -> TokenError {
        match error {
            ClientError::Remote { status, body } if status == 401 || status == 403 => {
                TokenError::Refused {
                    status,
                    code: body.code,
                    message: body.message,
                }
            }
            other => self.unavailable(other.to_string()),
        }
    }

    /// Who a presented token belongs to, if it is a live `devices:connect` token.
    pub async fn check(&self, token: &str) -> Result<TokenCheckResponse, TokenError> {
        let request = TokenCheckRequest {
            token: token.to_owned(),
        };
        match tokio::time::timeout(
            AGENTD_TIMEOUT,
            self.client.post("/v1/gateway/token-check", &request),
        )
        .await
        {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(self.map(e)),
            Err(_) => Err(self.unavailable("no answer within 5 s".into())),
        }
    }

    /// Which of `token_ids` are no longer valid (revoked, expired, unknown, user disabled).
    pub async fn invalid(&self, token_ids: Vec<String>) -> Result<Vec<String>, TokenError> {
        let request = TokenStatusRequest { token_ids };
        match tokio::time::timeout(
            AGENTD_TIMEOUT,
            self.client
                .post::<_, TokenStatusResponse>("/v1/gateway/token-status", &request),
        )
        .await
        {
            Ok(Ok(answer)) => Ok(answer.invalid),
            Ok(Err(e)) => Err(self.map(e)),
            Err(_) => Err(self.unavailable("no answer within 5 s".into())),
        }
    }
}
