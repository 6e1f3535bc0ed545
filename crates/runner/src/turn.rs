//! One turn of a coding CLI: the runtime prepared, the project pinned, a capability opened on
//! the model gateway, the CLI started in the sandbox with the runtime as its cwd, its JSON
//! stream turned into the turn's events, and the end: normal, failed, cancelled or timed out.
//!
//! Owns: [`Runner`] (what every turn shares: the providers, the gateway, the launcher, the
//! limits, the turns running now) and the turn's sandbox policy ([`Runner::policy`]).
//! Must never: start the CLI outside the sandbox, give it the project writable in Run mode,
//! name the provider's key in its environment, files or arguments, or leave its process tree
//! behind once the turn has ended.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentworks_contract::runnerd::{Mode, TurnEvent, TurnRequest, codes};
use agentworks_core::guard::ResolvedGuard;
use agentworks_core::guard::path::RelPath;
use agentworks_sandbox::limits::Limits;
use agentworks_sandbox::process::{Launcher, SandboxCommand, Stream};
use agentworks_sandbox::{PinnedAccess, PinnedDir, SandboxPolicy};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::acp;
use crate::bridge::endpoint::{ShellSandbox, TurnBridge};
use crate::bridge::mcp::read_line;
use crate::bridge::{self, Bridge};
use crate::driver::{self, Conversation, DriverError, TurnSetup};
use crate::gateway::{ModelGateway, Upstream};
use crate::provider::Providers;
use crate::runtime::{self, RuntimeError, RuntimeKey};

/// The most of the CLI's stderr kept for an error message (its last bytes).
const STDERR_TAIL: usize = 4096;

/// How long a protected file is looked for below the project root, at most (entries visited).
const PROTECTED_WALK_LIMIT: usize = 20_000;

/// Where runnerd's turns live, and what they must never reach.
#[derive(Debug, Clone)]
pub struct RunnerPaths {
    /// `<state>/runner/runtimes`.
    pub runtimes: PathBuf,
    /// The documents root (canonical): one folder per project.
    pub documents_root: PathBuf,
    /// Never readable in a turn, wherever they lie: the other daemons' state, the sockets'
    /// directory, the config directory, the providers' key files.
    pub denied: Vec<PathBuf>,
}

/// What every turn shares.
pub struct Runner {
    pub paths: RunnerPaths,
    pub providers: Providers,
    pub gateway: ModelGateway,
    pub launcher: Launcher,
    pub limits: Arc<Limits>,
    /// `agentworks-mcpbridge` and the endpoint that answers it.
    pub bridge: Bridge,
    /// Whether exclusions inside writable folders are covered by mounts (the launcher's probe).
    pub overmount: bool,
    /// Why commands cannot be sandboxed here, when they cannot: every turn is then refused.
    pub sandbox_unavailable: Option<String>,
    pub timeout: Duration,
    turns: Mutex<HashMap<String, CancellationToken>>,
}

/// Why a turn ended without [`TurnEvent::End`]: a code of [`codes`] and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnFailure {
    pub code: &'static str,
    pub message: String,
}

impl TurnFailure {
    fn new(code: &'static str, message: impl Into<String>) -> TurnFailure {
        TurnFailure {
            code,
            message: message.into(),
        }
    }
}

/// Sends the turn's events to whoever streams them; a reader that went away loses them (the
/// turn goes on until it ends or is cancelled, as the contract says).
#[derive(Clone)]
struct Events(UnboundedSender<Bytes>);

impl Events {
    fn send(&self, event: &TurnEvent) {
        if let Ok(mut line) = serde_json::to_vec(event) {
            line.push(b'\n');
            let _ = self.0.send(Bytes::from(line));
        }
    }
}

