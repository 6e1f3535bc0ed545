//! What agentd's OAuth authorization server keeps (issue 13), in the identity store:
//!
//! - **Registered clients** (RFC 7591 `/register`): redirect URIs, the token endpoint auth
//!   method and, for a confidential client, its secret's SHA-256. A registration that no
//!   grant has used within [`UNUSED_CLIENT_TTL_MS`] expires and is swept. Clients named by a
//!   Client ID Metadata Document are not stored: their document is fetched at authorization.
//! - **Grants**: one per consent (person × client), with the scopes, the projects and the
//!   folder caps the person chose (a [`FileGuard`], exactly as a personal token stores it)
//!   and the resource it is for. Its access tokens are rows in `tokens` carrying its id, so
//!   every call re-checks them like any token; revoking the grant revokes them all at once.
//! - **Codes**: one per consent, its SHA-256 stored, usable once within [`CODE_TTL_MS`] by the
//!   same client, redirect URI and PKCE verifier. A code presented twice revokes its grant
//!   (RFC 6749 §4.1.2: the tokens issued from it are revoked).
//! - **Refresh tokens** rotate: each use spends the token and issues a new one. A spent one
//!   presented again means it was stolen or replayed, so the whole grant (the refresh
//!   token's family) is revoked (OAuth 2.1 §4.3.1, RFC 9700 §4.14.2).
//!
//! Every call that depends on the time takes `now` (ms since the epoch) so tests can move it.

use crate::db::{DbError, Row, Sql, Tx};
use crate::identity::authority::{FileGuard, Scope};
use crate::identity::store::{IdentityError, IdentityStore, new_id, to_json};
use crate::identity::token;
use crate::oauth::client_metadata::{ClientMetadata, TokenEndpointAuthMethod};
use crate::oauth::{OAuthError, pkce, scopes};

/// An access token lives an hour; the client refreshes it.
pub const ACCESS_TOKEN_TTL_MS: i64 = 3_600_000;
/// A refresh token unused for 30 days expires.
pub const REFRESH_TOKEN_TTL_MS: i64 = 30 * 24 * 3_600_000;
/// A code must be exchanged within 5 minutes.
pub const CODE_TTL_MS: i64 = 5 * 60_000;
/// A registration no grant used within a day expires.
pub const UNUSED_CLIENT_TTL_MS: i64 = 24 * 3_600_000;
/// A grant's last use is written at most this often.
pub const GRANT_TOUCH_MS: i64 = 60_000;

/// A client registered at `/register`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredClient {
    pub id: String,
    pub name: Option<String>,
    pub redirect_uris: Vec<String>,
    pub auth_method: TokenEndpointAuthMethod,
    secret_hash: Option<String>,
    pub created_at_ms: i64,
    /// `None` once a grant used it.
    pub expires_at_ms: Option<i64>,
}

impl RegisteredClient {
    /// Whether `secret` is this confidential client's secret.
    pub fn secret_matches(&self, secret: &str) -> bool {
        self.secret_hash
            .as_deref()
            .is_some_and(|hash| token::hashes_equal(&token::hash_secret(secret), hash))
    }
}

/// What a person consented to, for a new grant.
#[derive(Debug, Clone)]
pub struct NewGrant {
    pub user_id: String,
    pub client_id: String,
    pub client_name: String,
    pub redirect_uri: String,
    pub scopes: Vec<Scope>,
    pub projects: Vec<String>,
    pub file_guard: FileGuard,
    pub resource: String,
    pub code_challenge: String,
}

/// A grant as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: String,
    pub user_id: String,
    pub client_id: String,
    pub client_name: String,
    pub redirect_uri: String,
    pub scopes: Vec<Scope>,
    pub projects: Vec<String>,
    pub file_guard: FileGuard,
    pub resource: String,
    pub created_at_ms: i64,
    pub last_used_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
}

