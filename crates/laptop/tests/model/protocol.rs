//! One laptop request's protocol as a transition system: agentd's turn dispatching it to
//! gatewayd (`turn.rs`: `dispatch`, and `recover` when the answer is lost), gatewayd's
//! dispatch, result and recovery (`dispatch.rs`, `executor.rs`, the store), and the executor's
//! receipts around the command (`connect.rs`: `handle`; `receipts.rs`), with gatewayd and the
//! executor killed, the WebSocket dropped and agentd's exchange with gatewayd lost, at any step.
//!
//! Plain Rust with no model checker: `tests/model.rs` explores it with stateright and states
//! the properties; the root suite's `crash_points.rs` includes it to ask what a crash at each
//! failpoint must leave. Each step a crash can follow is a [`CrashPoint`] named after the
//! failpoint the code reaches there.
//!
//! What is abstracted: one request id and one command (its side effect counted, not done);
//! stores that are durable at every commit (both are SQLite with `synchronous=FULL`, so a
//! power cut is a kill here); one connection at a time; the deadlines as steps that may come
//! at any moment (gatewayd's resolves a pending request unknown; agentd's recovery gives up
//! after [`RECOVERY_TRIES`] questions).

#![allow(dead_code)]

/// How many `/v1/recover` questions agentd asks before its deadline passes.
pub const RECOVERY_TRIES: u8 = 3;

/// How the command ended on the laptop, as its outcome says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Completed,
    /// Stopped by the end of its connection (or a cancel).
    Cancelled,
    /// The executor died while it was running: unknown, never run again.
    Interrupted,
    /// Refused before anything ran (only a mutation makes one here).
    RefusedNotRun,
}

/// gatewayd's record of the request (`requests` table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Record {
    Pending,
    Done(Outcome),
    Unknown { sent: bool },
}

/// The executor's receipt of the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Receipt {
    Running,
    Done(Outcome),
    Interrupted,
}

/// What the executor answers a receipt query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReceiptAnswer {
    Done(Outcome),
    Running,
    Unknown,
}

/// A frame on the WebSocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    Request,
    ReceiptQuery,
    Cancel,
    Result(Outcome),
    Receipt(ReceiptAnswer),
}

/// What gatewayd answers agentd about the request (`DispatchState` or `Recovery`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    State(Record),
    /// Refused before anything was recorded or sent (`device_offline`).
    Offline,
    NeverSent,
    Unsettled,
}

/// What agentd's turn tells the model about the tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Report {
    /// The command's result (completed, or cancelled).
    Result(Outcome),
    /// `interrupted`: the executor died while it ran; inspect the files.
    Interrupted,
    /// Not run: `not_run`, `device_offline`, `gateway_unavailable`, or a refusal.
    NotRun,
    /// `outcome_unknown`.
    Unknown,
}

/// A change to the code, to show that a property catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// gatewayd sends the request before recording it.
    SendBeforeRecord,
    /// gatewayd fails a request pending on a lost connection as refused (not run) instead of
    /// unknown.
    DisconnectReportsNotRun,
    /// The executor's start turns a `running` receipt into a refusal (not run) instead of
    /// `interrupted`.
    InterruptedAsNotRun,
    /// agentd takes a lost answer for a dispatch that was never sent.
    LostAnswerIsNotSent,
    /// gatewayd answers a recovery of an unknown id "never sent" without claiming the id.
    RecoverWithoutClaim,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub gatewayd_kills: u8,
    pub executor_kills: u8,
    pub disconnects: u8,
    pub lost_exchanges: u8,
    /// Faults of all kinds together.
    pub faults: u8,
    /// Whether gatewayd's deadline may pass (a real test's short command never reaches it).
    pub deadlines: bool,
    pub mutation: Option<Mutation>,
}

impl Config {
    pub fn mutated(&self, mutation: Mutation) -> Config {
        Config {
            mutation: Some(mutation),
            ..self.clone()
        }
    }

    fn is(&self, mutation: Mutation) -> bool {
        self.mutation == Some(mutation)
    }
}

/// Where gatewayd's dispatch handler is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DispatchPc {
    /// The call arrived.
    Received,
    /// [`Mutation::SendBeforeRecord`]: sent, not recorded.
    SentUnrecorded,
    /// Recorded pending, not sent.
    Recorded,
    /// Sent; waiting for the result.
    Sent,
}

