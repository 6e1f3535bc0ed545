//! The `scope` parameter (RFC 6749 §3.3) and the rule that a grant never widens.
//!
//! Only the workflow scopes are issued through OAuth. `devices:connect` stays the device grant's
//! (RFC 8628, `agentworks login`) and `devices:approve` is asked for by name on a personal
//! token; both are `invalid_scope` here. A token or refresh request may ask for less than was
//! consented, never more (RFC 6749 §6: "MUST NOT include any scope not originally granted"),
//! so a client granted `workflows:read` or `:run` never gets `workflows:write`.

use super::OAuthError;
use agentworks_contract::agentd::Scope;

/// The scopes issued through this flow, in their canonical order.
pub const OFFERED: [Scope; 3] = [
    Scope::WorkflowsRead,
    Scope::WorkflowsRun,
    Scope::WorkflowsWrite,
];

/// Parse a `scope` value: space-separated, case-sensitive names of offered scopes. The result
/// is deduplicated, in canonical order. Empty, unknown or device scopes are `invalid_scope`.
pub fn parse(raw: &str) -> Result<Vec<Scope>, OAuthError> {
    let mut asked = Vec::new();
    for name in raw.split(' ').filter(|name| !name.is_empty()) {
        let scope = match Scope::parse(name) {
            Some(scope) if OFFERED.contains(&scope) => scope,
            Some(_) => {
                return Err(OAuthError::InvalidScope(format!(
                    "{name} is not issued through this flow"
                )));
            }
            None => {
                return Err(OAuthError::InvalidScope(format!(
                    "unknown scope {name:?}; this server offers {}",
                    format(&OFFERED)
                )));
            }
        };
        asked.push(scope);
    }
    if asked.is_empty() {
        return Err(OAuthError::InvalidScope("scope names no scope".into()));
    }
    Ok(canonical(&asked))
}

/// The `scope` value of a set: space-separated, in the order given.
pub fn format(scopes: &[Scope]) -> String {
    scopes
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The scopes a token gets when `asked` (the token or refresh request's `scope`, `None` if it
/// had none) is checked against `consented` (what the person allowed): all of `consented`
/// when nothing is asked (RFC 6749 §5.1, §6), else `asked` if it is within `consented`, else
/// `invalid_scope`. An empty `asked` is `invalid_scope` too.
pub fn grant(consented: &[Scope], asked: Option<&[Scope]>) -> Result<Vec<Scope>, OAuthError> {
    let Some(asked) = asked else {
        return Ok(canonical(consented));
    };
    if asked.is_empty() {
        return Err(OAuthError::InvalidScope("scope names no scope".into()));
    }
    let beyond: Vec<Scope> = canonical(asked)
        .into_iter()
        .filter(|scope| !consented.contains(scope))
        .collect();
    if beyond.is_empty() {
        Ok(canonical(asked))
    } else {
        Err(OAuthError::InvalidScope(format!(
            "{} {} not granted to this client (granted: {}); ask the person to consent again",
            format(&beyond),
            if beyond.len() == 1 { "was" } else { "were" },
            format(&canonical(consented)),
        )))
    }
}

/// `scopes` deduplicated, in [`OFFERED`] order (anything else after, in the order given).
fn canonical(scopes: &[Scope]) -> Vec<Scope> {
    let mut out: Vec<Scope> = OFFERED
        .iter()
        .copied()
        .filter(|s| scopes.contains(s))
        .collect();
    for scope in scopes {
        if !out.contains(scope) {
            out.push(*scope);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use Scope::*;

    #[test]
    fn parses_space_separated_scopes_in_canonical_order() {
        assert_eq!(
            parse("workflows:write workflows:read"),
            Ok(vec![WorkflowsRead, WorkflowsWrite])
        );
        assert_eq!(
            parse(" workflows:run  workflows:run "),
            Ok(vec![WorkflowsRun])
        );
        assert_eq!(
            format(&parse("workflows:run workflows:read").unwrap()),
            "workflows:read workflows:run"
        );
    }

    #[test]
    fn unknown_empty_and_device_scopes_are_invalid_scope() {
        for (raw, why) in [
            ("workflows:admin", "unknown scope"),
            ("Workflows:read", "unknown scope"),
            ("workflows:read\tworkflows:run", "unknown scope"),
            ("workflows:read openid", "unknown scope"),
            ("", "no scope"),
            ("   ", "no scope"),
            ("devices:connect", "not issued through this flow"),
            (
                "workflows:read devices:approve",
                "not issued through this flow",
            ),
        ] {
            let error = parse(raw).unwrap_err();
            assert_eq!(error.code(), "invalid_scope", "{raw:?}");
            assert!(error.description().contains(why), "{raw:?}: {error}");
        }
    }

    #[test]
    fn read_or_run_never_becomes_write() {
        let consented = [WorkflowsRead, WorkflowsRun];
        let error = grant(&consented, Some(&[WorkflowsWrite])).unwrap_err();
        assert_eq!(error.code(), "invalid_scope");
        assert!(
            error
                .description()
                .starts_with("workflows:write was not granted")
        );
        assert!(grant(&consented, Some(&[WorkflowsRead, WorkflowsWrite])).is_err());
        assert!(grant(&[WorkflowsRead], Some(&[WorkflowsRun])).is_err());
        assert!(grant(&[WorkflowsRead], Some(&[DevicesConnect])).is_err());
        // Nothing asked: what was consented; never more.
        assert_eq!(
            grant(&consented, None),
            Ok(vec![WorkflowsRead, WorkflowsRun])
        );
        assert!(grant(&consented, Some(&[])).is_err());
    }

    #[test]
    fn a_request_may_narrow_the_grant() {
        let consented = [WorkflowsWrite, WorkflowsRead, WorkflowsRun];
        assert_eq!(
            grant(&consented, Some(&[WorkflowsRead])),
            Ok(vec![WorkflowsRead])
        );
        assert_eq!(
            grant(
                &consented,
                Some(&[WorkflowsWrite, WorkflowsRead, WorkflowsWrite])
            ),
            Ok(vec![WorkflowsRead, WorkflowsWrite])
        );
        assert_eq!(grant(&consented, None), Ok(OFFERED.to_vec()));
    }
}
