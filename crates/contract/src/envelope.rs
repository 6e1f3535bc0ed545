//! The one JSON error envelope every agentworks socket and endpoint speaks:
//! `{"error": {"code": "revision_conflict", "message": "...", ...details}}`.
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
