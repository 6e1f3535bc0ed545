//! Chat attachments: files a person attaches to a message in the console, kept in agentd's
//! private state (`<state>/agent/attachments.db`, SQLite, WAL, `synchronous=FULL`), or, with
//! `[cluster] database_url`, in the cluster's PostgreSQL (namespace `agentd`, version table
//! `attachments_schema`), so a turn on any agentd host finds what was uploaded through another.
//!
//! An attachment belongs to one chat and its owner; it is uploaded first (pending, no turn) and
//! claimed by the turn whose message names it, at most [`MAX_FILES_PER_MESSAGE`] per message and
//! [`MAX_FILE_BYTES`] each. Its type is sniffed from the bytes (the browser's claim is never
//! read): PNG, JPEG, GIF and WebP images, or UTF-8 text without NUL bytes; anything else is
//! refused. Its name is reduced to a safe display name. The agent only reads them: text files
//! reach the model as a bounded preview ([`text_preview`]), images through `read_image`, which
//! reads only the current turn's attachments ([`AttachmentStore::read_for_turn`]). Nothing here
//! is ever copied to a laptop. Pending uploads a message never claimed are dropped after
//! [`PENDING_LIFETIME_MS`].

use crate::db::{Database, DbError, Row, Sql, TransactionError};
use agentworks_support::clock::now_ms;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

/// At most this many files per message.
pub const MAX_FILES_PER_MESSAGE: usize = 10;
/// At most this many bytes per file.
pub const MAX_FILE_BYTES: usize = 10 * 1024 * 1024;
/// The model sees at most this many bytes of a text attachment.
pub const TEXT_PREVIEW_BYTES: usize = 16 * 1024;
/// An upload no message claimed within this time is deleted.
pub const PENDING_LIFETIME_MS: i64 = 24 * 60 * 60 * 1000;
/// Longest display name kept, in characters.
const MAX_NAME_CHARS: usize = 120;

#[derive(Debug, thiserror::Error)]
pub enum AttachmentError {
    #[error("cannot open the attachment store {path}: {source}")]
    Open {
        path: std::path::PathBuf,
        source: rusqlite::Error,
    },
    /// The cluster's database (`[cluster] database_url`) cannot be reached or migrated.
    #[error("the attachment store (PostgreSQL) cannot be opened: {0}")]
    OpenShared(#[from] crate::db::OpenError),
    #[error("the attachment store failed: {0}")]
    Sql(#[from] DbError),
    #[error("{name} is {size} bytes; an attachment may be at most {MAX_FILE_BYTES} bytes (10 MB)")]
    TooLarge { name: String, size: usize },
    #[error("{count} attachments; a message may carry at most {MAX_FILES_PER_MESSAGE}")]
    TooMany { count: usize },
    #[error(
        "{name} is neither an image (PNG, JPEG, GIF, WebP) nor a UTF-8 text file; only those can be attached"
    )]
    Unsupported { name: String },
    #[error("{name} is empty")]
    Empty { name: String },
    #[error("attachment {id} does not exist in this chat, or is already part of a message")]
    NotFound { id: String },
}

impl TransactionError for AttachmentError {
    fn as_db_error(&self) -> Option<&DbError> {
        match self {
            AttachmentError::Sql(error) => Some(error),
            _ => None,
        }
    }
}

impl AttachmentError {
    /// The error code the API answers with.
    pub fn code(&self) -> &'static str {
        match self {
            AttachmentError::Open { .. }
            | AttachmentError::OpenShared(_)
            | AttachmentError::Sql(_) => "unavailable",
            AttachmentError::TooLarge { .. } => "attachment_too_large",
            AttachmentError::TooMany { .. } => "too_many_attachments",
            AttachmentError::Unsupported { .. } => "unsupported_attachment",
            AttachmentError::Empty { .. } => "empty_attachment",
            AttachmentError::NotFound { .. } => "attachment_not_found",
        }
    }
}

/// What an attachment is, from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Image,
    Text,
}

/// An attachment as listed (never its bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentInfo {
    pub attachment_id: String,
    pub chat_id: String,
    pub name: String,
    pub kind: Kind,
    pub media_type: String,
    pub size: usize,
    pub sha256: String,
    pub created_at_ms: i64,
    /// The turn whose message carries it; `None` while it waits for its message.
    pub turn: Option<i64>,
}