/// Where gatewayd's recovery handler is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecoverPc {
    Received,
    /// The receipt query is out.
    Asking,
    /// The outcome from the receipt is recorded; agentd not answered yet.
    Settled(Outcome),
}

/// One of gatewayd's handlers of an agentd call; `attached` while agentd still waits for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handler<P> {
    pub pc: P,
    pub attached: bool,
}

/// gatewayd's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gatewayd {
    pub dispatch: Option<Handler<DispatchPc>>,
    pub recover: Option<Handler<RecoverPc>>,
    /// The request is pending on the live connection (the registry).
    pub pending: bool,
    /// A resolve's final state, and whether it is recorded yet (it answers the dispatch
    /// handler after).
    pub resolving: Option<(Record, bool)>,
}

/// Where the executor's task for the request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskPc {
    /// The frame arrived; its receipt not looked at yet.
    Received,
    /// Recorded `running`; the command not started.
    Running,
    /// The command is running.
    Executing,
    /// The command ended; its outcome not recorded.
    Ran(Outcome),
    /// Recorded done; the result not sent.
    Done(Outcome),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Task {
    pub pc: TaskPc,
    /// Its connection has ended: its command is killed, its result goes nowhere.
    pub orphan: bool,
    /// A cancel frame came: its command is killed.
    pub cancelled: bool,
}

/// The executor's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Executor {
    pub task: Option<Task>,
    /// A receipt query being answered.
    pub query: bool,
}

/// Where agentd's turn is with the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Agentd {
    Start,
    /// `/v1/dispatch` is out.
    Dispatching,
    /// The dispatch's answer was lost: `tries` questions asked, one out now or not.
    Recovering {
        tries: u8,
        asking: bool,
    },
    Reported(Report),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub agentd: Agentd,
    pub gatewayd: Option<Gatewayd>,
    pub record: Option<Record>,
    pub executor: Option<Executor>,
    pub receipt: Option<Receipt>,
    /// The WebSocket between them is up.
    pub connected: bool,
    pub to_executor: Vec<Frame>,
    pub to_gatewayd: Vec<Frame>,
    /// A reply on its way to agentd.
    pub reply: Option<Reply>,
    /// Faults used: gatewayd kills, executor kills, disconnects, lost exchanges.
    pub used: [u8; 4],
    /// How many times the command started, and how its last run ended.
    pub runs: u8,
    pub ran: Option<Outcome>,
    /// Whether gatewayd's deadline has fired.
    pub deadline: bool,
}

/// Every crash point, named after the failpoint at the same step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CrashPoint {
    DispatchReceived,
    DispatchRecorded,
    DispatchSent,
    ResultRecorded,
    ReceiptSettled,
    ExecutorReceived,
    ExecutorRunning,
    ExecutorRan,
    ExecutorDone,
}