/// The token endpoint's answer, shown to the client once.
#[derive(Debug, Clone)]
pub struct IssuedTokens {
    pub access_token: String,
    pub expires_in_s: i64,
    pub refresh_token: String,
    pub scopes: Vec<Scope>,
    pub grant_id: String,
}

/// A refresh token on the wire: `awr_<id>_<secret>` (16 and 64 hex).
fn parse_refresh(presented: &str) -> Option<(&str, &str)> {
    let (id, secret) = presented.strip_prefix("awr_")?.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 16) && hex(secret, 64)).then_some((id, secret))
}

fn grant_error(error: IdentityError) -> OAuthError {
    tracing::warn!(%error, "the OAuth store failed");
    OAuthError::ServerError("the authorization server's store is unavailable".into())
}

const GRANT_COLUMNS: &str = "id, user_id, client_id, client_name, redirect_uri, scopes, projects, \
     file_guard, resource, created_at_ms, last_used_at_ms, revoked_at_ms";

fn row_grant(r: &Row<'_>) -> Result<Grant, DbError> {
    let scopes: String = r.get(5)?;
    let projects: String = r.get(6)?;
    let guard: String = r.get(7)?;
    Ok(Grant {
        id: r.get(0)?,
        user_id: r.get(1)?,
        client_id: r.get(2)?,
        client_name: r.get(3)?,
        redirect_uri: r.get(4)?,
        // Unreadable rows fail closed: no scope, no project, nothing writable.
        scopes: serde_json::from_str(&scopes).unwrap_or_default(),
        projects: serde_json::from_str(&projects).unwrap_or_default(),
        file_guard: serde_json::from_str(&guard).unwrap_or(FileGuard {
            write_folders: Some(Vec::new()),
            read_only_folders: Vec::new(),
        }),
        resource: r.get(8)?,
        created_at_ms: r.get(9)?,
        last_used_at_ms: r.get(10)?,
        revoked_at_ms: r.get(11)?,
    })
}

fn row_client(r: &Row<'_>) -> Result<RegisteredClient, DbError> {
    let uris: String = r.get(2)?;
    let method: String = r.get(3)?;
    Ok(RegisteredClient {
        id: r.get(0)?,
        name: r.get(1)?,
        redirect_uris: serde_json::from_str(&uris).unwrap_or_default(),
        auth_method: match method.as_str() {
            "client_secret_basic" => TokenEndpointAuthMethod::ClientSecretBasic,
            "client_secret_post" => TokenEndpointAuthMethod::ClientSecretPost,
            _ => TokenEndpointAuthMethod::None,
        },
        secret_hash: r.get(4)?,
        created_at_ms: r.get(5)?,
        expires_at_ms: r.get(6)?,
    })
}

fn grant_in(tx: &mut Tx<'_>, id: &str) -> Result<Option<Grant>, DbError> {
    tx.query_opt(
        &format!("SELECT {GRANT_COLUMNS} FROM oauth_grants WHERE id = ?1"),
        &[&id],
        row_grant,
    )
}

/// Revoke a grant, its access tokens and its refresh tokens, in `tx`.
fn revoke_grant_in(tx: &mut Tx<'_>, grant_id: &str, now: i64) -> Result<(), DbError> {
    tx.execute(
        "UPDATE oauth_grants SET revoked_at_ms = ?1 WHERE id = ?2 AND revoked_at_ms IS NULL",
        &[&now, &grant_id],
    )?;
    tx.execute(
        "UPDATE tokens SET revoked_at_ms = ?1 WHERE grant_id = ?2 AND revoked_at_ms IS NULL",
        &[&now, &grant_id],
    )?;
    tx.execute(
        "UPDATE oauth_refresh_tokens SET used_at_ms = ?1 WHERE grant_id = ?2 AND used_at_ms IS NULL",
        &[&now, &grant_id],
    )?;
    Ok(())
}

