//! Signed-in sessions of the web console.
//!
//! The interface the console's pages and the chat API use; sign-in itself is not built yet,
//! so no request carries a session and [`Sessions::check`] answers `None` for every one.

use crate::identity::{TokenInfo, User};
use agentworks_daemon::ipc::envelope::Refusal;
use hyper::http::request::Parts;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "aw_session";
/// The header a state-changing request made with a session carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The person a request's session belongs to.
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub user: User,
    /// The session's own token row: what file operations re-check, revoked at sign-out.
    pub token: TokenInfo,
    pub csrf_token: String,
}

/// The signed-in sessions. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Sessions {}

impl Sessions {
    /// `None`: the request carries no session cookie. `Some(Err)`: a session that is unknown,
    /// expired or signed out (401), or, on a state-changing method, a foreign `Origin` or a
    /// missing or wrong CSRF token (403). `Some(Ok)`: the signed-in person.
    pub async fn check(&self, _parts: &Parts) -> Option<Result<SignedIn, Refusal>> {
        None
    }
}