impl Runner {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        paths: RunnerPaths,
        providers: Providers,
        gateway: ModelGateway,
        launcher: Launcher,
        limits: Limits,
        bridge: Bridge,
        overmount: bool,
        sandbox_unavailable: Option<String>,
        timeout: Duration,
    ) -> Runner {
        Runner {
            paths,
            providers,
            gateway,
            launcher,
            limits: Arc::new(limits),
            bridge,
            overmount,
            sandbox_unavailable,
            timeout,
            turns: Mutex::new(HashMap::new()),
        }
    }

    /// Starts `request` as a turn of its own; its events go to `events`, one JSON line each,
    /// the first `started`, the last `end` or `error`.
    pub fn start_turn(self: &Arc<Self>, request: TurnRequest, events: UnboundedSender<Bytes>) {
        let turn_id = format!("turn_{}", hex::encode(rand::random::<[u8; 12]>()));
        let cancel = CancellationToken::new();
        self.turns_lock().insert(turn_id.clone(), cancel.clone());
        let runner = self.clone();
        let events = Events(events);
        tokio::spawn(async move {
            let outcome = runner.turn(&turn_id, &request, &cancel, &events).await;
            runner.turns_lock().remove(&turn_id);
            match outcome {
                Ok(exit_code) => events.send(&TurnEvent::End { exit_code }),
                Err(failure) => {
                    tracing::info!(turn = %turn_id, code = failure.code, message = %failure.message, "turn failed");
                    events.send(&TurnEvent::Error {
                        code: failure.code.to_owned(),
                        message: failure.message,
                    });
                }
            }
        });
    }

    /// Cancels a running turn: its CLI's whole tree is ended. False if no such turn runs.
    pub fn cancel(&self, turn_id: &str) -> bool {
        match self.turns_lock().get(turn_id) {
            Some(cancel) => {
                cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// How many turns run now.
    pub fn running(&self) -> usize {
        self.turns_lock().len()
    }

    fn turns_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        // A panic while holding the map leaves it usable: it holds only tokens.
        self.turns.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn turn(
        &self,
        turn_id: &str,
        request: &TurnRequest,
        cancel: &CancellationToken,
        events: &Events,
    ) -> Result<Option<i32>, TurnFailure> {
        if let Some(why) = &self.sandbox_unavailable {
            return Err(TurnFailure::new(
                codes::SANDBOX_UNAVAILABLE,
                format!("coding CLIs cannot run on this server: {why}"),
            ));
        }
        let provider = self.providers.get(&request.provider).ok_or_else(|| {
            TurnFailure::new(
                codes::UNKNOWN_PROVIDER,
                format!(
                    "no provider named {:?} is configured in [runnerd.providers]",
                    request.provider
                ),
            )
        })?;
        let executable = provider.executable.as_ref().map_err(|why| {
            TurnFailure::new(
                codes::PROVIDER_UNAVAILABLE,
                format!("provider {:?} cannot run: {why}", provider.name),
            )
        })?;
        let guard = request.guard.resolve().map_err(|e| {
            TurnFailure::new(codes::INTERNAL, format!("the turn's guard is invalid: {e}"))
        })?;
        check_project_name(&request.project)?;
        if request.laptop.is_some() && !request.tools.is_empty() {
            return Err(TurnFailure::new(
                codes::INTERNAL,
                "a turn in a laptop folder takes no extra bridge tools",
            ));
        }
        // A turn in a laptop folder gets no project at all: no pinned folder, no link.
        let project = match request.laptop {
            None => Some(self.pin_project(&request.project, &guard)?),
            Some(_) => None,
        };
        let key = RuntimeKey {
            user_id: &request.user_id,
            project: &request.project,
            chat_id: &request.chat_id,
            provider: &provider.name,
            mode: request.mode,
            laptop: request.laptop.is_some(),
        };
        let target = project.as_ref().map(PinnedDir::path);
        let runtime =
            runtime::prepare(&self.paths.runtimes, &key, target).map_err(|e| match e {
                RuntimeError::Occupied { .. } => {
                    TurnFailure::new(codes::RUNTIME_OCCUPIED, e.to_string())
                }
                other => TurnFailure::new(
                    codes::INTERNAL,
                    format!("cannot prepare the runtime: {other}"),
                ),
            })?;
        let real_key = provider
            .read_key()
            .map_err(|e| TurnFailure::new(codes::INTERNAL, e.to_string()))?;
        let driver = driver::for_driver(provider.driver);
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            TurnFailure::new(codes::INTERNAL, format!("{what}: {e}"))
        };
        let guidance = match (&project, request.laptop) {
            (Some(project), _) => runtime::guidance(
                request.mode,
                project.path(),
                &request.guard.write_paths,
                &request.guard.blocked_paths,
                &[
                    request.guard.blocked_write_paths.clone(),
                    request.guard.read_only_paths.clone(),
                ]
                .concat(),
            ),
            (None, folder) => runtime::laptop_guidance(folder.is_some_and(|f| f.writable)),
        };
        let base_url = self.gateway.base_url();
        let setup = TurnSetup {
            model: &provider.model,
            gateway_base_url: &base_url,
            bridge_command: self.bridge.command(),
            builder: request.mode == Mode::Builder,
            bound: request.laptop.is_some(),
            runtime_dir: &runtime.dir,
            guidance: &guidance,
            acp: provider.acp.as_ref(),
        };
        let refused = |e: DriverError| match e {
            DriverError::Config(why) => TurnFailure::new(
                codes::PROVIDER_UNAVAILABLE,
                format!("provider {:?} cannot run: {why}", provider.name),
            ),
            DriverError::Unbindable(why) => TurnFailure::new(codes::PROVIDER_UNAVAILABLE, why),
        };
        let mut hashes = Vec::new();
        for file in driver.files(&setup).map_err(refused)? {
            hashes.push(
                runtime::write_generated(&runtime.dir, &file.path, &file.content)
                    .map_err(|e| internal(&format!("cannot write {}", file.path.display()), &e))?,
            );
        }
        let session_key = runtime::session_key(&key, &hashes);
        // A session recorded under another key (other guidance, chat, mode or provider) is
        // never resumed: the turn starts a new one.
        let resume = request
            .resume
            .as_ref()
            .filter(|r| r.session_key == session_key)
            .map(|r| r.session_id.as_str());
        let capability = self.gateway.open_turn(Upstream {
            base_url: provider.upstream.clone(),
            key: real_key,
            auth: driver.upstream_auth(),
        });
        let launch = driver
            .launch(&setup, capability.secret(), resume)
            .map_err(refused)?;
        let mut conversation = driver.conversation(&setup, resume);
        events.send(&TurnEvent::Started {
            turn_id: turn_id.to_owned(),
            session_key: session_key.clone(),
        });

        let (mut policy, write_pins) =
            self.policy(project.as_ref(), &guard, request.mode, &runtime, executable)?;
        let bridge = self.open_bridge(
            turn_id,
            request,
            cancel,
            events,
            &policy,
            project.as_ref(),
            &write_pins,
        );
        if let Some(binary) = self.bridge.command() {
            // The CLI spawns the bridge inside its sandbox: the one file, read and execute.
            policy.read_only.push(PathBuf::from(binary));
        }
        // An ACP agent is given its MCP servers' environment in `session/new`, not its own.
        if let (Conversation::Acp(session), Some(bridge)) = (&mut conversation, &bridge) {
            session.bridge_env = vec![
                (bridge::URL_ENV.to_owned(), self.bridge.endpoint.url()),
                (bridge::TOKEN_ENV.to_owned(), bridge.secret().to_owned()),
            ];
        }
        let cgroup = self
            .limits
            .for_command(&mut policy)
            .map_err(|e| internal("cannot make the turn's cgroup", &e))?;
        // The bridge's URL and capability reach a CLI that starts the bridge from its config
        // through its environment; an ACP agent gets them in `session/new` instead, so they are
        // not in its environment at all (nor, then, in its commands').
        let bridge_env = match &conversation {
            Conversation::Acp(_) => None,
            Conversation::PromptOnStdin(_) => bridge.as_ref(),
        };
        let mut command = SandboxCommand::new(executable, policy);
        command
            .args(launch.args)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(runtime.environment())
            .env("LANG", "C.UTF-8")
            .envs(launch.env)
            .envs(bridge_env.iter().flat_map(|b| {
                [
                    (bridge::URL_ENV, self.bridge.endpoint.url()),
                    (bridge::TOKEN_ENV, b.secret().to_owned()),
                ]
            }))
            .stdin(Stream::Piped)
            .stdout(Stream::Piped)
            .stderr(Stream::Piped);
        let outcome = self
            .run_cli(&command, conversation, &request.prompt, cancel, events)
            .await;
        let usage = capability.usage();
        let refusal = capability.upstream_refusal();
        capability.close();
        // Refused from now on; its calls still waiting end.
        drop(bridge);
        if let Some(cgroup) = cgroup
            && let Err(e) = cgroup.kill_and_remove()
        {
            tracing::warn!(turn = %turn_id, error = %e, "cannot remove the turn's cgroup");
        }
        if usage.input_tokens > 0 || usage.output_tokens > 0 {
            events.send(&TurnEvent::Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
            });
        }
        // Project replaced while the turn ran: its writes went to the pinned directory, and
        // the turn says so.
        if let Some(Err(why)) = project.as_ref().map(PinnedDir::check) {
            return Err(TurnFailure::new(
                codes::PROJECT_UNAVAILABLE,
                format!("the project's folder was replaced during the turn: {why}"),
            ));
        }
        let exit = outcome?;
        if let Some(code) = refusal {
            return Err(TurnFailure::new(
                codes::UPSTREAM_REFUSED,
                format!(
                    "the model API refused the operator's key (HTTP {code}): check key_file of \
                     [runnerd.providers.{}]",
                    provider.name
                ),
            ));
        }
        match exit.failure {
            None if exit.status.success() || exit.finished => Ok(exit.status.code()),
            failure => Err(TurnFailure::new(
                codes::CLI_FAILED,
                format!(
                    "{}{}",
                    failure.unwrap_or_else(|| format!(
                        "{} exited with {} before the turn ended",
                        provider.name, exit.status
                    )),
                    tail_sentence(&exit.stderr)
                ),
            )),
        }
    }

    /// Opens the project's folder (one name under the documents root, never a symlink) and
    /// pins it for the turn's grants; refuses a project the guard blocks whole.
    fn pin_project(&self, project: &str, guard: &ResolvedGuard) -> Result<PinnedDir, TurnFailure> {
        if guard.root_blocked() {
            return Err(TurnFailure::new(
                codes::PROJECT_UNAVAILABLE,
                "the project is blocked for this person",
            ));
        }
        let path = self.paths.documents_root.join(project);
        PinnedDir::open(&path).map_err(|e| {
            TurnFailure::new(
                codes::PROJECT_UNAVAILABLE,
                format!(
                    "the project's folder {} cannot be opened: {e}",
                    path.display()
                ),
            )
        })
    }

    /// The turn's bridge, when runnerd has the binary: a capability on the endpoint, and for a
    /// server-mode turn the sandbox its shell commands run in — the turn's own policy (same
    /// pinned grants, exclusions and denied paths, so the same mode) with the project as cwd,
    /// no runtime and no CLI install: the cwd grants nothing by itself, Run stays read-only. A
    /// turn in a laptop folder (no `project`) runs no command here: agentd sends them all.
    #[allow(clippy::too_many_arguments)]
    fn open_bridge(
        &self,
        turn_id: &str,
        request: &TurnRequest,
        cancel: &CancellationToken,
        events: &Events,
        policy: &SandboxPolicy,
        project: Option<&PinnedDir>,
        write_pins: &[PinnedDir],
    ) -> Option<bridge::endpoint::BridgeCapability> {
        self.bridge.command()?;
        let shell = project.map(|project| self.shell_sandbox(policy, project, write_pins));
        Some(self.bridge.endpoint.open_turn(TurnBridge {
            turn_id: turn_id.to_owned(),
            mode: request.mode,
            events: events.0.clone(),
            cancel: cancel.clone(),
            shell,
            laptop: request.laptop,
            // Listed to the bridge; their calls go to agentd, which checks them again.
            tools: request.tools.clone(),
        }))
    }

    /// A server-mode turn's shell: the turn's policy with the project as cwd.
    fn shell_sandbox(
        &self,
        policy: &SandboxPolicy,
        project: &PinnedDir,
        write_pins: &[PinnedDir],
    ) -> ShellSandbox {
        let mut shell_policy = policy.clone();
        shell_policy.cwd = project.path().to_path_buf();
        shell_policy.read_write = Vec::new();
        shell_policy.read_only = Vec::new();
        let mut pins = vec![project.clone()];
        pins.extend(write_pins.iter().cloned());
        ShellSandbox {
            launcher: self.launcher.clone(),
            limits: self.limits.clone(),
            policy: shell_policy,
            scratch_root: self.bridge.scratch_root.clone(),
            pins,
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
                ("LANG".into(), "C.UTF-8".into()),
            ],
        }
    }

    /// The sandbox of a turn: the runtime read/write (the CLI's cwd and home), the CLI's
    /// install directory read-only, the project through its pinned descriptor — read-only in
    /// Run mode; in Builder mode its write grants writable, with blocked, read-only and
    /// protected paths excluded — and the denied paths. A turn in a laptop folder (`project`
    /// `None`) gets no project at all.
    fn policy(
        &self,
        project: Option<&PinnedDir>,
        guard: &ResolvedGuard,
        mode: Mode,
        runtime: &runtime::Runtime,
        executable: &Path,
    ) -> Result<(SandboxPolicy, Vec<PinnedDir>), TurnFailure> {
        let (pinned, pins, blocked, read_only_within) = match project {
            Some(project) => project_grants(project, guard, mode)?,
            None => Default::default(),
        };
        // The CLI's own install: where npm put it, the binary and what lies beside it.
        let install = executable
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/usr/bin"));
        let policy = SandboxPolicy {
            pinned,
            read_write: vec![runtime.dir.clone()],
            read_only: vec![install],
            read_only_if_present: Vec::new(),
            blocked,
            read_only_within,
            denied: self.paths.denied.clone(),
            scratch: runtime.tmp.clone(),
            cwd: runtime.dir.clone(),
            limits: Default::default(),
            overmount_exclusions: self.overmount,
            private_terminals: true,
        };
        // The write grants' descriptors must stay open until the launcher has started: the
        // policy holds only their numbers, so the caller keeps the pins.
        Ok((policy, pins))
    }

    /// Runs the CLI to its end: the prompt on stdin (or in ACP's `session/prompt`), its
    /// stdout's events forwarded, its stderr's tail kept; ends its tree on cancel or timeout.
    async fn run_cli(
        &self,
        command: &SandboxCommand,
        conversation: Conversation,
        prompt: &str,
        cancel: &CancellationToken,
        events: &Events,
    ) -> Result<CliExit, TurnFailure> {
        let mut child = command.spawn(&self.launcher).map_err(|e| {
            TurnFailure::new(codes::CLI_FAILED, format!("cannot start the CLI: {e}"))
        })?;
        let stderr = StderrTail::start(&mut child);
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut parser = match conversation {
            Conversation::PromptOnStdin(parser) => parser,
            Conversation::Acp(session) => {
                return self
                    .run_acp(child, stderr, &session, prompt, cancel, events, deadline)
                    .await;
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            let prompt = prompt.as_bytes().to_vec();
            tokio::spawn(async move {
                let _ = stdin.write_all(&prompt).await;
                let _ = stdin.shutdown().await;
            });
        }
        let stdout = child.stdout.take();
        let mut failure: Option<String> = None;
        let read_events = async {
            if let Some(stdout) = stdout {
                let mut reader = tokio::io::BufReader::new(stdout);
                let mut line = Vec::new();
                // Each line bounded (a longer one is read to its end and dropped) and read as
                // lossy UTF-8: a line the CLI garbles never stops the reading, so the CLI
                // never blocks on a full pipe.
                while let Ok(Some(long)) = read_line(&mut reader, &mut line, MAX_EVENT_LINE).await {
                    if !long {
                        for event in parser.line(&String::from_utf8_lossy(&line)) {
                            forward(events, event, &mut failure);
                        }
                    }
                }
            }
        };
        let ended = tokio::select! {
            _ = read_events => None,
            _ = cancel.cancelled() => Some(TurnFailure::new(codes::CANCELLED, "the turn was stopped")),
            _ = tokio::time::sleep_until(deadline) => Some(self.timed_out()),
        };
        let status = match ended {
            Some(failure) => {
                let _ = child.kill_tree().await;
                return Err(failure);
            }
            None => tokio::select! {
                status = child.wait() => status,
                _ = cancel.cancelled() => {
                    let _ = child.kill_tree().await;
                    return Err(TurnFailure::new(codes::CANCELLED, "the turn was stopped"));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let _ = child.kill_tree().await;
                    return Err(self.timed_out());
                }
            },
        };
        let status = status.map_err(|e| {
            TurnFailure::new(codes::CLI_FAILED, format!("cannot wait for the CLI: {e}"))
        })?;
        let stderr = stderr.finish().await;
        for event in parser.finish(status.code()) {
            forward(events, event, &mut failure);
        }
        Ok(CliExit {
            status,
            stderr,
            failure,
            finished: false,
        })
    }

    /// Runs an ACP agent's turn ([`acp::converse`] on its stdout and stdin) to the prompt's
    /// answer, then closes its stdin and gives it [`ACP_EXIT_GRACE`] to exit before its tree
    /// is ended. Stop sends `session/cancel` first ([`acp::CANCEL_GRACE`]), then ends the tree.
    #[allow(clippy::too_many_arguments)]
    async fn run_acp(
        &self,
        mut child: agentworks_sandbox::process::SandboxedChild,
        stderr: StderrTail,
        session: &acp::AcpSession,
        prompt: &str,
        cancel: &CancellationToken,
        events: &Events,
        deadline: tokio::time::Instant,
    ) -> Result<CliExit, TurnFailure> {
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill_tree().await;
            return Err(TurnFailure::new(
                codes::INTERNAL,
                "the CLI was started without its stdin and stdout pipes",
            ));
        };
        let mut failure: Option<String> = None;
        let outcome = {
            let mut emit = |event: TurnEvent| forward(events, event, &mut failure);
            // The agent's stdin is dropped with the conversation: the end of its input.
            let talk = acp::converse(
                tokio::io::BufReader::new(stdout),
                stdin,
                session,
                prompt,
                cancel,
                &mut emit,
            );
            tokio::select! {
                outcome = talk => Some(outcome),
                _ = tokio::time::sleep_until(deadline) => None,
            }
        };
        let finished = match outcome {
            None => {
                let _ = child.kill_tree().await;
                return Err(self.timed_out());
            }
            Some(Err(acp::AcpError::Cancelled)) => {
                let _ = child.kill_tree().await;
                return Err(TurnFailure::new(codes::CANCELLED, "the turn was stopped"));
            }
            Some(Err(e)) => {
                failure.get_or_insert(format!("the ACP agent failed: {e}"));
                false
            }
            Some(Ok(())) => true,
        };
        let status = match tokio::time::timeout(ACP_EXIT_GRACE, child.wait()).await {
            Ok(status) => status,
            // Still running after its input ended: the turn is over all the same.
            Err(_) => child.kill_tree().await,
        }
        .map_err(|e| {
            TurnFailure::new(codes::CLI_FAILED, format!("cannot wait for the CLI: {e}"))
        })?;
        Ok(CliExit {
            status,
            stderr: stderr.finish().await,
            failure,
            finished,
        })
    }

    fn timed_out(&self) -> TurnFailure {
        TurnFailure::new(
            codes::TIMEOUT,
            format!(
                "the turn ran longer than {} s ([runnerd] turn_timeout_secs)",
                self.timeout.as_secs()
            ),
        )
    }
}

