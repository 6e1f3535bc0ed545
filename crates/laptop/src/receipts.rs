//! The executor's private receipts: one row per request id, in SQLite under the CLI's state dir
//! (`receipts.db`, WAL, `synchronous=FULL`, file 0600 in a 0700 dir).
//!
//! Owns: recording a request as `running` durably before it runs and its outcome after;
//! answering a repeated request id from the record; marking requests found `running` at start-up
//! (the executor died mid-command) `interrupted`; answering the server's receipt query
//! ([`Receipts::lookup`]) from the record alone.
//!
//! Must never: let a request id run twice; run a request it could not first record; live inside
//! a shared folder (the grants refuse folders containing the state dir); record or run
//! anything because of a receipt query.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use agentworks_contract::executor::{Operation, Outcome, ReceiptState};

/// Why the receipts could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error("cannot open the receipts database {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("receipts database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("a stored receipt does not decode: {0}")]
    Decode(#[from] serde_json::Error),
}

/// What to do with a request, according to the receipts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// New: recorded as running; run it, then call [`Receipts::finish`].
    Run,
    /// Already finished (or interrupted): answer with this, do not run.
    Recorded(Outcome),
    /// Running right now in this process: its result will be sent when it ends.
    InProgress,
}

pub struct Receipts {
    conn: Mutex<Connection>,
}

use agentworks_support::clock::now_ms;
use agentworks_support::sqlite::open_durable;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS receipts (
    request_id TEXT PRIMARY KEY,
    folder TEXT NOT NULL,
    operation TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'done', 'interrupted')),
    outcome TEXT,
    started_ms INTEGER NOT NULL,
    finished_ms INTEGER
);
";

/// The message of an interrupted request.
pub const INTERRUPTED_MESSAGE: &str = "the executor stopped while this request was running; its outcome is unknown and it is never run again under this request id: inspect the files before deciding what to do next";

