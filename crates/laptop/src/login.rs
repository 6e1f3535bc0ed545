//! `agentworks login`/`logout`: the RFC 8628 device authorization grant against agentd's public
//! listener, and a token given on stdin checked against the server.
//!
//! Owns: the small HTTP/1.1 client these need (hyper over TCP, or rustls for `https://`), the
//! polling loop (the server's interval, +5 s on `slow_down`, until approved, denied or expired)
//! and the token check ([`account`]: `GET /v1/device/account` answers a live `devices:connect`
//! token with the account it belongs to, which `login` shows and asks about before storing it;
//! any other token 403, an unknown or revoked one 401).
//!
//! Must never: send a token over plain `http://` to anything but a loopback host; store a token
//! that has scopes beyond `devices:connect`.

use std::time::Duration;

use http_body_util::{BodyExt, Full};

use super::connect::{BaseUrl, is_loopback, parse_url, tls_config};

/// Why login failed.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error(transparent)]
    Url(#[from] super::connect::ConnectError),
    #[error("refusing {url}: plain http:// is only allowed to a loopback host; use https://")]
    Insecure { url: String },
    #[error("cannot reach {url}: {reason}")]
    Http { url: String, reason: String },
    #[error("the server answered {status} to {url}: {body}")]
    Unexpected {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the login was denied")]
    Denied,
    #[error("the code expired before it was approved; run `agentworks login` again")]
    Expired,
    #[error("the server does not accept this token (unknown, expired or revoked)")]
    TokenRejected,
    #[error(
        "this token is not a devices:connect token; create one with only that scope (or use the device login)"
    )]
    WrongScope,
    #[error(
        "the server does not say whose account the token serves ({status} from {url}); nothing was stored (is the server older than this agentworks?)"
    )]
    NoAccount { url: String, status: u16 },
}

/// agentd's public URL, checked: `https://`, or `http://` to loopback.
pub fn server_url(raw: &str) -> Result<BaseUrl, LoginError> {
    let url = parse_url(raw, &["http", "https"])?;
    if url.scheme == "http" && !is_loopback(&url.host) {
        return Err(LoginError::Insecure { url: url.render() });
    }
    Ok(url)
}

/// One response: status and body.
pub struct Reply {
    pub status: u16,
    pub body: String,
}

/// POST `body` (with `content_type`) to `server` + `path`; the whole answer.
pub async fn post(
    server: &BaseUrl,
    path: &str,
    content_type: &str,
    body: String,
    bearer: Option<&str>,
    extra: &[(&str, &str)],
) -> Result<Reply, LoginError> {
    request(
        server,
        "POST",
        path,
        Some(content_type),
        body,
        bearer,
        extra,
    )
    .await
}

