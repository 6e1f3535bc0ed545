//! The chat store: chats, their messages and their laptop binding, in
//! `<state>/agent/chats.db` (SQLite, WAL, `synchronous=FULL`) beside the identity store, or,
//! with `[cluster] database_url`, in the cluster's PostgreSQL (namespace `agentd`, its version
//! table `chats_schema`), shared by every agentd host ([`crate::db`] runs the same SQL on both).
//!
//! A chat belongs to one project and is pinned to the person who created it (`owner_id`). Its
//! messages are kept in the OpenAI chat format (`{"role": …, "content": …, "tool_calls": …}`)
//! in order, so the next turn continues the conversation. The binding (one device and one
//! folder alias of the owner's) is stored with the chat; `binding_generation` grows on every
//! bind and unbind, so a turn can tell that the binding it started with is still the current one.
//! Turn numbers grow per chat and never repeat: they are part of the request ids the server
//! makes for tool calls. Each turn's token usage (the sum over its model calls, as the model
//! reported it) is kept in `turn_usage`, added to after every model answer.
//!
//! A chat's title is the first line of the first message sent in it ([`title_of`]), set once
//! when that message is stored and kept afterwards; a chat from before titles has none until
//! its next message.
//!
//! A chat's agent ([`ChatAgent`]: `api`, the built-in model loop, or a provider runnerd runs)
//! and its mode (`run` or `builder`) are chosen when it is created and never change; a chat
//! whose agent is a coding CLI also keeps the CLI's session recorded by its last turn
//! ([`CliSession`]), so the next turn resumes it under the same session key.
//!
//! SQLite layouts (`PRAGMA user_version`): 0 had no `turn_usage`; 1 adds it; 2 adds
//! `chats.title`; 3 adds `chats.agent`, `chats.mode` and the CLI session. Opening an older
//! store creates what it lacks (its turns have no usage rows: they count as zero; its chats
//! have no title, and are `api` chats in `run` mode). PostgreSQL migrates by
//! [`POSTGRES_MIGRATIONS`].
//!
//! Must never hand out another person's chat: every lookup that serves a request is checked
//! against the owner by the caller ([`crate::chat::api`]).

use crate::db::{Database, DbError, Row, Sql, TransactionError};
pub use agentworks_contract::public_api::API_AGENT;
pub use agentworks_contract::runnerd::Mode;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ChatStoreError {
    #[error("cannot open the chat store {path}: {source}")]
    Open {
        path: std::path::PathBuf,
        source: rusqlite::Error,
    },
    /// The cluster's database (`[cluster] database_url`) cannot be reached or migrated.
    #[error("the chat store (PostgreSQL) cannot be opened: {0}")]
    OpenShared(#[from] crate::db::OpenError),
    #[error("the chat store failed: {0}")]
    Sql(#[from] DbError),
    #[error("a stored message is not valid JSON: {0}")]
    Corrupt(#[from] serde_json::Error),
}

impl TransactionError for ChatStoreError {
    fn as_db_error(&self) -> Option<&DbError> {
        match self {
            ChatStoreError::Sql(error) => Some(error),
            _ => None,
        }
    }
}

/// A chat's binding to one folder on one of its owner's devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binding {
    pub device_id: String,
    pub folder: String,
    pub bound_at_ms: i64,
}

/// A chat as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Chat {
    pub chat_id: String,
    pub project_id: String,
    /// The user id of the person who created it: the only one who may read it or run turns.
    pub owner: String,
    pub owner_name: String,
    pub created_at_ms: i64,
    pub binding: Option<Binding>,
    /// Grows on every bind and unbind.
    #[serde(skip)]
    pub binding_generation: i64,
    /// Turns started so far.
    pub turns: i64,
    /// From the first message sent in it ([`title_of`]); `None` until then.
    pub title: Option<String>,
    /// Who answers: [`API_AGENT`] (the built-in model loop) or a provider's name.
    pub agent: String,
    /// What a coding CLI may do to the project (an `api` chat is always `run`).
    pub mode: Mode,
    /// The CLI session the chat's last CLI turn recorded, resumed by its next turn.
    #[serde(skip)]
    pub cli_session: Option<CliSession>,
}

impl Chat {
    /// Whether a coding CLI (run by runnerd) answers this chat, rather than the model loop.
    pub fn is_cli(&self) -> bool {
        self.agent != API_AGENT
    }
}

/// A chat's agent and mode, as chosen when it is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatAgent {
    pub agent: String,
    pub mode: Mode,
}

