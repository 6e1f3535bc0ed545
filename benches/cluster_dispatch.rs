//! gatewayd as a cluster (issue 16): many light executors spread over four gatewayd hosts on one
//! PostgreSQL and one nats-server, measured for memory per connection, for dispatch latency
//! routed through NATS against a same-host dispatch, and for failover when a host dies.
//!
//! The servers: a private PostgreSQL and `nats-server` (Debian's packages, started as the
//! integration suite starts them), one workspaced + agentd (tokens), and gatewayd hosts `gw-1`
//! to `gw-4` on the one database, with `heartbeat_secs = 1` (a lease lasts 3 s unless renewed)
//! and connection limits raised for the run. All four have the integration suite's config and
//! starters (`tests/suite/harness`, included here whole with `#[path]`).
//!
//! The executors: N light clients in this one process (tokio-tungstenite tasks on a two-thread
//! runtime), executor `i` connecting to host `i mod 4`, as one of up to 100 users (a
//! `devices:connect` token each; every executor its own device name, so its own device). Each
//! says hello, answers a request with `accepted` and a completed result whose stdout is the
//! command, answers pings, and, when its connection is lost, dials the next host as the laptop
//! does: at once after a session that served (welcomed and up at least 1 s), else after the
//! backoff (1 s and up to a quarter more, doubling); the next host is `(h + 1 + i mod 3) mod
//! 4`, so a dead host's devices spread over the other three. At most 64 dials are under way
//! at once.
//!
//! 1. Connect: the time until every executor has its welcome.
//! 2. Memory: each gatewayd's VmRSS after start and with its quarter of the executors
//!    connected (after 3 s of heartbeats), and the difference per connection; this process's
//!    own (the clients') the same way.
//! 3. Latency: `execute_shell_command` dispatches (`echo <k>`, a fresh request id each), three
//!    routes interleaved so they share the load: on gw-1's `gatewayd.sock` to a device on gw-1
//!    (same host, as agentd on one host dispatches), through NATS to a device on gw-2..4 (as
//!    agentd in a cluster dispatches, with its own client, `GatewaydClient`: `/v1/watch` on any
//!    host finds the holder from the lease, then `/v1/dispatch` on the holder's subject, which
//!    sends the frame), and to a device on gw-2..4 through that host's own socket (what the
//!    call costs on the holder). First one in flight, then 16. The headline is the ratio
//!    through NATS / same host. After the failover, for scale: agentd's `device_offline`
//!    answer for a device with no lease (its `/v1/watch` and `/v1/locate`), the lookups a
//!    dispatch makes before it calls the holder.
//! 4. Failover: gw-4 gets SIGKILL. A few of its executors (probes) do not reconnect: every
//!    20 ms agentd's client dispatches to one of them (each on its own, so one that waits does
//!    not hold up the next) until one answers `device_offline`, and every 20 ms gw-1's device
//!    list is read until it shows a probe offline (its lease expired); the table
//!    gives each answer the probes got, when it first came and the longest wait for it. The
//!    others reconnect: the time until 50/99/100% of them are welcomed again on gw-1..3, and
//!    until 99/100% of one in five of them have answered a dispatch of agentd's client
//!    (checking all would time this process's dispatch throughput instead).
//!
//! A benchmark: nothing is asserted about timings; it exits non-zero only when something does
//! not run (a server, an executor that cannot connect, a dispatch that fails outside the
//! failover). Run: `cargo bench --bench cluster_dispatch` (optionally `-- 2000` for fewer
//! executors; default 10,000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The integration suite's harness, whole (it compiles on its own, and a piece of it would need
// its neighbours): PostgreSQL, nats-server, the stack and the gatewayd hosts. This benchmark
// uses a part of it; the rest, and the re-exports of the rest, are unused here.
#[allow(dead_code, unused_imports)]
#[path = "../tests/suite/harness/mod.rs"]
mod harness;
#[path = "common/measure.rs"]
mod measure;

use agentworks_agent::clients::gatewayd::GatewaydClient;
use agentworks_contract::executor::{
    ExecutorFrame, FolderAccess, FolderInfo, GatewayFrame, Operation, Outcome,
};
use agentworks_support::unix_http::UnixClient;
use futures_util::{SinkExt, StreamExt};
use measure::{Stats, ms, percentile, rss_kib, stats};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;

/// Executors connected when no count is given.
const DEFAULT_EXECUTORS: usize = 10_000;
const GATEWAYS: usize = 4;
/// Users (one `devices:connect` token each) the executors belong to.
const USERS: usize = 100;
/// Dials under way at once, from this one client process.
const DIAL_CONCURRENCY: usize = 64;
/// Dispatches in flight in the loaded latency round.
const IN_FLIGHT: usize = 16;
/// Dispatches in flight at most in the failover's checks: enough that a check waits for gw-1,
/// not for a free slot here.
const CHECKS_IN_FLIGHT: usize = 64;
/// Timed dispatches per route: one in flight, then [`IN_FLIGHT`].
const SEQUENTIAL: usize = 300;
const LOADED: usize = 2000;
/// Untimed dispatches per route before each round.
const WARMUP: usize = 30;
/// gw-4's executors that stay down after the kill (probes for `device_offline`).
const PROBES: usize = 10;
/// One in this many of gw-4's reconnecting executors is checked with dispatches after its
/// welcome: checking them all would time this process's dispatch throughput instead.
const CHECK_EVERY: usize = 5;
/// As the laptop waits after a failed dial (crates/laptop/src/connect.rs): 1 s and a random
/// quarter more, doubling per failed dial up to 30 s.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// As the laptop's: a session welcomed and up this long has served, and its loss is redialled
/// at once.
const SERVED_AFTER: Duration = BACKOFF_START;
/// How long the connect phase and the failover may take before the run gives up.
const CONNECT_WITHIN: Duration = Duration::from_secs(300);
const FAILOVER_WITHIN: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// The cluster.

