//! agentd's OAuth 2.1 authorization server for MCP clients (issue 13). [`server`] is the HTTP
//! side (metadata, registration, authorization, token, revocation); what it stores is
//! [`crate::identity::oauth`]; the consent and connected-apps API is
//! [`crate::console::oauth_consent`]. [`device`] is the device authorization grant (RFC 8628)
//! that `agentworks login` uses; [`answer`] is the `{error, error_description}` refusal every
//! OAuth endpoint sends. The rest are pure building blocks (no network, no HTTP, no store):
//!
//! - [`pkce`]: RFC 7636 proof keys, S256 only.
//! - [`redirect`]: redirect URI registration and matching (RFC 6749 §3.1.2, RFC 8252 §7.3, §8.3).
//! - [`metadata`]: RFC 8414 and RFC 9728 metadata documents and the `WWW-Authenticate` challenges.
//! - [`client_metadata`]: Client ID Metadata Documents and RFC 7591 registration bodies.
//! - [`scopes`]: the `scope` parameter and the rule that a grant never widens.
//!
//! Every refusal is an [`OAuthError`], which carries the OAuth `error` code the endpoint
//! answers with and a description for `error_description`.
//!
//! May call: `identity` (what the server stores: clients, grants, pending authorizations, device
//! logins, the failed-attempt limits), `catalog`'s scope list (the metadata's `scopes_supported`)
//! and `console::assets` (the page shell of the device and authorization pages). The pure building
//! blocks call nothing but `identity::token`'s constant-time comparison.

pub mod answer;
pub mod client_metadata;
pub mod device;
pub mod metadata;
pub mod pkce;
pub mod redirect;
pub mod scopes;
pub mod server;

/// A refusal, by its OAuth `error` code (RFC 6749 §4.1.2.1, §5.2; RFC 7591 §3.2.2), with a
/// human description. `Display` is `code: description`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OAuthError {
    #[error("invalid_request: {0}")]
    InvalidRequest(String),
    #[error("invalid_client: {0}")]
    InvalidClient(String),
    #[error("invalid_grant: {0}")]
    InvalidGrant(String),
    #[error("invalid_scope: {0}")]
    InvalidScope(String),
    #[error("unsupported_grant_type: {0}")]
    UnsupportedGrantType(String),
    #[error("unsupported_response_type: {0}")]
    UnsupportedResponseType(String),
    #[error("invalid_redirect_uri: {0}")]
    InvalidRedirectUri(String),
    #[error("invalid_client_metadata: {0}")]
    InvalidClientMetadata(String),
    #[error("invalid_target: {0}")]
    InvalidTarget(String),
    #[error("access_denied: {0}")]
    AccessDenied(String),
    #[error("server_error: {0}")]
    ServerError(String),
    #[error("temporarily_unavailable: {0}")]
    TemporarilyUnavailable(String),
}

impl OAuthError {
    /// The `error` value of the OAuth error response.
    pub fn code(&self) -> &'static str {
        match self {
            OAuthError::InvalidRequest(_) => "invalid_request",
            OAuthError::InvalidClient(_) => "invalid_client",
            OAuthError::InvalidGrant(_) => "invalid_grant",
            OAuthError::InvalidScope(_) => "invalid_scope",
            OAuthError::UnsupportedGrantType(_) => "unsupported_grant_type",
            OAuthError::UnsupportedResponseType(_) => "unsupported_response_type",
            OAuthError::InvalidRedirectUri(_) => "invalid_redirect_uri",
            OAuthError::InvalidClientMetadata(_) => "invalid_client_metadata",
            OAuthError::InvalidTarget(_) => "invalid_target",
            OAuthError::AccessDenied(_) => "access_denied",
            OAuthError::ServerError(_) => "server_error",
            OAuthError::TemporarilyUnavailable(_) => "temporarily_unavailable",
        }
    }

    /// The `error_description` value: what was wrong, for a person.
    pub fn description(&self) -> &str {
        match self {
            OAuthError::InvalidRequest(d)
            | OAuthError::InvalidClient(d)
            | OAuthError::InvalidGrant(d)
            | OAuthError::InvalidScope(d)
            | OAuthError::UnsupportedGrantType(d)
            | OAuthError::UnsupportedResponseType(d)
            | OAuthError::InvalidRedirectUri(d)
            | OAuthError::InvalidClientMetadata(d)
            | OAuthError::InvalidTarget(d)
            | OAuthError::AccessDenied(d)
            | OAuthError::ServerError(d)
            | OAuthError::TemporarilyUnavailable(d) => d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_carries_its_code_and_description() {
        let error = OAuthError::InvalidScope("workflows:write was not consented to".into());
        assert_eq!(error.code(), "invalid_scope");
        assert_eq!(error.description(), "workflows:write was not consented to");
        assert_eq!(
            error.to_string(),
            "invalid_scope: workflows:write was not consented to"
        );
        assert_eq!(
            OAuthError::InvalidClientMetadata(String::new()).code(),
            "invalid_client_metadata"
        );
    }
}
