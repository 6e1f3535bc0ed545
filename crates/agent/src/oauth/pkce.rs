//! Proof Key for Code Exchange, RFC 7636, with the `S256` method only.
//!
//! - The `code_verifier` is 43–128 characters of the unreserved set `[A-Za-z0-9-._~]` (§4.1).
//! - The `code_challenge` is `BASE64URL(SHA256(verifier))` without padding (§4.2): 43
//!   characters that decode to 32 bytes.
//! - `plain` is refused, and so is a missing method: OAuth 2.1 (draft-ietf-oauth-v2-1 §4.1.1)
//!   lets a server require S256, and the default of RFC 7636 §4.3 is `plain`.
//! - The server's check (§4.6) compares in constant time.

use super::OAuthError;
use crate::identity::token::hashes_equal;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// The only `code_challenge_method` accepted.
pub const S256: &str = "S256";

/// Accept a `code_challenge_method`: `S256` only (RFC 7636 §4.3, §4.4.1).
pub fn check_method(method: Option<&str>) -> Result<(), OAuthError> {
    match method {
        Some(S256) => Ok(()),
        Some("plain") => Err(OAuthError::InvalidRequest(
            "code_challenge_method plain is not supported; use S256".into(),
        )),
        Some(other) => Err(OAuthError::InvalidRequest(format!(
            "code_challenge_method {other:?} is not supported; use S256"
        ))),
        None => Err(OAuthError::InvalidRequest(
            "code_challenge_method is required and must be S256".into(),
        )),
    }
}

/// Accept a `code_challenge` (at the authorization endpoint): 43 base64url characters, no
/// padding, that decode to a SHA-256 digest.
pub fn check_challenge(challenge: &str) -> Result<(), OAuthError> {
    let decodes = challenge.len() == 43
        && URL_SAFE_NO_PAD
            .decode(challenge)
            .is_ok_and(|digest| digest.len() == 32);
    if decodes {
        Ok(())
    } else {
        Err(OAuthError::InvalidRequest(
            "code_challenge must be the 43-character unpadded base64url SHA-256 of the verifier"
                .into(),
        ))
    }
}

/// Accept a `code_verifier` (at the token endpoint): 43–128 unreserved characters (§4.1).
pub fn check_verifier(verifier: &str) -> Result<(), OAuthError> {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
    if (43..=128).contains(&verifier.len()) && verifier.bytes().all(unreserved) {
        Ok(())
    } else {
        Err(OAuthError::InvalidRequest(
            "code_verifier must be 43 to 128 characters of A-Z a-z 0-9 - . _ ~".into(),
        ))
    }
}

/// The S256 challenge of a verifier (§4.2).
pub fn challenge_of(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// The token endpoint's check (§4.6): the verifier is well formed and its S256 challenge is
/// the one stored with the code. A mismatch is `invalid_grant` (§4.6, RFC 6749 §5.2).
pub fn verify(verifier: &str, challenge: &str) -> Result<(), OAuthError> {
    check_verifier(verifier)?;
    check_challenge(challenge)?;
    if hashes_equal(&challenge_of(verifier), challenge) {
        Ok(())
    } else {
        Err(OAuthError::InvalidGrant(
            "code_verifier does not match the code_challenge".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7636 Appendix B.
    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

    #[test]
    fn the_rfc_7636_appendix_b_vector_verifies() {
        assert_eq!(challenge_of(VERIFIER), CHALLENGE);
        assert_eq!(verify(VERIFIER, CHALLENGE), Ok(()));
    }

    #[test]
    fn a_wrong_verifier_is_invalid_grant() {
        let other = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXj";
        let error = verify(other, CHALLENGE).unwrap_err();
        assert_eq!(error.code(), "invalid_grant");
    }

    #[test]
    fn only_s256_is_accepted() {
        assert_eq!(check_method(Some("S256")), Ok(()));
        for method in [Some("plain"), Some("s256"), Some(""), None] {
            let error = check_method(method).unwrap_err();
            assert_eq!(error.code(), "invalid_request", "{method:?}");
        }
        assert!(
            check_method(Some("plain"))
                .unwrap_err()
                .description()
                .contains("plain")
        );
    }

    #[test]
    fn challenges_must_be_43_base64url_characters() {
        assert_eq!(check_challenge(CHALLENGE), Ok(()));
        let padded = format!("{CHALLENGE}=");
        let standard_alphabet = CHALLENGE.replace('-', "+");
        let short = &CHALLENGE[..42];
        let long = format!("{CHALLENGE}A");
        // The plain method's challenge is the verifier itself; as S256 it is not a digest.
        let too_long_plain = "a".repeat(128);
        for bad in [
            padded.as_str(),
            standard_alphabet.as_str(),
            short,
            long.as_str(),
            too_long_plain.as_str(),
            "",
        ] {
            assert!(check_challenge(bad).is_err(), "{bad}");
        }
        // 43 characters carry 258 bits: the last one must leave the 2 spare bits zero.
        let mut trailing_bits = CHALLENGE[..42].to_owned();
        trailing_bits.push('N');
        assert!(check_challenge(&trailing_bits).is_err());
    }

    #[test]
    fn verifiers_are_43_to_128_unreserved_characters() {
        assert_eq!(check_verifier(&"a".repeat(43)), Ok(()));
        assert_eq!(check_verifier(&"~._-Zz09".repeat(16)), Ok(()));
        for bad in [
            "a".repeat(42),
            "a".repeat(129),
            format!("{}+", "a".repeat(42)),
            format!("{}/", "a".repeat(42)),
            format!("{} ", "a".repeat(42)),
            format!("{}é", "a".repeat(41)),
        ] {
            assert_eq!(
                check_verifier(&bad).unwrap_err().code(),
                "invalid_request",
                "{bad}"
            );
        }
        // A malformed verifier is refused before any comparison.
        assert_eq!(
            verify("short", CHALLENGE).unwrap_err().code(),
            "invalid_request"
        );
    }
}