/// How long an ACP agent has to exit once its turn is answered and its input closed.
const ACP_EXIT_GRACE: Duration = Duration::from_secs(5);

/// Sends one of the CLI's events on: its usage is dropped (the gateway's count is the turn's,
/// sent at the end), its own failure kept to end the turn after its exit (the last event).
fn forward(events: &Events, event: TurnEvent, failure: &mut Option<String>) {
    match event {
        TurnEvent::Usage { .. } => {}
        TurnEvent::Error { message, .. } => {
            failure.get_or_insert(message);
        }
        other => events.send(&other),
    }
}

/// The last [`STDERR_TAIL`] bytes of the CLI's stderr, copied as it writes them.
struct StderrTail {
    tail: Arc<Mutex<Vec<u8>>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl StderrTail {
    fn start(child: &mut agentworks_sandbox::process::SandboxedChild) -> StderrTail {
        let tail = Arc::new(Mutex::new(Vec::<u8>::new()));
        let reader = child.stderr.take().map(|mut stderr| {
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                    tail.extend_from_slice(&buf[..n]);
                    let excess = tail.len().saturating_sub(STDERR_TAIL);
                    tail.drain(..excess);
                }
            })
        });
        StderrTail { tail, reader }
    }

    /// The tail, once the reader has copied the last bytes: the launcher has ended the tree,
    /// so the pipe closes; a second at most.
    async fn finish(self) -> String {
        if let Some(reader) = self.reader {
            let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
        }
        let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&tail).into_owned()
    }
}

