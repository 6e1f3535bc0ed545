//! A project's secrets: values an owner or co-owner sets once (an API key an MCP connection's
//! header names) and agentd uses without ever showing them again, in
//! `<state>/agent/project_secrets.db` (SQLite, WAL, `synchronous=FULL`), or, with
//! `[cluster] database_url`, in the cluster's PostgreSQL (namespace `agentd`, version table
//! `project_secrets_schema`). Hosts sharing that database must share the sealing key too (the
//! same systemd credential): a value sealed by one host opens only with its key.
//!
//! Every value is sealed ([`crate::connections::sealed`], AES-256-GCM) before it reaches the store, with the
//! additional data naming this store, the project and the secret's name: a blob copied to
//! another row does not open. Only names and times are ever listed. A value must be usable
//! as an HTTP header value (visible ASCII, spaces and tabs; no line breaks), at most
//! [`MAX_VALUE_BYTES`].
//!
//! Must never: write a value in clear, return one through any API, or put one into a command's
//! environment (secrets only ever become request headers of the project's MCP connections).

use crate::connections::sealed::{Place, SealError, SealingKey};
use crate::db::{Database, DbError, Sql};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;

/// The largest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 8 * 1024;
/// The store's name in every blob's additional data.
const STORE: &str = "project_secrets";

#[derive(Debug, thiserror::Error)]
pub enum SecretStoreError {
    #[error("cannot open the project secret store {path}: {source}")]
    Open {
        path: std::path::PathBuf,
        source: rusqlite::Error,
    },
    /// The cluster's database (`[cluster] database_url`) cannot be reached or migrated.
    #[error("the project secret store (PostgreSQL) cannot be opened: {0}")]
    OpenShared(#[from] crate::db::OpenError),
    #[error("the project secret store failed: {0}")]
    Sql(#[from] DbError),
    #[error("{0}")]
    Seal(#[from] SealError),
}

/// Why a value or a name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretRuleError {
    #[error(
        "{0:?} is not a secret name (upper-case letters, digits and _, starting with a letter, at most 64)"
    )]
    Name(String),
    #[error(
        "the value must be 1 to {MAX_VALUE_BYTES} bytes of visible ASCII, spaces or tabs (it is sent as an HTTP header value)"
    )]
    Value,
}

/// A project secret's name: an upper-case letter, then upper-case letters, digits and `_`, at
/// most 64 in all (the shape of an environment variable, which is how people name keys).
pub fn check_name(name: &str) -> Result<(), SecretRuleError> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(SecretRuleError::Name(name.to_owned()))
    }
}

fn check_value(value: &str) -> Result<(), SecretRuleError> {
    let ok = (1..=MAX_VALUE_BYTES).contains(&value.len())
        && value
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SecretRuleError::Value)
    }
}

/// A secret as listed: its name and when and by whom it was last set, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretInfo {
    pub name: String,
    pub updated_by: String,
    pub updated_at_ms: i64,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS project_secrets (
    project_id TEXT NOT NULL,
    name TEXT NOT NULL,
    sealed BLOB NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (project_id, name)
);
PRAGMA user_version = 1;
";

/// The same table in the cluster's PostgreSQL (`[cluster] database_url`), in the namespace
/// `agentd`: the sealed value `BYTEA`, the time `BIGINT`. One migration per version; never
/// edit one that has shipped, add the next.
pub const POSTGRES_MIGRATIONS: &[&str] = &[
    // 1: the sealed secrets.
    "
CREATE TABLE project_secrets (
    project_id TEXT NOT NULL, name TEXT NOT NULL, sealed BYTEA NOT NULL,
    updated_by TEXT NOT NULL, updated_at_ms BIGINT NOT NULL, PRIMARY KEY (project_id, name));
",
];

/// agentd's project secrets in PostgreSQL, migrated under the advisory lock "awagsecr".
pub const POSTGRES_SCHEMA: agentworks_daemon::postgres::Schema =
    agentworks_daemon::postgres::Schema {
        daemon: "agentd",
        namespace: Some("agentd"),
        version_table: "project_secrets_schema",
        lock_key: 0x6177_6167_7365_6372,
        migrations: POSTGRES_MIGRATIONS,
    };

