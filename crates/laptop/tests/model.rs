//! The laptop request protocol, model-checked: agentd's turn, gatewayd's dispatch, result
//! and recovery, and the executor's receipts around one command, with gatewayd and the
//! executor killed, the WebSocket dropped and agentd's exchange with gatewayd lost at every
//! step, explored exhaustively with stateright. The transition system is
//! `model/protocol.rs`; this file holds the properties (named after the guarantees the README
//! states), the mutations each must catch, and the tie between the model's crash points and
//! the failpoints of gatewayd and the executor.
//!
//! `cargo test -p agentworks-laptop --test model`; each test prints how many states it
//! explored.

#[path = "model/protocol.rs"]
mod protocol;

use agentworks_fs::failpoint::{Failpoint, Process};
use protocol::*;
use stateright::{Checker, HasDiscoveries, Model, Property};
use std::collections::BTreeSet;

struct Laptop(Protocol);

const AT_MOST_ONCE: &str = "a command runs at most once per request id";
const NEVER_NOT_RUN_IF_RAN: &str = "an unknown outcome is never reported as not run";
const RESULT_IS_REAL: &str = "a reported result is the command's own";
const LOST_ANSWER_RECOVERED: &str =
    "a lost answer is recovered or reported outcome_unknown, never left hanging";

impl Model for Laptop {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.0.init()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        actions.extend(self.0.actions(state));
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        self.0.next(state, &action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONCE, |_, s: &State| s.runs <= 1),
            Property::always(NEVER_NOT_RUN_IF_RAN, |_, s: &State| {
                s.agentd != Agentd::Reported(Report::NotRun) || s.runs == 0
            }),
            Property::always(RESULT_IS_REAL, |_, s: &State| match s.agentd {
                Agentd::Reported(Report::Result(o)) => s.ran == Some(o),
                _ => true,
            }),
            Property::eventually(LOST_ANSWER_RECOVERED, |_, s: &State| {
                matches!(s.agentd, Agentd::Reported(_))
            }),
            // The model reaches what it is about.
            Property::sometimes(
                "a lost answer is recovered from the device's receipt",
                |_, s: &State| {
                    matches!(s.agentd, Agentd::Reported(Report::Result(_)))
                        && s.used.iter().sum::<u8>() > 0
                        && s.used[3] + s.used[0] > 0
                },
            ),
            Property::sometimes(
                "an interrupted command is reported interrupted",
                |_, s: &State| s.agentd == Agentd::Reported(Report::Interrupted),
            ),
        ]
    }
}

/// Each kind of fault up to twice, three of them in one run.
fn faults() -> Config {
    Config {
        gatewayd_kills: 2,
        executor_kills: 2,
        disconnects: 2,
        lost_exchanges: 2,
        faults: 3,
        deadlines: true,
        mutation: None,
    }
}

fn check_all(config: Config) -> usize {
    let checker = Laptop(Protocol::new(config))
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    eprintln!(
        "laptop request: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
    checker.unique_state_count()
}

fn caught_by(config: Config, property: &'static str) {
    let mutation = config.mutation;
    let checker = Laptop(Protocol::new(config))
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let found = checker.discovery(property);
    assert!(
        found.is_some(),
        "{mutation:?} was not caught by \"{property}\" ({} states)",
        checker.unique_state_count()
    );
    eprintln!(
        "{mutation:?} caught by \"{property}\" after {} states: {:?}",
        checker.unique_state_count(),
        found.map(|path| path.into_actions())
    );
}

#[test]
fn a_laptop_request_keeps_every_guarantee() {
    check_all(faults());
}

#[test]
fn sending_before_recording_is_caught() {
    caught_by(
        faults().mutated(Mutation::SendBeforeRecord),
        NEVER_NOT_RUN_IF_RAN,
    );
}

#[test]
fn failing_a_lost_connections_request_as_not_run_is_caught() {
    caught_by(
        faults().mutated(Mutation::DisconnectReportsNotRun),
        NEVER_NOT_RUN_IF_RAN,
    );
}

#[test]
fn an_interrupted_command_recorded_as_not_run_is_caught() {
    caught_by(
        faults().mutated(Mutation::InterruptedAsNotRun),
        NEVER_NOT_RUN_IF_RAN,
    );
}

#[test]
fn a_lost_answer_taken_for_not_sent_is_caught() {
    caught_by(
        faults().mutated(Mutation::LostAnswerIsNotSent),
        NEVER_NOT_RUN_IF_RAN,
    );
}

#[test]
fn a_recovery_that_does_not_claim_the_id_is_caught() {
    caught_by(
        faults().mutated(Mutation::RecoverWithoutClaim),
        NEVER_NOT_RUN_IF_RAN,
    );
}

/// The model's crash points are the failpoints of gatewayd and the executor: each names one
/// the code has, and each of theirs is a crash point the model reaches.
#[test]
fn the_crash_points_are_the_failpoints_of_gatewayd_and_the_executor() {
    let protocol = Protocol::new(faults());
    let mut reached = BTreeSet::new();
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![protocol.init()];
    while let Some(state) = todo.pop() {
        if !seen.insert(state.clone()) {
            continue;
        }
        reached.extend(protocol.crash_points(&state));
        for action in protocol.actions(&state) {
            if let Some(next) = protocol.next(&state, &action) {
                todo.push(next);
            }
        }
    }
    let model: BTreeSet<(&str, Process)> = reached
        .into_iter()
        .map(|p| {
            let process = if p.in_gatewayd() {
                Process::Gatewayd
            } else {
                Process::Executor
            };
            (p.failpoint(), process)
        })
        .collect();
    let code: BTreeSet<(&str, Process)> = Failpoint::ALL
        .iter()
        .filter_map(|f| match f.process() {
            Some(p @ (Process::Gatewayd | Process::Executor)) if f.is_step() => Some((f.name(), p)),
            _ => None,
        })
        .collect();
    assert_eq!(
        model, code,
        "the model's crash points (left) and the failpoints of gatewayd and the executor \
         (right) differ"
    );
}

/// What the real crash test (`tests/suite/crash_points.rs`) checks is the model's: an
/// executor killed once its command ran reports it interrupted or unknown, never not run,
/// and the command ran once.
#[test]
fn the_model_predicts_each_crash_of_a_request() {
    let kill = |point| Kill {
        point,
        command_running: false,
    };
    let ends = after_kills(&[kill(CrashPoint::ExecutorRan)]);
    assert!(!ends.is_empty());
    for (report, runs) in &ends {
        assert_eq!(*runs, 1, "{ends:?}");
        assert!(
            matches!(report, Report::Interrupted | Report::Unknown),
            "{ends:?}"
        );
    }
    // Never sent: not run (or, had agentd given up asking first, unknown).
    let ends = after_kills(&[kill(CrashPoint::DispatchReceived)]);
    assert!(ends.contains(&(Report::NotRun, 0)), "{ends:?}");
    assert!(ends.iter().all(|(_, runs)| *runs == 0), "{ends:?}");
    let ends = after_kills(&[
        Kill {
            point: CrashPoint::DispatchSent,
            command_running: true,
        },
        kill(CrashPoint::ReceiptSettled),
    ]);
    assert!(
        ends.contains(&(Report::Result(Outcome::Cancelled), 1)),
        "{ends:?}"
    );
}
