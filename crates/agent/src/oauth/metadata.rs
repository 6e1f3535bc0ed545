//! The documents that let an MCP client find agentd's authorization server, and the
//! challenges that point it there.
//!
//! - [`AuthorizationServerMetadata`]: RFC 8414 §2, served at
//!   `/.well-known/oauth-authorization-server`; with `authorization_response_iss_parameter_supported`
//!   (RFC 9207 §3) and `client_id_metadata_document_supported`
//!   (draft-ietf-oauth-client-id-metadata-document).
//! - [`ProtectedResourceMetadata`]: RFC 9728 §2 for `/mcp`, a superset of what `/mcp` serves
//!   today (`resource`, `bearer_methods_supported`, `scopes_supported`, `resource_name`) with
//!   `authorization_servers`.
//! - [`unauthorized_challenge`] and [`insufficient_scope_challenge`]: `WWW-Authenticate`
//!   values (RFC 6750 §3, RFC 9728 §5.1), every value a quoted-string (RFC 9110 §5.6.4).

use super::scopes::OFFERED;
use serde::Serialize;

/// RFC 8414 authorization server metadata. The issuer is agentd's public URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthorizationServerMetadata {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub registration_endpoint: String,
    pub revocation_endpoint: String,
    pub response_types_supported: Vec<String>,
    pub grant_types_supported: Vec<String>,
    pub code_challenge_methods_supported: Vec<String>,
    pub token_endpoint_auth_methods_supported: Vec<String>,
    pub revocation_endpoint_auth_methods_supported: Vec<String>,
    pub scopes_supported: Vec<String>,
    pub client_id_metadata_document_supported: bool,
    pub authorization_response_iss_parameter_supported: bool,
}

impl AuthorizationServerMetadata {
    /// The metadata of the authorization server at `public_url` (a trailing `/` is ignored).
    pub fn new(public_url: &str) -> Self {
        let url = public_url.trim_end_matches('/');
        let auth_methods = strings(&["none", "client_secret_basic", "client_secret_post"]);
        AuthorizationServerMetadata {
            issuer: url.to_owned(),
            authorization_endpoint: format!("{url}/oauth/authorize"),
            token_endpoint: format!("{url}/oauth/token"),
            registration_endpoint: format!("{url}/register"),
            revocation_endpoint: format!("{url}/oauth/revoke"),
            response_types_supported: strings(&["code"]),
            grant_types_supported: strings(&["authorization_code", "refresh_token"]),
            code_challenge_methods_supported: strings(&[super::pkce::S256]),
            revocation_endpoint_auth_methods_supported: auth_methods.clone(),
            token_endpoint_auth_methods_supported: auth_methods,
            scopes_supported: scopes_supported(),
            client_id_metadata_document_supported: true,
            authorization_response_iss_parameter_supported: true,
        }
    }
}

/// RFC 9728 protected resource metadata for `/mcp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProtectedResourceMetadata {
    pub resource: String,
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Vec<String>,
    pub bearer_methods_supported: Vec<String>,
    pub resource_name: String,
}

impl ProtectedResourceMetadata {
    /// The metadata of `{public_url}/mcp`, whose authorization server is agentd itself.
    pub fn for_mcp(public_url: &str, resource_name: &str) -> Self {
        let url = public_url.trim_end_matches('/');
        ProtectedResourceMetadata {
            resource: format!("{url}/mcp"),
            authorization_servers: vec![url.to_owned()],
            scopes_supported: scopes_supported(),
            bearer_methods_supported: strings(&["header"]),
            resource_name: resource_name.to_owned(),
        }
    }
}

/// The URL of `/mcp`'s RFC 9728 metadata (§3.1: the well-known path before the resource path).
pub fn resource_metadata_url(public_url: &str) -> String {
    format!(
        "{}/.well-known/oauth-protected-resource/mcp",
        public_url.trim_end_matches('/')
    )
}

/// The URL of the RFC 8414 metadata (§3.1; the issuer has no path).
pub fn authorization_server_metadata_url(public_url: &str) -> String {
    format!(
        "{}/.well-known/oauth-authorization-server",
        public_url.trim_end_matches('/')
    )
}

/// The 401 challenge for a request without a usable token: where the metadata is and, if
/// given, the scope to ask for (RFC 9728 §5.1, RFC 6750 §3).
pub fn unauthorized_challenge(scope: Option<&str>, resource_metadata: &str) -> String {
    let mut challenge = format!("Bearer resource_metadata={}", quoted(resource_metadata));
    if let Some(scope) = scope {
        challenge.push_str(&format!(", scope={}", quoted(scope)));
    }
    challenge
}

