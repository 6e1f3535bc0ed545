//! Sealed `requestState` for input-required results (2026-07-28 SEP-2322): the state a backend
//! wants back on the client's retry travels through the client, so it is sealed with
//! HMAC-SHA256 under a per-process random key, bound to the token, the method and the
//! tool/prompt/resource name it was issued for, and expires.
//!
//! Owns the key, the format (`<hex payload>.<hex mac>`, the payload `{"exp":…,"state":…}`) and
//! the check. Must never hand the backend a state whose seal does not verify, never compare
//! MACs in variable time, and never panic on any string a client sends.
//!
//! HMAC (RFC 2104) is written out over `sha2` (already a dependency) rather than adding the
//! `hmac` crate: it is two hashes, and RFC 4231's vectors check it below.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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
    key: [u8; 32],
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
        let mac = self.mac(&payload, binding);
        format!("{payload}.{}", hex::encode(mac))
    }

    /// The state sealed in `sealed` for `binding`, if its seal verifies and it has not expired.
    pub fn open(&self, sealed: &str, binding: &Binding<'_>, now: u64) -> Option<Value> {
        if sealed.len() > MAX_SEALED_BYTES {
            return None;
        }
        let (payload, mac) = sealed.split_once('.')?;
        let mac = hex::decode(mac).ok()?;
        if !constant_time_eq(&mac, &self.mac(payload, binding)) {
            return None;
        }
        let payload: Value = serde_json::from_slice(&hex::decode(payload).ok()?).ok()?;
        if payload.get("exp")?.as_u64()? <= now {
            return None;
        }
        payload.get("state").cloned()
    }

    fn mac(&self, payload: &str, binding: &Binding<'_>) -> [u8; 32] {
        // Each bound field is length-prefixed, so no two bindings share an input.
        let mut message = Vec::with_capacity(CONTEXT.len() + payload.len() + 64);
        message.extend_from_slice(CONTEXT);
        for field in [binding.token_id, binding.method, binding.name, payload] {
            message.extend_from_slice(&(field.len() as u64).to_be_bytes());
            message.extend_from_slice(field.as_bytes());
        }
        hmac_sha256(&self.key, &message)
    }
}

/// Now, in Unix seconds (0 if the clock is before 1970, which only makes states expire).
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        assert_eq!(
            hex::encode(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

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
