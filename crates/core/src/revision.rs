//! Revisions: `sha256:<hex of the content>`, or `missing` for a file that does not exist.
//!
//! A revision is derived from the bytes alone, so an edit made outside agentworks changes it
//! too; nothing here trusts a modification time.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// The content revision of a file, or its absence.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Revision {
    Missing,
    Sha256(String),
}

/// A revision string that is neither `missing` nor `sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a revision: use \"missing\" or the \"sha256:…\" value read_file returned")]
pub struct BadRevision(pub String);

impl Revision {
    pub fn of(content: &[u8]) -> Revision {
        Revision::Sha256(hex::encode(Sha256::digest(content)))
    }

    pub fn parse(raw: &str) -> Result<Revision, BadRevision> {
        if raw == "missing" {
            return Ok(Revision::Missing);
        }
        match raw.strip_prefix("sha256:") {
            Some(hex)
                if hex.len() == 64
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
            {
                Ok(Revision::Sha256(hex.to_owned()))
            }
            _ => Err(BadRevision(raw.chars().take(80).collect())),
        }
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Revision::Missing => f.write_str("missing"),
            Revision::Sha256(hex) => write!(f, "sha256:{hex}"),
        }
    }
}

impl TryFrom<String> for Revision {
    type Error = BadRevision;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Revision::parse(&value)
    }
}

impl From<Revision> for String {
    fn from(value: Revision) -> String {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest_and_round_trip() {
        let r = Revision::of(b"");
        assert_eq!(
            r.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Revision::parse(&r.to_string()).unwrap(), r);
        assert_eq!(Revision::parse("missing").unwrap(), Revision::Missing);
    }

    #[test]
    fn refuses_malformed_revisions() {
        for bad in [
            "",
            "sha256:",
            "sha256:XYZ",
            "md5:00",
            "MISSING",
            &format!("sha256:{}", "A".repeat(64)),
        ] {
            assert!(Revision::parse(bad).is_err(), "{bad:?}");
        }
    }
}