/// The servers and daemons. Fields drop in order: the gatewayd hosts, agentd and workspaced,
/// then the servers they use.
struct Cluster {
    gateways: Vec<harness::Gatewayd>,
    stack: harness::Stack,
    nats: harness::Nats,
    postgres: harness::Postgres,
}

impl Cluster {
    /// PostgreSQL, nats-server, workspaced + agentd, and gw-1..gw-4, each taking up to
    /// `connections` executor connections (all from 127.0.0.1).
    fn start(connections: usize) -> Cluster {
        let postgres = harness::Postgres::start();
        let nats = harness::Nats::start();
        let (stack, port_1) = harness::Stack::start_with_embedded_gateway();
        let path = stack.state.root().join("agentworks.toml");
        let config = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            format!(
                "{config}heartbeat_secs = 1\nmax_connections = {connections}\n\
                 max_connections_per_address = {connections}\n\
                 [cluster]\ndatabase_url = \"{}\"\nnats_url = \"{}\"\nhost_id = \"gw-1\"\n",
                postgres.url(),
                nats.url()
            ),
        )
        .unwrap();
        let mut gateways = vec![harness::Gatewayd::start(&stack, port_1)];
        for k in 2..=GATEWAYS {
            gateways.push(harness::start_gatewayd_host(
                &stack,
                port_1,
                harness::free_port(),
                &format!("gatewayd-{k}"),
                &[("host_id = \"gw-1\"", &format!("host_id = \"gw-{k}\""))],
            ));
        }
        Cluster {
            gateways,
            stack,
            nats,
            postgres,
        }
    }

    /// What agentd in a cluster dispatches with: its gatewayd client over NATS, as host
    /// `agentd-1`, with the cluster's gatewayd key.
    async fn agentd(&self) -> Dispatcher {
        let client = async_nats::connect(self.nats.url()).await.unwrap();
        let cluster = agentworks_daemon::config::ClusterConfig {
            database_url: Some(self.postgres.url()),
            ..Default::default()
        };
        let key = agentworks_daemon::bus::cluster_key(
            &cluster,
            "agentworks-agentd",
            agentworks_contract::cluster::GATEWAYD_KEY,
        )
        .await
        .unwrap();
        Dispatcher::Agentd(GatewaydClient::cluster(client, key, "agentd-1"))
    }

    fn ports(&self) -> Vec<u16> {
        self.gateways.iter().map(|g| g.port).collect()
    }

    fn clients(&self) -> Vec<UnixClient> {
        self.gateways
            .iter()
            .map(|g| UnixClient::new(&g.socket))
            .collect()
    }

    fn rss(&self) -> Vec<u64> {
        self.gateways
            .iter()
            .map(|g| rss_kib(g.child.id()).expect("a gatewayd's VmRSS"))
            .collect()
    }
}

/// Connected executors per host, from each live host's `/v1/health`.
async fn connected(clients: &[UnixClient]) -> Vec<Option<u64>> {
    let mut counts = Vec::with_capacity(clients.len());
    for client in clients {
        let health: Option<Value> = client.get("/v1/health").await.ok();
        counts.push(health.and_then(|h| h["connected"].as_u64()));
    }
    counts
}

// ---------------------------------------------------------------------------------------------
// The light executors.

/// Who one simulated executor is.
struct Sim {
    index: usize,
    token: Arc<str>,
    name: String,
    /// The host it dials first.
    home: usize,
    /// Whether it dials another host when its connection is lost.
    reconnects: bool,
}

