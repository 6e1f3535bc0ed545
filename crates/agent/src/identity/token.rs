//! Personal access tokens on the wire: `awt_<id>_<secret>`, shown once, stored as a hash.
//!
//! The id (16 hex) finds the row; the secret (64 hex, 256 random bits) is compared by its
//! SHA-256 in constant time. A token that does not parse is refused before any lookup.

use sha2::{Digest, Sha256};

/// A freshly minted token: the id for the row, the full string for the person, once.
pub struct NewToken {
    pub id: String,
    pub secret_hash: String,
    pub plaintext: String,
}

pub fn mint() -> NewToken {
    let id = hex::encode(rand::random::<[u8; 8]>());
    let secret = hex::encode(rand::random::<[u8; 32]>());
    NewToken {
        secret_hash: hash_secret(&secret),
        plaintext: format!("awt_{id}_{secret}"),
        id,
    }
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Split a presented token into (id, secret); `None` if it is not one of ours.
pub fn parse(presented: &str) -> Option<(&str, &str)> {
    let rest = presented.strip_prefix("awt_")?;
    let (id, secret) = rest.split_once('_')?;
    let hex16 = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex16(id, 16) && hex16(secret, 64)).then_some((id, secret))
}

/// Compare two hashes without an early exit, so timing does not reveal a matching prefix.
pub fn hashes_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_parse_and_match_their_hash() {
        let t = mint();
        let (id, secret) = parse(&t.plaintext).unwrap();
        assert_eq!(id, t.id);
        assert!(hashes_equal(&hash_secret(secret), &t.secret_hash));
        assert!(!hashes_equal(&hash_secret("x"), &t.secret_hash));
    }

    #[test]
    fn refuses_foreign_shapes() {
        for bad in [
            "",
            "awt_",
            "awt_zz_yy",
            "Bearer x",
            &format!("awt_{}_{}", "a".repeat(16), "b".repeat(63)),
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }
}
