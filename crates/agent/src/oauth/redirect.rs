//! Redirect URIs: which ones a client may register, and whether a requested one matches.
//!
//! - Registration: `https` with a host, or a loopback `http` redirect of a native client
//!   (`http://127.0.0.1`, `http://[::1]`, `http://localhost`; RFC 8252 §7.3, §8.3). No
//!   fragment (RFC 6749 §3.1.2), no userinfo. Private-use schemes (RFC 8252 §7.1) are refused:
//!   agentd serves MCP clients that listen on loopback or on the web.
//! - Matching (OAuth 2.1 §2.3.1, RFC 9700 §4.1.3): simple string comparison, no
//!   normalisation of case or percent-encoding, except that a loopback `http` redirect
//!   matches on any port (RFC 8252 §7.3): the rest, host spelling, path and query included,
//!   must still be identical.

use super::OAuthError;
use url::Url;

/// The loopback hosts of RFC 8252 §7.3 (and `localhost`, which §8.3 discourages but native
/// clients still register).
const LOOPBACK_HOSTS: [&str; 3] = ["127.0.0.1", "[::1]", "localhost"];

/// Accept a redirect URI for registration (a registration body or a client ID metadata
/// document). The refusal is `invalid_redirect_uri` (RFC 7591 §3.2.2).
pub fn check_registration(uri: &str) -> Result<(), OAuthError> {
    let refuse = |why: &str| OAuthError::InvalidRedirectUri(format!("redirect URI {uri:?} {why}"));
    let url = Url::parse(uri).map_err(|e| refuse(&format!("is not an absolute URL ({e})")))?;
    if url.fragment().is_some() || uri.contains('#') {
        return Err(refuse("has a fragment"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse("has userinfo"));
    }
    match url.scheme() {
        "https" if url.host_str().is_some_and(|h| !h.is_empty()) => Ok(()),
        "https" => Err(refuse("has no host")),
        "http" if is_loopback(&url) => Ok(()),
        "http" => Err(refuse(
            "uses http on a host that is not loopback; use https, or http://127.0.0.1, \
             http://[::1] or http://localhost for a native client",
        )),
        scheme => Err(refuse(&format!(
            "uses the scheme {scheme:?}; custom URI schemes are not supported, use https or a \
             loopback http redirect (http://127.0.0.1:<port>/...)"
        ))),
    }
}

/// Whether `requested` is `registered`: exactly the same string, or both loopback `http`
/// redirects that differ only in their port.
pub fn matches(requested: &str, registered: &str) -> bool {
    if requested == registered {
        return true;
    }
    let loopback = |uri: &str| {
        Url::parse(uri).is_ok_and(|url| url.scheme() == "http" && is_loopback(&url))
            && check_registration(uri).is_ok()
    };
    match (without_port(requested), without_port(registered)) {
        (Some(a), Some(b)) => a == b && loopback(requested) && loopback(registered),
        _ => false,
    }
}

/// The registered redirect URI `requested` matches, or `invalid_request`: the authorization
/// endpoint then must not redirect (RFC 6749 §4.1.2.1) but show the error itself.
pub fn find_match<'a, S: AsRef<str>>(
    requested: &str,
    registered: &'a [S],
) -> Result<&'a str, OAuthError> {
    registered
        .iter()
        .map(AsRef::as_ref)
        .find(|candidate| matches(requested, candidate))
        .ok_or_else(|| {
            OAuthError::InvalidRequest(format!(
                "redirect_uri {requested:?} is not one of the client's registered redirect URIs"
            ))
        })
}

fn is_loopback(url: &Url) -> bool {
    url.host_str()
        .is_some_and(|host| LOOPBACK_HOSTS.contains(&host))
}

