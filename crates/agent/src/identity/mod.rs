//! Identity: users, projects, members with roles, personal access tokens, and the write
//! authority computed from them.
//!
//! agentd owns this data (SQLite in `<state>/agent/agentd.db`, or the cluster's PostgreSQL with
//! `[cluster] database_url`, shared by every agentd host). Every decision is made from
//! live rows at the time of the call: a role removed or a token revoked a second ago counts.
//! This module never touches a document; it only resolves who may do what, and the guard that
//! workspaced re-applies.
//!
//! Files: [`store`] (users, projects, members, tokens, on [`crate::db`]); [`authority`] (roles and
//! the write authority, pure); [`token`] (tokens on the wire: minted, shown once, kept as a hash);
//! [`accounts`] (passwords, one-time codes, console sessions, disabling an account and what it
//! ends); [`device_logins`] and [`authorization_requests`] (the device logins and OAuth
//! authorizations in progress); [`oauth`] (what the OAuth authorization server keeps);
//! [`attempt_limits`] (failed attempts counted per account and per client address).
//!
//! May call: `db` and the OAuth folder's pure building blocks (`oauth::pkce`, `oauth::scopes`,
//! `oauth::client_metadata`, the `OAuthError` they refuse with). Never calls the endpoints
//! that build on it (the OAuth server, the console, MCP, the chats, the connections).

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