/// Revoke every live grant of `user_id` (a disabled account), in `tx`.
pub(super) fn revoke_grants_of_in(tx: &mut Tx<'_>, user_id: &str, now: i64) -> Result<(), DbError> {
    let live: Vec<String> = tx.query_all(
        "SELECT id FROM oauth_grants WHERE user_id = ?1 AND revoked_at_ms IS NULL",
        &[&user_id],
        |r| r.get(0),
    )?;
    for grant_id in live {
        revoke_grant_in(tx, &grant_id, now)?;
    }
    Ok(())
}

/// Whether `user_id`'s account is disabled (or gone), read in `tx`.
fn account_disabled_in(tx: &mut Tx<'_>, user_id: &str) -> Result<bool, DbError> {
    let disabled: Option<i64> = tx.query_opt(
        "SELECT disabled FROM users WHERE id = ?1",
        &[&user_id],
        |r| r.get(0),
    )?;
    Ok(disabled != Some(0))
}

/// Issue an access token and a refresh token for `grant` with `scopes`, in `tx`.
fn issue_in(
    tx: &mut Tx<'_>,
    grant: &Grant,
    scopes: &[Scope],
    now: i64,
) -> Result<IssuedTokens, DbError> {
    let access = token::mint();
    tx.execute(
        "INSERT INTO tokens (id, user_id, label, secret_hash, scopes, project_id, file_guard, expires_at_ms, revoked_at_ms, created_at_ms, grant_id)
         VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6, ?7, NULL, ?8, ?9)",
        &[&access.id, &grant.user_id, &format!("oauth: {}", grant.client_name), &access.secret_hash, &to_json(&scopes), &to_json(&grant.file_guard), &(now + ACCESS_TOKEN_TTL_MS), &now, &grant.id],
    )?;
    let refresh_id = hex::encode(rand::random::<[u8; 8]>());
    let refresh_secret = hex::encode(rand::random::<[u8; 32]>());
    tx.execute(
        "INSERT INTO oauth_refresh_tokens (id, grant_id, secret_hash, scopes, created_at_ms, expires_at_ms, used_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)",
        &[&refresh_id, &grant.id, &token::hash_secret(&refresh_secret), &to_json(&scopes), &now, &(now + REFRESH_TOKEN_TTL_MS)],
    )?;
    tx.execute(
        "UPDATE oauth_grants SET last_used_at_ms = ?1 WHERE id = ?2",
        &[&now, &grant.id],
    )?;
    Ok(IssuedTokens {
        access_token: access.plaintext,
        expires_in_s: ACCESS_TOKEN_TTL_MS / 1000,
        refresh_token: format!("awr_{refresh_id}_{refresh_secret}"),
        scopes: scopes.to_vec(),
        grant_id: grant.id.clone(),
    })
}

impl IdentityStore {
    // ----- registered clients -----

    /// Register a client; a confidential one gets a secret, returned once.
    pub fn register_client(
        &self,
        metadata: &ClientMetadata,
        now: i64,
    ) -> Result<(RegisteredClient, Option<String>), IdentityError> {
        let secret = (metadata.token_endpoint_auth_method != TokenEndpointAuthMethod::None)
            .then(|| hex::encode(rand::random::<[u8; 32]>()));
        let client = RegisteredClient {
            id: new_id("cli"),
            name: metadata.client_name.clone(),
            redirect_uris: metadata.redirect_uris.clone(),
            auth_method: metadata.token_endpoint_auth_method,
            secret_hash: secret.as_deref().map(token::hash_secret),
            created_at_ms: now,
            expires_at_ms: Some(now + UNUSED_CLIENT_TTL_MS),
        };
        self.db()?.execute(
            "INSERT INTO oauth_clients (id, name, redirect_uris, auth_method, secret_hash, created_at_ms, expires_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            &[&client.id, &client.name, &to_json(&client.redirect_uris), &client.auth_method.as_str(), &client.secret_hash, &client.created_at_ms, &client.expires_at_ms],
        )?;
        Ok((client, secret))
    }

