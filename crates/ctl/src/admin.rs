//! agentworksctl's side of agentd's operator endpoints: one call per command, errors that say
//! what to do, and the flag parsing helpers the commands share.

use agentworks_contract::agentd::{ConsoleLink, PasswordRequest};
use agentworks_daemon::config::Config;
use agentworks_support::unix_http::{ClientError, UnixClient};
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(
        "agentd is not reachable on {socket}: {source}\n  is it running? (systemctl status agentworks-agentd, or AGENTWORKS_STATE_ROOT=<quickstart state root> for a quickstart)"
    )]
    Unreachable { socket: String, source: ClientError },
    #[error("{message} [{code}]")]
    Refused {
        code: String,
        message: String,
        details: serde_json::Map<String, Value>,
    },
    #[error("{0}")]
    Usage(String),
    /// A typed request that would not serialize (not expected: they are plain data).
    #[error("cannot encode the request: {0}")]
    Encode(#[from] serde_json::Error),
    /// An answer that is not the shape agentd's endpoint promises.
    #[error("agentd's answer is not understood: {0}")]
    Answer(String),
}

/// POST `body` to `/v1/admin/<endpoint>` on agentd's socket.
pub async fn call<T: Serialize>(
    config: &Config,
    endpoint: &str,
    body: &T,
) -> Result<Value, CtlError> {
    let socket = config.agentd_socket();
    let answer = UnixClient::new(&socket)
        .post::<_, Value>(&format!("/v1/admin/{endpoint}"), body)
        .await;
    answered(&socket, answer)
}

/// An operator call's answer, or its refusal or failure as the error `agentworksctl` reports.
fn answered(
    socket: &std::path::Path,
    answer: Result<Value, ClientError>,
) -> Result<Value, CtlError> {
    match answer {
        Ok(v) => Ok(v),
        Err(ClientError::Remote { body, .. }) => Err(CtlError::Refused {
            code: body.code,
            message: body.message,
            details: body.details,
        }),
        Err(source) => Err(CtlError::Unreachable {
            socket: socket.display().to_string(),
            source,
        }),
    }
}

/// `GET`, `PUT` or `DELETE` of an operator resource (`mcp-apps/<key>`), answered like [`call`].
pub async fn call_resource(
    config: &Config,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, CtlError> {
    let socket = config.agentd_socket();
    let client = UnixClient::new(&socket);
    let path = format!("/v1/admin/{path}");
    let answer = match (method, body) {
        ("PUT", Some(body)) => client.put::<_, Value>(&path, body).await,
        ("DELETE", _) => client.delete::<Value>(&path).await,
        _ => client.get::<Value>(&path).await,
    };
    answered(&socket, answer)
}

/// `users/<name>/<action>`, once the name is one agentd could have (so it is one path
/// segment).
fn user_endpoint(name: &str, action: &str) -> Result<String, CtlError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
        && !name.starts_with('.');
    if ok {
        Ok(format!("users/{name}/{action}"))
    } else {
        Err(CtlError::Usage(format!("{name:?} is not a user name")))
    }
}

/// Set a user's console password (their console sessions end).
pub async fn set_password(config: &Config, name: &str, password: &str) -> Result<Value, CtlError> {
    let body = PasswordRequest {
        password: password.to_owned(),
    };
    call(config, &user_endpoint(name, "password")?, &body).await
}

async fn link(config: &Config, name: &str, action: &str) -> Result<ConsoleLink, CtlError> {
    let answer = call(
        config,
        &user_endpoint(name, action)?,
        &serde_json::json!({}),
    )
    .await?;
    serde_json::from_value(answer).map_err(|e| CtlError::Answer(e.to_string()))
}

/// A one-time console invite for the user (set a password, then signed in; 7 days).
pub async fn invite(config: &Config, name: &str) -> Result<ConsoleLink, CtlError> {
    link(config, name, "invites").await
}

/// A one-time console sign-in link for the user (15 minutes): what the quickstart prints so
/// its person is signed in without a password, and what `user sign-in-link` makes anew.
pub async fn sign_in_link(config: &Config, name: &str) -> Result<ConsoleLink, CtlError> {
    link(config, name, "sign-in-links").await
}

/// `30d`, `12h`, `90m`, `45s` → milliseconds.
pub fn parse_duration_ms(raw: &str) -> Result<i64, CtlError> {
    let (number, unit) = raw.split_at(raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len()));
    let n: i64 = number
        .parse()
        .map_err(|_| CtlError::Usage(format!("{raw:?} is not a duration like 30d, 12h, 90m")))?;
    let unit_ms = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1_000,
        _ => {
            return Err(CtlError::Usage(format!(
                "{raw:?}: the unit must be d, h, m or s"
            )));
        }
    };
    if n <= 0 {
        return Err(CtlError::Usage(format!(
            "{raw:?}: the duration must be positive"
        )));
    }
    n.checked_mul(unit_ms)
        .ok_or_else(|| CtlError::Usage(format!("{raw:?} is too long")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_endpoints_take_only_user_names() {
        assert_eq!(
            user_endpoint("ann", "invites").unwrap(),
            "users/ann/invites"
        );
        for bad in ["", "..", "a/b", "Ann", "a b", "a%2f"] {
            assert!(user_endpoint(bad, "password").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30d").unwrap(), 30 * 86_400_000);
        assert_eq!(parse_duration_ms("90m").unwrap(), 90 * 60_000);
        for bad in ["", "d", "10", "10y", "-1d", "0h"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?}");
        }
    }
}