impl CrashPoint {
    pub fn failpoint(self) -> &'static str {
        match self {
            CrashPoint::DispatchReceived => "dispatch_received",
            CrashPoint::DispatchRecorded => "dispatch_recorded",
            CrashPoint::DispatchSent => "dispatch_sent",
            CrashPoint::ResultRecorded => "result_recorded",
            CrashPoint::ReceiptSettled => "receipt_settled",
            CrashPoint::ExecutorReceived => "executor_received",
            CrashPoint::ExecutorRunning => "executor_running",
            CrashPoint::ExecutorRan => "executor_ran",
            CrashPoint::ExecutorDone => "executor_done",
        }
    }

    pub fn in_gatewayd(self) -> bool {
        matches!(
            self,
            CrashPoint::DispatchReceived
                | CrashPoint::DispatchRecorded
                | CrashPoint::DispatchSent
                | CrashPoint::ResultRecorded
                | CrashPoint::ReceiptSettled
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// agentd sends `/v1/dispatch`, or a `/v1/recover` question.
    Call,
    /// gatewayd's reply reaches agentd.
    Answer,
    /// gatewayd's dispatch handler steps.
    Dispatch,
    /// gatewayd's recovery handler steps.
    Recover,
    /// gatewayd records a resolve's final state, or answers the dispatch handler with it.
    Resolve,
    /// gatewayd's deadline for the pending request passes.
    Deadline,
    /// The executor's task steps.
    Task,
    /// The first frame to the executor arrives.
    DeliverToExecutor,
    /// The first frame to gatewayd arrives.
    DeliverToGatewayd,
    /// A receipt query the executor got is answered.
    AnswerQuery,
    /// The executor dials gatewayd and is welcomed.
    Connect,
    KillGatewayd,
    RestartGatewayd,
    KillExecutor,
    RestartExecutor,
    Disconnect,
    /// agentd's exchange with gatewayd breaks; gatewayd's handler of it is dropped, or goes
    /// on unheard (a NATS call in a cluster).
    LoseExchange {
        dropped: bool,
    },
}

#[derive(Clone, Debug)]
pub struct Protocol {
    pub config: Config,
}

impl Protocol {
    pub fn new(config: Config) -> Protocol {
        Protocol { config }
    }

    pub fn init(&self) -> State {
        State {
            agentd: Agentd::Start,
            gatewayd: Some(Gatewayd::default()),
            record: None,
            executor: Some(Executor::default()),
            receipt: None,
            connected: true,
            to_executor: Vec::new(),
            to_gatewayd: Vec::new(),
            reply: None,
            used: [0; 4],
            runs: 0,
            ran: None,
            deadline: false,
        }
    }

    fn fault_left(&self, s: &State, kind: usize, max: u8) -> bool {
        s.used[kind] < max && s.used.iter().sum::<u8>() < self.config.faults
    }

    /// The crash points a kill of gatewayd or of the executor now stops at.
    pub fn crash_points(&self, s: &State) -> Vec<CrashPoint> {
        let mut points = Vec::new();
        if let Some(g) = &s.gatewayd {
            match g.dispatch.map(|h| h.pc) {
                Some(DispatchPc::Received) => points.push(CrashPoint::DispatchReceived),
                Some(DispatchPc::Recorded) => points.push(CrashPoint::DispatchRecorded),
                Some(DispatchPc::Sent) => points.push(CrashPoint::DispatchSent),
                _ => {}
            }
            if matches!(g.resolving, Some((_, true))) {
                points.push(CrashPoint::ResultRecorded);
            }
            if let Some(Handler {
                pc: RecoverPc::Settled(_),
                ..
            }) = g.recover
            {
                points.push(CrashPoint::ReceiptSettled);
            }
        }
        if let Some(Task { pc, .. }) = s.executor.as_ref().and_then(|e| e.task) {
            points.push(match pc {
                TaskPc::Received => CrashPoint::ExecutorReceived,
                TaskPc::Running | TaskPc::Executing => CrashPoint::ExecutorRunning,
                TaskPc::Ran(_) => CrashPoint::ExecutorRan,
                TaskPc::Done(_) => CrashPoint::ExecutorDone,
            });
        }
        points
    }

    pub fn actions(&self, s: &State) -> Vec<Action> {
        let c = &self.config;
        let mut a = Vec::new();
        match s.agentd {
            Agentd::Start => a.push(Action::Call),
            Agentd::Recovering { asking: false, .. } => a.push(Action::Call),
            _ => {}
        }
        if s.reply.is_some() {
            a.push(Action::Answer);
        }
        if let Some(g) = &s.gatewayd {
            if g.dispatch.is_some_and(|h| h.pc != DispatchPc::Sent) {
                a.push(Action::Dispatch);
            }
            if g.recover.is_some_and(|h| h.pc != RecoverPc::Asking) {
                a.push(Action::Recover);
            }
            // A receipt query that goes unanswered times out.
            if g.recover.is_some_and(|h| h.pc == RecoverPc::Asking) {
                a.push(Action::Recover);
            }
            if g.resolving.is_some() {
                a.push(Action::Resolve);
            }
            if g.pending && !s.deadline && self.config.deadlines {
                a.push(Action::Deadline);
            }
            if !s.to_gatewayd.is_empty() {
                a.push(Action::DeliverToGatewayd);
            }
            if s.executor.is_some() && !s.connected {
                a.push(Action::Connect);
            }
        }
        if let Some(e) = &s.executor {
            if e.task.is_some() {
                a.push(Action::Task);
            }
            if e.query {
                a.push(Action::AnswerQuery);
            }
            if !s.to_executor.is_empty() {
                a.push(Action::DeliverToExecutor);
            }
        }
        match &s.gatewayd {
            Some(_) if self.fault_left(s, 0, c.gatewayd_kills) => a.push(Action::KillGatewayd),
            None => a.push(Action::RestartGatewayd),
            _ => {}
        }
        match &s.executor {
            Some(_) if self.fault_left(s, 1, c.executor_kills) => a.push(Action::KillExecutor),
            None => a.push(Action::RestartExecutor),
            _ => {}
        }
        if s.connected && self.fault_left(s, 2, c.disconnects) {
            a.push(Action::Disconnect);
        }
        let waiting = matches!(
            s.agentd,
            Agentd::Dispatching | Agentd::Recovering { asking: true, .. }
        );
        if waiting && self.fault_left(s, 3, c.lost_exchanges) {
            a.push(Action::LoseExchange { dropped: true });
            a.push(Action::LoseExchange { dropped: false });
        }
        a
    }

    pub fn next(&self, s: &State, action: &Action) -> Option<State> {
        let mut s = s.clone();
        match *action {
            Action::Call => self.call(&mut s),
            Action::Answer => self.answer(&mut s),
            Action::Dispatch => self.dispatch(&mut s),
            Action::Recover => self.recover(&mut s),
            Action::Resolve => self.resolve(&mut s),
            Action::Deadline => {
                s.deadline = true;
                if let Some(g) = s.gatewayd.as_mut() {
                    g.pending = false;
                }
                if s.connected {
                    s.to_executor.push(Frame::Cancel);
                }
                self.start_resolve(&mut s, Record::Unknown { sent: true });
            }
            Action::Task => self.task(&mut s),
            Action::DeliverToExecutor => self.deliver_to_executor(&mut s),
            Action::DeliverToGatewayd => self.deliver_to_gatewayd(&mut s),
            Action::AnswerQuery => {
                let answer = match s.receipt {
                    None => ReceiptAnswer::Unknown,
                    Some(Receipt::Running) => ReceiptAnswer::Running,
                    Some(Receipt::Done(o)) => ReceiptAnswer::Done(o),
                    Some(Receipt::Interrupted) => ReceiptAnswer::Done(Outcome::Interrupted),
                };
                s.executor.as_mut()?.query = false;
                if s.connected {
                    s.to_gatewayd.push(Frame::Receipt(answer));
                }
            }
            Action::Connect => {
                s.connected = true;
            }
            Action::KillGatewayd => {
                s.used[0] += 1;
                self.disconnect(&mut s);
                s.gatewayd = None;
                self.exchange_lost(&mut s);
            }
            Action::RestartGatewayd => {
                // Requests left pending are unknown: nobody can tell whether they ran.
                if s.record == Some(Record::Pending) {
                    s.record = Some(Record::Unknown { sent: true });
                }
                s.gatewayd = Some(Gatewayd::default());
            }
            Action::KillExecutor => {
                s.used[1] += 1;
                self.disconnect(&mut s);
                s.executor = None;
            }
            Action::RestartExecutor => {
                if s.receipt == Some(Receipt::Running) {
                    s.receipt = Some(if self.config.is(Mutation::InterruptedAsNotRun) {
                        Receipt::Done(Outcome::RefusedNotRun)
                    } else {
                        Receipt::Interrupted
                    });
                }
                s.executor = Some(Executor::default());
            }
            Action::Disconnect => {
                s.used[2] += 1;
                self.disconnect(&mut s);
            }
            Action::LoseExchange { dropped } => {
                s.used[3] += 1;
                if let Some(g) = s.gatewayd.as_mut() {
                    match &mut s.agentd {
                        Agentd::Dispatching => {
                            if dropped {
                                g.dispatch = None;
                            } else if let Some(h) = g.dispatch.as_mut() {
                                h.attached = false;
                            }
                        }
                        _ => {
                            if dropped {
                                g.recover = None;
                            } else if let Some(h) = g.recover.as_mut() {
                                h.attached = false;
                            }
                        }
                    }
                }
                self.exchange_lost(&mut s);
            }
        }
        Some(s)
    }

    /// agentd's exchange is gone: a dispatch's answer is recovered (or, with the mutation,
    /// taken as never sent); a recovery question is asked again.
    fn exchange_lost(&self, s: &mut State) {
        s.reply = None;
        s.agentd = match s.agentd {
            Agentd::Dispatching if self.config.is(Mutation::LostAnswerIsNotSent) => {
                Agentd::Reported(Report::NotRun)
            }
            Agentd::Dispatching => Agentd::Recovering {
                tries: 0,
                asking: false,
            },
            Agentd::Recovering {
                tries,
                asking: true,
            } => self.ask_again(tries + 1),
            other => other,
        };
    }

    fn ask_again(&self, tries: u8) -> Agentd {
        if tries >= RECOVERY_TRIES {
            Agentd::Reported(Report::Unknown)
        } else {
            Agentd::Recovering {
                tries,
                asking: false,
            }
        }
    }

    /// The WebSocket ends: gatewayd fails what was pending on it (unknown), the executor's
    /// task loses its connection (a running command is cancelled).
    fn disconnect(&self, s: &mut State) {
        if !s.connected {
            return;
        }
        s.connected = false;
        s.to_executor.clear();
        s.to_gatewayd.clear();
        if let Some(e) = s.executor.as_mut() {
            if let Some(task) = e.task.as_mut() {
                task.orphan = true;
            }
            e.query = false;
        }
        let mut failed = false;
        let mut unsettled = false;
        if let Some(g) = s.gatewayd.as_mut() {
            failed = std::mem::take(&mut g.pending);
            // A receipt query cannot be answered once its connection is gone: unsettled.
            if let Some(h) = g.recover.filter(|h| h.pc == RecoverPc::Asking) {
                g.recover = None;
                unsettled = h.attached;
            }
        }
        if unsettled {
            s.reply = Some(Reply::Unsettled);
        }
        if failed {
            let state = if self.config.is(Mutation::DisconnectReportsNotRun) {
                Record::Done(Outcome::RefusedNotRun)
            } else {
                Record::Unknown { sent: true }
            };
            self.start_resolve(s, state);
        }
    }

    fn call(&self, s: &mut State) {
        let recovering = matches!(s.agentd, Agentd::Recovering { .. });
        let Some(g) = s.gatewayd.as_mut() else {
            // Cannot connect: a dispatch was not sent; a recovery question is asked again.
            s.agentd = match s.agentd {
                Agentd::Recovering { tries, .. } => self.ask_again(tries + 1),
                _ => Agentd::Reported(Report::NotRun),
            };
            return;
        };
        if recovering {
            g.recover = Some(Handler {
                pc: RecoverPc::Received,
                attached: true,
            });
            if let Agentd::Recovering { asking, .. } = &mut s.agentd {
                *asking = true;
            }
        } else {
            g.dispatch = Some(Handler {
                pc: DispatchPc::Received,
                attached: true,
            });
            s.agentd = Agentd::Dispatching;
        }
    }

    /// gatewayd's reply reaches agentd's turn.
    fn answer(&self, s: &mut State) {
        let Some(reply) = s.reply.take() else {
            return;
        };
        let report = |record: Record| match record {
            Record::Done(Outcome::Interrupted) => Report::Interrupted,
            Record::Done(Outcome::RefusedNotRun) => Report::NotRun,
            Record::Done(o) => Report::Result(o),
            Record::Pending | Record::Unknown { .. } => Report::Unknown,
        };
        s.agentd = match (s.agentd, reply) {
            (_, Reply::State(record)) => Agentd::Reported(report(record)),
            (_, Reply::Offline) | (_, Reply::NeverSent) => Agentd::Reported(Report::NotRun),
            (Agentd::Recovering { tries, .. }, Reply::Unsettled) => self.ask_again(tries + 1),
            (other, Reply::Unsettled) => other,
        };
    }

    fn reply(s: &mut State, attached: bool, reply: Reply) {
        if attached {
            s.reply = Some(reply);
        }
    }

    /// `/v1/dispatch`: replay a record, refuse an offline device, record, send once, wait.
    fn dispatch(&self, s: &mut State) {
        let c = &self.config;
        let Some(g) = s.gatewayd.as_mut() else {
            return;
        };
        let Some(h) = g.dispatch else {
            return;
        };
        match h.pc {
            DispatchPc::Received => {
                if let Some(record) = s.record {
                    g.dispatch = None;
                    Self::reply(s, h.attached, Reply::State(record));
                } else if !s.connected {
                    g.dispatch = None;
                    Self::reply(s, h.attached, Reply::Offline);
                } else if c.is(Mutation::SendBeforeRecord) {
                    g.pending = true;
                    s.to_executor.push(Frame::Request);
                    g.dispatch = Some(Handler {
                        pc: DispatchPc::SentUnrecorded,
                        ..h
                    });
                } else {
                    s.record = Some(Record::Pending);
                    g.dispatch = Some(Handler {
                        pc: DispatchPc::Recorded,
                        ..h
                    });
                }
            }
            DispatchPc::SentUnrecorded => {
                if let Some(record) = s.record {
                    g.dispatch = None;
                    Self::reply(s, h.attached, Reply::State(record));
                } else {
                    s.record = Some(Record::Pending);
                    g.dispatch = Some(Handler {
                        pc: DispatchPc::Sent,
                        ..h
                    });
                }
            }
            DispatchPc::Recorded => {
                if s.connected {
                    g.pending = true;
                    s.to_executor.push(Frame::Request);
                    g.dispatch = Some(Handler {
                        pc: DispatchPc::Sent,
                        ..h
                    });
                } else {
                    // The connection went away before the send: nothing was sent, and the
                    // handler is answered by the resolve.
                    g.dispatch = Some(Handler {
                        pc: DispatchPc::Sent,
                        ..h
                    });
                    self.start_resolve(s, Record::Unknown { sent: true });
                }
            }
            DispatchPc::Sent => {}
        }
    }

    /// A final state for the pending request: recorded first, then answered.
    fn start_resolve(&self, s: &mut State, state: Record) {
        if let Some(g) = s.gatewayd.as_mut() {
            g.resolving = Some((state, false));
        }
    }

    /// `Gateway::resolve`: `finish_request` (only over `pending`: a late result never
    /// overwrites), then, as its own step, the dispatch handler answered with the state.
    fn resolve(&self, s: &mut State) {
        let Some(g) = s.gatewayd.as_mut() else {
            return;
        };
        match g.resolving {
            Some((state, false)) => {
                if s.record == Some(Record::Pending) {
                    s.record = Some(state);
                }
                g.resolving = Some((state, true));
            }
            Some((state, true)) => {
                g.resolving = None;
                if let Some(h) = g.dispatch.filter(|h| h.pc == DispatchPc::Sent) {
                    g.dispatch = None;
                    Self::reply(s, h.attached, Reply::State(state));
                }
            }
            None => {}
        }
    }

    /// `/v1/recover`: claim or read the record; for an unknown sent request, ask the device.
    fn recover(&self, s: &mut State) {
        let c = &self.config;
        let Some(g) = s.gatewayd.as_mut() else {
            return;
        };
        let Some(h) = g.recover else {
            return;
        };
        match h.pc {
            RecoverPc::Received => {
                let reply = match s.record {
                    None => {
                        if !c.is(Mutation::RecoverWithoutClaim) {
                            s.record = Some(Record::Unknown { sent: false });
                        }
                        Some(Reply::NeverSent)
                    }
                    Some(Record::Done(o)) => Some(Reply::State(Record::Done(o))),
                    Some(Record::Pending) => Some(Reply::Unsettled),
                    Some(Record::Unknown { sent: false }) => Some(Reply::NeverSent),
                    Some(Record::Unknown { sent: true }) => {
                        if s.connected {
                            s.to_executor.push(Frame::ReceiptQuery);
                            g.recover = Some(Handler {
                                pc: RecoverPc::Asking,
                                ..h
                            });
                            None
                        } else {
                            Some(Reply::Unsettled)
                        }
                    }
                };
                if let Some(reply) = reply {
                    g.recover = None;
                    Self::reply(s, h.attached, reply);
                }
            }
            // No answer in time.
            RecoverPc::Asking => {
                g.recover = None;
                Self::reply(s, h.attached, Reply::Unsettled);
            }
            RecoverPc::Settled(o) => {
                g.recover = None;
                Self::reply(s, h.attached, Reply::State(Record::Done(o)));
            }
        }
    }

    fn deliver_to_gatewayd(&self, s: &mut State) {
        let frame = s.to_gatewayd.remove(0);
        let Some(g) = s.gatewayd.as_mut() else {
            return;
        };
        match frame {
            // Counts only for a request pending on this connection.
            Frame::Result(o) if std::mem::take(&mut g.pending) => {
                self.start_resolve(s, Record::Done(o));
            }
            Frame::Receipt(answer) => {
                let Some(h) = g.recover.filter(|h| h.pc == RecoverPc::Asking) else {
                    return;
                };
                match answer {
                    ReceiptAnswer::Running => {
                        g.recover = None;
                        Self::reply(s, h.attached, Reply::Unsettled);
                    }
                    ReceiptAnswer::Unknown => {
                        g.recover = None;
                        Self::reply(s, h.attached, Reply::State(Record::Unknown { sent: true }));
                    }
                    ReceiptAnswer::Done(o) => {
                        // `recover_request`: only an unknown request that was sent.
                        if s.record == Some(Record::Unknown { sent: true }) {
                            s.record = Some(Record::Done(o));
                        }
                        g.recover = Some(Handler {
                            pc: RecoverPc::Settled(o),
                            ..h
                        });
                    }
                }
            }
            _ => {}
        }
    }

    fn deliver_to_executor(&self, s: &mut State) {
        let frame = s.to_executor.remove(0);
        let Some(e) = s.executor.as_mut() else {
            return;
        };
        match frame {
            Frame::Request => {
                e.task = Some(Task {
                    pc: TaskPc::Received,
                    orphan: false,
                    cancelled: false,
                });
            }
            Frame::ReceiptQuery => e.query = true,
            Frame::Cancel => {
                if let Some(task) = e.task.as_mut() {
                    task.cancelled = true;
                }
            }
            _ => {}
        }
    }

    /// `handle`: the receipt first, then at most once the command, then the receipt.
    fn task(&self, s: &mut State) {
        let Some(e) = s.executor.as_mut() else {
            return;
        };
        let Some(mut task) = e.task else {
            return;
        };
        let mut send = None;
        match task.pc {
            TaskPc::Received => match s.receipt {
                None => {
                    s.receipt = Some(Receipt::Running);
                    task.pc = TaskPc::Running;
                }
                Some(Receipt::Done(o)) => send = Some(o),
                Some(Receipt::Interrupted) => send = Some(Outcome::Interrupted),
                // In progress in this process: its own result will come.
                Some(Receipt::Running) => {
                    e.task = None;
                    return;
                }
            },
            TaskPc::Running => {
                s.runs += 1;
                task.pc = TaskPc::Executing;
            }
            TaskPc::Executing => {
                // Its connection gone, the command is killed; else it completes.
                let o = if task.orphan || task.cancelled {
                    Outcome::Cancelled
                } else {
                    Outcome::Completed
                };
                s.ran = Some(o);
                task.pc = TaskPc::Ran(o);
            }
            TaskPc::Ran(o) => {
                s.ran = Some(o);
                s.receipt = Some(Receipt::Done(o));
                task.pc = TaskPc::Done(o);
            }
            TaskPc::Done(o) => send = Some(o),
        }
        match send {
            Some(o) => {
                e.task = None;
                if !task.orphan && s.connected {
                    s.to_gatewayd.push(Frame::Result(o));
                }
            }
            None => e.task = Some(task),
        }
    }
}

/// One kill of a real crash test: the process of `point` dies at a state the model labels
/// `point`, and (for a plain SIGKILL from the test rather than a failpoint) only once the
/// command is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kill {
    pub point: CrashPoint,
    pub command_running: bool,
}

