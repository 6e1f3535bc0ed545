//! The bearer token of an HTTP request (`Authorization: Bearer <token>`, RFC 6750), parsed
//! once for every endpoint that takes one: MCP, the chat API, the device grant, the executor
//! WebSocket.
//!
//! Pure: no I/O. Never decides whether a token is good (the identity store does); a repeated,
//! non-ASCII or empty header is `Malformed`, never `Absent`, so a doubt is refused, not ignored.

use hyper::header::{AUTHORIZATION, HeaderMap};

/// What the `Authorization` header holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bearer<'a> {
    /// No `Authorization` header, or one with another scheme: no bearer credentials at all.
    Absent,
    /// `Bearer <token>`.
    Token(&'a str),
    /// Repeated, not ASCII, or `Bearer` with no token: refused without asking the backend.
    Malformed,
}

/// Extracts the bearer token. The scheme is case-insensitive (RFC 9110 §11.1).
pub fn bearer(headers: &HeaderMap) -> Bearer<'_> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Bearer::Absent;
    };
    if values.next().is_some() {
        return Bearer::Malformed;
    }
    let Ok(value) = value.to_str() else {
        return Bearer::Malformed;
    };
    let (scheme, rest) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Bearer::Absent;
    }
    let token = rest.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Bearer::Malformed;
    }
    Bearer::Token(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn with_auth(values: &[&'static str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(AUTHORIZATION, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn bearer_extraction() {
        assert_eq!(bearer(&with_auth(&[])), Bearer::Absent);
        assert_eq!(bearer(&with_auth(&["Bearer abc"])), Bearer::Token("abc"));
        assert_eq!(bearer(&with_auth(&["bearer  abc "])), Bearer::Token("abc"));
        assert_eq!(bearer(&with_auth(&["Basic dXNlcjpwdw=="])), Bearer::Absent);
        assert_eq!(bearer(&with_auth(&["Bearer"])), Bearer::Malformed);
        assert_eq!(bearer(&with_auth(&["Bearer a b"])), Bearer::Malformed);
        assert_eq!(
            bearer(&with_auth(&["Bearer a", "Bearer b"])),
            Bearer::Malformed
        );
        let mut map = HeaderMap::new();
        map.insert(
            AUTHORIZATION,
            HeaderValue::from_bytes(b"Bearer \xff").unwrap(),
        );
        assert_eq!(bearer(&map), Bearer::Malformed);
    }
}
