//! Console accounts: passwords, one-time codes (invites and sign-in links), sessions, and
//! disabling an account (which ends its sessions and revokes its OAuth grants, so it calls
//! [`crate::identity::oauth`]; the store itself calls neither).
//!
//! - A password is stored as an Argon2id PHC string. Checking one always runs Argon2, against
//!   a dummy hash when the user is unknown or has no password, so the time taken does not
//!   reveal which names exist. The hashing is slow on purpose: async callers run these calls
//!   on a blocking thread.
//! - A one-time code is 256 random bits, shown once, stored as its SHA-256 (like a token's
//!   secret), with a kind, an expiry and the time it was used; a code works once.
//! - A session is 256 random bits in the `aw_session` cookie, stored as its SHA-256. It owns a
//!   token row (label [`SESSION_TOKEN_LABEL`], `workflows:write`, no project restriction,
//!   expiring with the session) because the file tools re-read the caller's token by id on
//!   every operation; signing out deletes the session and revokes that token.
//!
//! Every call that depends on the time takes `now` (ms since the epoch) so tests can move it.

use crate::db::Sql;
use crate::identity::authority::Scope;
use crate::identity::store::{IdentityError, IdentityStore, TokenInfo, TokenRequest, User};
use crate::identity::token;
use argon2::Argon2;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use std::sync::OnceLock;

/// Shortest password accepted, in characters.
pub const MIN_PASSWORD_CHARS: usize = 8;
/// Longest password accepted, in characters (bounds the work one request can cause).
pub const MAX_PASSWORD_CHARS: usize = 1024;

/// How long an invite (set a password, then sign in) stays usable: 7 days.
pub const INVITE_TTL_MS: i64 = 7 * 24 * 3_600_000;
/// How long a sign-in link stays usable: 15 minutes.
pub const SIGN_IN_LINK_TTL_MS: i64 = 15 * 60_000;

/// A session unused for this long ends: 8 hours.
pub const SESSION_IDLE_MS: i64 = 8 * 3_600_000;
/// A session ends this long after sign-in, however much it is used: 7 days.
pub const SESSION_ABSOLUTE_MS: i64 = 7 * 24 * 3_600_000;
/// A session's last use is written at most this often (a read per request, not a write).
pub const SESSION_TOUCH_MS: i64 = 60_000;

/// The label of a session's own token row.
pub const SESSION_TOKEN_LABEL: &str = "console session";

/// What a one-time code lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeKind {
    /// Set the account's password, then sign in.
    Invite,
    /// Sign in once.
    SignIn,
}

impl CodeKind {
    fn as_str(self) -> &'static str {
        match self {
            CodeKind::Invite => "invite",
            CodeKind::SignIn => "sign-in",
        }
    }

    /// How long a new code of this kind is usable.
    pub fn ttl_ms(self) -> i64 {
        match self {
            CodeKind::Invite => INVITE_TTL_MS,
            CodeKind::SignIn => SIGN_IN_LINK_TTL_MS,
        }
    }
}

/// How long sessions last; [`SessionPolicy::default`] is the constants above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPolicy {
    pub idle_ms: i64,
    pub absolute_ms: i64,
    pub touch_ms: i64,
}

impl Default for SessionPolicy {
    fn default() -> SessionPolicy {
        SessionPolicy {
            idle_ms: SESSION_IDLE_MS,
            absolute_ms: SESSION_ABSOLUTE_MS,
            touch_ms: SESSION_TOUCH_MS,
        }
    }
}

/// A live session, as checked: never its secret.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub user: User,
    pub token: TokenInfo,
    pub csrf_token: String,
    pub created_at_ms: i64,
    /// The absolute expiry (the idle one moves with use).
    pub expires_at_ms: i64,
}

/// A new session: the cookie's secret, once, and the session.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub secret: String,
    pub session: Session,
}

/// A new one-time code: the plaintext, once, and its expiry.
#[derive(Debug, Clone)]
pub struct NewCode {
    pub code: String,
    pub expires_at_ms: i64,
}