impl Receipts {
    /// Open (creating 0600; WAL, `synchronous=FULL`, see [`open_durable`]) and reconcile:
    /// every `running` row becomes `interrupted`. Returns the receipts and how many requests
    /// were interrupted.
    pub fn open(path: &Path) -> Result<(Receipts, usize), ReceiptError> {
        let open_error = |source| ReceiptError::Open {
            path: path.to_owned(),
            source,
        };
        // Create the file 0600 ourselves; SQLite gives its -wal/-shm files the same mode.
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(open_error)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(open_error)?;
        let conn = open_durable(path, SCHEMA)?;
        let interrupted = conn.execute(
            "UPDATE receipts SET state = 'interrupted', finished_ms = ?1 WHERE state = 'running'",
            params![now_ms()],
        )?;
        Ok((
            Receipts {
                conn: Mutex::new(conn),
            },
            interrupted,
        ))
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Look the request up; when it is new, record it `running` (durably) before returning
    /// [`Begin::Run`]. A request id reused for a different operation is refused.
    pub fn begin(
        &self,
        request_id: &str,
        folder: &str,
        operation: &Operation,
    ) -> Result<Begin, ReceiptError> {
        let op = serde_json::to_string(operation)?;
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let found: Option<(String, String, String, Option<String>)> = tx
            .query_row(
                "SELECT folder, operation, state, outcome FROM receipts WHERE request_id = ?1",
                params![request_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let begin = match found {
            Some((f, o, _, _)) if f != folder || o != op => Begin::Recorded(Outcome::Refused {
                code: "request_id_reused".into(),
                message: format!(
                    "request id {request_id} was already used for a different operation; it is not run"
                ),
            }),
            Some((_, _, state, _)) if state == "interrupted" => {
                Begin::Recorded(Outcome::Interrupted {
                    message: INTERRUPTED_MESSAGE.into(),
                })
            }
            Some((_, _, state, _)) if state == "running" => Begin::InProgress,
            Some((_, _, _, Some(outcome))) => Begin::Recorded(serde_json::from_str(&outcome)?),
            Some((_, _, _, None)) => Begin::Recorded(Outcome::Interrupted {
                message: INTERRUPTED_MESSAGE.into(),
            }),
            None => {
                tx.execute(
                    "INSERT INTO receipts (request_id, folder, operation, state, started_ms)
                     VALUES (?1, ?2, ?3, 'running', ?4)",
                    params![request_id, folder, op, now_ms()],
                )?;
                Begin::Run
            }
        };
        tx.commit()?;
        Ok(begin)
    }

    /// What the receipts record for `request_id`, for the server's receipt query: the outcome
    /// (an interrupted request's too), "running", or unknown (never seen). Only reads.
    pub fn lookup(&self, request_id: &str) -> Result<ReceiptState, ReceiptError> {
        let found: Option<(String, Option<String>)> = self
            .conn()
            .query_row(
                "SELECT state, outcome FROM receipts WHERE request_id = ?1",
                params![request_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        Ok(match found {
            None => ReceiptState::Unknown,
            Some((state, _)) if state == "running" => ReceiptState::Running,
            Some((state, Some(outcome))) if state == "done" => ReceiptState::Done {
                outcome: serde_json::from_str(&outcome)?,
            },
            // Interrupted, or done without an outcome (cannot be written, but never guessed).
            Some(_) => ReceiptState::Done {
                outcome: Outcome::Interrupted {
                    message: INTERRUPTED_MESSAGE.into(),
                },
            },
        })
    }

    /// Record the outcome of a request that [`Receipts::begin`] let run.
    pub fn finish(&self, request_id: &str, outcome: &Outcome) -> Result<(), ReceiptError> {
        let text = serde_json::to_string(outcome)?;
        self.conn().execute(
            "UPDATE receipts SET state = 'done', outcome = ?2, finished_ms = ?3 WHERE request_id = ?1",
            params![request_id, text, now_ms()],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_runs_once_and_running_becomes_interrupted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("receipts.db");
        let op = Operation::ExecuteShellCommand {
            command: "true".into(),
            timeout: None,
        };
        let (r, n) = Receipts::open(&path).expect("open");
        assert_eq!(n, 0);
        assert_eq!(r.begin("a", "p", &op).expect("begin"), Begin::Run);
        assert_eq!(r.begin("a", "p", &op).expect("begin"), Begin::InProgress);
        let done = Outcome::Refused {
            code: "x".into(),
            message: "y".into(),
        };
        r.finish("a", &done).expect("finish");
        assert_eq!(
            r.begin("a", "p", &op).expect("begin"),
            Begin::Recorded(done)
        );
        assert_eq!(r.begin("b", "p", &op).expect("begin"), Begin::Run);
        assert!(matches!(
            r.begin("b", "other", &op).expect("begin"),
            Begin::Recorded(Outcome::Refused { .. })
        ));
        drop(r);
        let (r, n) = Receipts::open(&path).expect("reopen");
        assert_eq!(n, 1);
        assert!(matches!(
            r.begin("b", "p", &op).expect("begin"),
            Begin::Recorded(Outcome::Interrupted { .. })
        ));
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_lookup_answers_from_the_record_and_never_records_anything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (r, _) = Receipts::open(&dir.path().join("receipts.db")).expect("open");
        let op = Operation::ExecuteShellCommand {
            command: "true".into(),
            timeout: None,
        };
        assert_eq!(r.lookup("new").expect("lookup"), ReceiptState::Unknown);
        // Looking did not record it: it still runs (once) when it arrives.
        assert_eq!(r.begin("new", "p", &op).expect("begin"), Begin::Run);
        assert_eq!(r.lookup("new").expect("lookup"), ReceiptState::Running);
        let done = Outcome::Refused {
            code: "x".into(),
            message: "y".into(),
        };
        r.finish("new", &done).expect("finish");
        assert_eq!(
            r.lookup("new").expect("lookup"),
            ReceiptState::Done { outcome: done }
        );
        assert_eq!(r.lookup("other").expect("lookup"), ReceiptState::Unknown);
    }
}