/// The 403 step-up challenge: the token lacks `scope` (RFC 6750 §3.1 `insufficient_scope`).
pub fn insufficient_scope_challenge(scope: &str, resource_metadata: &str) -> String {
    format!(
        "Bearer error=\"insufficient_scope\", scope={}, resource_metadata={}",
        quoted(scope),
        quoted(resource_metadata)
    )
}

/// An RFC 9110 §5.6.4 quoted-string: `"` and `\` escaped; control characters (a CR or LF
/// would end the header) dropped, as a quoted-string cannot carry them.
pub fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars().filter(|c| !c.is_control()) {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The scopes this authorization server issues: the workflow scopes, never `devices:*`.
fn scopes_supported() -> Vec<String> {
    OFFERED.iter().map(|s| s.as_str().to_owned()).collect()
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|&v| v.to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn authorization_server_metadata_names_every_endpoint() {
        let metadata =
            serde_json::to_value(AuthorizationServerMetadata::new("https://h.example/")).unwrap();
        assert_eq!(
            metadata,
            json!({
                "issuer": "https://h.example",
                "authorization_endpoint": "https://h.example/oauth/authorize",
                "token_endpoint": "https://h.example/oauth/token",
                "registration_endpoint": "https://h.example/register",
                "revocation_endpoint": "https://h.example/oauth/revoke",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported":
                    ["none", "client_secret_basic", "client_secret_post"],
                "revocation_endpoint_auth_methods_supported":
                    ["none", "client_secret_basic", "client_secret_post"],
                "scopes_supported": ["workflows:read", "workflows:run", "workflows:write"],
                "client_id_metadata_document_supported": true,
                "authorization_response_iss_parameter_supported": true,
            })
        );
    }

    #[test]
    fn no_device_scope_is_advertised() {
        let metadata = AuthorizationServerMetadata::new("https://h.example");
        assert!(
            metadata
                .scopes_supported
                .iter()
                .all(|s| !s.starts_with("devices:"))
        );
        assert_eq!(
            metadata.scopes_supported,
            crate::catalog::WORKFLOW_SCOPES.map(str::to_owned).to_vec()
        );
    }

    #[test]
    fn protected_resource_metadata_is_a_superset_of_what_mcp_serves() {
        let metadata = serde_json::to_value(ProtectedResourceMetadata::for_mcp(
            "http://h:1",
            "agentworks",
        ))
        .unwrap();
        assert_eq!(
            metadata,
            json!({
                "resource": "http://h:1/mcp",
                "authorization_servers": ["http://h:1"],
                "scopes_supported": ["workflows:read", "workflows:run", "workflows:write"],
                "bearer_methods_supported": ["header"],
                "resource_name": "agentworks",
            })
        );
        // /mcp's own metadata URL, spelled the same way.
        assert_eq!(
            resource_metadata_url("http://h:1"),
            "http://h:1/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            authorization_server_metadata_url("http://h:1/"),
            "http://h:1/.well-known/oauth-authorization-server"
        );
    }

    #[test]
    fn challenges_quote_their_values() {
        let url = "https://h.example/.well-known/oauth-protected-resource/mcp";
        assert_eq!(
            unauthorized_challenge(None, url),
            format!("Bearer resource_metadata=\"{url}\"")
        );
        assert_eq!(
            unauthorized_challenge(Some("workflows:read workflows:run"), url),
            format!("Bearer resource_metadata=\"{url}\", scope=\"workflows:read workflows:run\"")
        );
        assert_eq!(
            insufficient_scope_challenge("workflows:write", url),
            format!(
                "Bearer error=\"insufficient_scope\", scope=\"workflows:write\", resource_metadata=\"{url}\""
            )
        );
    }

    #[test]
    fn quoting_escapes_quotes_and_backslashes_and_drops_line_breaks() {
        assert_eq!(quoted(""), "\"\"");
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quoted("a\r\nSet-Cookie: x\t"), "\"aSet-Cookie: x\"");
        assert_eq!(
            insufficient_scope_challenge("x\", error=\"y", "u"),
            r#"Bearer error="insufficient_scope", scope="x\", error=\"y", resource_metadata="u""#
        );
    }
}