    /// A registered client that has not expired.
    pub fn registered_client(
        &self,
        id: &str,
        now: i64,
    ) -> Result<Option<RegisteredClient>, IdentityError> {
        let client = self.db()?.query_opt(
            "SELECT id, name, redirect_uris, auth_method, secret_hash, created_at_ms, expires_at_ms
             FROM oauth_clients WHERE id = ?1",
            &[&id],
            row_client,
        )?;
        Ok(client.filter(|c| c.expires_at_ms.is_none_or(|t| t > now)))
    }

    /// Delete registrations that expired unused; answers how many unused ones are left.
    pub fn sweep_clients(&self, now: i64) -> Result<usize, IdentityError> {
        let mut db = self.db()?;
        db.execute(
            "DELETE FROM oauth_clients WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ?1",
            &[&now],
        )?;
        let unused: i64 = db.query_one(
            "SELECT COUNT(*) FROM oauth_clients WHERE expires_at_ms IS NOT NULL",
            &[],
            |r| r.get(0),
        )?;
        Ok(unused as usize)
    }

    // ----- grants and codes -----

    /// Store what the person allowed and mint the code the client exchanges for tokens.
    pub fn create_grant(&self, new: &NewGrant, now: i64) -> Result<(Grant, String), IdentityError> {
        Scope::validate_set(&new.scopes).map_err(IdentityError::Invalid)?;
        let grant = Grant {
            id: new_id("grt"),
            user_id: new.user_id.clone(),
            client_id: new.client_id.clone(),
            client_name: new.client_name.clone(),
            redirect_uri: new.redirect_uri.clone(),
            scopes: new.scopes.clone(),
            projects: new.projects.clone(),
            file_guard: new.file_guard.clone(),
            resource: new.resource.clone(),
            created_at_ms: now,
            last_used_at_ms: None,
            revoked_at_ms: None,
        };
        let code = format!("awc_{}", hex::encode(rand::random::<[u8; 32]>()));
        self.transaction(|tx| {
        // In the grant's transaction: an account disabled meanwhile gets no grant (which
        // enabling it again would otherwise bring back).
        if account_disabled_in(tx, &grant.user_id)? {
            return Err(IdentityError::Invalid("the account is disabled".into()));
        }
        tx.execute(
            &format!(
                "INSERT INTO oauth_grants ({GRANT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL, NULL)"
            ),
            &[&grant.id, &grant.user_id, &grant.client_id, &grant.client_name, &grant.redirect_uri, &to_json(&grant.scopes), &to_json(&grant.projects), &to_json(&grant.file_guard), &grant.resource, &now],
        )?;
        tx.execute(
            "INSERT INTO oauth_codes (code_hash, grant_id, redirect_uri, code_challenge, expires_at_ms, used_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, NULL)",
            &[&token::hash_secret(&code), &grant.id, &grant.redirect_uri, &new.code_challenge, &(now + CODE_TTL_MS)],
        )?;
        // A registration that got a grant is in use: it no longer expires.
        tx.execute(
            "UPDATE oauth_clients SET expires_at_ms = NULL WHERE id = ?1",
            &[&grant.client_id],
        )?;
        Ok(())
        })?;
        Ok((grant, code))
    }