/// 256 random bits as 64 hex characters: session secrets, CSRF tokens, one-time codes.
pub fn random_secret() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Whether `s` has the shape of [`random_secret`] (checked before any lookup).
pub fn is_secret_shaped(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A password's length rule, in characters.
pub fn validate_password(password: &str) -> Result<(), IdentityError> {
    let n = password.chars().count();
    if (MIN_PASSWORD_CHARS..=MAX_PASSWORD_CHARS).contains(&n) {
        Ok(())
    } else {
        Err(IdentityError::Invalid(format!(
            "a password must be {MIN_PASSWORD_CHARS}-{MAX_PASSWORD_CHARS} characters"
        )))
    }
}

/// An Argon2id PHC string of `password` with a fresh salt (slow: call on a blocking thread).
pub fn hash_password(password: &str) -> Result<String, IdentityError> {
    validate_password(password)?;
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| IdentityError::Invalid(format!("cannot hash the password: {e}")))
}

/// Whether `password` matches the PHC string; an unreadable string matches nothing.
fn password_matches(password: &str, phc: &str) -> bool {
    Argon2::default()
        .verify_password(password.as_bytes(), phc)
        .is_ok()
}

/// The hash checked when there is no real one, so an unknown name costs the same Argon2 run.
fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        Argon2::default()
            .hash_password(random_secret().as_bytes())
            .map(|h| h.to_string())
            .unwrap_or_default()
    })
}

impl IdentityStore {
    /// Set a user's password (replacing any), and end their sessions: whoever knew the old
    /// password is signed out.
    pub fn set_password(&self, name: &str, password: &str) -> Result<User, IdentityError> {
        let phc = hash_password(password)?;
        let user = self
            .user_by_name(name)?
            .ok_or_else(|| IdentityError::NotFound {
                kind: "user",
                name: name.into(),
            })?;
        self.store_password(&user, &phc)?;
        Ok(user)
    }

    fn store_password(&self, user: &User, phc: &str) -> Result<(), IdentityError> {
        self.db()?.execute(
            "INSERT INTO passwords (user_id, phc, updated_at_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (user_id) DO UPDATE SET phc = excluded.phc, updated_at_ms = excluded.updated_at_ms",
            &[&user.id, &phc, &crate::identity::store::now_ms()],
        )?;
        self.end_sessions_of(&user.id)
    }

    /// The user whose name and password these are, if they may sign in (exists, has a
    /// password, is not disabled). Always runs one Argon2 verification.
    pub fn verify_password(
        &self,
        name: &str,
        password: &str,
    ) -> Result<Option<User>, IdentityError> {
        let user = self.user_by_name(name)?;
        let phc: Option<String> = match &user {
            Some(u) => self.db()?.query_opt(
                "SELECT phc FROM passwords WHERE user_id = ?1",
                &[&u.id],
                |r| r.get(0),
            )?,
            None => None,
        };
        // An over-long password is not hashed at all (the limit is public, so this says
        // nothing about the name).
        let within = password.chars().count() <= MAX_PASSWORD_CHARS;
        let matched = within
            && match &phc {
                Some(phc) => password_matches(password, phc),
                None => {
                    password_matches(password, dummy_hash());
                    false
                }
            };
        Ok(user.filter(|u| matched && !u.disabled))
    }

    /// A new one-time code of `kind` for the user.
    pub fn create_code(
        &self,
        name: &str,
        kind: CodeKind,
        now: i64,
    ) -> Result<NewCode, IdentityError> {
        let user = self
            .user_by_name(name)?
            .ok_or_else(|| IdentityError::NotFound {
                kind: "user",
                name: name.into(),
            })?;
        let code = random_secret();
        let expires_at_ms = now + kind.ttl_ms();
        self.db()?.execute(
            "INSERT INTO one_time_codes (code_hash, user_id, kind, expires_at_ms, used_at_ms, created_at_ms)
             VALUES (?1, ?2, ?3, ?4, NULL, ?5)",
            &[&token::hash_secret(&code), &user.id, &kind.as_str(), &expires_at_ms, &now],
        )?;
        Ok(NewCode {
            code,
            expires_at_ms,
        })
    }