/// What a server-mode turn's sandbox gets of its project: the pinned grants (the project
/// read-only, or writable where Builder's write grants say), the descriptors of the write
/// grants' folders (kept open until the launcher has started), the blocked folders, and what
/// stays read-only within writable ones.
#[allow(clippy::type_complexity)]
fn project_grants(
    project: &PinnedDir,
    guard: &ResolvedGuard,
    mode: Mode,
) -> Result<
    (
        Vec<agentworks_sandbox::PinnedGrant>,
        Vec<PinnedDir>,
        Vec<PathBuf>,
        Vec<PathBuf>,
    ),
    TurnFailure,
> {
    let root = project.path();
    let at = |rel: &Option<RelPath>| match rel {
        None => root.to_path_buf(),
        Some(rel) => root.join(rel.as_str()),
    };
    let mut pinned = Vec::new();
    let mut blocked: Vec<PathBuf> = guard.blocked_folders().iter().map(at).collect();
    let mut read_only_within = Vec::new();
    let whole_writable = mode == Mode::Builder && guard.write_folders().iter().any(Option::is_none);
    if whole_writable {
        pinned.push(project.grant(PinnedAccess::ReadWrite));
    } else {
        pinned.push(project.grant(PinnedAccess::ReadOnly));
    }
    let mut pins = Vec::new();
    if mode == Mode::Builder && !whole_writable {
        for folder in guard.write_folders().iter().flatten() {
            let path = root.join(folder.as_str());
            // A grant whose folder does not exist yet (or is a file) grants nothing here.
            match std::fs::canonicalize(&path) {
                Ok(canonical) if canonical.starts_with(root) && canonical.is_dir() => {
                    let pin = PinnedDir::open(&canonical).map_err(|e| {
                        TurnFailure::new(
                            codes::PROJECT_UNAVAILABLE,
                            format!("cannot open the write grant {}: {e}", path.display()),
                        )
                    })?;
                    pinned.push(pin.grant(PinnedAccess::ReadWrite));
                    pins.push(pin);
                }
                _ => continue,
            }
        }
    }
    if mode == Mode::Builder {
        read_only_within.extend(guard.no_write_folders().iter().map(at));
        read_only_within.extend(protected_files(root));
    }
    blocked.retain(|b| b != root);
    Ok((pinned, pins, blocked, read_only_within))
}

