//! Device logins in progress (RFC 8628, `agentworks login`): rows of the identity store, so
//! that in a cluster the laptop's polls, the person's approval and the operator's may each
//! reach a different agentd host.
//!
//! - A device code is 256 random bits, kept only as its SHA-256 (like a token's secret); a
//!   user code is short and typed by a person, useless without the device code that polls.
//! - A login is decided once (approved for one user, or denied), and redeemed once: the row is
//!   marked redeemed by one conditional `UPDATE` before the token is minted, so two hosts
//!   polling at the same moment can never mint two tokens. A crash between the two loses the
//!   login (the laptop asks again); it never mints twice.
//! - Rows older than [`DEVICE_LOGIN_TTL_MS`] are swept when the next login starts.
//!
//! Every call takes `now` (ms since the epoch) so tests can move it.

use crate::db::Sql;
use crate::identity::authority::Scope;
use crate::identity::store::{IdentityError, IdentityStore, TokenRequest};
use crate::identity::token;

/// How long a device login stays usable: 10 minutes.
pub const DEVICE_LOGIN_TTL_MS: i64 = 600_000;
/// The polling interval the laptop is told to keep (RFC 8628 §3.2); a poll sooner than half
/// of it is answered `slow_down`.
pub const DEVICE_POLL_INTERVAL_MS: i64 = 2_000;
/// Logins waiting at most: `/v1/device/code` is anonymous, so its rows are bounded; past this
/// a new login is refused until some expire (10 minutes at most). The last resort: each
/// source address has its own, much smaller share ([`MAX_WAITING_DEVICE_LOGINS_PER_ADDRESS`]).
pub const MAX_WAITING_DEVICE_LOGINS: i64 = 10_000;
/// Undecided logins one source address (its bucket) may have waiting: a flood from one
/// address fills its own share, never the table.
pub const MAX_WAITING_DEVICE_LOGINS_PER_ADDRESS: i64 = 20;

/// Which bound refused a new login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingRefusal {
    /// The source address has its share waiting.
    Address,
    /// All logins together are at their bound.
    Total,
}
/// User codes: 8 characters from an alphabet without vowels or look-alikes, shown XXXX-XXXX.
const USER_CODE_ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";

/// A new login: the device code (shown once, to the laptop) and the user code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDeviceLogin {
    pub device_code: String,
    pub user_code: String,
}

/// A live, undecided login as an approval page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingDeviceLogin {
    pub user_code: String,
    /// The device's name as the laptop reported it (untrusted text).
    pub label: String,
    /// Milliseconds until it expires.
    pub expires_in_ms: i64,
}

/// Why a decision on a user code was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("no pending login has that code (it may have expired)")]
    NotFound,
    #[error("that login was already approved or denied")]
    AlreadyDecided,
}

/// One poll's answer (RFC 8628 §3.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevicePoll {
    Granted {
        access_token: String,
        token_id: String,
    },
    Pending,
    SlowDown,
    Denied,
    Expired,
    Invalid,
}

fn random_user_code() -> String {
    let bytes: [u8; 8] = rand::random();
    let chars: String = bytes
        .iter()
        .map(|b| USER_CODE_ALPHABET[*b as usize % USER_CODE_ALPHABET.len()] as char)
        .collect();
    format!("{}-{}", &chars[..4], &chars[4..])
}

/// What a person typed, as stored: case and the dash do not matter.
pub fn normalise_user_code(raw: &str) -> String {
    let letters: String = raw
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect();
    if letters.len() == 8 {
        format!("{}-{}", &letters[..4], &letters[4..])
    } else {
        letters
    }
}

