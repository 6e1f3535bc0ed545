//! The journald `MESSAGE_ID` of every audit event kind, and the audit log target.
//!
//! Every audit event (workspaced's applied changes and reconciliations, gatewayd's executor
//! connections and dispatched requests) is one journal entry carrying `message_id` (journald's
//! `MESSAGE_ID`) from here and `agentworks_*` fields (`AGENTWORKS_*` in the journal, since
//! [`crate::logging`] applies no field prefix), so that
//! `journalctl MESSAGE_ID=<id> AGENTWORKS_REQUEST_ID=<request id>` finds it. The ids are the ones
//! `packaging/agentworks.catalog` explains (installed to `/usr/lib/systemd/catalog/`); a unit test
//! keeps the two in step. Secrets, tokens and file contents never enter an audit event.

/// The `tracing` target of every audit event.
pub const TARGET: &str = "agentworks::audit";

/// workspaced: a file was written.
pub const WRITE: &str = "3b5c5e7282d241a599ac5c902abc3f65";
/// workspaced: a file was patched.
pub const PATCH: &str = "0269559ec88b461d9170623b70007393";
/// workspaced: a file was moved.
pub const MOVE: &str = "882efcc0da734abdaa7785c82d0bfa03";
/// workspaced: a file was deleted.
pub const DELETE: &str = "11f6207da08e425886712cb57fce92f0";
/// workspaced: a file was restored from history.
pub const RESTORE: &str = "8d941e2e111340bbb68cc4c4d1e05225";
/// workspaced: an interrupted change was reconciled.
pub const RECEIPT_RECONCILED: &str = "fa6d4f44c4c74796bbb5fa01e9b18bf3";
/// gatewayd: an executor connected.
pub const EXECUTOR_CONNECTED: &str = "ee0c92d704b041c28274fa9cd8fc3bef";
/// gatewayd: an executor disconnected.
pub const EXECUTOR_DISCONNECTED: &str = "dad9c6e1a253463794bcff321e5d6fd4";
/// gatewayd: an executor was disconnected because its token was revoked.
pub const EXECUTOR_REVOKED: &str = "79ba839b2a674d39b661e4f871a757ed";
/// gatewayd: a request was dispatched to an executor.
pub const REQUEST_SENT: &str = "c76970ca2f474909b98802476d37b2ee";
/// gatewayd: cancellation of a dispatched request was requested.
pub const REQUEST_CANCEL: &str = "535580b2b4fa4a8fad14c84b96da0013";
/// gatewayd: a dispatched request finished.
pub const REQUEST: &str = "0003199064884dc2880ff5051603ad3c";

/// Every event kind (the `agentworks_event` field) with its `MESSAGE_ID`.
pub const ALL: [(&str, &str); 12] = [
    ("write", WRITE),
    ("patch", PATCH),
    ("move", MOVE),
    ("delete", DELETE),
    ("restore", RESTORE),
    ("receipt_reconciled", RECEIPT_RECONCILED),
    ("executor_connected", EXECUTOR_CONNECTED),
    ("executor_disconnected", EXECUTOR_DISCONNECTED),
    ("executor_revoked", EXECUTOR_REVOKED),
    ("request_sent", REQUEST_SENT),
    ("request_cancel", REQUEST_CANCEL),
    ("request", REQUEST),
];

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOG: &str = include_str!("../../../packaging/agentworks.catalog");

    /// `(kind, id)` of every catalog entry: its `-- <id>` line and its `Event kind: <kind>.` line.
    fn catalog_entries() -> Vec<(String, String)> {
        let mut entries = Vec::new();
        let mut current: Option<String> = None;
        for line in CATALOG.lines() {
            if let Some(id) = line.strip_prefix("-- ") {
                assert!(
                    current.is_none(),
                    "catalog entry {current:?} names no event kind"
                );
                current = Some(id.trim().to_owned());
            } else if let Some(kind) = line.strip_prefix("Event kind: ") {
                let id = current
                    .take()
                    .expect("`Event kind:` outside a catalog entry");
                entries.push((kind.trim().trim_end_matches('.').to_owned(), id));
            }
        }
        assert!(
            current.is_none(),
            "the last catalog entry names no event kind"
        );
        entries
    }

    #[test]
    fn ids_match_the_catalog() {
        let catalog = catalog_entries();
        for (kind, id) in &catalog {
            assert!(
                ALL.iter().any(|(k, i)| k == kind && i == id),
                "catalog entry {kind} {id} has no matching const"
            );
        }
        for (kind, id) in ALL {
            assert!(
                catalog.iter().any(|(k, i)| k == kind && i == id),
                "const {kind} {id} has no catalog entry"
            );
        }
        assert_eq!(catalog.len(), ALL.len());
    }

    #[test]
    fn ids_are_distinct_128_bit_hex() {
        for (n, (kind, id)) in ALL.iter().enumerate() {
            assert_eq!(id.len(), 32, "{kind}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{kind}: {id}"
            );
            assert!(
                ALL[..n].iter().all(|(_, other)| other != id),
                "{kind}: {id}"
            );
        }
    }
}
