//! What a client says about itself: a Client ID Metadata Document
//! (draft-ietf-oauth-client-id-metadata-document-00 §3, §4) or an RFC 7591 registration
//! request (§2, §3.1), checked into a [`ClientMetadata`].
//!
//! - A document is at most [`MAX_DOCUMENT_BYTES`], refused before it is parsed.
//! - A document's `client_id` is exactly the URL it was fetched from: https, with a path, no
//!   fragment, no userinfo, no dot segments (draft §3). Its client is public:
//!   `token_endpoint_auth_method` is absent or `none` (other methods, `private_key_jwt`
//!   included, are not supported here).
//! - A registration body has no `client_id` (the server assigns it; one sent is ignored, as
//!   RFC 7591 §2 lets a server replace any value) and may also ask for
//!   `client_secret_basic` or `client_secret_post`.
//! - Both: `redirect_uris` non-empty, each per [`super::redirect::check_registration`];
//!   `grant_types` ⊆ {authorization_code, refresh_token} and `response_types` ⊆ {code}
//!   (defaults per RFC 7591 §2); `client_name` cleaned for the consent page;
//!   `client_uri` and `logo_uri` https URLs. Unknown fields are ignored (RFC 7591 §2).

use super::OAuthError;
use super::redirect;
use serde::Deserialize;
use url::Url;

/// The largest client ID metadata document accepted.
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024;

/// The longest `client_name` shown, in characters; a longer one is cut.
pub const MAX_CLIENT_NAME_CHARS: usize = 100;

/// How a client authenticates at the token endpoint (RFC 7591 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenEndpointAuthMethod {
    None,
    ClientSecretBasic,
    ClientSecretPost,
}

impl TokenEndpointAuthMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenEndpointAuthMethod::None => "none",
            TokenEndpointAuthMethod::ClientSecretBasic => "client_secret_basic",
            TokenEndpointAuthMethod::ClientSecretPost => "client_secret_post",
        }
    }
}

/// The grants a client may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantType {
    AuthorizationCode,
    RefreshToken,
}

impl GrantType {
    pub fn as_str(self) -> &'static str {
        match self {
            GrantType::AuthorizationCode => "authorization_code",
            GrantType::RefreshToken => "refresh_token",
        }
    }
}

/// A client's checked metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMetadata {
    /// The document's URL for a client ID metadata document; `None` for a registration.
    pub client_id: Option<String>,
    pub redirect_uris: Vec<String>,
    pub token_endpoint_auth_method: TokenEndpointAuthMethod,
    pub grant_types: Vec<GrantType>,
    /// Trimmed, without control or bidirectional-formatting characters, at most
    /// [`MAX_CLIENT_NAME_CHARS`]; `None` if nothing is left.
    pub client_name: Option<String>,
    pub client_uri: Option<String>,
    pub logo_uri: Option<String>,
}

/// The fields read, as sent. Wrong JSON types fail the parse.
#[derive(Deserialize)]
struct Raw {
    client_id: Option<String>,
    redirect_uris: Option<Vec<String>>,
    token_endpoint_auth_method: Option<String>,
    grant_types: Option<Vec<String>>,
    response_types: Option<Vec<String>>,
    client_name: Option<String>,
    client_uri: Option<String>,
    logo_uri: Option<String>,
}

/// Check a client ID metadata document fetched from `fetched_from`.
pub fn parse_document(bytes: &[u8], fetched_from: &str) -> Result<ClientMetadata, OAuthError> {
    check_client_id_url(fetched_from)?;
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(invalid(format!(
            "the client metadata document is {} bytes; at most {MAX_DOCUMENT_BYTES} are accepted",
            bytes.len()
        )));
    }
    let raw = parse_raw(bytes)?;
    match raw.client_id.as_deref() {
        Some(id) if id == fetched_from => {}
        Some(id) => {
            return Err(invalid(format!(
                "the document's client_id {id:?} is not the URL it was fetched from ({fetched_from:?})"
            )));
        }
        None => {
            return Err(invalid(
                "the client metadata document has no client_id".into(),
            ));
        }
    }
    let method = match raw.token_endpoint_auth_method.as_deref() {
        None | Some("none") => TokenEndpointAuthMethod::None,
        Some(other) => {
            return Err(invalid(format!(
                "token_endpoint_auth_method {other:?} is not supported for a client ID metadata \
                 document; such clients are public (\"none\")"
            )));
        }
    };
    let mut checked = check_common(raw, method)?;
    checked.client_id = Some(fetched_from.to_owned());
    Ok(checked)
}

