//! URL rules every client applies the same way.
//!
//! Plain `http://` and `ws://` are allowed only to a loopback host: there the traffic never
//! leaves the machine. Everything else must be `https://` or `wss://`.

/// True for `localhost` (any case) and loopback IP addresses, with or without IPv6 brackets.
pub fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Why `url` may not be the base of HTTP requests that carry a credential (a model's API key,
/// say), or `None`: `https://host…`, or plain `http://` to a loopback host only. The reason is
/// written to follow "is refused: ".
pub fn http_base_url_problem(url: &str) -> Option<&'static str> {
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return Some("it is not a URL such as https://api.example.com/v1");
    };
    let https = match uri.scheme_str() {
        Some(scheme) if scheme.eq_ignore_ascii_case("https") => true,
        Some(scheme) if scheme.eq_ignore_ascii_case("http") => false,
        _ => return Some("it must start with https:// (or http:// to a loopback host)"),
    };
    match uri.host() {
        None | Some("") => Some("it has no host"),
        Some(host) if !https && !is_loopback_host(host) => Some(
            "plain http:// is allowed to a loopback host only (127.0.0.1, ::1, localhost): the \
             API key and every prompt would cross the network in clear; use https://",
        ),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_base_urls_are_https_or_plain_to_loopback() {
        for url in [
            "https://api.example.com/v1",
            "HTTPS://api.example.com",
            "http://127.0.0.1:9/v1",
            "http://localhost:8080/v1",
            "http://[::1]:9/v1",
        ] {
            assert_eq!(http_base_url_problem(url), None, "{url}");
        }
        for (url, says) in [
            ("http://example.com/v1", "loopback host only"),
            ("http://10.0.0.1/v1", "loopback host only"),
            ("ftp://example.com", "https://"),
            ("example.com/v1", "https://"),
            ("x", "https://"),
            ("", "not a URL"),
            ("https:///v1", "https://"),
        ] {
            let problem = http_base_url_problem(url).unwrap_or_default();
            assert!(problem.contains(says), "{url}: {problem:?}");
        }
    }

    #[test]
    fn loopback_hosts() {
        for host in [
            "localhost",
            "LocalHost",
            "127.0.0.1",
            "127.8.9.1",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "example.com",
            "10.0.0.1",
            "localhost.example.com",
            "[::2]",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
