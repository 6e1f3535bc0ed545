//! A chat's agent: the agents a person may pick ([`options`], `GET /v1/agents`) and the check
//! of a new chat's agent and mode ([`choose`], `POST /v1/chats`).
//!
//! The agents are `api` (the built-in model loop) and the providers runnerd has (coding CLIs).
//! runnerd is asked each time; when it does not answer, `api` is the only agent, and asking for
//! another says runnerd is not running. The rules of a new chat:
//!
//! - `agent` is `api` (the default) or a provider runnerd lists (else 400 `unknown_agent`); a
//!   provider runnerd reports unavailable is refused with runnerd's reason (400
//!   `agent_unavailable`);
//! - `mode` is `run` (the default) or `builder`; `builder` is a coding CLI's mode only (an `api`
//!   chat writes through its own tools under the person's write grants: 400 `invalid_mode`),
//!   and only for the project's authoring roles (owner, co-owner, editor: 403 `forbidden`,
//!   reason `no_authoring_role`); every CLI turn checks the role again.
//!
//! A chat's agent and mode are stored when it is created and never change.
//!
//! May call: the chat service (runnerd's client), `catalog::files` (the authoring-role check).
//! Never starts a turn.

use crate::catalog::files::{from_tool, require_authoring_role_for};
use crate::chat::service::ChatService;
use crate::chat::store::{API_AGENT, ChatAgent, Mode};
use crate::clients::runnerd::{NOT_RUNNING, RunnerdError};
use crate::identity::authority::Access;
use agentworks_contract::public_api::{AgentOption, AgentsAnswer, RunnerdState};
use agentworks_contract::runnerd::ProvidersAnswer;
use agentworks_daemon::ipc::envelope::Refusal;
use hyper::StatusCode;

/// What the person asked for: `POST /v1/chats`'s `agent` and `mode`, as sent.
pub struct Requested {
    pub agent: Option<String>,
    pub mode: Option<String>,
}

/// runnerd's providers, or why it did not answer (`Err(None)`: agentd has no runnerd client).
type Providers = Result<ProvidersAnswer, Option<RunnerdError>>;

async fn providers(service: &ChatService) -> Providers {
    match &service.runnerd {
        Some(runnerd) => runnerd.providers().await.map_err(Some),
        None => Err(None),
    }
}

/// Why runnerd offers nothing, as a sentence.
fn runnerd_down(error: &Option<RunnerdError>) -> String {
    match error {
        Some(error @ (RunnerdError::NotRunning { .. } | RunnerdError::Unreachable { .. })) => {
            error.to_string()
        }
        Some(error) => format!("runnerd did not answer as expected ({error})"),
        None => NOT_RUNNING.to_owned(),
    }
}

/// `GET /v1/agents`: `api`, then runnerd's providers with whether each can run.
pub async fn options(service: &ChatService) -> AgentsAnswer {
    let (model, model_missing) = match &service.model {
        Some(model) => (Some(model.model_name().to_owned()), None),
        None => (
            None,
            Some(
                "no model is configured ([agentd.model]); a chat's messages are kept until one is"
                    .to_owned(),
            ),
        ),
    };
    let mut agents = vec![AgentOption {
        name: API_AGENT.to_owned(),
        kind: "api".to_owned(),
        driver: None,
        model,
        available: model_missing.is_none(),
        unavailable: model_missing,
        modes: vec![Mode::Run.as_str().to_owned()],
    }];
    let runnerd = match providers(service).await {
        Ok(answer) => {
            agents.extend(answer.providers.into_iter().map(|p| AgentOption {
                available: p.unavailable.is_none(),
                name: p.name,
                kind: "cli".to_owned(),
                driver: Some(p.driver),
                model: Some(p.model),
                unavailable: p.unavailable,
                modes: vec![
                    Mode::Run.as_str().to_owned(),
                    Mode::Builder.as_str().to_owned(),
                ],
            }));
            RunnerdState {
                running: true,
                message: None,
            }
        }
        Err(error) => RunnerdState {
            running: false,
            message: Some(runnerd_down(&error)),
        },
    };
    AgentsAnswer { agents, runnerd }
}

/// The agent and mode of a new chat of a person with `access` to the project, or why not.
pub async fn choose(
    service: &ChatService,
    access: &Access,
    requested: Requested,
) -> Result<ChatAgent, Refusal> {
    let mode = parse_mode(requested.mode.as_deref())?;
    let agent = requested.agent.unwrap_or_else(|| API_AGENT.to_owned());
    let chosen = if agent == API_AGENT {
        decide(&agent, mode, None)?
    } else {
        decide(&agent, mode, Some(&providers(service).await))?
    };
    if chosen.mode == Mode::Builder {
        require_authoring_role_for(access, "a Builder chat (its coding CLI writes the project)")
            .map_err(from_tool)?;
    }
    Ok(chosen)
}