/// A cheap-to-clone handle on the secret store and the key that seals it. Calls block: run
/// them off the async workers.
#[derive(Clone)]
pub struct SecretStore {
    pub(crate) db: Database,
    key: Arc<SealingKey>,
}

impl SecretStore {
    /// The SQLite store at `path` (one host).
    pub fn open(path: &Path, key: Arc<SealingKey>) -> Result<SecretStore, SecretStoreError> {
        let db = Database::open_sqlite(path, SCHEMA).map_err(|source| SecretStoreError::Open {
            path: path.to_owned(),
            source,
        })?;
        Ok(SecretStore { db, key })
    }

    /// The store in the cluster's PostgreSQL at `url` (several agentd hosts share it, and must
    /// share `key`), its schema migrated first.
    pub fn open_postgres(url: &str, key: Arc<SealingKey>) -> Result<SecretStore, SecretStoreError> {
        Self::on_postgres(&crate::db::connect_postgres(url)?, key)
    }

    /// The store on agentd's `pool` to the cluster's database, which its other stores share
    /// ([`crate::db::connect_postgres`]), its schema migrated first.
    pub fn on_postgres(
        pool: &agentworks_daemon::postgres::Pool,
        key: Arc<SealingKey>,
    ) -> Result<SecretStore, SecretStoreError> {
        let db =
            Database::on_postgres(pool, &POSTGRES_SCHEMA, agentworks_support::clock::now_ms())?;
        Ok(SecretStore { db, key })
    }

