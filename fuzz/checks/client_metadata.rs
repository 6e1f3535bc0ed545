//! Client metadata checks: the input's first line is the URL a client ID metadata document was
//! fetched from, the rest the document; the whole input is also a registration body. Whatever
//! is accepted must hold what the consent page and the authorization endpoint rely on: the
//! document's own URL as `client_id`, valid redirect URIs, a clean short name.

use agentworks_agent::oauth::client_metadata::{
    ClientMetadata, MAX_CLIENT_NAME_CHARS, parse_document, parse_registration,
};
use agentworks_agent::oauth::redirect;

fn check(metadata: &ClientMetadata) {
    assert!(!metadata.redirect_uris.is_empty());
    for uri in &metadata.redirect_uris {
        assert_eq!(redirect::check_registration(uri), Ok(()), "{uri:?}");
        assert!(redirect::matches(uri, uri));
    }
    if let Some(name) = &metadata.client_name {
        assert!(!name.is_empty() && name.chars().count() <= MAX_CLIENT_NAME_CHARS);
        assert!(!name.chars().any(char::is_control), "{name:?}");
        assert_eq!(name.trim(), name);
    }
}

pub fn run(data: &[u8]) {
    if let Ok(metadata) = parse_registration(data) {
        assert_eq!(metadata.client_id, None);
        check(&metadata);
    }
    let Some(newline) = data.iter().position(|&b| b == b'\n') else {
        return;
    };
    let Ok(url) = std::str::from_utf8(&data[..newline]) else {
        return;
    };
    if let Ok(metadata) = parse_document(&data[newline + 1..], url) {
        assert_eq!(metadata.client_id.as_deref(), Some(url));
        check(&metadata);
    }
}
