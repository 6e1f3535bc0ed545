//! The credential in the macOS login Keychain (Security.framework's generic passwords, through
//! the `security-framework` crate): service [`SERVICE`], account the CLI's config directory, so
//! two config directories (a test's and the person's) never share an item.
//!
//! Owns: the [`SecretStore`](crate::config::SecretStore) over the login Keychain. Where the
//! Keychain cannot be used (no login keychain, a locked one in an SSH session, a refused
//! access), `config.rs` falls back to the 0600 file and says so.
//! Must never: store the credential anywhere else, or log it.

use crate::config::SecretStore;

/// The Keychain item's service name.
pub const SERVICE: &str = "agentworks";

/// `errSecItemNotFound`: no such item.
const ITEM_NOT_FOUND: i32 = -25300;

/// The person's login Keychain.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoginKeychain;

impl SecretStore for LoginKeychain {
    fn name(&self) -> String {
        format!("the login Keychain (service {SERVICE:?})")
    }

    fn get(&self, account: &str) -> Result<Option<Vec<u8>>, String> {
        match security_framework::passwords::get_generic_password(SERVICE, account) {
            Ok(secret) => Ok(Some(secret)),
            Err(e) if e.code() == ITEM_NOT_FOUND => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn set(&self, account: &str, secret: &[u8]) -> Result<(), String> {
        security_framework::passwords::set_generic_password(SERVICE, account, secret)
            .map_err(|e| e.to_string())
    }

    fn remove(&self, account: &str) -> Result<bool, String> {
        match security_framework::passwords::delete_generic_password(SERVICE, account) {
            Ok(()) => Ok(true),
            Err(e) if e.code() == ITEM_NOT_FOUND => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}