    fn place<'a>(path: &'a str) -> Place<'a> {
        Place { store: STORE, path }
    }

    /// Set (or replace) a secret; `Ok(Err(_))` when the name or the value is refused.
    pub fn set(
        &self,
        project_id: &str,
        name: &str,
        value: &str,
        updated_by: &str,
    ) -> Result<Result<SecretInfo, SecretRuleError>, SecretStoreError> {
        if let Err(refused) = check_name(name).and_then(|()| check_value(value)) {
            return Ok(Err(refused));
        }
        let path = format!("{project_id}/{name}");
        let sealed = self.key.seal(Self::place(&path), value.as_bytes())?;
        let info = SecretInfo {
            name: name.to_owned(),
            updated_by: updated_by.to_owned(),
            updated_at_ms: agentworks_support::clock::now_ms(),
        };
        self.db.conn()?.execute(
            "INSERT INTO project_secrets (project_id, name, sealed, updated_by, updated_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (project_id, name) DO UPDATE SET
                 sealed = excluded.sealed, updated_by = excluded.updated_by,
                 updated_at_ms = excluded.updated_at_ms",
            &[
                &project_id,
                &name,
                &sealed,
                &info.updated_by,
                &info.updated_at_ms,
            ],
        )?;
        Ok(Ok(info))
    }

    /// The project's secrets, by name; never their values.
    pub fn list(&self, project_id: &str) -> Result<Vec<SecretInfo>, SecretStoreError> {
        Ok(self.db.conn()?.query_all(
            "SELECT name, updated_by, updated_at_ms FROM project_secrets
             WHERE project_id = ?1 ORDER BY name",
            &[&project_id],
            |r| {
                Ok(SecretInfo {
                    name: r.get(0)?,
                    updated_by: r.get(1)?,
                    updated_at_ms: r.get(2)?,
                })
            },
        )?)
    }

    /// A secret's value, for a request header only; `None` when the project has none by that
    /// name. A blob that does not open (altered, moved, another key) is an error, never `None`.
    pub fn reveal(&self, project_id: &str, name: &str) -> Result<Option<String>, SecretStoreError> {
        let sealed: Option<Vec<u8>> = self.db.conn()?.query_opt(
            "SELECT sealed FROM project_secrets WHERE project_id = ?1 AND name = ?2",
            &[&project_id, &name],
            |r| r.get(0),
        )?;
        let Some(sealed) = sealed else {
            return Ok(None);
        };
        let path = format!("{project_id}/{name}");
        let plain = self.key.open(Self::place(&path), &sealed)?;
        Ok(Some(String::from_utf8_lossy(&plain).into_owned()))
    }

    /// Remove a secret; whether it was there.
    pub fn remove(&self, project_id: &str, name: &str) -> Result<bool, SecretStoreError> {
        Ok(self.db.conn()?.execute(
            "DELETE FROM project_secrets WHERE project_id = ?1 AND name = ?2",
            &[&project_id, &name],
        )? > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path) -> SecretStore {
        let key = Arc::new(SealingKey::load_or_create(dir, None).unwrap());
        SecretStore::open(&dir.join("project_secrets.db"), key).unwrap()
    }

    #[test]
    fn values_are_sealed_on_disk_listed_by_name_only_and_revealed_for_their_place() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = store(dir.path());
        let value = "lin_api_0123456789abcdef-unique-marker";
        let info = secrets
            .set("p1", "LINEAR_API_KEY", value, "u1")
            .unwrap()
            .unwrap();
        assert_eq!(info.name, "LINEAR_API_KEY");
        assert_eq!(
            secrets.reveal("p1", "LINEAR_API_KEY").unwrap().as_deref(),
            Some(value)
        );
        assert_eq!(secrets.reveal("p2", "LINEAR_API_KEY").unwrap(), None);
        assert_eq!(secrets.list("p1").unwrap(), vec![info]);
        // Nothing on disk holds the value in clear (the database, its WAL, the key file).
        drop(secrets);
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            assert!(
                !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                "a file holds the value in clear"
            );
        }
    }

    #[test]
    fn a_blob_moved_to_another_project_does_not_open() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = store(dir.path());
        secrets.set("p1", "KEY", "value-1", "u").unwrap().unwrap();
        secrets.set("p2", "KEY", "value-2", "u").unwrap().unwrap();
        // Copy p1's blob over p2's, as someone with write access to the file could.
        secrets
            .db
            .conn()
            .unwrap()
            .execute(
                "UPDATE project_secrets SET sealed = (SELECT sealed FROM project_secrets
                 WHERE project_id = 'p1') WHERE project_id = 'p2'",
                &[],
            )
            .unwrap();
        assert!(matches!(
            secrets.reveal("p2", "KEY"),
            Err(SecretStoreError::Seal(SealError::Open { .. }))
        ));
        assert_eq!(
            secrets.reveal("p1", "KEY").unwrap().as_deref(),
            Some("value-1")
        );
    }

    #[test]
    fn names_and_values_are_checked_and_removal_removes() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = store(dir.path());
        for name in ["", "lower", "1ABC", "A-B", &"A".repeat(65)] {
            assert!(matches!(
                secrets.set("p", name, "v", "u").unwrap(),
                Err(SecretRuleError::Name(_))
            ));
        }
        for value in [
            "",
            "line\nbreak",
            "cr\r",
            "nul\0",
            "é",
            &"v".repeat(MAX_VALUE_BYTES + 1),
        ] {
            assert_eq!(
                secrets.set("p", "KEY", value, "u").unwrap(),
                Err(SecretRuleError::Value)
            );
        }
        secrets
            .set("p", "KEY", "Bearer\tok value", "u")
            .unwrap()
            .unwrap();
        secrets.set("p", "KEY", "replaced", "u2").unwrap().unwrap();
        assert_eq!(
            secrets.reveal("p", "KEY").unwrap().as_deref(),
            Some("replaced")
        );
        assert_eq!(secrets.list("p").unwrap()[0].updated_by, "u2");
        assert!(secrets.remove("p", "KEY").unwrap());
        assert!(!secrets.remove("p", "KEY").unwrap());
        assert_eq!(secrets.reveal("p", "KEY").unwrap(), None);
    }
}
