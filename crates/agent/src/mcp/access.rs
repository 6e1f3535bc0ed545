//! Who may reach the endpoint: `Origin` validation (the bearer token is parsed by
//! [`agentworks_daemon::ipc::bearer`]), and the
//! `WWW-Authenticate` challenges for 401 and 403 answers (RFC 6750 with the RFC 9728
//! `resource_metadata` parameter the MCP authorization specification asks for).
//!
//! Pure: no I/O. Must never accept a token itself (the backend does) and never treat a missing or
//! malformed header as permission: every doubt fails closed.

use super::AuthError;
use agentworks_contract::agentd::TokenRefusal;

impl AuthError {
    /// The refusal of a presented token, in the contract's one table of codes and messages.
    fn refusal(self) -> Option<TokenRefusal> {
        match self {
            AuthError::Missing => None,
            AuthError::Invalid => Some(TokenRefusal::Invalid),
            AuthError::Expired => Some(TokenRefusal::Expired),
            AuthError::Revoked => Some(TokenRefusal::Revoked),
            AuthError::Disabled => Some(TokenRefusal::Disabled),
        }
    }

    /// The envelope code of this failure.
    pub fn code(self) -> &'static str {
        self.refusal().map_or("missing_token", TokenRefusal::code)
    }
}

impl From<TokenRefusal> for AuthError {
    fn from(refusal: TokenRefusal) -> AuthError {
        match refusal {
            TokenRefusal::Invalid => AuthError::Invalid,
            TokenRefusal::Expired => AuthError::Expired,
            TokenRefusal::Revoked => AuthError::Revoked,
            TokenRefusal::Disabled => AuthError::Disabled,
        }
    }
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.refusal().map_or(
            "this endpoint needs an `Authorization: Bearer <token>` header",
            TokenRefusal::message,
        ))
    }
}

impl std::error::Error for AuthError {}

/// The scheme, host and port of a URL (or `Origin` value), lowercased, without a default port.
fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next()?.to_ascii_lowercase();
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let authority = match (scheme.as_str(), authority.rsplit_once(':')) {
        ("http", Some((host, "80"))) | ("https", Some((host, "443"))) => host.to_owned(),
        _ => authority,
    };
    Some(format!("{scheme}://{authority}"))
}

/// Whether a request with this `Origin` may proceed: no header (not a browser), an origin
/// equal to `public_url`'s own or to one of `allowed`, or (on a loopback listener, whose port
/// is `loopback_port`) one of the three names of that listener: `http://localhost:PORT`,
/// `http://127.0.0.1:PORT`, `http://[::1]:PORT`. `null` and unparsable origins fail, and so
/// does any other host or port (a rebound DNS name keeps its own host in `Origin`).
/// This is the specification's DNS-rebinding defence, so it runs before anything else.
pub(crate) fn origin_allowed(
    origin: Option<&str>,
    public_url: &str,
    allowed: &[String],
    loopback_port: Option<u16>,
) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    let Some(origin) = origin_of(origin.trim()) else {
        return false;
    };
    let loopback = loopback_port.is_some_and(|port| {
        ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .any(|host| origin == format!("http://{host}:{port}"))
    });
    loopback
        || origin_of(public_url).as_deref() == Some(origin.as_str())
        || allowed
            .iter()
            .any(|a| origin_of(a.trim()).as_deref() == Some(origin.as_str()))
}

/// The RFC 9728 metadata URL for `/mcp`.
pub(super) fn resource_metadata_url(public_url: &str) -> String {
    format!("{public_url}/.well-known/oauth-protected-resource/mcp")
}

/// What every 401 challenge names: the metadata URL and the scopes to ask for.
#[derive(Debug, Clone)]
pub(super) struct Challenge {
    pub metadata_url: String,
    /// Space-separated; empty when the endpoint lists no scopes.
    pub scope: String,
}