/// Check an RFC 7591 registration request body (`POST /register`).
pub fn parse_registration(bytes: &[u8]) -> Result<ClientMetadata, OAuthError> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(invalid(format!(
            "the registration request is {} bytes; at most {MAX_DOCUMENT_BYTES} are accepted",
            bytes.len()
        )));
    }
    let raw = parse_raw(bytes)?;
    let method = match raw.token_endpoint_auth_method.as_deref() {
        // RFC 7591 §2's default is client_secret_basic; MCP clients that register are mostly
        // public and say "none".
        None | Some("client_secret_basic") => TokenEndpointAuthMethod::ClientSecretBasic,
        Some("none") => TokenEndpointAuthMethod::None,
        Some("client_secret_post") => TokenEndpointAuthMethod::ClientSecretPost,
        Some(other) => {
            return Err(invalid(format!(
                "token_endpoint_auth_method {other:?} is not supported; use none, \
                 client_secret_basic or client_secret_post"
            )));
        }
    };
    check_common(raw, method)
}

/// Accept a `client_id` that names a metadata document: an https URL with a host and a path
/// other than `/`, without fragment, userinfo or `.`/`..` segments, written as it parses.
pub fn check_client_id_url(client_id: &str) -> Result<(), OAuthError> {
    let refuse = |why: &str| OAuthError::InvalidClient(format!("client_id {client_id:?} {why}"));
    let url = Url::parse(client_id).map_err(|e| refuse(&format!("is not a URL ({e})")))?;
    if url.scheme() != "https" {
        return Err(refuse("is not an https URL"));
    }
    if url.fragment().is_some() || client_id.contains('#') {
        return Err(refuse("has a fragment"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse("has userinfo"));
    }
    if has_dot_segment(client_id) {
        return Err(refuse("has a dot segment (. or ..) in its path"));
    }
    if url.path() == "/" {
        return Err(refuse("has no path"));
    }
    // Anything the parser would rewrite (case, default port, escapes) makes the exact
    // comparison of the document's client_id ambiguous: ask for the canonical spelling.
    if url.as_str() != client_id {
        return Err(refuse(&format!(
            "is not in canonical form (it parses as {:?})",
            url.as_str()
        )));
    }
    Ok(())
}

/// Whether the path of `uri` (as written) has a `.` or `..` segment, escaped or not.
fn has_dot_segment(uri: &str) -> bool {
    let Some((_, rest)) = uri.split_once("://") else {
        return false;
    };
    let path_start = rest.find('/').unwrap_or(rest.len());
    let path_end = rest.find(['?', '#']).unwrap_or(rest.len()).max(path_start);
    rest[path_start..path_end].split('/').any(|segment| {
        let segment = segment.to_ascii_lowercase().replace("%2e", ".");
        segment == "." || segment == ".."
    })
}

fn parse_raw(bytes: &[u8]) -> Result<Raw, OAuthError> {
    serde_json::from_slice(bytes).map_err(|e| {
        invalid(format!(
            "the client metadata is not a valid JSON object: {e}"
        ))
    })
}

fn check_common(raw: Raw, method: TokenEndpointAuthMethod) -> Result<ClientMetadata, OAuthError> {
    let redirect_uris = raw.redirect_uris.unwrap_or_default();
    if redirect_uris.is_empty() {
        return Err(OAuthError::InvalidRedirectUri(
            "redirect_uris must name at least one redirect URI".into(),
        ));
    }
    for uri in &redirect_uris {
        redirect::check_registration(uri)?;
    }
    let grant_types = match raw.grant_types {
        None => vec![GrantType::AuthorizationCode],
        Some(names) => names
            .iter()
            .map(|name| match name.as_str() {
                "authorization_code" => Ok(GrantType::AuthorizationCode),
                "refresh_token" => Ok(GrantType::RefreshToken),
                other => Err(invalid(format!(
                    "grant type {other:?} is not supported; use authorization_code and \
                     refresh_token"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    // RFC 7591 §2.1: response type `code` goes with the authorization_code grant.
    if !grant_types.contains(&GrantType::AuthorizationCode) {
        return Err(invalid(
            "grant_types must include authorization_code, the only flow served".into(),
        ));
    }
    let mut unique_grants = Vec::new();
    for grant in grant_types {
        if !unique_grants.contains(&grant) {
            unique_grants.push(grant);
        }
    }
    if let Some(types) = &raw.response_types {
        if types.is_empty() {
            return Err(invalid("response_types must include code".into()));
        }
        if let Some(other) = types.iter().find(|t| *t != "code") {
            return Err(invalid(format!(
                "response type {other:?} is not supported; only code is"
            )));
        }
    }
    Ok(ClientMetadata {
        client_id: None,
        redirect_uris,
        token_endpoint_auth_method: method,
        grant_types: unique_grants,
        client_name: raw.client_name.as_deref().and_then(clean_name),
        client_uri: raw
            .client_uri
            .map(|uri| check_https("client_uri", uri))
            .transpose()?,
        logo_uri: raw
            .logo_uri
            .map(|uri| check_https("logo_uri", uri))
            .transpose()?,
    })
}

/// A name fit for the consent page: no control or bidirectional-formatting characters
/// (which could make it read as something else), trimmed, cut to [`MAX_CLIENT_NAME_CHARS`].
pub fn clean_name(name: &str) -> Option<String> {
    let bidi = |c: char| matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    let kept: String = name
        .chars()
        .filter(|&c| !c.is_control() && !bidi(c))
        .collect();
    let cut: String = kept.trim().chars().take(MAX_CLIENT_NAME_CHARS).collect();
    let cut = cut.trim_end();
    (!cut.is_empty()).then(|| cut.to_owned())
}

fn check_https(field: &str, uri: String) -> Result<String, OAuthError> {
    let ok = Url::parse(&uri).is_ok_and(|url| {
        url.scheme() == "https"
            && url.host_str().is_some()
            && url.username().is_empty()
            && url.password().is_none()
    });
    if ok {
        Ok(uri)
    } else {
        Err(invalid(format!(
            "{field} {uri:?} must be an https URL without userinfo"
        )))
    }
}

fn invalid(description: String) -> OAuthError {
    OAuthError::InvalidClientMetadata(description)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const ID: &str = "https://app.example/oauth/client.json";

    fn document(changes: Value) -> Vec<u8> {
        let mut doc = json!({
            "client_id": ID,
            "client_name": "Example App",
            "redirect_uris": ["http://127.0.0.1/callback", "https://app.example/cb"],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        });
        for (key, value) in changes.as_object().unwrap() {
            if value.is_null() {
                doc.as_object_mut().unwrap().remove(key);
            } else {
                doc[key] = value.clone();
            }
        }
        serde_json::to_vec(&doc).unwrap()
    }

    fn refused(changes: Value) -> OAuthError {
        parse_document(&document(changes.clone()), ID)
            .expect_err(&format!("{changes} should be refused"))
    }

    #[test]
    fn a_document_is_checked_into_metadata() {
        let metadata = parse_document(&document(json!({"extra": {"ignored": true}})), ID).unwrap();
        assert_eq!(
            metadata,
            ClientMetadata {
                client_id: Some(ID.into()),
                redirect_uris: vec![
                    "http://127.0.0.1/callback".into(),
                    "https://app.example/cb".into()
                ],
                token_endpoint_auth_method: TokenEndpointAuthMethod::None,
                grant_types: vec![GrantType::AuthorizationCode, GrantType::RefreshToken],
                client_name: Some("Example App".into()),
                client_uri: None,
                logo_uri: None,
            }
        );
        // The minimal document: defaults per RFC 7591 §2.
        let minimal = json!({"client_id": ID, "redirect_uris": ["https://app.example/cb"]});
        let metadata = parse_document(minimal.to_string().as_bytes(), ID).unwrap();
        assert_eq!(metadata.grant_types, vec![GrantType::AuthorizationCode]);
        assert_eq!(
            metadata.token_endpoint_auth_method,
            TokenEndpointAuthMethod::None
        );
        assert_eq!(metadata.client_name, None);
    }

    #[test]
    fn an_oversized_document_is_refused_before_parsing() {
        // Not JSON at all: the size is what refuses it.
        let big = vec![b'x'; MAX_DOCUMENT_BYTES + 1];
        let error = parse_document(&big, ID).unwrap_err();
        assert_eq!(error.code(), "invalid_client_metadata");
        assert!(error.description().contains("bytes"), "{error}");
        assert!(
            parse_registration(&big)
                .unwrap_err()
                .description()
                .contains("bytes")
        );
        // Exactly the limit is accepted (trailing whitespace is valid JSON).
        let mut padded = document(json!({}));
        padded.resize(MAX_DOCUMENT_BYTES, b' ');
        assert!(parse_document(&padded, ID).is_ok());
    }

    #[test]
    fn the_client_id_must_be_the_url_it_was_fetched_from() {
        for (changes, why) in [
            (
                json!({"client_id": "https://app.example/other.json"}),
                "not the URL",
            ),
            (
                json!({"client_id": "https://APP.example/oauth/client.json"}),
                "not the URL",
            ),
            (json!({"client_id": null}), "no client_id"),
            (json!({"client_id": 7}), "not a valid JSON object"),
        ] {
            let error = refused(changes.clone());
            assert_eq!(error.code(), "invalid_client_metadata", "{changes}");
            assert!(error.description().contains(why), "{changes}: {error}");
        }
        for bytes in [&b"[]"[..], b"null", b"{", b"\"x\""] {
            assert_eq!(
                parse_document(bytes, ID).unwrap_err().code(),
                "invalid_client_metadata"
            );
        }
    }

    #[test]
    fn client_id_urls_are_https_with_a_path() {
        assert_eq!(check_client_id_url(ID), Ok(()));
        assert_eq!(
            check_client_id_url("https://app.example:8443/c?v=1"),
            Ok(())
        );
        for (url, why) in [
            ("http://app.example/client.json", "not an https URL"),
            ("https://app.example", "no path"),
            ("https://app.example/", "no path"),
            ("https://app.example/client.json#x", "fragment"),
            ("https://u:p@app.example/client.json", "userinfo"),
            ("https://app.example/a/../client.json", "dot"),
            ("https://app.example/./client.json", "dot"),
            ("https://app.example/a/%2E%2e/client.json", "dot"),
            ("https://app.example/a/..", "dot"),
            ("https://APP.example/client.json", "canonical"),
            ("https://app.example:443/client.json", "canonical"),
            ("client.json", "not a URL"),
        ] {
            let error = check_client_id_url(url).unwrap_err();
            assert_eq!(error.code(), "invalid_client", "{url}");
            assert!(error.description().contains(why), "{url}: {error}");
            // The same check runs on the URL a document is fetched from.
            assert!(parse_document(&document(json!({"client_id": url})), url).is_err());
        }
        // A segment that merely contains dots is fine.
        assert_eq!(
            check_client_id_url("https://app.example/a..b/.well-known"),
            Ok(())
        );
    }

    #[test]
    fn redirect_uris_are_required_and_checked() {
        for changes in [
            json!({"redirect_uris": null}),
            json!({"redirect_uris": []}),
            json!({"redirect_uris": ["https://app.example/cb", "http://evil.example/cb"]}),
            json!({"redirect_uris": ["myapp://cb"]}),
            json!({"redirect_uris": ["https://app.example/cb#f"]}),
        ] {
            assert_eq!(
                refused(changes.clone()).code(),
                "invalid_redirect_uri",
                "{changes}"
            );
        }
        assert_eq!(
            refused(json!({"redirect_uris": "https://app.example/cb"})).code(),
            "invalid_client_metadata"
        );
    }

    #[test]
    fn a_document_describes_a_public_client() {
        for method in [
            "private_key_jwt",
            "client_secret_basic",
            "client_secret_post",
            "tls_client_auth",
        ] {
            let error = refused(json!({"token_endpoint_auth_method": method}));
            assert_eq!(error.code(), "invalid_client_metadata");
            assert!(error.description().contains(method), "{error}");
        }
    }

    #[test]
    fn grant_and_response_types_are_limited_to_the_code_flow() {
        for changes in [
            json!({"grant_types": ["authorization_code", "client_credentials"]}),
            json!({"grant_types": ["implicit"]}),
            json!({"grant_types": ["refresh_token"]}),
            json!({"grant_types": []}),
            json!({"grant_types": ["urn:ietf:params:oauth:grant-type:device_code"]}),
            json!({"response_types": ["token"]}),
            json!({"response_types": ["code", "id_token"]}),
            json!({"response_types": []}),
        ] {
            assert_eq!(
                refused(changes.clone()).code(),
                "invalid_client_metadata",
                "{changes}"
            );
        }
        let repeated =
            document(json!({"grant_types": ["authorization_code", "authorization_code"]}));
        assert_eq!(
            parse_document(&repeated, ID).unwrap().grant_types,
            vec![GrantType::AuthorizationCode]
        );
    }

    #[test]
    fn client_names_are_cleaned_for_the_consent_page() {
        assert_eq!(
            clean_name("  Example\u{0} App\n "),
            Some("Example App".into())
        );
        assert_eq!(clean_name("Pay\u{202E}lapyap"), Some("Paylapyap".into()));
        assert_eq!(clean_name(" \t\r\n"), None);
        assert_eq!(clean_name(""), None);
        let long = "é".repeat(150);
        assert_eq!(
            clean_name(&long).unwrap().chars().count(),
            MAX_CLIENT_NAME_CHARS
        );
        let cut_at_space = format!("{} tail", "a".repeat(99));
        assert_eq!(clean_name(&cut_at_space), Some("a".repeat(99)));
        let metadata =
            parse_document(&document(json!({"client_name": "\u{1b}[31mRed"})), ID).unwrap();
        assert_eq!(metadata.client_name.as_deref(), Some("[31mRed"));
    }

    #[test]
    fn client_and_logo_uris_must_be_https() {
        let ok = document(json!({
            "client_uri": "https://app.example/",
            "logo_uri": "https://cdn.example/logo.png",
        }));
        let metadata = parse_document(&ok, ID).unwrap();
        assert_eq!(metadata.client_uri.as_deref(), Some("https://app.example/"));
        assert_eq!(
            metadata.logo_uri.as_deref(),
            Some("https://cdn.example/logo.png")
        );
        for changes in [
            json!({"client_uri": "http://app.example/"}),
            json!({"client_uri": "javascript:alert(1)"}),
            json!({"logo_uri": "data:image/png;base64,AAAA"}),
            json!({"logo_uri": "https://u@cdn.example/logo.png"}),
            json!({"logo_uri": "logo.png"}),
        ] {
            let error = refused(changes.clone());
            assert_eq!(error.code(), "invalid_client_metadata", "{changes}");
        }
    }

    #[test]
    fn registrations_have_no_client_id_and_may_be_confidential() {
        let body = json!({
            "client_name": "CLI",
            "redirect_uris": ["http://localhost:33418/callback"],
            "token_endpoint_auth_method": "none",
        });
        let metadata = parse_registration(body.to_string().as_bytes()).unwrap();
        assert_eq!(metadata.client_id, None);
        assert_eq!(
            metadata.token_endpoint_auth_method,
            TokenEndpointAuthMethod::None
        );
        // A client_id sent is not the client's to choose: ignored.
        let with_id = json!({"client_id": "mine", "redirect_uris": ["https://a.example/cb"]});
        let metadata = parse_registration(with_id.to_string().as_bytes()).unwrap();
        assert_eq!(metadata.client_id, None);
        // RFC 7591 §2's default method.
        assert_eq!(
            metadata.token_endpoint_auth_method,
            TokenEndpointAuthMethod::ClientSecretBasic
        );
        let post = json!({"redirect_uris": ["https://a.example/cb"], "token_endpoint_auth_method": "client_secret_post"});
        assert_eq!(
            parse_registration(post.to_string().as_bytes())
                .unwrap()
                .token_endpoint_auth_method,
            TokenEndpointAuthMethod::ClientSecretPost
        );
        for body in [
            json!({"redirect_uris": ["https://a.example/cb"], "token_endpoint_auth_method": "private_key_jwt"}),
            json!({"redirect_uris": ["https://a.example/cb"], "grant_types": ["client_credentials"]}),
            json!({"redirect_uris": ["https://a.example/cb"], "response_types": ["token"]}),
            json!({"redirect_uris": ["https://a.example/cb"], "logo_uri": "http://a.example/l.png"}),
        ] {
            let error = parse_registration(body.to_string().as_bytes()).unwrap_err();
            assert_eq!(error.code(), "invalid_client_metadata", "{body}");
        }
        for body in [
            json!({}),
            json!({"redirect_uris": ["http://evil.example/cb"]}),
        ] {
            let error = parse_registration(body.to_string().as_bytes()).unwrap_err();
            assert_eq!(error.code(), "invalid_redirect_uri", "{body}");
        }
    }
}