    /// Use a one-time code: the user it was for, if it is of `kind`, unexpired, unused, and
    /// the user is not disabled. It is marked used in the same statement that checks it, so
    /// two requests with one code cannot both succeed.
    pub fn redeem_code(
        &self,
        code: &str,
        kind: CodeKind,
        now: i64,
    ) -> Result<Option<User>, IdentityError> {
        if !is_secret_shaped(code) {
            return Ok(None);
        }
        let user_id: Option<String> = self.db()?.query_opt(
            "UPDATE one_time_codes SET used_at_ms = ?1
             WHERE code_hash = ?2 AND kind = ?3 AND used_at_ms IS NULL AND expires_at_ms > ?1
             RETURNING user_id",
            &[&now, &token::hash_secret(code), &kind.as_str()],
            |r| r.get(0),
        )?;
        let Some(user_id) = user_id else {
            return Ok(None);
        };
        Ok(self.user_by_id(&user_id)?.filter(|u| !u.disabled))
    }

    /// Accept an invite: the password is checked and hashed before the code is used (a
    /// too-short password does not burn the invite), then stored for the invite's user.
    pub fn accept_invite(
        &self,
        code: &str,
        password: &str,
        now: i64,
    ) -> Result<Option<User>, IdentityError> {
        let phc = hash_password(password)?;
        let Some(user) = self.redeem_code(code, CodeKind::Invite, now)? else {
            return Ok(None);
        };
        self.store_password(&user, &phc)?;
        Ok(Some(user))
    }

    /// Start a session for a user who just proved who they are.
    pub fn create_session(
        &self,
        user: &User,
        policy: SessionPolicy,
        now: i64,
    ) -> Result<NewSession, IdentityError> {
        self.sweep_sessions(policy, now)?;
        let expires_at_ms = now + policy.absolute_ms;
        // The token's plaintext is dropped: the session's cookie is its only credential.
        let (token, _plaintext) = self.create_token(&TokenRequest {
            user: user.name.clone(),
            label: SESSION_TOKEN_LABEL.into(),
            scopes: vec![Scope::WorkflowsWrite],
            project: None,
            expires_at_ms: Some(expires_at_ms),
            file_guard: Default::default(),
        })?;
        let secret = random_secret();
        let session = Session {
            id: format!("ses_{}", hex::encode(rand::random::<[u8; 8]>())),
            user: user.clone(),
            token,
            csrf_token: random_secret(),
            created_at_ms: now,
            expires_at_ms,
        };
        let secret_hash = token::hash_secret(&secret);
        let started = self.transaction(|tx| {
            // Checked in the insert's transaction: an account disabled since its password was
            // checked gets no session (which enabling it again would otherwise bring back).
            let disabled: Option<i64> = tx.query_opt(
                "SELECT disabled FROM users WHERE id = ?1",
                &[&user.id],
                |r| r.get(0),
            )?;
            if disabled != Some(0) {
                tx.execute(
                    "UPDATE tokens SET revoked_at_ms = ?1 WHERE id = ?2 AND revoked_at_ms IS NULL",
                    &[&now, &session.token.id],
                )?;
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO sessions (id, secret_hash, user_id, token_id, csrf_token, created_at_ms, last_used_at_ms, expires_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7)",
                &[
                    &session.id,
                    &secret_hash,
                    &user.id,
                    &session.token.id,
                    &session.csrf_token,
                    &now,
                    &expires_at_ms,
                ],
            )?;
            Ok(true)
        })?;
        if !started {
            return Err(IdentityError::Invalid(format!(
                "the account {} is disabled",
                user.name
            )));
        }
        Ok(NewSession { secret, session })
    }