/// What the executors tell the benchmark.
enum Event {
    Welcomed {
        index: usize,
        gateway: usize,
        device_id: String,
        at: Instant,
    },
    /// A welcomed connection ended (not at the benchmark's stop).
    Lost,
    /// A dial that did not end in a welcome.
    Failed { gateway: usize, why: String },
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn text(frame: &ExecutorFrame) -> Message {
    Message::text(serde_json::to_string(frame).unwrap())
}

/// Dial `port`, say hello, wait for the welcome: the connection and the device id.
async fn open(port: u16, sim: &Sim) -> Result<(Ws, String), String> {
    let mut request = format!("ws://127.0.0.1:{port}/v1/executor")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", sim.token).parse().unwrap(),
    );
    // A small read buffer: this process holds every client (tungstenite reserves 128 KiB).
    let config = WebSocketConfig::default().read_buffer_size(8 * 1024);
    let dial = tokio_tungstenite::connect_async_with_config(request, Some(config), false);
    let (mut ws, _) = tokio::time::timeout(Duration::from_secs(20), dial)
        .await
        .map_err(|_| "no upgrade within 20 s".to_owned())?
        .map_err(|e| format!("cannot connect: {e}"))?;
    let hello = ExecutorFrame::Hello {
        device_name: sim.name.clone(),
        version: "bench".to_owned(),
        folders: vec![FolderInfo {
            alias: "proj".to_owned(),
            access: FolderAccess::ReadWrite,
            downloads: false,
        }],
    };
    ws.send(text(&hello))
        .await
        .map_err(|e| format!("cannot send the hello: {e}"))?;
    let welcome = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<GatewayFrame>(&t) {
                    Ok(GatewayFrame::Welcome { device_id, .. }) => return Ok(device_id),
                    other => return Err(format!("expected a welcome, got {other:?}")),
                },
                Some(Ok(Message::Close(frame))) => return Err(format!("closed: {frame:?}")),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("disconnected before the welcome".to_owned()),
            }
        }
    };
    let device_id = tokio::time::timeout(Duration::from_secs(20), welcome)
        .await
        .map_err(|_| "no welcome within 20 s".to_owned())??;
    Ok((ws, device_id))
}

/// Serve one connection until it ends (false) or the benchmark stops (true): a request is
/// accepted and answered at once with its command as stdout; pings are answered by
/// tungstenite while the stream is read.
async fn serve(ws: &mut Ws, stop: &CancellationToken) -> bool {
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return true,
            message = ws.next() => message,
        };
        match message {
            Some(Ok(Message::Text(t))) => {
                let Ok(GatewayFrame::Request {
                    request_id,
                    operation,
                    ..
                }) = serde_json::from_str::<GatewayFrame>(&t)
                else {
                    continue; // a cancel or a receipt query: nothing runs here to cancel or ask
                };
                let stdout = match operation {
                    Operation::ExecuteShellCommand { command, .. } => command,
                    Operation::DiffPatchWorkspaceFile { filepath, .. } => filepath,
                };
                let accepted = ExecutorFrame::Accepted {
                    request_id: request_id.clone(),
                };
                let result = ExecutorFrame::Result {
                    request_id,
                    outcome: Outcome::Completed {
                        stdout,
                        stderr: String::new(),
                        exit_code: Some(0),
                        stdout_truncated: false,
                        stderr_truncated: false,
                        timed_out: false,
                        cancelled: false,
                        undone: Vec::new(),
                    },
                };
                if ws.feed(text(&accepted)).await.is_err() || ws.send(text(&result)).await.is_err()
                {
                    return false;
                }
            }
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return false,
            Some(Ok(_)) => {}
        }
    }
}

/// One executor until the benchmark stops: dial (at most [`DIAL_CONCURRENCY`] at once across
/// all executors), serve, and dial the next host: at once after a session that served, after
/// the backoff after a failed dial or a session lost before it served.
async fn run_executor(
    sim: Sim,
    ports: Arc<[u16]>,
    dials: Arc<Semaphore>,
    events: mpsc::UnboundedSender<Event>,
    stop: CancellationToken,
) {
    let mut gateway = sim.home;
    let mut backoff = BACKOFF_START;
    loop {
        let opened = {
            let _permit = dials.acquire().await.unwrap();
            tokio::select! {
                () = stop.cancelled() => return,
                opened = open(ports[gateway], &sim) => opened,
            }
        };
        let served = match opened {
            Ok((mut ws, device_id)) => {
                let at = Instant::now();
                let _ = events.send(Event::Welcomed {
                    index: sim.index,
                    gateway,
                    device_id,
                    at,
                });
                if serve(&mut ws, &stop).await {
                    return;
                }
                let _ = events.send(Event::Lost);
                if !sim.reconnects {
                    return;
                }
                at.elapsed() >= SERVED_AFTER
            }
            Err(why) => {
                let _ = events.send(Event::Failed { gateway, why });
                false
            }
        };
        gateway = (gateway + 1 + sim.index % (GATEWAYS - 1)) % GATEWAYS;
        if served {
            backoff = BACKOFF_START;
            continue;
        }
        let millis = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX);
        let jitter = Duration::from_millis(rand::random::<u64>() % (millis / 4 + 1));
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff + jitter) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// A connected executor's device, as a dispatch names it.
#[derive(Clone)]
struct Device {
    user_id: Arc<str>,
    device_id: String,
    gateway: usize,
}

// ---------------------------------------------------------------------------------------------
// Dispatches.

/// Who dispatches: a gatewayd's socket, or agentd's client over NATS.
#[derive(Clone)]
enum Dispatcher {
    Socket(UnixClient),
    Agentd(GatewaydClient),
}

