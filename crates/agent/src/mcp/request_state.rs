//! Sealed `requestState` for input-required results (2026-07-28 SEP-2322): the state a backend
//! wants back on the client's retry travels through the client, so it is sealed with
//! HMAC-SHA256 under a per-process random key, bound to the token, the method and the
//! tool/prompt/resource name it was issued for, and expires.
//!
//! Owns the key, the format (`<hex payload>.<hex mac>`, the payload `{"exp":…,"state":…}`) and
//! the check. Must never hand the backend a state whose seal does not verify, never compare
//! MACs in variable time (`hmac`'s `verify_slice` compares in constant time), and never panic
//! on any string a client sends.

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

/// How long a sealed state is accepted.
const LIFETIME_SECS: u64 = 15 * 60;
/// The largest sealed state read (the body limit bounds it anyway; this keeps hex decoding
/// and hashing of a hostile string short).
const MAX_SEALED_BYTES: usize = 256 * 1024;
/// Domain separation: this MAC is for nothing else.
const CONTEXT: &[u8] = b"agentworks mcp requestState v1\0";

/// The sealing key, random per process (a restart invalidates outstanding states, which only
/// costs a client one more round).
pub(super) struct Sealer {
    /// One SHA-256 block: HMAC's own key size, so no key hashing or padding choice arises.
    key: [u8; 64],
}

/// What a sealed state is bound to.
pub(super) struct Binding<'a> {
    pub token_id: &'a str,
    pub method: &'a str,
    pub name: &'a str,
}

impl Sealer {
    pub fn new() -> Sealer {
        Sealer {
            key: rand::random(),
        }
    }

    /// Seals `state` for `binding`, valid for [`LIFETIME_SECS`] from `now` (Unix seconds).
    pub fn seal(&self, state: &Value, binding: &Binding<'_>, now: u64) -> String {
        let payload = json!({"exp": now.saturating_add(LIFETIME_SECS), "state": state});
        let payload = hex::encode(payload.to_string());
        let mac = self.mac(&payload, binding).finalize().into_bytes();
        format!("{payload}.{}", hex::encode(mac))
    }

    /// The state sealed in `sealed` for `binding`, if its seal verifies and it has not expired.
    pub fn open(&self, sealed: &str, binding: &Binding<'_>, now: u64) -> Option<Value> {
        if sealed.len() > MAX_SEALED_BYTES {
            return None;
        }
        let (payload, mac) = sealed.split_once('.')?;
        let mac = hex::decode(mac).ok()?;
        self.mac(payload, binding).verify_slice(&mac).ok()?;
        let payload: Value = serde_json::from_slice(&hex::decode(payload).ok()?).ok()?;
        if payload.get("exp")?.as_u64()? <= now {
            return None;
        }
        payload.get("state").cloned()
    }

    /// The MAC over the binding and `payload`, not yet finalized.
    fn mac(&self, payload: &str, binding: &Binding<'_>) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new(&self.key.into());
        mac.update(CONTEXT);
        // Each bound field is length-prefixed, so no two bindings share an input.
        for field in [binding.token_id, binding.method, binding.name, payload] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field.as_bytes());
        }
        mac
    }
}

/// Now, in Unix seconds (0 if the clock is before 1970, which only makes states expire).
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_state_opens_only_unchanged_for_its_binding_before_it_expires() {
        let sealer = Sealer::new();
        let binding = Binding {
            token_id: "tok",
            method: "tools/call",
            name: "confirm",
        };
        let state = json!({"round": 1, "name": "Alice"});
        let sealed = sealer.seal(&state, &binding, 1000);
        assert_eq!(sealer.open(&sealed, &binding, 1001), Some(state));
        assert_eq!(sealer.open(&sealed, &binding, 1000 + LIFETIME_SECS), None);
        for other in [
            Binding {
                token_id: "tok2",
                ..binding
            },
            Binding {
                method: "prompts/get",
                ..binding
            },
            Binding {
                name: "other",
                ..binding
            },
        ] {
            assert_eq!(sealer.open(&sealed, &other, 1001), None);
        }
        let tampered = format!("{sealed}-TAMPERED");
        assert_eq!(sealer.open(&tampered, &binding, 1001), None);
        let mut flipped = sealed.clone().into_bytes();
        flipped[0] = if flipped[0] == b'7' { b'6' } else { b'7' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(sealer.open(&flipped, &binding, 1001), None);
        for junk in ["", ".", "zz.zz", "7b7d.", "\u{0}.\u{0}", "é.é"] {
            assert_eq!(sealer.open(junk, &binding, 1001), None, "{junk:?}");
        }
        // Another process (another key) cannot open it.
        assert_eq!(Sealer::new().open(&sealed, &binding, 1001), None);
    }
}