    /// Exchange a code (the authorization_code grant): once, by the client it was issued to,
    /// with the same redirect URI and the verifier of its PKCE challenge.
    pub fn exchange_code(
        &self,
        code: &str,
        client_id: &str,
        redirect_uri: &str,
        verifier: &str,
        now: i64,
    ) -> Result<IssuedTokens, OAuthError> {
        let invalid = |why: &str| OAuthError::InvalidGrant(why.into());
        // The outer result is the store's; the inner one what the client is told. Either
        // inner answer commits: a reused code revokes its grant, and a code gets one try.
        let answer = self.transaction(|tx| {
            let found = tx.query_opt(
                "SELECT grant_id, redirect_uri, code_challenge, expires_at_ms, used_at_ms FROM oauth_codes WHERE code_hash = ?1",
                &[&token::hash_secret(code)],
                |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<String>(1)?,
                        r.get::<String>(2)?,
                        r.get::<i64>(3)?,
                        r.get::<Option<i64>>(4)?,
                    ))
                },
            )?;
            let Some((grant_id, code_redirect, challenge, expires, used)) = found else {
                return Ok(Err(invalid("the code is unknown")));
            };
            if used.is_some() {
                revoke_grant_in(tx, &grant_id, now)?;
                return Ok(Err(invalid(
                    "the code was already used; the tokens issued with it are revoked",
                )));
            }
            // Spent whatever happens next: a code gets one try.
            tx.execute(
                "UPDATE oauth_codes SET used_at_ms = ?1 WHERE code_hash = ?2",
                &[&now, &token::hash_secret(code)],
            )?;
            if expires <= now {
                return Ok(Err(invalid("the code has expired")));
            }
            let Some(grant) = grant_in(tx, &grant_id)? else {
                return Ok(Err(invalid("the code's grant is gone")));
            };
            if grant.client_id != client_id {
                return Ok(Err(invalid("the code was issued to another client")));
            }
            if grant.revoked_at_ms.is_some() {
                return Ok(Err(invalid("the grant was revoked")));
            }
            if redirect_uri != code_redirect {
                return Ok(Err(invalid(
                    "redirect_uri is not the one the authorization request used",
                )));
            }
            if let Err(refused) = pkce::verify(verifier, &challenge) {
                return Ok(Err(refused));
            }
            Ok(Ok(issue_in(tx, &grant, &grant.scopes, now)?))
        });
        answer.map_err(grant_error)?
    }

    /// The refresh_token grant: spend `presented` and issue a new pair, with `asked` scopes
    /// (never more than the grant's). A spent token presented again revokes the grant.
    pub fn refresh(
        &self,
        presented: &str,
        client_id: &str,
        asked: Option<&[Scope]>,
        now: i64,
    ) -> Result<IssuedTokens, OAuthError> {
        let invalid = |why: &str| OAuthError::InvalidGrant(why.into());
        let Some((id, secret)) = parse_refresh(presented) else {
            return Err(invalid("the refresh token is not one this server issued"));
        };
        // The outer result is the store's; the inner one what the client is told. A spent
        // token presented again commits the grant's revocation.
        let answer = self.transaction(|tx| {
            let found = tx.query_opt(
                "SELECT grant_id, secret_hash, scopes, expires_at_ms, used_at_ms FROM oauth_refresh_tokens WHERE id = ?1",
                &[&id],
                |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<String>(1)?,
                        r.get::<String>(2)?,
                        r.get::<i64>(3)?,
                        r.get::<Option<i64>>(4)?,
                    ))
                },
            )?;
            let Some((grant_id, hash, scopes_json, expires, used)) = found else {
                return Ok(Err(invalid("the refresh token is unknown")));
            };
            if !token::hashes_equal(&token::hash_secret(secret), &hash) {
                return Ok(Err(invalid("the refresh token is unknown")));
            }
            let Some(grant) = grant_in(tx, &grant_id)? else {
                return Ok(Err(invalid("the refresh token's grant is gone")));
            };
            if grant.client_id != client_id {
                return Ok(Err(invalid("the refresh token was issued to another client")));
            }
            if grant.revoked_at_ms.is_some() {
                return Ok(Err(invalid("the grant was revoked")));
            }
            if account_disabled_in(tx, &grant.user_id)? {
                return Ok(Err(invalid("the account is disabled")));
            }
            if used.is_some() {
                revoke_grant_in(tx, &grant_id, now)?;
                return Ok(Err(invalid(
                    "the refresh token was already used; every token of this grant is revoked",
                )));
            }
            if expires <= now {
                return Ok(Err(invalid("the refresh token has expired")));
            }
            let held: Vec<Scope> = serde_json::from_str(&scopes_json).unwrap_or_default();
            // Never more than the person consented to, nor than this token held.
            let consented: Vec<Scope> = held
                .into_iter()
                .filter(|s| grant.scopes.contains(s))
                .collect();
            let scopes = match scopes::grant(&consented, asked) {
                Ok(scopes) => scopes,
                Err(refused) => return Ok(Err(refused)),
            };
            tx.execute(
                "UPDATE oauth_refresh_tokens SET used_at_ms = ?1 WHERE id = ?2",
                &[&now, &id],
            )?;
            Ok(Ok(issue_in(tx, &grant, &scopes, now)?))
        });
        answer.map_err(grant_error)?
    }

    /// RFC 7009: revoke an access or refresh token `client_id` holds. Revoking a refresh
    /// token revokes its grant (the access tokens issued with it too). A token that is
    /// unknown or another client's is left alone, and that is not an error (§2.2).
    pub fn revoke_presented(
        &self,
        presented: &str,
        client_id: &str,
        now: i64,
    ) -> Result<(), IdentityError> {
        let grant_id = if let Some((id, secret)) = parse_refresh(presented) {
            let row = self.db()?.query_opt(
                "SELECT grant_id, secret_hash FROM oauth_refresh_tokens WHERE id = ?1",
                &[&id],
                |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?)),
            )?;
            row.filter(|(_, hash)| token::hashes_equal(&token::hash_secret(secret), hash))
                .map(|(grant, _)| (grant, None))
        } else if let Some((id, _)) = token::parse(presented) {
            match self.authenticate(presented)? {
                Ok((info, _)) => info.grant_id.map(|grant| (grant, Some(id.to_owned()))),
                Err(_) => None,
            }
        } else {
            None
        };
        let Some((grant_id, access_id)) = grant_id else {
            return Ok(());
        };
        self.transaction(|tx| {
            let Some(grant) = grant_in(tx, &grant_id)? else {
                return Ok(());
            };
            if grant.client_id != client_id {
                return Ok(());
            }
            match &access_id {
                Some(id) => {
                    tx.execute(
                        "UPDATE tokens SET revoked_at_ms = ?1 WHERE id = ?2 AND revoked_at_ms IS NULL",
                        &[&now, id],
                    )?;
                }
                None => revoke_grant_in(tx, &grant_id, now)?,
            }
            Ok(())
        })
    }

    // ----- connected apps -----

    /// The person's live grants that issued tokens, newest first.
    pub fn grants_of(&self, user_id: &str) -> Result<Vec<Grant>, IdentityError> {
        Ok(self.db()?.query_all(
            &format!(
                "SELECT {GRANT_COLUMNS} FROM oauth_grants
                 WHERE user_id = ?1 AND revoked_at_ms IS NULL AND last_used_at_ms IS NOT NULL
                 ORDER BY created_at_ms DESC"
            ),
            &[&user_id],
            row_grant,
        )?)
    }

    /// Revoke one of the person's grants: its tokens stop at once. `false` if the person has
    /// no live grant by that id.
    pub fn revoke_grant(
        &self,
        grant_id: &str,
        user_id: &str,
        now: i64,
    ) -> Result<bool, IdentityError> {
        self.transaction(|tx| {
            let live = grant_in(tx, grant_id)?
                .is_some_and(|g| g.user_id == user_id && g.revoked_at_ms.is_none());
            if live {
                revoke_grant_in(tx, grant_id, now)?;
            }
            Ok(live)
        })
    }

    /// Note that a grant's token was used (at most once per [`GRANT_TOUCH_MS`]).
    pub fn touch_grant(&self, grant_id: &str, now: i64) -> Result<(), IdentityError> {
        self.db()?.execute(
            "UPDATE oauth_grants SET last_used_at_ms = ?1 WHERE id = ?2 AND last_used_at_ms < ?3",
            &[&now, &grant_id, &(now - GRANT_TOUCH_MS)],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::store::now_ms;
    use crate::oauth::client_metadata::parse_registration;
    use agentworks_core::guard::Guard;

    const VERIFIER: &str = "0123456789012345678901234567890123456789abc";

    fn store() -> (tempfile::TempDir, IdentityStore, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let s = IdentityStore::open(&dir.path().join("agentd.db")).unwrap();
        let user = s.add_user("alice").unwrap();
        let project = s
            .add_project(
                "demo",
                crate::identity::ProjectKind::Workflow,
                "demo",
                &Guard {
                    write_paths: vec!["workflows".into()],
                    ..Guard::default()
                },
                "alice",
            )
            .unwrap();
        (dir, s, user.id, project.id)
    }

    fn grant(s: &IdentityStore, user: &str, project: &str, now: i64) -> (Grant, String) {
        s.create_grant(
            &NewGrant {
                user_id: user.into(),
                client_id: "cli_x".into(),
                client_name: "X".into(),
                redirect_uri: "http://127.0.0.1:1/cb".into(),
                scopes: vec![Scope::WorkflowsWrite],
                projects: vec![project.into()],
                file_guard: FileGuard {
                    write_folders: Some(vec!["workflows/a".into()]),
                    read_only_folders: Vec::new(),
                },
                resource: "http://h/mcp".into(),
                code_challenge: pkce::challenge_of(VERIFIER),
            },
            now,
        )
        .unwrap()
    }

    #[test]
    fn a_grants_token_carries_its_projects_caps_and_audience() {
        let (_d, s, user, project) = store();
        let now = now_ms();
        let (g, code) = grant(&s, &user, &project, now);
        let issued = s
            .exchange_code(&code, "cli_x", "http://127.0.0.1:1/cb", VERIFIER, now)
            .unwrap();
        let (info, _) = s.authenticate(&issued.access_token).unwrap().unwrap();
        assert_eq!(info.grant_id.as_deref(), Some(g.id.as_str()));
        assert_eq!(info.projects, Some(vec![project.clone()]));
        assert_eq!(info.audience.as_deref(), Some("http://h/mcp"));
        assert_eq!(info.project_restriction(), Some(vec![project]));
        assert_eq!(
            info.file_guard.write_folders,
            Some(vec!["workflows/a".into()])
        );
        assert_eq!(
            info.expires_at_ms,
            Some(now + ACCESS_TOKEN_TTL_MS),
            "access tokens are short-lived"
        );
        // The grant shows in connected apps once it issued a token; revoking it revokes it.
        assert_eq!(s.grants_of(&user).unwrap().len(), 1);
        assert!(s.revoke_grant(&g.id, &user, now).unwrap());
        assert!(!s.revoke_grant(&g.id, &user, now).unwrap());
        assert!(s.grants_of(&user).unwrap().is_empty());
        assert!(s.authenticate(&issued.access_token).unwrap().is_err());
        assert!(
            s.refresh(&issued.refresh_token, "cli_x", None, now)
                .is_err(),
            "its refresh token died with it"
        );
    }

    #[test]
    fn codes_expire_and_work_once_and_refresh_tokens_rotate() {
        let (_d, s, user, project) = store();
        let now = now_ms();
        let (_, late) = grant(&s, &user, &project, now);
        let error = s
            .exchange_code(
                &late,
                "cli_x",
                "http://127.0.0.1:1/cb",
                VERIFIER,
                now + CODE_TTL_MS,
            )
            .unwrap_err();
        assert_eq!(error.to_string(), "invalid_grant: the code has expired");
        let (_, code) = grant(&s, &user, &project, now);
        let first = s
            .exchange_code(&code, "cli_x", "http://127.0.0.1:1/cb", VERIFIER, now)
            .unwrap();
        let second = s.refresh(&first.refresh_token, "cli_x", None, now).unwrap();
        assert!(s.authenticate(&second.access_token).unwrap().is_ok());
        // Another client cannot use it; a refresh past its idle life is refused.
        assert!(
            s.refresh(&second.refresh_token, "cli_y", None, now)
                .is_err()
        );
        let stale = s
            .refresh(
                &second.refresh_token,
                "cli_x",
                None,
                now + REFRESH_TOKEN_TTL_MS,
            )
            .unwrap_err();
        assert_eq!(stale.code(), "invalid_grant");
        // Replaying the first: the whole family goes.
        let replay = s
            .refresh(&first.refresh_token, "cli_x", None, now)
            .unwrap_err();
        assert!(replay.description().contains("already used"), "{replay}");
        assert!(s.authenticate(&second.access_token).unwrap().is_err());
        assert!(s.authenticate(&first.access_token).unwrap().is_err());
    }

    #[test]
    fn unused_registrations_expire_and_used_ones_stay() {
        let (_d, s, user, project) = store();
        let now = now_ms();
        let metadata = parse_registration(
            br#"{"redirect_uris": ["http://127.0.0.1/cb"], "token_endpoint_auth_method": "client_secret_post"}"#,
        )
        .unwrap();
        let (unused, secret) = s.register_client(&metadata, now).unwrap();
        let secret = secret.expect("a confidential client gets a secret");
        let found = s.registered_client(&unused.id, now).unwrap().unwrap();
        assert!(found.secret_matches(&secret));
        assert!(!found.secret_matches("wrong"));
        let (used, _) = s.register_client(&metadata, now).unwrap();
        s.create_grant(
            &NewGrant {
                client_id: used.id.clone(),
                ..grant_request(&user, &project)
            },
            now,
        )
        .unwrap();
        let later = now + UNUSED_CLIENT_TTL_MS;
        assert!(s.registered_client(&unused.id, later).unwrap().is_none());
        assert!(s.registered_client(&used.id, later).unwrap().is_some());
        assert_eq!(s.sweep_clients(later).unwrap(), 0);
    }

    fn grant_request(user: &str, project: &str) -> NewGrant {
        NewGrant {
            user_id: user.into(),
            client_id: "cli_x".into(),
            client_name: "X".into(),
            redirect_uri: "http://127.0.0.1/cb".into(),
            scopes: vec![Scope::WorkflowsRead],
            projects: vec![project.into()],
            file_guard: FileGuard::default(),
            resource: "http://h/mcp".into(),
            code_challenge: pkce::challenge_of(VERIFIER),
        }
    }

    #[test]
    fn a_store_from_before_grants_gains_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        {
            let old = rusqlite::Connection::open(&path).unwrap();
            old.execute_batch(
                "CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, disabled INTEGER NOT NULL DEFAULT 0, created_at_ms INTEGER NOT NULL);
                 CREATE TABLE tokens (id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id), label TEXT NOT NULL,
                    secret_hash TEXT NOT NULL, scopes TEXT NOT NULL, project_id TEXT, file_guard TEXT NOT NULL,
                    expires_at_ms INTEGER, revoked_at_ms INTEGER, created_at_ms INTEGER NOT NULL);",
            )
            .unwrap();
        }
        let s = IdentityStore::open(&path).unwrap();
        s.add_user("alice").unwrap();
        let (_, plain) = s
            .create_token(&crate::identity::store::TokenRequest {
                user: "alice".into(),
                scopes: vec![Scope::WorkflowsRead],
                ..Default::default()
            })
            .unwrap();
        let (info, _) = s.authenticate(&plain).unwrap().unwrap();
        assert_eq!((info.grant_id, info.audience), (None, None));
        // Opening again is a no-op.
        drop(s);
        IdentityStore::open(&path).unwrap();
    }
}