/// A device code is 64 lowercase hex digits; anything else is not looked up.
fn is_device_code_shaped(code: &str) -> bool {
    code.len() == 64
        && code
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A live login nobody decided yet, by user code (`?1`) and the oldest creation time still
/// live (`?2`).
const UNDECIDED: &str = "user_code = ?1 AND created_at_ms > ?2 \
     AND redeemed_at_ms IS NULL AND approved_for IS NULL AND denied = 0";

/// The row a poll reads: created, last poll, approved for, denied (0 or 1), redeemed.
type PollRow = (i64, Option<i64>, Option<String>, i64, bool);

impl IdentityStore {
    /// Starts a login for the device named `label` (cut to 64 characters), asked from
    /// `address`; refused when `per_address` undecided logins from there, or `max` live logins
    /// in all, are waiting already.
    pub fn start_device_login(
        &self,
        label: &str,
        address: &str,
        now: i64,
        per_address: i64,
        max: i64,
    ) -> Result<Result<NewDeviceLogin, WaitingRefusal>, IdentityError> {
        let device_code = hex::encode(rand::random::<[u8; 32]>());
        let hash = token::hash_secret(&device_code);
        let label: String = label.chars().take(64).collect();
        let user_code = self.transaction(|tx| {
            tx.execute(
                "DELETE FROM device_logins WHERE created_at_ms <= ?1",
                &[&(now - DEVICE_LOGIN_TTL_MS)],
            )?;
            let from_address: i64 = tx.query_one(
                "SELECT count(*) FROM device_logins
                 WHERE address = ?1 AND approved_for IS NULL AND denied = 0",
                &[&address],
                |r| r.get(0),
            )?;
            if from_address >= per_address {
                return Ok(Err(WaitingRefusal::Address));
            }
            let waiting: i64 =
                tx.query_one("SELECT count(*) FROM device_logins", &[], |r| r.get(0))?;
            if waiting >= max {
                return Ok(Err(WaitingRefusal::Total));
            }
            // 20^8 codes: a clash with a live login is rare; draw again until there is none.
            let mut user_code = random_user_code();
            while tx
                .query_opt(
                    "SELECT user_code FROM device_logins WHERE user_code = ?1",
                    &[&user_code],
                    |r| r.get::<String>(0),
                )?
                .is_some()
            {
                user_code = random_user_code();
            }
            tx.execute(
                "INSERT INTO device_logins (device_code_hash, user_code, label, created_at_ms, denied, address)
                 VALUES (?1, ?2, ?3, ?4, 0, ?5)",
                &[&hash, &user_code, &label, &now, &address],
            )?;
            Ok::<_, IdentityError>(Ok(user_code))
        })?;
        Ok(user_code.map(|user_code| NewDeviceLogin {
            device_code,
            user_code,
        }))
    }

    /// The live login with this user code that nobody decided yet, if any.
    pub fn pending_device_login(
        &self,
        user_code: &str,
        now: i64,
    ) -> Result<Option<PendingDeviceLogin>, IdentityError> {
        let code = normalise_user_code(user_code);
        let row: Option<(String, String, i64)> = self.db()?.query_opt(
            &format!("SELECT user_code, label, created_at_ms FROM device_logins WHERE {UNDECIDED}"),
            &[&code, &(now - DEVICE_LOGIN_TTL_MS)],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        Ok(row.map(|(user_code, label, created)| PendingDeviceLogin {
            user_code,
            label,
            expires_in_ms: created + DEVICE_LOGIN_TTL_MS - now,
        }))
    }

    /// Approves (for `user`) or denies the live login with this user code, once: the device's
    /// label. A second decision fails, so a denial cannot become an approval, nor the approving
    /// user be swapped, afterwards.
    pub fn decide_device_login(
        &self,
        user_code: &str,
        user: &str,
        approve: bool,
        now: i64,
    ) -> Result<Result<String, DecideError>, IdentityError> {
        let code = normalise_user_code(user_code);
        let since = now - DEVICE_LOGIN_TTL_MS;
        self.transaction(|tx| {
            let decided: Option<String> = if approve {
                tx.query_opt(
                    &format!("UPDATE device_logins SET approved_for = ?3 WHERE {UNDECIDED} RETURNING label"),
                    &[&code, &since, &user],
                    |r| r.get(0),
                )?
            } else {
                tx.query_opt(
                    &format!("UPDATE device_logins SET denied = 1 WHERE {UNDECIDED} RETURNING label"),
                    &[&code, &since],
                    |r| r.get(0),
                )?
            };
            if let Some(label) = decided {
                return Ok(Ok(label));
            }
            let live = tx
                .query_opt(
                    "SELECT user_code FROM device_logins
                     WHERE user_code = ?1 AND created_at_ms > ?2 AND redeemed_at_ms IS NULL",
                    &[&code, &since],
                    |r| r.get::<String>(0),
                )?
                .is_some();
            Ok::<_, IdentityError>(Err(if live {
                DecideError::AlreadyDecided
            } else {
                DecideError::NotFound
            }))
        })
    }

    /// One poll by the laptop: mints its `devices:connect` token, once, when the login was
    /// approved. An expired or denied login is removed as it is answered.
    pub fn poll_device_login(
        &self,
        device_code: &str,
        now: i64,
    ) -> Result<DevicePoll, IdentityError> {
        if !is_device_code_shaped(device_code) {
            return Ok(DevicePoll::Invalid);
        }
        let hash = token::hash_secret(device_code);
        let row: Option<PollRow> = self.db()?.query_opt(
            "SELECT created_at_ms, last_poll_at_ms, approved_for, denied, redeemed_at_ms IS NOT NULL
             FROM device_logins WHERE device_code_hash = ?1",
            &[&hash],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )?;
        let Some((created, last_poll, approved_for, denied, redeemed)) = row else {
            return Ok(DevicePoll::Invalid);
        };
        let gone = |answer| -> Result<DevicePoll, IdentityError> {
            self.db()?.execute(
                "DELETE FROM device_logins WHERE device_code_hash = ?1",
                &[&hash],
            )?;
            Ok(answer)
        };
        if created <= now - DEVICE_LOGIN_TTL_MS {
            return gone(DevicePoll::Expired);
        }
        if denied != 0 {
            return gone(DevicePoll::Denied);
        }
        if redeemed {
            return Ok(DevicePoll::Invalid);
        }
        let Some(user) = approved_for else {
            self.db()?.execute(
                "UPDATE device_logins SET last_poll_at_ms = ?2 WHERE device_code_hash = ?1",
                &[&hash, &now],
            )?;
            let too_fast = last_poll.is_some_and(|t| now - t < DEVICE_POLL_INTERVAL_MS / 2);
            return Ok(if too_fast {
                DevicePoll::SlowDown
            } else {
                DevicePoll::Pending
            });
        };
        // Redeemed once, whichever host polls first: the others find no row to mark.
        let label: Option<String> = self.db()?.query_opt(
            "UPDATE device_logins SET redeemed_at_ms = ?2
             WHERE device_code_hash = ?1 AND redeemed_at_ms IS NULL AND approved_for IS NOT NULL
             RETURNING label",
            &[&hash, &now],
            |r| r.get(0),
        )?;
        let Some(label) = label else {
            return Ok(DevicePoll::Invalid);
        };
        let minted = self.create_token(&TokenRequest {
            user,
            label: if label.is_empty() {
                "agentworks login".into()
            } else {
                format!("agentworks login: {label}")
            },
            scopes: vec![Scope::DevicesConnect],
            ..TokenRequest::default()
        });
        gone(DevicePoll::Invalid)?;
        let (info, access_token) = minted?;
        Ok(DevicePoll::Granted {
            access_token,
            token_id: info.id,
        })
    }
}