    /// The live session this cookie secret names: `None` if it is unknown, idle too long,
    /// past its absolute expiry, its token is revoked or expired, or its user is disabled.
    /// A use refreshes the idle expiry (written at most once per `policy.touch_ms`).
    pub fn check_session(
        &self,
        secret: &str,
        policy: SessionPolicy,
        now: i64,
    ) -> Result<Option<Session>, IdentityError> {
        if !is_secret_shaped(secret) {
            return Ok(None);
        }
        let row: Option<(String, String, String, String, i64, i64, i64)> = self.db()?.query_opt(
                "SELECT id, user_id, token_id, csrf_token, created_at_ms, last_used_at_ms, expires_at_ms
                 FROM sessions WHERE secret_hash = ?1",
                &[&token::hash_secret(secret)],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                    ))
                },
            )?;
        let Some((id, user_id, token_id, csrf_token, created, last_used, expires)) = row else {
            return Ok(None);
        };
        if now >= expires || now >= last_used + policy.idle_ms {
            self.delete_session(&id, &token_id)?;
            return Ok(None);
        }
        let Some(token) = self.token_by_id(&token_id)? else {
            return Ok(None);
        };
        if token.revoked_at_ms.is_some() || token.expires_at_ms.is_some_and(|t| t <= now) {
            return Ok(None);
        }
        let Some(user) = self.user_by_id(&user_id)? else {
            return Ok(None);
        };
        if user.disabled {
            return Ok(None);
        }
        if now - last_used >= policy.touch_ms {
            self.db()?.execute(
                "UPDATE sessions SET last_used_at_ms = ?1 WHERE id = ?2",
                &[&now, &id],
            )?;
        }
        Ok(Some(Session {
            id,
            user,
            token,
            csrf_token,
            created_at_ms: created,
            expires_at_ms: expires,
        }))
    }

    /// Sign out: delete the session this secret names and revoke its token. `false` if there
    /// was no such session.
    pub fn end_session(&self, secret: &str) -> Result<bool, IdentityError> {
        if !is_secret_shaped(secret) {
            return Ok(false);
        }
        let row: Option<(String, String)> = self.db()?.query_opt(
            "SELECT id, token_id FROM sessions WHERE secret_hash = ?1",
            &[&token::hash_secret(secret)],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        match row {
            Some((id, token_id)) => {
                self.delete_session(&id, &token_id)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Sessions past either expiry that nobody presented again are deleted (their tokens
    /// revoked), so the table holds live sessions only.
    fn sweep_sessions(&self, policy: SessionPolicy, now: i64) -> Result<(), IdentityError> {
        let rows: Vec<(String, String)> = self.db()?.query_all(
            "SELECT id, token_id FROM sessions WHERE expires_at_ms <= ?1 OR last_used_at_ms + ?2 <= ?1",
            &[&now, &policy.idle_ms],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        for (id, token_id) in rows {
            self.delete_session(&id, &token_id)?;
        }
        Ok(())
    }

    /// Disable or enable a user. Disabling also ends, at once and for good, what the person is
    /// signed in with: every console session is deleted (its token revoked) and every OAuth
    /// grant is revoked (its access tokens too, its refresh tokens spent), in the same
    /// transaction, so enabling the account again brings none of them back. Tokens an operator
    /// made stay, refused while the account is disabled.
    pub fn set_user_disabled(&self, name: &str, disabled: bool) -> Result<User, IdentityError> {
        let user = self.require_user(name)?;
        let now = crate::identity::store::now_ms();
        self.transaction(|tx| {
            tx.execute(
                "UPDATE users SET disabled = ?1 WHERE id = ?2",
                &[&(disabled as i64), &user.id],
            )?;
            if disabled {
                end_sessions_in(tx, &user.id, now)?;
                crate::identity::oauth::revoke_grants_of_in(tx, &user.id, now)?;
            }
            Ok(())
        })?;
        Ok(User { disabled, ..user })
    }

    /// Every session of the user ends (their tokens revoked).
    fn end_sessions_of(&self, user_id: &str) -> Result<(), IdentityError> {
        let now = crate::identity::store::now_ms();
        self.transaction(|tx| Ok(end_sessions_in(tx, user_id, now)?))
    }

    fn delete_session(&self, id: &str, token_id: &str) -> Result<(), IdentityError> {
        let now = crate::identity::store::now_ms();
        self.transaction(|tx| {
            tx.execute("DELETE FROM sessions WHERE id = ?1", &[&id])?;
            tx.execute(
                "UPDATE tokens SET revoked_at_ms = ?1 WHERE id = ?2 AND revoked_at_ms IS NULL",
                &[&now, &token_id],
            )?;
            Ok(())
        })
    }
}

/// Every session of `user_id` ends in `tx`: deleted, and its token revoked.
pub(super) fn end_sessions_in(
    tx: &mut crate::db::Tx<'_>,
    user_id: &str,
    now: i64,
) -> Result<(), crate::db::DbError> {
    tx.execute(
        "UPDATE tokens SET revoked_at_ms = ?1
         WHERE id IN (SELECT token_id FROM sessions WHERE user_id = ?2) AND revoked_at_ms IS NULL",
        &[&now, &user_id],
    )?;
    tx.execute("DELETE FROM sessions WHERE user_id = ?1", &[&user_id])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::store::now_ms;

    fn store() -> (tempfile::TempDir, IdentityStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = IdentityStore::open(&dir.path().join("agentd.db")).unwrap();
        s.add_user("alice").unwrap();
        (dir, s)
    }

    #[test]
    fn passwords_are_argon2id_and_verified() {
        let (dir, s) = store();
        assert!(
            s.verify_password("alice", "no password yet")
                .unwrap()
                .is_none()
        );
        assert!(matches!(
            s.set_password("alice", "short"),
            Err(IdentityError::Invalid(_))
        ));
        assert!(s.set_password("alice", &"x".repeat(1025)).is_err());
        s.set_password("alice", "correct horse").unwrap();
        let phc: String = s
            .db()
            .unwrap()
            .query_one("SELECT phc FROM passwords", &[], |r| r.get(0))
            .unwrap();
        assert!(phc.starts_with("$argon2id$v=19$"), "{phc}");
        for file in ["agentd.db", "agentd.db-wal"] {
            let raw = std::fs::read(dir.path().join(file)).unwrap_or_default();
            assert!(!raw.windows(13).any(|w| w == b"correct horse"), "{file}");
        }
        assert_eq!(
            s.verify_password("alice", "correct horse")
                .unwrap()
                .unwrap()
                .name,
            "alice"
        );
        assert!(s.verify_password("alice", "wrong horse").unwrap().is_none());
        assert!(
            s.verify_password("nobody", "correct horse")
                .unwrap()
                .is_none()
        );
        s.set_user_disabled("alice", true).unwrap();
        assert!(
            s.verify_password("alice", "correct horse")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn one_time_codes_work_once_for_their_kind_until_they_expire() {
        let (_d, s) = store();
        let now = now_ms();
        let link = s.create_code("alice", CodeKind::SignIn, now).unwrap();
        assert_eq!(link.expires_at_ms, now + SIGN_IN_LINK_TTL_MS);
        assert!(
            s.redeem_code(&link.code, CodeKind::Invite, now)
                .unwrap()
                .is_none(),
            "a sign-in link is not an invite"
        );
        assert!(
            s.redeem_code(&link.code, CodeKind::SignIn, now)
                .unwrap()
                .is_some()
        );
        assert!(
            s.redeem_code(&link.code, CodeKind::SignIn, now)
                .unwrap()
                .is_none(),
            "used twice"
        );
        let late = s.create_code("alice", CodeKind::SignIn, now).unwrap();
        assert!(
            s.redeem_code(&late.code, CodeKind::SignIn, now + SIGN_IN_LINK_TTL_MS)
                .unwrap()
                .is_none(),
            "expired"
        );
        let invite = s.create_code("alice", CodeKind::Invite, now).unwrap();
        assert_eq!(invite.expires_at_ms, now + INVITE_TTL_MS);
        assert!(matches!(
            s.accept_invite(&invite.code, "short", now),
            Err(IdentityError::Invalid(_))
        ));
        assert!(
            s.accept_invite(&invite.code, "a new password", now)
                .unwrap()
                .is_some()
        );
        assert!(
            s.verify_password("alice", "a new password")
                .unwrap()
                .is_some()
        );
        assert!(
            s.accept_invite(&invite.code, "another password", now)
                .unwrap()
                .is_none()
        );
        let disabled = s.create_code("alice", CodeKind::SignIn, now).unwrap();
        s.set_user_disabled("alice", true).unwrap();
        assert!(
            s.redeem_code(&disabled.code, CodeKind::SignIn, now)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn sessions_end_when_idle_past_their_absolute_expiry_signed_out_or_disabled() {
        let (_d, s) = store();
        let alice = s.user_by_name("alice").unwrap().unwrap();
        let policy = SessionPolicy {
            idle_ms: 1_000,
            absolute_ms: 5_000,
            touch_ms: 100,
        };
        let now = now_ms();
        let new = s.create_session(&alice, policy, now).unwrap();
        let token = s.token_by_id(&new.session.token.id).unwrap().unwrap();
        assert_eq!(token.label, SESSION_TOKEN_LABEL);
        assert_eq!(token.scopes, vec![Scope::WorkflowsWrite]);
        assert_eq!(token.project_id, None);
        assert_eq!(token.expires_at_ms, Some(now + 5_000));
        // Used every 900 ms: the idle expiry moves, the absolute one does not.
        let mut t = now;
        while t + 900 < now + 5_000 {
            t += 900;
            let live = s.check_session(&new.secret, policy, t).unwrap().unwrap();
            assert_eq!(live.csrf_token, new.session.csrf_token);
        }
        assert!(
            s.check_session(&new.secret, policy, now + 5_000)
                .unwrap()
                .is_none()
        );
        assert!(
            s.token_by_id(&token.id)
                .unwrap()
                .unwrap()
                .revoked_at_ms
                .is_some(),
            "an expired session's token is revoked"
        );

        let idle = s.create_session(&alice, policy, now).unwrap();
        assert!(
            s.check_session(&idle.secret, policy, now + 999)
                .unwrap()
                .is_some()
        );
        assert!(
            s.check_session(&idle.secret, policy, now + 1_999)
                .unwrap()
                .is_none()
        );

        let forgotten = s.create_session(&alice, policy, now).unwrap();
        s.create_session(&alice, policy, now + 1_000).unwrap();
        assert!(
            s.token_by_id(&forgotten.session.token.id)
                .unwrap()
                .unwrap()
                .revoked_at_ms
                .is_some(),
            "an idle session nobody came back to is swept when the next one starts"
        );

        let out = s.create_session(&alice, policy, now).unwrap();
        assert!(s.end_session(&out.secret).unwrap());
        assert!(s.check_session(&out.secret, policy, now).unwrap().is_none());
        assert!(
            s.token_by_id(&out.session.token.id)
                .unwrap()
                .unwrap()
                .revoked_at_ms
                .is_some()
        );
        assert!(!s.end_session(&out.secret).unwrap());

        let off = s.create_session(&alice, policy, now).unwrap();
        s.set_user_disabled("alice", true).unwrap();
        assert!(s.check_session(&off.secret, policy, now).unwrap().is_none());
        s.set_user_disabled("alice", false).unwrap();
        assert!(
            s.check_session(&off.secret, policy, now).unwrap().is_none(),
            "enabling the account again does not bring its sessions back"
        );
        assert!(
            s.token_by_id(&off.session.token.id)
                .unwrap()
                .unwrap()
                .revoked_at_ms
                .is_some(),
            "disabling revoked the session's token"
        );
        s.set_user_disabled("alice", true).unwrap();
        assert!(
            matches!(
                s.create_session(&alice, policy, now),
                Err(IdentityError::Invalid(_))
            ),
            "a disabled account gets no session"
        );
        s.set_user_disabled("alice", false).unwrap();
        assert!(
            s.check_session(&"0".repeat(64), policy, now)
                .unwrap()
                .is_none()
        );
        assert!(
            s.check_session("not a secret", policy, now)
                .unwrap()
                .is_none()
        );

        let reset = s.create_session(&alice, policy, now).unwrap();
        s.set_password("alice", "a fresh password").unwrap();
        assert!(
            s.check_session(&reset.secret, policy, now)
                .unwrap()
                .is_none(),
            "a new password ends the sessions"
        );
    }
}