/// The URI as written with its authority's `:port` removed, or `None` if it has no
/// `scheme://` authority. Textual, so that everything but the port is compared as written.
fn without_port(uri: &str) -> Option<String> {
    let (scheme, rest) = uri.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // An IPv6 literal's colons are inside its brackets; the port's colon follows them.
    let host_end = authority.rfind(']').map_or(0, |i| i + 1);
    let host = match authority[host_end..].rfind(':') {
        Some(colon) => {
            let port = &authority[host_end + colon + 1..];
            if !port.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            &authority[..host_end + colon]
        }
        None => authority,
    };
    Some(format!("{scheme}://{host}{tail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_and_loopback_http_register() {
        for uri in [
            "https://a.example/cb",
            "https://a.example:8443/cb?x=1",
            "http://127.0.0.1/cb",
            "http://127.0.0.1:1234/cb",
            "http://[::1]:1234/cb",
            "http://localhost:1234/callback",
        ] {
            assert_eq!(check_registration(uri), Ok(()), "{uri}");
        }
    }

    #[test]
    fn registration_refusals_say_why() {
        for (uri, why) in [
            ("http://evil.example/cb", "not loopback"),
            ("http://127.0.0.2/cb", "not loopback"),
            ("http://localhost.evil.example/cb", "not loopback"),
            ("https://a.example@evil.example/", "userinfo"),
            ("https://user:pw@a.example/cb", "userinfo"),
            ("http://x@127.0.0.1/cb", "userinfo"),
            ("https://a.example/cb#frag", "fragment"),
            ("https://a.example/cb#", "fragment"),
            ("com.example.app:/cb", "custom URI schemes"),
            ("myapp://cb", "custom URI schemes"),
            ("javascript:alert(1)", "custom URI schemes"),
            ("/cb", "not an absolute URL"),
            ("", "not an absolute URL"),
        ] {
            let error = check_registration(uri).unwrap_err();
            assert_eq!(error.code(), "invalid_redirect_uri", "{uri}");
            assert!(error.description().contains(why), "{uri}: {error}");
        }
    }

    #[test]
    fn https_redirects_match_exactly() {
        let registered = "https://a.example/cb";
        assert!(matches("https://a.example/cb", registered));
        for requested in [
            "https://a.example/cb/",
            "https://a.example/cb?x=1",
            "https://a.example:443/cb",
            "https://a.example/CB",
            "HTTPS://a.example/cb",
            "https://A.EXAMPLE/cb",
            "https://a.example/%63b",
            "https://a.example/cb#x",
            "https://a.example@evil.example/cb",
            "http://a.example/cb",
        ] {
            assert!(!matches(requested, registered), "{requested}");
        }
        assert!(!matches(
            "https://a.example/cb?x=2",
            "https://a.example/cb?x=1"
        ));
        assert!(!matches("https://a.example/a%20b", "https://a.example/a b"));
        // An upper-case registration matches only itself.
        assert!(matches("HTTPS://A.example/cb", "HTTPS://A.example/cb"));
        assert!(!matches("https://a.example/cb", "HTTPS://A.example/cb"));
    }

    #[test]
    fn loopback_http_matches_on_any_port() {
        let registered = "http://127.0.0.1:1234/cb";
        for requested in [
            "http://127.0.0.1:5555/cb",
            "http://127.0.0.1/cb",
            "http://127.0.0.1:1234/cb",
        ] {
            assert!(matches(requested, registered), "{requested}");
        }
        assert!(matches("http://127.0.0.1:49152/cb", "http://127.0.0.1/cb"));
        assert!(matches("http://[::1]:49152/cb?a=b", "http://[::1]/cb?a=b"));
        assert!(matches("http://localhost:3/cb", "http://localhost:4/cb"));
        for requested in [
            "http://127.0.0.2:1234/cb",
            "http://localhost:1234/cb",
            "http://[::1]:1234/cb",
            "http://127.0.0.1:5555/cb/",
            "http://127.0.0.1:5555/cb?x=1",
            "http://127.0.0.1:5555/CB",
            "http://127.0.0.1:5555/%63b",
            "http://127.0.0.1:5555/cb#x",
            "http://u@127.0.0.1:5555/cb",
            "https://127.0.0.1:5555/cb",
            "http://127.0.0.1:x/cb",
        ] {
            assert!(!matches(requested, registered), "{requested}");
        }
        // The any-port rule is for loopback only.
        assert!(!matches(
            "https://a.example:8443/cb",
            "https://a.example/cb"
        ));
        assert!(!matches(
            "http://evil.example:1/cb",
            "http://evil.example:2/cb"
        ));
    }

    #[test]
    fn find_match_names_the_registered_uri_or_refuses() {
        let registered = vec![
            "https://a.example/cb".to_owned(),
            "http://127.0.0.1/cb".to_owned(),
        ];
        assert_eq!(
            find_match("http://127.0.0.1:8080/cb", &registered),
            Ok("http://127.0.0.1/cb")
        );
        assert_eq!(
            find_match("https://a.example/cb", &registered),
            Ok("https://a.example/cb")
        );
        let error = find_match("https://a.example/cb/", &registered).unwrap_err();
        assert_eq!(error.code(), "invalid_request");
        assert!(find_match::<String>("https://a.example/cb", &[]).is_err());
    }

    #[test]
    fn without_port_keeps_everything_else_as_written() {
        assert_eq!(
            without_port("http://[::1]:80/a?b").as_deref(),
            Some("http://[::1]/a?b")
        );
        assert_eq!(
            without_port("HTTP://127.0.0.1").as_deref(),
            Some("HTTP://127.0.0.1")
        );
        assert_eq!(without_port("http://h:p/"), None);
        assert_eq!(without_port("mailto:x"), None);
    }
}
