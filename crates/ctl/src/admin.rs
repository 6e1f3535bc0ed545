//! agentworksctl's side of agentd's operator endpoints: one call per command, errors that say
//! what to do, and the flag parsing helpers the commands share.

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
}

/// POST `body` to `/v1/admin/<endpoint>` on agentd's socket.
pub async fn call<T: Serialize>(
    config: &Config,
    endpoint: &str,
    body: &T,
) -> Result<Value, CtlError> {
    let socket = config.agentd_socket();
    let client = UnixClient::new(&socket);
    match client
        .post::<_, Value>(&format!("/v1/admin/{endpoint}"), body)
        .await
    {
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
    fn durations() {
        assert_eq!(parse_duration_ms("30d").unwrap(), 30 * 86_400_000);
        assert_eq!(parse_duration_ms("90m").unwrap(), 90 * 60_000);
        for bad in ["", "d", "10", "10y", "-1d", "0h"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?}");
        }
    }
}