/// The 401 challenge: `error="invalid_token"` for every failure but a missing token (RFC 6750
/// §3.1: a request without credentials gets no error code), with the scope a client should
/// ask for (MCP authorization, scope selection).
pub(super) fn unauthorized_challenge(error: AuthError, challenge: &Challenge) -> String {
    let Challenge {
        metadata_url,
        scope,
    } = challenge;
    let scope = if scope.is_empty() {
        String::new()
    } else {
        format!(", scope=\"{scope}\"")
    };
    match error {
        AuthError::Missing => format!("Bearer resource_metadata=\"{metadata_url}\"{scope}"),
        _ => format!(
            "Bearer error=\"invalid_token\", error_description=\"{error}\", resource_metadata=\"{metadata_url}\"{scope}"
        ),
    }
}

/// The 403 challenge naming the scope a client should ask for.
pub(super) fn insufficient_scope_challenge(scope: &str, metadata_url: &str) -> String {
    format!(
        "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{metadata_url}\""
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let public = "http://127.0.0.1:8470";
        let allowed = vec!["https://app.example.com".to_owned()];
        assert!(origin_allowed(None, public, &allowed, None));
        assert!(origin_allowed(
            Some("http://127.0.0.1:8470"),
            public,
            &allowed,
            None
        ));
        assert!(origin_allowed(
            Some("HTTPS://App.Example.com:443"),
            public,
            &allowed,
            None
        ));
        assert!(!origin_allowed(
            Some("http://127.0.0.1:8471"),
            public,
            &allowed,
            None
        ));
        assert!(!origin_allowed(
            Some("https://evil.example"),
            public,
            &allowed,
            None
        ));
        assert!(!origin_allowed(Some("null"), public, &allowed, None));
        assert!(!origin_allowed(
            Some("https://app.example.com.evil.example"),
            public,
            &allowed,
            None
        ));
        assert!(origin_allowed(
            Some("http://example.org"),
            "http://example.org:80/base",
            &[],
            None
        ));
    }

    #[test]
    fn a_loopback_listener_accepts_its_three_names_and_nothing_else() {
        let public = "http://127.0.0.1:8470";
        for own in [
            "http://localhost:8470",
            "http://LOCALHOST:8470",
            "http://127.0.0.1:8470",
            "http://[::1]:8470",
        ] {
            assert!(origin_allowed(Some(own), public, &[], Some(8470)), "{own}");
        }
        for other in [
            // Another port: another service on this machine.
            "http://localhost:8471",
            "http://[::1]:8471",
            // Not the scheme the listener speaks.
            "https://localhost:8470",
            // A rebound DNS name keeps its own host in the Origin.
            "http://evil.example:8470",
            "http://localhost.evil.example:8470",
            "http://127.0.0.2:8470",
            "http://localhost",
            "null",
        ] {
            assert!(
                !origin_allowed(Some(other), public, &[], Some(8470)),
                "{other}"
            );
        }
        // Not a loopback listener: only the public URL's own origin.
        assert!(!origin_allowed(
            Some("http://localhost:8470"),
            public,
            &[],
            None
        ));
    }

    #[test]
    fn challenges() {
        let url = resource_metadata_url("http://h:1");
        assert_eq!(url, "http://h:1/.well-known/oauth-protected-resource/mcp");
        let bare = Challenge {
            metadata_url: url.clone(),
            scope: String::new(),
        };
        let missing = unauthorized_challenge(AuthError::Missing, &bare);
        assert_eq!(missing, format!("Bearer resource_metadata=\"{url}\""));
        let scoped = Challenge {
            metadata_url: url.clone(),
            scope: "workflows:read workflows:write".into(),
        };
        assert_eq!(
            unauthorized_challenge(AuthError::Missing, &scoped),
            format!("Bearer resource_metadata=\"{url}\", scope=\"workflows:read workflows:write\"")
        );
        for e in [
            AuthError::Invalid,
            AuthError::Expired,
            AuthError::Revoked,
            AuthError::Disabled,
        ] {
            let c = unauthorized_challenge(e, &scoped);
            assert!(
                c.ends_with(", scope=\"workflows:read workflows:write\""),
                "{c}"
            );
            assert!(c.starts_with("Bearer error=\"invalid_token\""), "{c}");
            assert!(c.contains(&format!("resource_metadata=\"{url}\"")));
        }
        let scope = insufficient_scope_challenge("workflows:write", &url);
        assert!(scope.contains("error=\"insufficient_scope\""));
        assert!(scope.contains("scope=\"workflows:write\""));
    }
}
