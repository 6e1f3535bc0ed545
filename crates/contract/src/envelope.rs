//! The one JSON error envelope every agentworks socket and endpoint speaks:
//! `{"error": {"code": "revision_conflict", "message": "...", ...details}}`, and the one health
//! answer every daemon gives at `GET /v1/health`.
//!
//! Owns the envelope's shape. Must never decide which code an error gets: each domain maps its
//! own error enum to a code, once.

/// The body of an error: a stable machine-readable `code`, a `message` for a person, and any
/// details flattened beside them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ErrorBody {
    /// Stable, snake_case, e.g. `revision_conflict`.
    pub code: String,
    /// What happened and, where possible, what to do about it.
    pub message: String,
    /// Extra fields (e.g. `current_revision`), flattened into the object.
    #[serde(flatten)]
    pub details: serde_json::Map<String, serde_json::Value>,
}

/// `{"error": ErrorBody}`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ErrorEnvelope {
    /// The error.
    pub error: ErrorBody,
}

/// The answer to `GET /v1/health` on every daemon's socket (and agentd's public listener):
/// `{"status": "ok", "daemon": "agentworks-agentd", "version": "0.1.0"}`. gatewayd adds the
/// number of connected laptops ([`crate::gatewayd::GatewayHealth`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Health {
    /// `ok` when the daemon answers at all.
    pub status: String,
    /// The daemon's program name, e.g. `agentworks-workspaced`.
    pub daemon: String,
    /// The daemon's version.
    pub version: String,
}

impl Health {
    /// A daemon that answers: `daemon` is its program name, `version` its crate's version.
    pub fn ok(daemon: &str, version: &str) -> Health {
        Health {
            status: "ok".into(),
            daemon: daemon.into(),
            version: version.into(),
        }
    }
}