/// One request to `server` + `path`; the whole answer, within 30 s.
async fn request(
    server: &BaseUrl,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: String,
    bearer: Option<&str>,
    extra: &[(&str, &str)],
) -> Result<Reply, LoginError> {
    let url = format!("{}{path}", server.render());
    let answer = async {
        let response = send(server, method, path, content_type, body, bearer, extra).await?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| LoginError::Http {
                url: url.clone(),
                reason: e.to_string(),
            })?
            .to_bytes();
        Ok(Reply {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(Duration::from_secs(30), answer)
        .await
        .map_err(|_| LoginError::Http {
            url: url.clone(),
            reason: "no answer in time".into(),
        })?
}

/// Send one request to `server` + `path` (TCP, or TLS for `https://`) and return the response
/// as soon as its head arrives, so a caller can read a long body (server-sent events) as it
/// streams. Connecting is bounded by 20 s; reading the body is up to the caller.
pub async fn send(
    server: &BaseUrl,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: String,
    bearer: Option<&str>,
    extra: &[(&str, &str)],
) -> Result<hyper::Response<hyper::body::Incoming>, LoginError> {
    let url = format!("{}{path}", server.render());
    let http = |reason: String| LoginError::Http {
        url: url.clone(),
        reason,
    };
    let port = server
        .port
        .unwrap_or(if server.scheme == "https" { 443 } else { 80 });
    let host = server
        .host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let tcp = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| http("connection timed out".into()))?
    .map_err(|e| http(e.to_string()))?;
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(format!("{}{path}", server.path))
        .header("host", server.authority())
        .header(
            "user-agent",
            concat!("agentworks/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    if let Some(token) = bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    for (k, v) in extra {
        request = request.header(*k, *v);
    }
    let request = request
        .body(Full::new(bytes::Bytes::from(body)))
        .map_err(|e| http(e.to_string()))?;
    if server.scheme == "https" {
        let client = tls_config().map_err(|e| http(e.to_string()))?;
        let tls = super::tls::connect(&client, &host, tcp)
            .await
            .map_err(|e| http(e.to_string()))?;
        exchange(hyper_util::rt::TokioIo::new(tls), request).await
    } else {
        exchange(hyper_util::rt::TokioIo::new(tcp), request).await
    }
    .map_err(http)
}

async fn exchange<IO>(
    io: IO,
    request: hyper::Request<Full<bytes::Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())
}

fn form(pairs: &[(&str, &str)]) -> String {
    serde_urlencoded::to_string(pairs).unwrap_or_default()
}

pub use agentworks_contract::public_api::DeviceCode;
use agentworks_contract::public_api::{DEVICE_ACCOUNT_PATH, DeviceAccount};

/// What `agentworks login` tells the person: the link to open (the approval page with the
/// code filled in), and the operator's way. Ends with the device's name and the code, the two
/// lines the approval page shows side by side to compare with; scripts read the last,
/// `Code: …`.
pub fn instructions(code: &DeviceCode, device_name: &str) -> String {
    let link = code
        .verification_uri_complete
        .clone()
        .unwrap_or_else(|| code.verification_uri.clone());
    format!(
        "To connect this device, open {link} in a browser, sign in to the console and press Approve \
(or enter the code at {page}).\n\
An operator can approve it instead: agentworksctl login approve {user_code} --user YOU\n\
Approve only if the page shows this device and this code:\n\
Device: {device_name}\n\
Code: {user_code}",
        page = code.verification_uri,
        user_code = code.user_code,
    )
}

/// Ask for a device code.
pub async fn start(server: &BaseUrl, device_name: &str) -> Result<DeviceCode, LoginError> {
    let reply = post(
        server,
        "/v1/device/code",
        "application/x-www-form-urlencoded",
        form(&[
            ("client_id", "agentworks-cli"),
            ("scope", "devices:connect"),
            ("device_name", device_name),
        ]),
        None,
        &[],
    )
    .await?;
    if reply.status != 200 {
        return Err(LoginError::Unexpected {
            url: format!("{}/v1/device/code", server.render()),
            status: reply.status,
            body: reply.body,
        });
    }
    serde_json::from_str(&reply.body).map_err(|e| LoginError::Unexpected {
        url: format!("{}/v1/device/code", server.render()),
        status: reply.status,
        body: e.to_string(),
    })
}

/// Poll until the code is approved; returns the access token.
pub async fn poll(server: &BaseUrl, code: &DeviceCode) -> Result<String, LoginError> {
    let mut interval = Duration::from_secs(code.interval.max(1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(code.expires_in.max(1));
    loop {
        tokio::time::sleep(interval).await;
        if tokio::time::Instant::now() > deadline {
            return Err(LoginError::Expired);
        }
        let reply = post(
            server,
            "/v1/device/token",
            "application/x-www-form-urlencoded",
            form(&[
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", &code.device_code),
                ("client_id", "agentworks-cli"),
            ]),
            None,
            &[],
        )
        .await?;
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap_or_default();
        if reply.status == 200
            && let Some(token) = body["access_token"].as_str()
        {
            return Ok(token.to_owned());
        }
        match body["error"].as_str() {
            Some("authorization_pending") => {}
            Some("slow_down") => interval += Duration::from_secs(5),
            Some("access_denied") => return Err(LoginError::Denied),
            Some("expired_token") => return Err(LoginError::Expired),
            _ => {
                return Err(LoginError::Unexpected {
                    url: format!("{}/v1/device/token", server.render()),
                    status: reply.status,
                    body: reply.body,
                });
            }
        }
    }
}

/// The account `token` serves, which also checks that it is a live `devices:connect` token:
/// the server answers any other token 403 and an unknown or revoked one 401.
pub async fn account(server: &BaseUrl, token: &str) -> Result<String, LoginError> {
    let url = format!("{}{DEVICE_ACCOUNT_PATH}", server.render());
    let Reply { status, body } = request(
        server,
        "GET",
        DEVICE_ACCOUNT_PATH,
        None,
        String::new(),
        Some(token),
        &[],
    )
    .await?;
    match status {
        200 => serde_json::from_str::<DeviceAccount>(&body)
            .ok()
            .map(|found| found.account)
            .filter(|account| !account.is_empty())
            .ok_or(LoginError::NoAccount { url, status }),
        401 => Err(LoginError::TokenRejected),
        403 => Err(LoginError::WrongScope),
        status => Err(LoginError::NoAccount { url, status }),
    }
}

/// Best-effort server-side revocation at logout (RFC 7009 style `POST /v1/device/revoke`).
/// `Err` says why it could not be done; the local credential is deleted either way.
pub async fn revoke(server: &BaseUrl, token: &str) -> Result<(), LoginError> {
    let reply = post(
        server,
        "/v1/device/revoke",
        "application/x-www-form-urlencoded",
        form(&[("token", token)]),
        Some(token),
        &[],
    )
    .await?;
    if reply.status == 200 {
        Ok(())
    } else {
        Err(LoginError::Unexpected {
            url: format!("{}/v1/device/revoke", server.render()),
            status: reply.status,
            body: reply.body.chars().take(200).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instructions_point_at_the_approval_page_with_the_code() {
        let code = DeviceCode {
            device_code: "d".into(),
            user_code: "BCDF-GHJK".into(),
            verification_uri: "https://aw.example/v1/device/approve".into(),
            verification_uri_complete: Some(
                "https://aw.example/v1/device/approve?user_code=BCDF-GHJK".into(),
            ),
            expires_in: 600,
            interval: 2,
        };
        let text = instructions(&code, "my-laptop");
        assert!(
            text.contains(
                "open https://aw.example/v1/device/approve?user_code=BCDF-GHJK in a browser"
            ),
            "{text}"
        );
        assert!(text.contains("Approve"), "{text}");
        assert!(
            text.contains("agentworksctl login approve BCDF-GHJK --user YOU"),
            "{text}"
        );
        let last: Vec<&str> = text.lines().rev().take(2).collect();
        assert_eq!(last, ["Code: BCDF-GHJK", "Device: my-laptop"]);
        let without = DeviceCode {
            verification_uri_complete: None,
            ..code
        };
        assert!(
            instructions(&without, "l")
                .contains("open https://aw.example/v1/device/approve in a browser"),
            "{}",
            instructions(&without, "l")
        );
    }
}
