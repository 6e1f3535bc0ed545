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

#[cfg(test)]
mod tests {
    use super::*;

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