fn parse_mode(mode: Option<&str>) -> Result<Mode, Refusal> {
    match mode {
        None | Some("run") => Ok(Mode::Run),
        Some("builder") => Ok(Mode::Builder),
        Some(other) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_mode",
            format!(
                "mode {other:?} is not one; a chat's mode is \"run\" (the default) or \"builder\""
            ),
        )),
    }
}

/// The rules that need no role: `providers` is runnerd's answer (`None` for an `api` chat, which
/// does not ask).
fn decide(agent: &str, mode: Mode, providers: Option<&Providers>) -> Result<ChatAgent, Refusal> {
    let unknown = |message: String| Refusal::new(StatusCode::BAD_REQUEST, "unknown_agent", message);
    let providers = match providers {
        None => {
            if mode == Mode::Builder {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_mode",
                    "Builder mode is for a coding CLI's chat; the built-in agent (api) writes \
                     through its own write_file tool under your write grants: leave mode out, or \
                     pick a coding CLI as the agent",
                ));
            }
            return Ok(ChatAgent {
                agent: agent.to_owned(),
                mode,
            });
        }
        Some(Ok(answer)) => answer,
        Some(Err(error)) => {
            return Err(unknown(format!(
                "there is no agent {agent:?}: {}, so the only agent is \"{API_AGENT}\"",
                runnerd_down(error)
            )));
        }
    };
    let Some(provider) = providers.providers.iter().find(|p| p.name == agent) else {
        let mut names = vec![format!("{API_AGENT:?}")];
        names.extend(providers.providers.iter().map(|p| format!("{:?}", p.name)));
        return Err(unknown(format!(
            "there is no agent {agent:?}; the agents are {}",
            names.join(", ")
        )));
    };
    if let Some(why) = &provider.unavailable {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "agent_unavailable",
            format!("the agent {agent:?} cannot run: {why}"),
        ));
    }
    Ok(ChatAgent {
        agent: agent.to_owned(),
        mode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentworks_contract::runnerd::ProviderInfo;

    fn runnerd_with(providers: &[(&str, Option<&str>)]) -> Providers {
        Ok(ProvidersAnswer {
            providers: providers
                .iter()
                .map(|(name, unavailable)| ProviderInfo {
                    name: (*name).to_owned(),
                    driver: "codex".to_owned(),
                    model: "gpt-test".to_owned(),
                    executable: None,
                    unavailable: unavailable.map(str::to_owned),
                })
                .collect(),
            bridge_unavailable: None,
        })
    }

    fn refused(result: Result<ChatAgent, Refusal>) -> (u16, String, String) {
        let refusal = result.unwrap_err();
        (refusal.status.as_u16(), refusal.code, refusal.message)
    }

    #[test]
    fn an_api_chat_is_run_mode_and_asks_no_runnerd() {
        assert_eq!(
            decide("api", Mode::Run, None).unwrap(),
            ChatAgent::default()
        );
        let (status, code, message) = refused(decide("api", Mode::Builder, None));
        assert_eq!((status, code.as_str()), (400, "invalid_mode"));
        assert!(message.contains("coding CLI"), "{message}");
    }

    #[test]
    fn a_provider_must_be_listed_and_available() {
        let runnerd = runnerd_with(&[
            ("codex", None),
            ("broken", Some("codex was not found on PATH")),
        ]);
        let chosen = decide("codex", Mode::Builder, Some(&runnerd)).unwrap();
        assert_eq!(
            (chosen.agent.as_str(), chosen.mode),
            ("codex", Mode::Builder)
        );
        let (status, code, message) = refused(decide("claude", Mode::Run, Some(&runnerd)));
        assert_eq!((status, code.as_str()), (400, "unknown_agent"));
        assert!(message.contains(r#""api", "codex", "broken""#), "{message}");
        let (status, code, message) = refused(decide("broken", Mode::Run, Some(&runnerd)));
        assert_eq!((status, code.as_str()), (400, "agent_unavailable"));
        assert!(message.contains("codex was not found on PATH"), "{message}");
    }

    #[test]
    fn without_runnerd_only_api_is_an_agent_and_the_refusal_says_why() {
        let down: Providers = Err(Some(RunnerdError::NotRunning {
            socket: "/run/agentworks/runnerd.sock".into(),
        }));
        let (status, code, message) = refused(decide("codex", Mode::Run, Some(&down)));
        assert_eq!((status, code.as_str()), (400, "unknown_agent"));
        assert!(message.contains("runnerd is not running"), "{message}");
        assert!(message.contains("only agent is \"api\""), "{message}");
    }

    #[test]
    fn a_mode_is_run_or_builder() {
        assert_eq!(parse_mode(None).unwrap(), Mode::Run);
        assert_eq!(parse_mode(Some("builder")).unwrap(), Mode::Builder);
        let refusal = parse_mode(Some("root")).unwrap_err();
        assert_eq!(refusal.code, "invalid_mode");
    }
}