/// What agentd may report, and how often the command ran, when the kills happen in order
/// and nothing else goes wrong (the killed process restarts, the executor reconnects): every
/// end the model reaches. Empty if the kills cannot happen in that order.
pub fn after_kills(kills: &[Kill]) -> std::collections::BTreeSet<(Report, u8)> {
    let protocol = Protocol::new(Config {
        gatewayd_kills: 0,
        executor_kills: 0,
        disconnects: 0,
        lost_exchanges: 0,
        faults: 0,
        deadlines: false,
        mutation: None,
    });
    let mut ends = std::collections::BTreeSet::new();
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![(protocol.init(), 0usize)];
    while let Some((state, done)) = todo.pop() {
        if !seen.insert((state.clone(), done)) {
            continue;
        }
        if let Agentd::Reported(report) = state.agentd {
            if done == kills.len() {
                ends.insert((report, state.runs));
            }
            continue;
        }
        for action in protocol.actions(&state) {
            if let Some(next) = protocol.next(&state, &action) {
                todo.push((next, done));
            }
        }
        if let Some(kill) = kills.get(done) {
            let running = state
                .executor
                .as_ref()
                .and_then(|e| e.task)
                .is_some_and(|t| t.pc == TaskPc::Executing);
            if protocol.crash_points(&state).contains(&kill.point)
                && (!kill.command_running || running)
            {
                let action = if kill.point.in_gatewayd() {
                    Action::KillGatewayd
                } else {
                    Action::KillExecutor
                };
                if let Some(next) = protocol.next(&state, &action) {
                    todo.push((next, done + 1));
                }
            }
        }
    }
    ends
}