/// The kind and media type of `bytes`, from their content alone.
pub fn sniff(bytes: &[u8]) -> Option<(Kind, &'static str)> {
    const IMAGES: [(&[u8], &str); 5] = [
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"RIFF", "image/webp"),
    ];
    for (magic, media_type) in IMAGES {
        let webp_ok = media_type != "image/webp" || bytes.get(8..12) == Some(b"WEBP".as_slice());
        if bytes.starts_with(magic) && webp_ok {
            return Some((Kind::Image, media_type));
        }
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let binary_control = |c: char| c.is_control() && !matches!(c, '\n' | '\r' | '\t' | '\x0c');
    (!text.chars().any(binary_control)).then_some((Kind::Text, "text/plain"))
}

/// A display name safe to show and to put in the model's text: the last path component, no
/// control or bidirectional-override characters, no leading dots, bounded; `attachment` if
/// nothing is left.
pub fn sanitize_name(raw: &str) -> String {
    let last = raw.rsplit(['/', '\\']).next().unwrap_or_default();
    let bidi = |c: char| matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let cleaned: String = last
        .chars()
        .filter(|c| !c.is_control() && !bidi(*c))
        .take(MAX_NAME_CHARS)
        .collect();
    let trimmed = cleaned.trim().trim_start_matches('.').trim();
    if trimmed.is_empty() {
        "attachment".into()
    } else {
        trimmed.to_owned()
    }
}

