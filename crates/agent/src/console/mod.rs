//! The web console: plain HTML, CSS and JavaScript embedded in agentd and served on its public
//! listener, and the signed-in sessions it runs on.
//!
//! - [`assets`]: the pages and files of the app, embedded, with their security headers.
//! - [`session`]: a person's signed-in session (cookie, CSRF token, `Origin` check), which the
//!   chat API and the console's own endpoints accept beside bearer tokens.
//! - [`accounts`]: sign-in, the current session, sign-out and invites.
//! - [`device_login`]: the API of the device-login approval page (`agentworks login`).
//! - [`oauth_consent`]: the API of the OAuth consent page and of Connected apps.
//! - [`laptop_cli`]: the laptop CLI this server shipped with, its manifest and the one-line
//!   install the setup page shows, served unauthenticated at `/v1/cli`.
//!
//! May call: `identity` (accounts, sessions' people, device logins, OAuth grants), `oauth` (the
//! authorization server the consent page completes, the OAuth refusal), `mcp`'s caller and `Origin`
//! check and `catalog::backend`'s caller (a session is a caller as a token is). Never calls the
//! chats or the connections, whose APIs accept its sessions.

pub mod accounts;
pub mod assets;
pub mod device_login;
pub mod laptop_cli;
pub mod oauth_consent;
pub mod session;
