//! Identity: users, projects, members with roles, personal access tokens, and the write
//! authority computed from them.
//!
//! agentd owns this data (SQLite in `<state>/agent/agentd.db`, or the cluster's PostgreSQL with
//! `[cluster] database_url`, shared by every agentd host). Every decision is made from
//! live rows at the time of the call: a role removed or a token revoked a second ago counts.
//! This module never touches a document; it only resolves who may do what, and the guard that
//! workspaced re-applies.

pub mod accounts;
pub mod attempt_limits;
pub mod authority;
pub mod authorization_requests;
#[cfg(any(test, feature = "store-conformance"))]
pub mod conformance;
pub mod device_logins;
pub mod oauth;
pub mod store;
pub mod token;

pub use authority::{Access, Role, Scope};
pub use store::{
    IdentityError, IdentityStore, Member, Project, ProjectKind, TokenCheckError, TokenInfo,
    TokenRefusal, User,
};