impl Default for ChatAgent {
    /// The built-in model loop, in Run mode.
    fn default() -> ChatAgent {
        ChatAgent {
            agent: API_AGENT.to_owned(),
            mode: Mode::Run,
        }
    }
}

/// A coding CLI's session (Codex's thread) and the session key runnerd recorded it under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliSession {
    pub session_id: String,
    pub session_key: String,
}

/// The longest title a chat gets, in characters.
pub const MAX_TITLE_CHARS: usize = 80;

/// A chat's title from the first message sent in it: its first line with anything to show,
/// without control or bidirectional formatting characters, at most [`MAX_TITLE_CHARS`]
/// characters. `None` when the message has nothing to show.
pub fn title_of(message: &str) -> Option<String> {
    Some(agentworks_core::text::first_line(message, MAX_TITLE_CHARS)).filter(|t| !t.is_empty())
}

/// The tokens one turn used (the sum over its model calls).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TurnUsage {
    pub turn: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub total_tokens: i64,
}

/// One stored message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredMessage {
    pub seq: i64,
    pub turn: i64,
    pub created_at_ms: i64,
    /// The message in the OpenAI chat format.
    pub message: Value,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS chats (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    owner_name TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    device_id TEXT,
    folder TEXT,
    bound_at_ms INTEGER,
    binding_generation INTEGER NOT NULL DEFAULT 0,
    turns INTEGER NOT NULL DEFAULT 0,
    title TEXT,
    agent TEXT NOT NULL DEFAULT 'api',
    mode TEXT NOT NULL DEFAULT 'run',
    cli_session_id TEXT,
    cli_session_key TEXT
);
CREATE INDEX IF NOT EXISTS chats_owner ON chats(owner_id, project_id);
CREATE TABLE IF NOT EXISTS messages (
    chat_id TEXT NOT NULL REFERENCES chats(id),
    seq INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (chat_id, seq)
);
CREATE TABLE IF NOT EXISTS turn_usage (
    chat_id TEXT NOT NULL REFERENCES chats(id),
    turn INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    total_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (chat_id, turn)
);
CREATE TABLE IF NOT EXISTS turn_claims (
    chat_id TEXT PRIMARY KEY REFERENCES chats(id),
    claim TEXT NOT NULL,
    host TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
";

/// The SQLite layout this binary writes (`PRAGMA user_version`).
const SQLITE_VERSION: i64 = 3;

/// The same tables in the cluster's PostgreSQL (`[cluster] database_url`), in the namespace
/// `agentd` beside the identity store's: every integer a `BIGINT`, as [`crate::db`] reads them.
/// One migration per version; never edit one that has shipped, add the next. (SQLite's layout
/// 0, before `turn_usage`, never existed here.)
pub const POSTGRES_MIGRATIONS: &[&str] = &[
    // 1: chats, their messages and each turn's usage.
    "
CREATE TABLE chats (
    id TEXT PRIMARY KEY, project_id TEXT NOT NULL, owner_id TEXT NOT NULL,
    owner_name TEXT NOT NULL, created_at_ms BIGINT NOT NULL, device_id TEXT, folder TEXT,
    bound_at_ms BIGINT, binding_generation BIGINT NOT NULL DEFAULT 0,
    turns BIGINT NOT NULL DEFAULT 0);
CREATE INDEX chats_owner ON chats (owner_id, project_id);
CREATE TABLE messages (
    chat_id TEXT NOT NULL REFERENCES chats(id), seq BIGINT NOT NULL, turn BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (chat_id, seq));
CREATE TABLE turn_usage (
    chat_id TEXT NOT NULL REFERENCES chats(id), turn BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL DEFAULT 0, completion_tokens BIGINT NOT NULL DEFAULT 0,
    total_tokens BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (chat_id, turn));
",
    // 2: which host runs a chat's turn, so two hosts never run two turns of one chat at once.
    "
CREATE TABLE turn_claims (
    chat_id TEXT PRIMARY KEY REFERENCES chats(id), claim TEXT NOT NULL, host TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL);
",
    // 3: a chat's title, from the first message sent in it.
    "
ALTER TABLE chats ADD COLUMN title TEXT;
",
    // 4: a chat's agent and mode (existing chats: the model loop, Run), and a CLI's session.
    "
ALTER TABLE chats ADD COLUMN agent TEXT NOT NULL DEFAULT 'api';
ALTER TABLE chats ADD COLUMN mode TEXT NOT NULL DEFAULT 'run';
ALTER TABLE chats ADD COLUMN cli_session_id TEXT;
ALTER TABLE chats ADD COLUMN cli_session_key TEXT;
",
];

/// agentd's chat tables in PostgreSQL, migrated under the advisory lock "awagchat".
pub const POSTGRES_SCHEMA: agentworks_daemon::postgres::Schema =
    agentworks_daemon::postgres::Schema {
        daemon: "agentd",
        namespace: Some("agentd"),
        version_table: "chats_schema",
        lock_key: 0x6177_6167_6368_6174,
        migrations: POSTGRES_MIGRATIONS,
    };

const CHAT_COLUMNS: &str = "id, project_id, owner_id, owner_name, created_at_ms, device_id, folder, \
     bound_at_ms, binding_generation, turns, title, agent, mode, cli_session_id, cli_session_key";

fn row_chat(r: &Row<'_>) -> Result<Chat, DbError> {
    let device_id: Option<String> = r.get(5)?;
    let folder: Option<String> = r.get(6)?;
    let bound_at_ms: Option<i64> = r.get(7)?;
    let binding = match (device_id, folder, bound_at_ms) {
        (Some(device_id), Some(folder), Some(bound_at_ms)) => Some(Binding {
            device_id,
            folder,
            bound_at_ms,
        }),
        _ => None,
    };
    Ok(Chat {
        chat_id: r.get(0)?,
        project_id: r.get(1)?,
        owner: r.get(2)?,
        owner_name: r.get(3)?,
        created_at_ms: r.get(4)?,
        binding,
        binding_generation: r.get(8)?,
        turns: r.get(9)?,
        title: r.get(10)?,
        agent: r.get(11)?,
        mode: mode_of(&r.get::<String>(12)?),
        cli_session: match (r.get(13)?, r.get(14)?) {
            (Some(session_id), Some(session_key)) => Some(CliSession {
                session_id,
                session_key,
            }),
            _ => None,
        },
    })
}

/// A stored mode. Only `builder` is Builder: anything else reads as Run, the lesser mode, so a
/// damaged row never promotes a chat.
fn mode_of(stored: &str) -> Mode {
    match stored {
        "builder" => Mode::Builder,
        _ => Mode::Run,
    }
}

/// Adds the columns an older layout lacks: `chats.title` (layout 1 or older: NULL, no title,
/// for every existing chat), then the agent, the mode and the CLI session (layout 2 or older:
/// every existing chat is an `api` chat in `run` mode); then marks the layout current.
fn add_missing_columns(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    let columns = [
        ("title", "title TEXT"),
        ("agent", "agent TEXT NOT NULL DEFAULT 'api'"),
        ("mode", "mode TEXT NOT NULL DEFAULT 'run'"),
        ("cli_session_id", "cli_session_id TEXT"),
        ("cli_session_key", "cli_session_key TEXT"),
    ];
    for (name, definition) in columns {
        let has_column = conn
            .prepare("SELECT 1 FROM pragma_table_info('chats') WHERE name = ?1")?
            .exists([name])?;
        if !has_column {
            conn.execute_batch(&format!("ALTER TABLE chats ADD COLUMN {definition};"))?;
        }
    }
    conn.execute_batch(&format!("PRAGMA user_version = {SQLITE_VERSION};"))
}

/// A cheap-to-clone handle on the chat store. Calls block: run them off the async workers.
#[derive(Clone)]
pub struct ChatStore {
    pub(crate) db: Database,
}

impl ChatStore {
    /// The SQLite store at `path` (one host).
    pub fn open(path: &Path) -> Result<ChatStore, ChatStoreError> {
        let err = |source| ChatStoreError::Open {
            path: path.to_owned(),
            source,
        };
        let db = Database::open_sqlite(path, SCHEMA).map_err(err)?;
        if let Some(conn) = db.sqlite() {
            add_missing_columns(&conn).map_err(err)?;
        }
        Ok(ChatStore { db })
    }

    /// The store in the cluster's PostgreSQL at `url` (several agentd hosts share it), its
    /// schema migrated first.
    pub fn open_postgres(url: &str) -> Result<ChatStore, ChatStoreError> {
        Self::on_postgres(&crate::db::connect_postgres(url)?)
    }

    /// The store on agentd's `pool` to the cluster's database, which its other stores share
    /// ([`crate::db::connect_postgres`]), its schema migrated first.
    pub fn on_postgres(
        pool: &agentworks_daemon::postgres::Pool,
    ) -> Result<ChatStore, ChatStoreError> {
        let db =
            Database::on_postgres(pool, &POSTGRES_SCHEMA, agentworks_support::clock::now_ms())?;
        Ok(ChatStore { db })
    }

    /// A new `api` chat in Run mode ([`ChatAgent::default`]).
    pub fn create(
        &self,
        project_id: &str,
        owner_id: &str,
        owner_name: &str,
    ) -> Result<Chat, ChatStoreError> {
        self.create_with(project_id, owner_id, owner_name, &ChatAgent::default())
    }

    /// A new chat answered by `agent` (checked by the caller: [`crate::chat::agents`]).
    pub fn create_with(
        &self,
        project_id: &str,
        owner_id: &str,
        owner_name: &str,
        agent: &ChatAgent,
    ) -> Result<Chat, ChatStoreError> {
        let id = format!("c{}", hex::encode(rand::random::<[u8; 10]>()));
        let now = agentworks_support::clock::now_ms();
        let (name, mode) = (agent.agent.as_str(), agent.mode.as_str());
        self.db.conn()?.execute(
            "INSERT INTO chats (id, project_id, owner_id, owner_name, created_at_ms, agent, mode) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            &[&id, &project_id, &owner_id, &owner_name, &now, &name, &mode],
        )?;
        Ok(Chat {
            chat_id: id,
            project_id: project_id.to_owned(),
            owner: owner_id.to_owned(),
            owner_name: owner_name.to_owned(),
            created_at_ms: now,
            binding: None,
            binding_generation: 0,
            turns: 0,
            title: None,
            agent: agent.agent.clone(),
            mode: agent.mode,
            cli_session: None,
        })
    }

    /// Records the CLI session a turn of the chat started (or resumed), replacing the last one.
    pub fn set_cli_session(
        &self,
        chat_id: &str,
        session: &CliSession,
    ) -> Result<(), ChatStoreError> {
        self.db.conn()?.execute(
            "UPDATE chats SET cli_session_id = ?2, cli_session_key = ?3 WHERE id = ?1",
            &[&chat_id, &session.session_id, &session.session_key],
        )?;
        Ok(())
    }

    /// Titles the chat `title` unless it has a title already: `true` if this call set it.
    /// One statement, so of two first messages racing on two hosts one titles the chat.
    pub fn title_once(&self, chat_id: &str, title: &str) -> Result<bool, ChatStoreError> {
        Ok(self.db.conn()?.execute(
            "UPDATE chats SET title = ?2 WHERE id = ?1 AND title IS NULL",
            &[&chat_id, &title],
        )? == 1)
    }

    pub fn get(&self, id: &str) -> Result<Option<Chat>, ChatStoreError> {
        Ok(self.db.conn()?.query_opt(
            &format!("SELECT {CHAT_COLUMNS} FROM chats WHERE id = ?1"),
            &[&id],
            row_chat,
        )?)
    }

    /// The chats `owner_id` created, optionally in one project, newest first.
    pub fn list(
        &self,
        owner_id: &str,
        project_id: Option<&str>,
    ) -> Result<Vec<Chat>, ChatStoreError> {
        // The cast gives PostgreSQL the parameter's type, which `IS NULL` alone does not.
        Ok(self.db.conn()?.query_all(
            &format!(
                "SELECT {CHAT_COLUMNS} FROM chats \
                 WHERE owner_id = ?1 AND (CAST(?2 AS TEXT) IS NULL OR project_id = ?2) \
                 ORDER BY created_at_ms DESC, id"
            ),
            &[&owner_id, &project_id],
            row_chat,
        )?)
    }

    pub fn messages(&self, chat_id: &str) -> Result<Vec<StoredMessage>, ChatStoreError> {
        let rows = self.db.conn()?.query_all(
            "SELECT seq, turn, created_at_ms, body FROM messages WHERE chat_id = ?1 ORDER BY seq",
            &[&chat_id],
            |r| {
                Ok((
                    r.get::<i64>(0)?,
                    r.get::<i64>(1)?,
                    r.get::<i64>(2)?,
                    r.get::<String>(3)?,
                ))
            },
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for (seq, turn, created_at_ms, body) in rows {
            out.push(StoredMessage {
                seq,
                turn,
                created_at_ms,
                message: serde_json::from_str(&body)?,
            });
        }
        Ok(out)
    }

    /// Appends a message after the chat's last one. The next number and the insert are one
    /// transaction, so two hosts appending at once take two numbers.
    pub fn append(&self, chat_id: &str, turn: i64, message: &Value) -> Result<(), ChatStoreError> {
        let body = serde_json::to_string(message)?;
        let now = agentworks_support::clock::now_ms();
        self.db.transaction(|tx| {
            let next: i64 = tx.query_one(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE chat_id = ?1",
                &[&chat_id],
                |r| r.get(0),
            )?;
            tx.execute(
                "INSERT INTO messages (chat_id, seq, turn, created_at_ms, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                &[&chat_id, &next, &turn, &now, &body],
            )?;
            Ok::<_, ChatStoreError>(())
        })
    }

    /// Starts the next turn: its number (1, 2, …), durable before anything is dispatched.
    /// Claims the chat's one running turn for `claim` (a fresh id) on agentd host `host` until
    /// `until_ms`: `Ok(None)` when it is taken, or the host of another claim that has not
    /// expired. One statement, so of several hosts claiming at once exactly one gets it.
    pub fn claim_turn(
        &self,
        chat_id: &str,
        claim: &str,
        host: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<String>, ChatStoreError> {
        let mut conn = self.db.conn()?;
        let taken = conn.execute(
            "INSERT INTO turn_claims (chat_id, claim, host, expires_at_ms) VALUES (?1, ?2, ?3, ?5)
             ON CONFLICT (chat_id) DO UPDATE SET claim = excluded.claim, host = excluded.host,
             expires_at_ms = excluded.expires_at_ms WHERE turn_claims.expires_at_ms <= ?4",
            &[&chat_id, &claim, &host, &now_ms, &until_ms],
        )?;
        if taken == 1 {
            return Ok(None);
        }
        let holder = conn.query_opt(
            "SELECT host FROM turn_claims WHERE chat_id = ?1",
            &[&chat_id],
            |r| r.get::<String>(0),
        )?;
        Ok(Some(holder.unwrap_or_default()))
    }

    /// Keeps `claim` on the chat until `until_ms`; `false` if it is no longer held.
    pub fn renew_turn_claim(
        &self,
        chat_id: &str,
        claim: &str,
        until_ms: i64,
    ) -> Result<bool, ChatStoreError> {
        Ok(self.db.conn()?.execute(
            "UPDATE turn_claims SET expires_at_ms = ?3 WHERE chat_id = ?1 AND claim = ?2",
            &[&chat_id, &claim, &until_ms],
        )? == 1)
    }

    /// Lets go of `claim` (the turn ended).
    pub fn release_turn_claim(&self, chat_id: &str, claim: &str) -> Result<(), ChatStoreError> {
        self.db.conn()?.execute(
            "DELETE FROM turn_claims WHERE chat_id = ?1 AND claim = ?2",
            &[&chat_id, &claim],
        )?;
        Ok(())
    }

    /// The host whose claim on the chat has not expired at `now_ms`, if any: where its
    /// running turn is.
    pub fn turn_claim_holder(
        &self,
        chat_id: &str,
        now_ms: i64,
    ) -> Result<Option<String>, ChatStoreError> {
        Ok(self.db.conn()?.query_opt(
            "SELECT host FROM turn_claims WHERE chat_id = ?1 AND expires_at_ms > ?2",
            &[&chat_id, &now_ms],
            |r| r.get::<String>(0),
        )?)
    }

    /// Drops every claim of agentd host `host`: at its start, the turns it ran are gone.
    pub fn release_turn_claims_of(&self, host: &str) -> Result<usize, ChatStoreError> {
        Ok(self
            .db
            .conn()?
            .execute("DELETE FROM turn_claims WHERE host = ?1", &[&host])?)
    }

    pub fn next_turn(&self, chat_id: &str) -> Result<i64, ChatStoreError> {
        Ok(self.db.conn()?.query_one(
            "UPDATE chats SET turns = turns + 1 WHERE id = ?1 RETURNING turns",
            &[&chat_id],
            |r| r.get(0),
        )?)
    }

    /// Adds one model call's tokens to the turn's usage (the row is made by the first call).
    /// Counts are bounded where they are parsed ([`crate::chat::model::MAX_REPORTED_TOKENS`]), so
    /// the sums stay far from overflowing.
    pub fn add_usage(
        &self,
        chat_id: &str,
        turn: i64,
        usage: &crate::chat::model::Usage,
    ) -> Result<(), ChatStoreError> {
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        // The old values are named by their table: PostgreSQL finds a bare column name
        // ambiguous beside `excluded`.
        self.db.conn()?.execute(
            "INSERT INTO turn_usage (chat_id, turn, prompt_tokens, completion_tokens, total_tokens) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (chat_id, turn) DO UPDATE SET \
             prompt_tokens = turn_usage.prompt_tokens + excluded.prompt_tokens, \
             completion_tokens = turn_usage.completion_tokens + excluded.completion_tokens, \
             total_tokens = turn_usage.total_tokens + excluded.total_tokens",
            &[
                &chat_id,
                &turn,
                &count(usage.prompt_tokens),
                &count(usage.completion_tokens),
                &count(usage.total_tokens),
            ],
        )?;
        Ok(())
    }

    /// Every turn's usage in the chat that has one, in turn order.
    pub fn usage(&self, chat_id: &str) -> Result<Vec<TurnUsage>, ChatStoreError> {
        Ok(self.db.conn()?.query_all(
            "SELECT turn, prompt_tokens, completion_tokens, total_tokens FROM turn_usage \
             WHERE chat_id = ?1 ORDER BY turn",
            &[&chat_id],
            |r| {
                Ok(TurnUsage {
                    turn: r.get(0)?,
                    prompt_tokens: r.get(1)?,
                    completion_tokens: r.get(2)?,
                    total_tokens: r.get(3)?,
                })
            },
        )?)
    }

    /// Binds (`Some`) or unbinds (`None`) the chat; the generation grows either way.
    pub fn set_binding(
        &self,
        chat_id: &str,
        binding: Option<(&str, &str)>,
    ) -> Result<Option<Chat>, ChatStoreError> {
        let now = agentworks_support::clock::now_ms();
        let (device, folder, at) = match binding {
            Some((device, folder)) => (Some(device), Some(folder), Some(now)),
            None => (None, None, None),
        };
        // The update and the read are one transaction: the chat returned is the one this call
        // made, not another host's bind a moment later.
        self.db.transaction(|tx| {
            tx.execute(
                "UPDATE chats SET device_id = ?2, folder = ?3, bound_at_ms = ?4, \
                 binding_generation = binding_generation + 1 WHERE id = ?1",
                &[&chat_id, &device, &folder, &at],
            )?;
            Ok::<_, ChatStoreError>(tx.query_opt(
                &format!("SELECT {CHAT_COLUMNS} FROM chats WHERE id = ?1"),
                &[&chat_id],
                row_chat,
            )?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `chats` as layouts 0 and 1 had it: no title.
    const OLD_CHATS: &str = "CREATE TABLE chats (id TEXT PRIMARY KEY, project_id TEXT NOT NULL,
        owner_id TEXT NOT NULL, owner_name TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
        device_id TEXT, folder TEXT, bound_at_ms INTEGER,
        binding_generation INTEGER NOT NULL DEFAULT 0, turns INTEGER NOT NULL DEFAULT 0);";

    #[test]
    fn chats_messages_turns_and_bindings_persist() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.db");
        let store = ChatStore::open(&path).unwrap();
        let chat = store.create("p1", "u1", "alice").unwrap();
        store.create("p2", "u1", "alice").unwrap();
        store.create("p1", "u2", "bob").unwrap();
        assert_eq!(store.list("u1", None).unwrap().len(), 2);
        assert_eq!(store.list("u1", Some("p1")).unwrap(), vec![chat.clone()]);
        assert_eq!(store.next_turn(&chat.chat_id).unwrap(), 1);
        store
            .append(
                &chat.chat_id,
                1,
                &serde_json::json!({"role": "user", "content": "hi"}),
            )
            .unwrap();
        store
            .append(
                &chat.chat_id,
                1,
                &serde_json::json!({"role": "assistant", "content": "yo"}),
            )
            .unwrap();
        let bound = store
            .set_binding(&chat.chat_id, Some(("d1", "proj")))
            .unwrap()
            .unwrap();
        assert_eq!(bound.binding.as_ref().unwrap().folder, "proj");
        assert_eq!(bound.binding_generation, 1);
        drop(store);

        let store = ChatStore::open(&path).unwrap();
        let again = store.get(&chat.chat_id).unwrap().unwrap();
        assert_eq!(again.turns, 1);
        assert_eq!(again.binding, bound.binding);
        let messages = store.messages(&chat.chat_id).unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[1].message["content"], "yo");
        assert_eq!(store.next_turn(&chat.chat_id).unwrap(), 2);
        let unbound = store.set_binding(&chat.chat_id, None).unwrap().unwrap();
        assert_eq!(unbound.binding, None);
        assert_eq!(unbound.binding_generation, 2);
        assert!(store.get("nope").unwrap().is_none());
    }

    #[test]
    fn usage_adds_up_per_turn_and_persists() {
        use crate::chat::model::Usage;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.db");
        let store = ChatStore::open(&path).unwrap();
        let chat = store.create("p1", "u1", "alice").unwrap();
        let other = store.create("p1", "u1", "alice").unwrap();
        let used = |p, c| Usage {
            prompt_tokens: p,
            completion_tokens: c,
            total_tokens: p + c,
        };
        store.add_usage(&chat.chat_id, 1, &used(10, 2)).unwrap();
        store.add_usage(&chat.chat_id, 1, &used(15, 3)).unwrap();
        store
            .add_usage(&chat.chat_id, 2, &Usage::default())
            .unwrap();
        store.add_usage(&other.chat_id, 1, &used(99, 1)).unwrap();
        drop(store);
        let store = ChatStore::open(&path).unwrap();
        assert_eq!(
            store.usage(&chat.chat_id).unwrap(),
            vec![
                TurnUsage {
                    turn: 1,
                    prompt_tokens: 25,
                    completion_tokens: 5,
                    total_tokens: 30
                },
                TurnUsage {
                    turn: 2,
                    ..TurnUsage::default()
                }
            ]
        );
        assert!(store.usage("nope").unwrap().is_empty());
    }

    /// A chats.db written before usage was stored (layout 0) opens, keeps its chats and
    /// messages, and records usage and titles from then on.
    #[test]
    fn a_store_from_before_usage_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.db");
        let old = rusqlite::Connection::open(&path).unwrap();
        old.execute_batch(OLD_CHATS).unwrap();
        old.execute_batch(
            "CREATE INDEX chats_owner ON chats(owner_id, project_id);
             CREATE TABLE messages (chat_id TEXT NOT NULL REFERENCES chats(id), seq INTEGER NOT NULL,
                turn INTEGER NOT NULL, created_at_ms INTEGER NOT NULL, body TEXT NOT NULL,
                PRIMARY KEY (chat_id, seq));
             INSERT INTO chats (id, project_id, owner_id, owner_name, created_at_ms, turns)
                VALUES ('c1', 'p1', 'u1', 'alice', 1, 1);
             INSERT INTO messages VALUES ('c1', 1, 1, 1, '{\"role\":\"user\",\"content\":\"hi\"}');",
        )
        .unwrap();
        drop(old);
        let store = ChatStore::open(&path).unwrap();
        assert_eq!(store.get("c1").unwrap().unwrap().turns, 1);
        assert_eq!(store.messages("c1").unwrap()[0].message["content"], "hi");
        assert!(store.usage("c1").unwrap().is_empty());
        let turn = store.next_turn("c1").unwrap();
        store
            .add_usage(
                "c1",
                turn,
                &crate::chat::model::Usage {
                    prompt_tokens: 7,
                    completion_tokens: 1,
                    total_tokens: 8,
                },
            )
            .unwrap();
        assert_eq!(store.usage("c1").unwrap()[0].total_tokens, 8);
        assert_eq!(store.get("c1").unwrap().unwrap().title, None);
        assert!(store.title_once("c1", "next message").unwrap());
        assert_eq!(
            store.get("c1").unwrap().unwrap().title.as_deref(),
            Some("next message")
        );
        let version: i64 = store
            .db
            .sqlite()
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SQLITE_VERSION);
    }

    /// A chats.db of layout 1 (usage, no titles) opens with its chats untitled, and opening
    /// the current layout again changes nothing.
    #[test]
    fn a_store_from_before_titles_is_migrated_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.db");
        let old = rusqlite::Connection::open(&path).unwrap();
        old.execute_batch(OLD_CHATS).unwrap();
        old.execute_batch(
            "INSERT INTO chats (id, project_id, owner_id, owner_name, created_at_ms, turns)
                VALUES ('c1', 'p1', 'u1', 'alice', 1, 2);
             PRAGMA user_version = 1;",
        )
        .unwrap();
        drop(old);
        let store = ChatStore::open(&path).unwrap();
        let chat = store.get("c1").unwrap().unwrap();
        assert_eq!((chat.turns, chat.title), (2, None));
        assert!(store.title_once("c1", "first").unwrap());
        drop(store);
        let store = ChatStore::open(&path).unwrap();
        assert_eq!(
            store.get("c1").unwrap().unwrap().title.as_deref(),
            Some("first")
        );
        assert!(!store.title_once("c1", "second").unwrap());
    }

    /// A chats.db of layout 2 (titles, no agents) opens with every chat an `api` chat in Run
    /// mode, keeps its title, and takes CLI chats from then on.
    #[test]
    fn a_store_from_before_agents_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.db");
        let old = rusqlite::Connection::open(&path).unwrap();
        old.execute_batch(OLD_CHATS).unwrap();
        old.execute_batch(
            "ALTER TABLE chats ADD COLUMN title TEXT;
             INSERT INTO chats (id, project_id, owner_id, owner_name, created_at_ms, turns, title)
                VALUES ('c1', 'p1', 'u1', 'alice', 1, 3, 'old chat');
             PRAGMA user_version = 2;",
        )
        .unwrap();
        drop(old);
        let store = ChatStore::open(&path).unwrap();
        let chat = store.get("c1").unwrap().unwrap();
        assert_eq!(
            (
                chat.agent.as_str(),
                chat.mode,
                chat.title.as_deref(),
                chat.turns
            ),
            ("api", Mode::Run, Some("old chat"), 3)
        );
        let cli = ChatAgent {
            agent: "codex".into(),
            mode: Mode::Builder,
        };
        let created = store.create_with("p1", "u1", "alice", &cli).unwrap();
        drop(store);
        let store = ChatStore::open(&path).unwrap();
        assert_eq!(
            store.get(&created.chat_id).unwrap().unwrap().mode,
            Mode::Builder
        );
        let version: i64 = store
            .db
            .sqlite()
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SQLITE_VERSION);
    }

    #[test]
    fn a_title_is_the_first_line_of_the_message_bounded_and_without_controls() {
        assert_eq!(
            title_of("\n  Fix the failing build\nIt fails since Tuesday").as_deref(),
            Some("Fix the failing build")
        );
        assert_eq!(
            title_of("run \x1b]0;pwned\x07it\u{202e}txt").as_deref(),
            Some("run ]0;pwnedittxt")
        );
        assert_eq!(title_of(" \n\t\u{1b}\n"), None);
        let long = title_of(&"word ".repeat(100)).unwrap();
        assert_eq!(long.chars().count(), MAX_TITLE_CHARS);
        assert!(long.ends_with('…'), "{long}");
    }
}