/// The text the model sees for a text attachment: its name, its size and at most
/// [`TEXT_PREVIEW_BYTES`] of it (cut on a character boundary), with the bound stated.
pub fn text_preview(info: &AttachmentInfo, bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(TEXT_PREVIEW_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let shown = &text[..end];
    let bound = if end < text.len() {
        format!(
            "only its first {end} bytes are shown (previews are bounded to {TEXT_PREVIEW_BYTES} bytes)"
        )
    } else {
        "shown whole".to_owned()
    };
    format!(
        "[attached text file {:?}, {} bytes, {bound}]\n{shown}\n[end of {:?}]",
        info.name, info.size, info.name
    )
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS attachments (
    id TEXT PRIMARY KEY,
    chat_id TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    media_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    turn INTEGER,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS attachments_chat ON attachments(chat_id, turn);
";

/// The same table in the cluster's PostgreSQL (`[cluster] database_url`), in the namespace
/// `agentd`: integers `BIGINT`, the bytes `BYTEA`. PostgreSQL has no `rowid`, so the table
/// has a column of that name numbering the rows as they are inserted, and the SQL that orders
/// by insertion (`ORDER BY created_at_ms, rowid`) is the same on both. One migration per
/// version; never edit one that has shipped, add the next.
pub const POSTGRES_MIGRATIONS: &[&str] = &[
    // 1: the attachments.
    "
CREATE TABLE attachments (
    id TEXT PRIMARY KEY, chat_id TEXT NOT NULL, owner_id TEXT NOT NULL, name TEXT NOT NULL,
    kind TEXT NOT NULL, media_type TEXT NOT NULL, size BIGINT NOT NULL, sha256 TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL, turn BIGINT, data BYTEA NOT NULL,
    rowid BIGINT GENERATED ALWAYS AS IDENTITY);
CREATE INDEX attachments_chat ON attachments (chat_id, turn);
CREATE INDEX attachments_pending ON attachments (created_at_ms) WHERE turn IS NULL;
",
];

/// agentd's attachment table in PostgreSQL, migrated under the advisory lock "awagattc".
pub const POSTGRES_SCHEMA: agentworks_daemon::postgres::Schema =
    agentworks_daemon::postgres::Schema {
        daemon: "agentd",
        namespace: Some("agentd"),
        version_table: "attachments_schema",
        lock_key: 0x6177_6167_6174_7463,
        migrations: POSTGRES_MIGRATIONS,
    };

const INFO_COLUMNS: &str = "id, chat_id, name, kind, media_type, size, sha256, created_at_ms, turn";

fn row_info(r: &Row<'_>) -> Result<AttachmentInfo, DbError> {
    let kind: String = r.get(3)?;
    let size: i64 = r.get(5)?;
    Ok(AttachmentInfo {
        attachment_id: r.get(0)?,
        chat_id: r.get(1)?,
        name: r.get(2)?,
        kind: if kind == "image" {
            Kind::Image
        } else {
            Kind::Text
        },
        media_type: r.get(4)?,
        size: usize::try_from(size).unwrap_or(0),
        sha256: r.get(6)?,
        created_at_ms: r.get(7)?,
        turn: r.get(8)?,
    })
}

/// A cheap-to-clone handle on the attachment store. Calls block: run them off the async
/// workers.
#[derive(Clone)]
pub struct AttachmentStore {
    pub(crate) db: Database,
}

impl AttachmentStore {
    /// The SQLite store at `path` (one host).
    pub fn open(path: &Path) -> Result<AttachmentStore, AttachmentError> {
        let db = Database::open_sqlite(path, SCHEMA).map_err(|source| AttachmentError::Open {
            path: path.to_owned(),
            source,
        })?;
        Ok(AttachmentStore { db })
    }

    /// The store in the cluster's PostgreSQL at `url` (several agentd hosts share it), its
    /// schema migrated first.
    pub fn open_postgres(url: &str) -> Result<AttachmentStore, AttachmentError> {
        Self::on_postgres(&crate::db::connect_postgres(url)?)
    }

    /// The store on agentd's `pool` to the cluster's database, which its other stores share
    /// ([`crate::db::connect_postgres`]), its schema migrated first.
    pub fn on_postgres(
        pool: &agentworks_daemon::postgres::Pool,
    ) -> Result<AttachmentStore, AttachmentError> {
        let db =
            Database::on_postgres(pool, &POSTGRES_SCHEMA, agentworks_support::clock::now_ms())?;
        Ok(AttachmentStore { db })
    }

    /// Stores an upload for `chat_id` by `owner_id`, pending until a message claims it.
    pub fn add(
        &self,
        chat_id: &str,
        owner_id: &str,
        raw_name: &str,
        bytes: &[u8],
    ) -> Result<AttachmentInfo, AttachmentError> {
        let name = sanitize_name(raw_name);
        if bytes.len() > MAX_FILE_BYTES {
            return Err(AttachmentError::TooLarge {
                name,
                size: bytes.len(),
            });
        }
        if bytes.is_empty() {
            return Err(AttachmentError::Empty { name });
        }
        let Some((kind, media_type)) = sniff(bytes) else {
            return Err(AttachmentError::Unsupported { name });
        };
        let info = AttachmentInfo {
            attachment_id: format!("att_{}", hex::encode(rand::random::<[u8; 12]>())),
            chat_id: chat_id.to_owned(),
            name,
            kind,
            media_type: media_type.to_owned(),
            size: bytes.len(),
            sha256: hex::encode(Sha256::digest(bytes)),
            created_at_ms: now_ms(),
            turn: None,
        };
        let mut db = self.db.conn()?;
        db.execute(
            "DELETE FROM attachments WHERE turn IS NULL AND created_at_ms < ?1",
            &[&(info.created_at_ms - PENDING_LIFETIME_MS)],
        )?;
        db.execute(
            "INSERT INTO attachments (id, chat_id, owner_id, name, kind, media_type, size, sha256, created_at_ms, turn, data)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL, ?10)",
            &[
                &info.attachment_id,
                &info.chat_id,
                &owner_id,
                &info.name,
                &if kind == Kind::Image { "image" } else { "text" },
                &info.media_type,
                &(info.size as i64),
                &info.sha256,
                &info.created_at_ms,
                &bytes,
            ],
        )?;
        Ok(info)
    }

    /// Gives the pending uploads `ids` (of this chat and owner) to `turn`, all or none.
    pub fn claim_for_turn(
        &self,
        chat_id: &str,
        owner_id: &str,
        ids: &[String],
        turn: i64,
    ) -> Result<Vec<AttachmentInfo>, AttachmentError> {
        if ids.len() > MAX_FILES_PER_MESSAGE {
            return Err(AttachmentError::TooMany { count: ids.len() });
        }
        // One transaction: an error (an id not found) rolls back the ids claimed before it, and
        // two hosts claiming one upload at once cannot both see it pending.
        self.db.transaction(|tx| {
            let mut claimed = Vec::with_capacity(ids.len());
            for id in ids {
                let changed = tx.execute(
                    "UPDATE attachments SET turn = ?1
                     WHERE id = ?2 AND chat_id = ?3 AND owner_id = ?4 AND turn IS NULL",
                    &[&turn, id, &chat_id, &owner_id],
                )?;
                if changed != 1 {
                    return Err(AttachmentError::NotFound { id: id.clone() });
                }
                let info = tx.query_one(
                    &format!("SELECT {INFO_COLUMNS} FROM attachments WHERE id = ?1"),
                    &[id],
                    row_info,
                )?;
                claimed.push(info);
            }
            Ok(claimed)
        })
    }

    /// The attachments of one turn of a chat, in upload order: by time, then by insertion
    /// (`rowid`), since two uploads can share a millisecond and ids are random.
    pub fn for_turn(
        &self,
        chat_id: &str,
        turn: i64,
    ) -> Result<Vec<AttachmentInfo>, AttachmentError> {
        Ok(self.db.conn()?.query_all(
            &format!(
                "SELECT {INFO_COLUMNS} FROM attachments WHERE chat_id = ?1 AND turn = ?2
                 ORDER BY created_at_ms, rowid"
            ),
            &[&chat_id, &turn],
            row_info,
        )?)
    }

    /// One attachment of `turn` (by id, or by its display name) and its bytes; an attachment of
    /// another turn or chat is not found.
    pub fn read_for_turn(
        &self,
        chat_id: &str,
        turn: i64,
        id_or_name: &str,
    ) -> Result<(AttachmentInfo, Vec<u8>), AttachmentError> {
        self.db
            .conn()?
            .query_opt(
                &format!(
                    "SELECT {INFO_COLUMNS}, data FROM attachments
                     WHERE chat_id = ?1 AND turn = ?2 AND (id = ?3 OR name = ?3)
                     ORDER BY created_at_ms, rowid LIMIT 1"
                ),
                &[&chat_id, &turn, &id_or_name],
                |r| Ok((row_info(r)?, r.get::<Vec<u8>>(9)?)),
            )?
            .ok_or_else(|| AttachmentError::NotFound {
                id: id_or_name.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn store() -> (tempfile::TempDir, AttachmentStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = AttachmentStore::open(&dir.path().join("attachments.db")).unwrap();
        (dir, store)
    }

    #[test]
    fn the_type_comes_from_the_bytes() {
        assert_eq!(sniff(PNG), Some((Kind::Image, "image/png")));
        assert_eq!(
            sniff(b"\xff\xd8\xff\xe0rest"),
            Some((Kind::Image, "image/jpeg"))
        );
        assert_eq!(sniff(b"GIF89a..."), Some((Kind::Image, "image/gif")));
        assert_eq!(
            sniff(b"RIFF\x10\0\0\0WEBPVP8 "),
            Some((Kind::Image, "image/webp"))
        );
        // A RIFF that is not WebP (a WAV) is not an image, and its bytes are not text.
        assert_eq!(sniff(b"RIFF\x10\0\0\0WAVEfmt \x10\0\0\0\x01\0"), None);
        assert_eq!(
            sniff("fn main() {}\n\tüñí\r\n".as_bytes()),
            Some((Kind::Text, "text/plain"))
        );
        assert_eq!(sniff(b"text with a \0 NUL"), None);
        assert_eq!(sniff(b"\x7fELF\x02\x01\x01"), None);
        assert_eq!(sniff(b"\xc3\x28 invalid utf-8"), None);
    }

    #[test]
    fn names_are_reduced_to_a_safe_display_name() {
        assert_eq!(sanitize_name("../../etc/passwd"), "passwd");
        assert_eq!(sanitize_name("C:\\Users\\me\\shot.png"), "shot.png");
        assert_eq!(sanitize_name(".bashrc"), "bashrc");
        assert_eq!(sanitize_name("a\u{202e}gnp.exe"), "agnp.exe");
        assert_eq!(sanitize_name("line\nbreak\r.txt"), "linebreak.txt");
        assert_eq!(sanitize_name("dir/"), "attachment");
        assert_eq!(sanitize_name("..."), "attachment");
        assert_eq!(sanitize_name(&"é".repeat(500)).chars().count(), 120);
    }

    #[test]
    fn uploads_are_refused_beyond_the_limits_and_for_unknown_types() {
        let (_dir, store) = store();
        let big = vec![b'a'; MAX_FILE_BYTES + 1];
        let error = store.add("c1", "u1", "big.txt", &big).unwrap_err();
        assert_eq!(error.code(), "attachment_too_large");
        assert!(error.to_string().contains("10 MB"), "{error}");
        let exactly = vec![b'a'; MAX_FILE_BYTES];
        assert!(store.add("c1", "u1", "max.txt", &exactly).is_ok());
        let error = store.add("c1", "u1", "x.bin", b"\0\x01\x02").unwrap_err();
        assert_eq!(error.code(), "unsupported_attachment");
        assert_eq!(
            store.add("c1", "u1", "e.txt", b"").unwrap_err().code(),
            "empty_attachment"
        );
        let ids: Vec<String> = (0..=MAX_FILES_PER_MESSAGE).map(|i| i.to_string()).collect();
        let error = store.claim_for_turn("c1", "u1", &ids, 1).unwrap_err();
        assert_eq!(error.code(), "too_many_attachments");
    }

    #[test]
    fn a_turn_reads_only_its_own_attachments_of_its_own_chat() {
        let (_dir, store) = store();
        let image = store.add("c1", "u1", "shot.png", PNG).unwrap();
        let text = store.add("c1", "u1", "notes.md", b"# notes").unwrap();
        let later = store.add("c1", "u1", "later.png", PNG).unwrap();
        let other_chat = store.add("c2", "u1", "other.png", PNG).unwrap();
        // Another owner, or another chat, cannot claim them.
        let stolen =
            store.claim_for_turn("c1", "u2", std::slice::from_ref(&image.attachment_id), 1);
        assert_eq!(stolen.unwrap_err().code(), "attachment_not_found");
        let cross = store.claim_for_turn(
            "c1",
            "u1",
            std::slice::from_ref(&other_chat.attachment_id),
            1,
        );
        assert_eq!(cross.unwrap_err().code(), "attachment_not_found");
        // All or none: one bad id leaves the good one pending.
        let mixed = [image.attachment_id.clone(), "att_missing".to_owned()];
        assert!(store.claim_for_turn("c1", "u1", &mixed, 1).is_err());
        let claimed = store
            .claim_for_turn(
                "c1",
                "u1",
                &[image.attachment_id.clone(), text.attachment_id.clone()],
                1,
            )
            .unwrap();
        assert_eq!(claimed.len(), 2);
        assert!(claimed.iter().all(|a| a.turn == Some(1)));
        // Claimed once: a second message cannot take them again.
        let again = store.claim_for_turn("c1", "u1", std::slice::from_ref(&image.attachment_id), 2);
        assert_eq!(again.unwrap_err().code(), "attachment_not_found");
        store
            .claim_for_turn("c1", "u1", std::slice::from_ref(&later.attachment_id), 2)
            .unwrap();
        let (info, bytes) = store.read_for_turn("c1", 1, "shot.png").unwrap();
        assert_eq!(
            (info.attachment_id.as_str(), bytes.as_slice()),
            (image.attachment_id.as_str(), PNG)
        );
        assert!(store.read_for_turn("c1", 1, &later.attachment_id).is_err());
        assert!(store.read_for_turn("c1", 2, &image.attachment_id).is_err());
        assert!(
            store
                .read_for_turn("c2", 1, &other_chat.attachment_id)
                .is_err()
        );
        let turn_one: Vec<_> = store
            .for_turn("c1", 1)
            .unwrap()
            .into_iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(turn_one, ["shot.png", "notes.md"]);
    }

    #[test]
    fn text_previews_are_bounded_and_say_so() {
        let (_dir, store) = store();
        let long = "é".repeat(TEXT_PREVIEW_BYTES); // 2 bytes each: twice the bound
        let info = store.add("c1", "u1", "long.txt", long.as_bytes()).unwrap();
        let preview = text_preview(&info, long.as_bytes());
        assert!(
            preview.contains(&format!("only its first {TEXT_PREVIEW_BYTES} bytes")),
            "{}",
            &preview[..120]
        );
        assert!(preview.len() < TEXT_PREVIEW_BYTES + 300);
        let short = store.add("c1", "u1", "s.txt", b"hello").unwrap();
        let preview = text_preview(&short, b"hello");
        assert!(
            preview.contains("shown whole") && preview.contains("\nhello\n"),
            "{preview}"
        );
    }

    #[test]
    fn unclaimed_uploads_expire() {
        let (_dir, store) = store();
        let old = store.add("c1", "u1", "old.txt", b"old").unwrap();
        store
            .db
            .conn()
            .unwrap()
            .execute(
                "UPDATE attachments SET created_at_ms = created_at_ms - ?1 WHERE id = ?2",
                &[&(PENDING_LIFETIME_MS + 1), &old.attachment_id],
            )
            .unwrap();
        store.add("c1", "u1", "new.txt", b"new").unwrap();
        let claim = store.claim_for_turn("c1", "u1", std::slice::from_ref(&old.attachment_id), 1);
        assert_eq!(claim.unwrap_err().code(), "attachment_not_found");
    }
}