/// One `echo` dispatch: `Ok` when it completed with the command as stdout; else the error code
/// gatewayd answered (or a description of what else went wrong).
async fn dispatch(
    dispatcher: &Dispatcher,
    device: &Device,
    request_id: &str,
    command: &str,
) -> Result<(), String> {
    let body = json!({
        "user_id": &*device.user_id, "device_id": device.device_id, "folder": "proj",
        "request_id": request_id,
        "operation": {"kind": "execute_shell_command", "command": command, "timeout": 10}
    });
    let answer = match dispatcher {
        Dispatcher::Socket(client) => client.post::<_, Value>("/v1/dispatch", &body).await,
        Dispatcher::Agentd(client) => {
            let request = serde_json::from_value(body).unwrap();
            (client.dispatch(&request).await).map(|state| serde_json::to_value(state).unwrap())
        }
    };
    match answer {
        Ok(answer)
            if answer["state"] == "done"
                && answer["outcome"]["status"] == "completed"
                && answer["outcome"]["stdout"] == command =>
        {
            Ok(())
        }
        Ok(answer) => Err(format!("unexpected answer {answer}")),
        Err(e) => Err(e.remote_code().map_or_else(|| e.to_string(), str::to_owned)),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Route {
    /// gw-1's socket, a device on gw-1.
    SameHost,
    /// agentd's client over NATS, a device on gw-2..4.
    Routed,
    /// A device on gw-2..4, through its own host's socket.
    HolderSocket,
}

const ROUTES: [Route; 3] = [Route::SameHost, Route::Routed, Route::HolderSocket];

impl Route {
    fn label(self) -> &'static str {
        match self {
            Route::SameHost => "same host: gw-1.sock -> device on gw-1",
            Route::Routed => "through NATS: agentd -> NATS -> device on gw-2..4",
            Route::HolderSocket => "holder's socket: gw-k.sock -> device on gw-k (k=2..4)",
        }
    }
}

/// `per_route` dispatches of each route, interleaved, `in_flight` at a time; their latencies
/// by route. Panics on a failed dispatch.
async fn latency_round(
    name: &str,
    clients: &[Dispatcher],
    agentd: &Dispatcher,
    on_gw1: &[Device],
    elsewhere: &[Device],
    per_route: usize,
    in_flight: usize,
) -> BTreeMap<Route, Vec<Duration>> {
    // A stride prime to the list lengths in practice, so consecutive dispatches of a route
    // reach different devices.
    const STRIDE: usize = 7919;
    let jobs = (0..per_route * ROUTES.len()).map(|k| {
        let route = ROUTES[k % ROUTES.len()];
        let list = if route == Route::SameHost {
            on_gw1
        } else {
            elsewhere
        };
        let device = list[(k / ROUTES.len() * STRIDE + k) % list.len()].clone();
        let client = match route {
            Route::SameHost => &clients[0],
            Route::Routed => agentd,
            Route::HolderSocket => &clients[device.gateway],
        };
        async move {
            let (request_id, command) = (format!("{name}-{k}"), format!("echo {k}"));
            let started = Instant::now();
            if let Err(e) = dispatch(client, &device, &request_id, &command).await {
                panic!("{route:?} dispatch {request_id} failed: {e}");
            }
            (route, started.elapsed())
        }
    });
    let mut samples: BTreeMap<Route, Vec<Duration>> = BTreeMap::new();
    let mut done = futures_util::stream::iter(jobs).buffer_unordered(in_flight);
    while let Some((route, took)) = done.next().await {
        samples.entry(route).or_default().push(took);
    }
    samples
}

/// `count` dispatches of agentd's, one at a time, to devices with no connection and no lease:
/// each answers `device_offline` after two calls to any gatewayd (`/v1/watch`: no lease, so
/// `/v1/locate`, which refuses it). Panics on another answer.
async fn offline_round(client: &Dispatcher, offline: &[Device], count: usize) -> Stats {
    let mut samples = Vec::with_capacity(count);
    for k in 0..WARMUP + count {
        let device = &offline[k % offline.len()];
        let started = Instant::now();
        let answer = dispatch(client, device, &format!("offline-{k}"), "echo offline").await;
        let took = started.elapsed();
        assert_eq!(
            answer,
            Err("device_offline".to_owned()),
            "offline dispatch {k}"
        );
        if k >= WARMUP {
            samples.push(took);
        }
    }
    stats(samples)
}

// ---------------------------------------------------------------------------------------------
// Failover.

struct Failover {
    /// gw-4's devices when it was killed: those that reconnect, and the probes.
    movers: usize,
    probes: usize,
    /// The probe dispatches by answer.
    probe_answers: BTreeMap<String, ProbeAnswers>,
    /// When gw-1 first listed a probe device offline.
    listed_offline: Option<Duration>,
    /// After the kill, when each mover was welcomed again, and when a dispatch through gw-1
    /// first reached each checked one (one in [`CHECK_EVERY`]).
    welcomed: Vec<Duration>,
    checked: usize,
    dispatchable: Vec<Duration>,
    /// Failed checking dispatches, by answer.
    check_failures: BTreeMap<String, usize>,
    /// Connected executors per host after the failover.
    connected_after: Vec<Option<u64>>,
}

/// The probe dispatches that got one answer.
#[derive(Debug)]
struct ProbeAnswers {
    count: usize,
    /// After the kill: when the first of them was sent, and when the first was answered.
    first_sent: Duration,
    first_answered: Duration,
    /// The longest any of them waited for its answer.
    longest: Duration,
}

/// Two loops, every 20 ms each, until [`FAILOVER_WITHIN`] after the kill: a dispatch of agentd
/// to one of the probes, each on its own (one that waits holds up neither the next nor the
/// other loop), until one has answered `device_offline`; and gw-1's device list, until it
/// shows a probe offline. Then the dispatches still out are awaited, until the same deadline.
/// The answers, and when gw-1 listed a probe offline.
async fn probe_offline(
    client: &Dispatcher,
    gw1: &UnixClient,
    probes: &[Device],
    killed: Instant,
) -> (BTreeMap<String, ProbeAnswers>, Option<Duration>) {
    let answers = Arc::new(Mutex::new(BTreeMap::<String, ProbeAnswers>::new()));
    let mut sent = tokio::task::JoinSet::new();
    let dispatching = async {
        for k in 0.. {
            if answers.lock().unwrap().contains_key("device_offline")
                || killed.elapsed() > FAILOVER_WITHIN
            {
                break;
            }
            let device = probes[k % probes.len()].clone();
            let (sender, record) = (client.clone(), answers.clone());
            sent.spawn(async move {
                let sent_at = killed.elapsed();
                let answer = dispatch(&sender, &device, &format!("probe-{k}"), "echo probe")
                    .await
                    .err()
                    .unwrap_or_else(|| "done".to_owned());
                let answered = killed.elapsed();
                let mut answers = record.lock().unwrap();
                let entry = answers.entry(answer).or_insert(ProbeAnswers {
                    count: 0,
                    first_sent: sent_at,
                    first_answered: answered,
                    longest: Duration::ZERO,
                });
                entry.count += 1;
                entry.first_sent = entry.first_sent.min(sent_at);
                entry.first_answered = entry.first_answered.min(answered);
                entry.longest = entry.longest.max(answered - sent_at);
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let listing = async {
        for k in 0.. {
            let device = &probes[k % probes.len()];
            let listed: Value = gw1
                .post("/v1/devices", &json!({"user_id": &*device.user_id}))
                .await
                .unwrap();
            let online = listed.as_array().and_then(|ds| {
                ds.iter()
                    .find(|d| d["device_id"] == device.device_id.as_str())
                    .map(|d| d["online"] == true)
            });
            if online == Some(false) {
                return Some(killed.elapsed());
            }
            if killed.elapsed() > FAILOVER_WITHIN {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    };
    let ((), listed_offline) = tokio::join!(dispatching, listing);
    let deadline = tokio::time::Instant::from_std(killed + FAILOVER_WITHIN);
    while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, sent.join_next()).await {
        joined.unwrap();
    }
    let unanswered = sent.len();
    sent.abort_all();
    let mut answers = std::mem::take(&mut *answers.lock().unwrap());
    if unanswered > 0 {
        answers.insert(
            format!("(no answer within {} s)", FAILOVER_WITHIN.as_secs()),
            ProbeAnswers {
                count: unanswered,
                first_sent: Duration::ZERO,
                first_answered: FAILOVER_WITHIN,
                longest: FAILOVER_WITHIN,
            },
        );
    }
    (answers, listed_offline)
}

/// SIGKILL gw-4 and measure: see the module doc, step 4.
async fn failover(
    cluster: &mut Cluster,
    clients: &[UnixClient],
    agentd: &Dispatcher,
    devices: &[Option<Device>],
    probe_indices: &[usize],
    events: &mut mpsc::UnboundedReceiver<Event>,
) -> Failover {
    while events.try_recv().is_ok() {}
    let movers: Vec<usize> = (0..devices.len())
        .filter(|&i| devices[i].as_ref().unwrap().gateway == GATEWAYS - 1)
        .filter(|i| !probe_indices.contains(i))
        .collect();
    let checked: std::collections::HashSet<usize> =
        movers.iter().copied().step_by(CHECK_EVERY).collect();
    let probes: Vec<Device> = probe_indices
        .iter()
        .map(|&i| devices[i].clone().unwrap())
        .collect();
    let gw1 = agentd.clone();

    let killed = Instant::now();
    cluster.gateways[GATEWAYS - 1].child.kill().unwrap();

    let probing = tokio::spawn({
        let (agentd, gw1) = (gw1.clone(), clients[0].clone());
        async move { probe_offline(&agentd, &gw1, &probes, killed).await }
    });

    // Each checked mover, once welcomed, gets dispatches on gw-1 until one completes.
    let (check, checks) = mpsc::unbounded_channel::<usize>();
    let dispatchable = Arc::new(Mutex::new(Vec::new()));
    let check_failures = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let checking = tokio::spawn({
        let (dispatchable, check_failures) = (dispatchable.clone(), check_failures.clone());
        let devices: Vec<Option<Device>> = devices.to_vec();
        let checks = futures_util::stream::unfold(checks, |mut rx| async {
            rx.recv().await.map(|index| (index, rx))
        });
        checks.for_each_concurrent(CHECKS_IN_FLIGHT, move |index| {
            let (gw1, device) = (gw1.clone(), devices[index].clone().unwrap());
            let (dispatchable, check_failures) = (dispatchable.clone(), check_failures.clone());
            async move {
                for attempt in 0.. {
                    let request_id = format!("failover-{index}-{attempt}");
                    match dispatch(&gw1, &device, &request_id, "echo back").await {
                        Ok(()) => {
                            dispatchable.lock().unwrap().push(killed.elapsed());
                            return;
                        }
                        Err(code) => *check_failures.lock().unwrap().entry(code).or_default() += 1,
                    }
                    if killed.elapsed() > FAILOVER_WITHIN {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
    });

    let mut welcomed = Vec::with_capacity(movers.len());
    let mut waiting: std::collections::HashSet<usize> = movers.iter().copied().collect();
    let deadline = tokio::time::Instant::from_std(killed + FAILOVER_WITHIN);
    while !waiting.is_empty() {
        let event = match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) | Err(_) => break,
        };
        if let Event::Welcomed { index, at, .. } = event
            && waiting.remove(&index)
        {
            welcomed.push(at - killed);
            if checked.contains(&index) {
                let _ = check.send(index);
            }
        }
    }
    drop(check);
    checking.await.unwrap();
    let (probe_answers, listed_offline) = probing.await.unwrap();
    let connected_after = connected(clients).await;
    let dispatchable = std::mem::take(&mut *dispatchable.lock().unwrap());
    let check_failures = std::mem::take(&mut *check_failures.lock().unwrap());
    Failover {
        movers: movers.len(),
        probes: probe_indices.len(),
        probe_answers,
        listed_offline,
        welcomed,
        checked: checked.len(),
        dispatchable,
        check_failures,
        connected_after,
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

struct Memory {
    gateways_before: Vec<u64>,
    gateways_after: Vec<u64>,
    per_gateway: Vec<u64>,
    clients_before: u64,
    clients_after: u64,
}

struct Report {
    executors: usize,
    users: usize,
    nofile: u64,
    connect: Duration,
    connect_failures: BTreeMap<String, usize>,
    lost_while_idle: usize,
    memory: Memory,
    sequential: BTreeMap<Route, Stats>,
    loaded: BTreeMap<Route, Stats>,
    /// gw-1's answer for a device with no lease (after the failover: the probes).
    offline: Stats,
    failover: Failover,
}

fn main() {
    let executors: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(DEFAULT_EXECUTORS);
    assert!(
        executors >= 100,
        "at least 100 executors (25 per host), got {executors}"
    );
    // This process holds every client socket, and gw-1 up to about a third of them after the
    // failover; the daemons inherit the limit.
    let wanted = executors as u64 + 4096;
    let nofile = measure::raise_nofile(wanted);
    assert!(
        nofile >= executors as u64 + 1024,
        "RLIMIT_NOFILE is {nofile}: {executors} executors need about {} open files in this \
         process; raise the hard limit (ulimit -Hn) or run fewer (`-- <count>`)",
        executors + 1024
    );

    let mut cluster = Cluster::start(executors + 256);
    let users = USERS.min(executors);
    let per_user = executors.div_ceil(users);
    // (token, user id) of each user.
    let tokens: Vec<(Arc<str>, Arc<str>)> = (0..users)
        .map(|u| {
            let (token, _, user_id) = harness::device_token(
                &cluster.stack,
                &format!("user-{u:03}"),
                &["devices:connect"],
            );
            (token.into(), user_id.into())
        })
        .collect();
    let probe_stride = (executors / GATEWAYS / PROBES).max(1);
    let is_probe =
        |i: usize| i % GATEWAYS == GATEWAYS - 1 && (i / GATEWAYS).is_multiple_of(probe_stride);
    let probe_indices: Vec<usize> = (0..executors)
        .filter(|&i| is_probe(i))
        .take(PROBES)
        .collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = runtime.block_on(async {
        let sockets = cluster.clients();
        let clients: Vec<Dispatcher> = sockets.iter().cloned().map(Dispatcher::Socket).collect();
        let agentd = cluster.agentd().await;
        // Let the fresh daemons settle before the baseline.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let gateways_before = cluster.rss();
        let clients_before = rss_kib(std::process::id()).unwrap();

        // 1. Connect.
        let ports: Arc<[u16]> = cluster.ports().into();
        let dials = Arc::new(Semaphore::new(DIAL_CONCURRENCY));
        let (events_to, mut events) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let started = Instant::now();
        for i in 0..executors {
            let sim = Sim {
                index: i,
                token: tokens[i / per_user].0.clone(),
                name: format!("sim-{i:05}"),
                home: i % GATEWAYS,
                reconnects: !probe_indices.contains(&i),
            };
            tokio::spawn(run_executor(
                sim,
                ports.clone(),
                dials.clone(),
                events_to.clone(),
                stop.clone(),
            ));
        }
        let mut devices: Vec<Option<Device>> = vec![None; executors];
        let (mut welcomed, mut last_welcome) = (0, started);
        let mut connect_failures = BTreeMap::<String, usize>::new();
        let mut lost_while_idle = 0;
        let deadline = tokio::time::Instant::from_std(started + CONNECT_WITHIN);
        while welcomed < executors {
            let event = tokio::time::timeout_at(deadline, events.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!("only {welcomed} of {executors} executors connected within {CONNECT_WITHIN:?}: {connect_failures:?}")
                })
                .unwrap();
            match event {
                Event::Welcomed {
                    index,
                    gateway,
                    device_id,
                    at,
                } => {
                    if devices[index].is_none() {
                        welcomed += 1;
                        last_welcome = at;
                    }
                    devices[index] = Some(Device {
                        user_id: tokens[index / per_user].1.clone(),
                        device_id,
                        gateway,
                    });
                }
                Event::Lost => lost_while_idle += 1,
                Event::Failed { gateway, why } => {
                    eprintln!("gw-{}: {why}", gateway + 1);
                    *connect_failures.entry(why).or_default() += 1;
                }
            }
        }
        let connect = last_welcome - started;
        eprintln!(
            "{executors} executors connected in {:.1} s",
            connect.as_secs_f64()
        );

        // 2. Memory, after three heartbeats with everyone connected.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let gateways_after = cluster.rss();
        let clients_after = rss_kib(std::process::id()).unwrap();
        let per_gateway: Vec<u64> = connected(&sockets)
            .await
            .into_iter()
            .map(|c| c.expect("every host answers its health check"))
            .collect();
        assert_eq!(
            per_gateway.iter().sum::<u64>(),
            executors as u64,
            "the hosts count other connections than the executors welcomed: {per_gateway:?}"
        );
        while let Ok(event) = events.try_recv() {
            if let Event::Lost = event {
                lost_while_idle += 1;
            }
        }

        // 3. Latency. The routes' devices as they are now (a connection lost and made again
        // elsewhere would have moved one).
        let on_gw1: Vec<Device> = devices
            .iter()
            .flatten()
            .filter(|d| d.gateway == 0)
            .cloned()
            .collect();
        let elsewhere: Vec<Device> = devices
            .iter()
            .flatten()
            .filter(|d| d.gateway != 0)
            .cloned()
            .collect();
        let mut sequential = BTreeMap::new();
        let mut loaded = BTreeMap::new();
        for (name, per_route, in_flight, into) in [
            ("seq", SEQUENTIAL, 1, &mut sequential),
            ("loaded", LOADED, IN_FLIGHT, &mut loaded),
        ] {
            let warm = format!("{name}-warmup");
            latency_round(&warm, &clients, &agentd, &on_gw1, &elsewhere, WARMUP, in_flight).await;
            let samples = latency_round(
                name, &clients, &agentd, &on_gw1, &elsewhere, per_route, in_flight,
            )
            .await;
            *into = samples.into_iter().map(|(r, s)| (r, stats(s))).collect();
        }
        eprintln!("latency rounds done");

        // 4. Failover.
        let failover = failover(
            &mut cluster,
            &sockets,
            &agentd,
            &devices,
            &probe_indices,
            &mut events,
        )
        .await;
        let probes: Vec<Device> = probe_indices
            .iter()
            .map(|&i| devices[i].clone().unwrap())
            .collect();
        let offline = offline_round(&agentd, &probes, SEQUENTIAL).await;
        stop.cancel();
        Report {
            executors,
            users,
            nofile,
            connect,
            connect_failures,
            lost_while_idle,
            memory: Memory {
                gateways_before,
                gateways_after,
                per_gateway,
                clients_before,
                clients_after,
            },
            sequential,
            loaded,
            offline,
            failover,
        }
    });
    // The executors' sockets close with the runtime, before the daemons stop.
    runtime.shutdown_timeout(Duration::from_secs(5));
    drop(cluster);
    print_report(&report);
}

// ---------------------------------------------------------------------------------------------
// The table.

/// The time after which `share` of `total` events had happened (sorted `times`), if they did.
fn time_to(times: &mut [Duration], share: f64, total: usize) -> String {
    times.sort();
    let needed = ((share * total as f64).ceil() as usize).max(1);
    if times.len() >= needed {
        format!("{:.2} s", times[needed - 1].as_secs_f64())
    } else {
        format!("not reached ({} of {total})", times.len())
    }
}

fn print_report(r: &Report) {
    let cores = std::thread::available_parallelism().map_or(0, |p| p.get());
    let m = &r.memory;
    println!(
        "## cluster_dispatch: {} executors over {GATEWAYS} gatewayd hosts (PostgreSQL + NATS), {cores} cores",
        r.executors
    );
    println!();
    println!(
        "{} users with {} devices each; heartbeat 1 s (lease 3 s); RLIMIT_NOFILE {}; clients, \
         daemons and servers on one machine.",
        r.users,
        r.executors.div_ceil(r.users),
        r.nofile
    );
    println!();
    println!("| connect | value |");
    println!("| --- | ---: |");
    println!(
        "| all {} executors welcomed ({DIAL_CONCURRENCY} dials at a time) | {:.1} s ({:.0}/s) |",
        r.executors,
        r.connect.as_secs_f64(),
        r.executors as f64 / r.connect.as_secs_f64()
    );
    let failed: usize = r.connect_failures.values().sum();
    println!("| dials that failed (retried) | {failed} |");
    println!(
        "| connections lost before the failover | {} |",
        r.lost_while_idle
    );
    println!();
    println!("| memory (VmRSS) | before KiB | after KiB | connections | KiB per connection |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (k, ((before, after), n)) in m
        .gateways_before
        .iter()
        .zip(&m.gateways_after)
        .zip(&m.per_gateway)
        .enumerate()
    {
        println!(
            "| gw-{} | {before} | {after} | {n} | {:.1} |",
            k + 1,
            (*after as f64 - *before as f64) / (*n).max(1) as f64
        );
    }
    let (before, after): (u64, u64) = (
        m.gateways_before.iter().sum(),
        m.gateways_after.iter().sum(),
    );
    println!(
        "| all four gatewayd | {before} | {after} | {} | {:.1} |",
        r.executors,
        (after as f64 - before as f64) / r.executors as f64
    );
    println!(
        "| this process (the light clients) | {} | {} | {} | {:.1} |",
        m.clients_before,
        m.clients_after,
        r.executors,
        (m.clients_after as f64 - m.clients_before as f64) / r.executors as f64
    );
    println!();
    println!("| dispatch of `echo` | in flight | n | p50 ms | p99 ms | mean ms |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (in_flight, round) in [(1, &r.sequential), (IN_FLIGHT, &r.loaded)] {
        for (route, s) in round {
            println!(
                "| {} | {in_flight} | {} | {:.2} | {:.2} | {:.2} |",
                route.label(),
                s.count,
                ms(s.p50),
                ms(s.p99),
                ms(s.mean)
            );
        }
    }
    println!(
        "| offline: agentd -> NATS (`/v1/watch`, `/v1/locate`) -> `device_offline`, a device with no lease (after the failover) | 1 | {} | {:.2} | {:.2} | {:.2} |",
        r.offline.count,
        ms(r.offline.p50),
        ms(r.offline.p99),
        ms(r.offline.mean)
    );
    for (in_flight, round) in [(1, &r.sequential), (IN_FLIGHT, &r.loaded)] {
        let (same, routed, holder) = (
            round[&Route::SameHost],
            round[&Route::Routed],
            round[&Route::HolderSocket],
        );
        println!(
            "| **ratio through NATS / same host**, {in_flight} in flight | | | **{:.2}** | **{:.2}** | {:.2} |",
            ms(routed.p50) / ms(same.p50),
            ms(routed.p99) / ms(same.p99),
            ms(routed.mean) / ms(same.mean)
        );
        println!(
            "| through NATS minus holder's socket (the hop), {in_flight} in flight | | | {:.2} | | {:.2} |",
            ms(routed.p50) - ms(holder.p50),
            ms(routed.mean) - ms(holder.mean)
        );
    }
    // The offline answer is two NATS calls to any gatewayd, each a PostgreSQL read there: half
    // of it is what the hop's first step (`/v1/watch`, which finds the holder) costs.
    println!(
        "| one call to any gatewayd over NATS (half the offline answer: request-reply, MACs, JSON, a read), 1 in flight | | | {:.2} | | {:.2} |",
        ms(r.offline.p50) / 2.0,
        ms(r.offline.mean) / 2.0
    );
    println!();
    let f = &r.failover;
    println!(
        "| failover: SIGKILL gw-4 ({} devices: {} reconnect, {} probes stay down) | after the kill |",
        f.movers + f.probes,
        f.movers,
        f.probes
    );
    println!("| --- | ---: |");
    for (answer, a) in &f.probe_answers {
        println!(
            "| agentd's probe dispatches answered `{answer}`: {}, first sent {:.1} ms after the \
             kill, longest wait {:.2} s; first answer at | {:.1} ms |",
            a.count,
            ms(a.first_sent),
            a.longest.as_secs_f64(),
            ms(a.first_answered)
        );
    }
    println!(
        "| gw-1 lists the probe offline (its lease expired) | {} |",
        f.listed_offline.map_or("not seen".to_owned(), |d| format!(
            "{:.2} s",
            d.as_secs_f64()
        ))
    );
    let (mut welcomed, mut dispatchable) = (f.welcomed.clone(), f.dispatchable.clone());
    for (share, label) in [(0.5, "50%"), (0.99, "99%"), (1.0, "100%")] {
        println!(
            "| {label} of the movers welcomed again on gw-1..3 | {} |",
            time_to(&mut welcomed, share, f.movers)
        );
    }
    for (share, label) in [(0.99, "99%"), (1.0, "100%")] {
        println!(
            "| {label} of {} checked movers (1 in {CHECK_EVERY}) answered a dispatch of agentd's | {} |",
            f.checked,
            time_to(&mut dispatchable, share, f.checked)
        );
    }
    if !welcomed.is_empty() {
        println!(
            "| (the first redial after the loss is at once, as the laptop's after a session that served; median welcome) | {:.2} s |",
            percentile(&welcomed, 50.0).as_secs_f64()
        );
    }
    let failures: Vec<String> = f
        .check_failures
        .iter()
        .map(|(code, n)| format!("{n} `{code}`"))
        .collect();
    println!(
        "| checking dispatches that failed first (retried every 50 ms) | {} |",
        if failures.is_empty() {
            "none".to_owned()
        } else {
            failures.join(", ")
        }
    );
    let after: Vec<String> = f
        .connected_after
        .iter()
        .enumerate()
        .map(|(k, c)| match c {
            Some(c) => format!("gw-{} {c}", k + 1),
            None => format!("gw-{} down", k + 1),
        })
        .collect();
    println!("| connected after the failover | {} |", after.join(", "));
    println!();
    println!(
        "reproduce: cargo bench --bench cluster_dispatch -- {}",
        r.executors
    );
}