/// Refuses a project name that is not one folder name under the documents root: it names the
/// runtime (and, in server mode, the folder pinned).
fn check_project_name(project: &str) -> Result<(), TurnFailure> {
    let one_name =
        !project.is_empty() && project != "." && project != ".." && !project.contains(['/', '\0']);
    if one_name {
        Ok(())
    } else {
        Err(TurnFailure::new(
            codes::PROJECT_UNAVAILABLE,
            format!("{project:?} is not a project's folder name"),
        ))
    }
}

/// The longest line of the CLI's event stream kept (a tool's output is bounded far below).
const MAX_EVENT_LINE: usize = 4 * 1024 * 1024;

/// How the CLI ended: its status, its stderr's tail, and the failure its own stream reported.
struct CliExit {
    status: std::process::ExitStatus,
    stderr: String,
    failure: Option<String>,
    /// Its protocol ended the turn (ACP's answer to the prompt): how it then exited (or was
    /// ended) does not make the turn a failure.
    finished: bool,
}

/// `": <its last lines>"` of a CLI's stderr, or nothing when it printed nothing.
fn tail_sentence(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let last = &lines[lines.len().saturating_sub(5)..];
    format!("; its last words: {}", last.join(" / "))
}

/// The protected files (`workflow.json`, `product.json`) that exist below `root`, found
/// without following symlinks. Only existing ones: an exclusion of a path that does not exist
/// is carved out by the rule walk, which takes file creation from every folder on its way (the
/// project's root, for these); a protected file the CLI creates natively is an unmanaged edit
/// like any other, which workspaced still never writes.
fn protected_files(root: &Path) -> Vec<PathBuf> {
    use agentworks_core::guard::PROTECTED_FILE_NAMES;
    let mut found: Vec<PathBuf> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    let mut visited = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            visited += 1;
            if visited > PROTECTED_WALK_LIMIT {
                return found;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            let name = entry.file_name();
            if kind.is_dir() {
                stack.push(path);
            } else if PROTECTED_FILE_NAMES.iter().any(|n| name == *n) && !found.contains(&path) {
                found.push(path);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::MAX_EVENT_LINE;
    use crate::bridge::mcp::read_line;

    #[tokio::test]
    async fn event_lines_are_bounded_and_a_garbled_one_does_not_stop_the_reading() {
        let mut input = Vec::new();
        input.extend_from_slice(b"first\n");
        input.extend(std::iter::repeat_n(b'x', MAX_EVENT_LINE + 10));
        input.extend_from_slice(b"\n\xff\xfe garbled\nlast");
        let mut reader = tokio::io::BufReader::with_capacity(4096, input.as_slice());
        let mut line = Vec::new();
        let mut seen = Vec::new();
        while let Some(long) = read_line(&mut reader, &mut line, MAX_EVENT_LINE)
            .await
            .expect("a slice reads")
        {
            seen.push((long, String::from_utf8_lossy(&line).into_owned()));
        }
        assert_eq!(
            seen,
            [
                (false, "first".to_owned()),
                (true, String::new()),
                (false, "\u{fffd}\u{fffd} garbled".to_owned()),
                (false, "last".to_owned()),
            ]
        );
    }
}
