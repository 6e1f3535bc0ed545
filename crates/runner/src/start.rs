//! runnerd's start and life as a daemon: no capability kept, then (in this order) the socket,
//! its state directory, the providers, the sandbox check, the model gateway, the bridge (its
//! binary found, its endpoint listening), with `[runnerd] serve_cluster` the cluster's NATS and
//! its runnerd key, READY, serving until shutdown.
//!
//! It must never announce READY before the socket is bound and the gateway listens, and never
//! run a turn when the sandbox is unavailable (each turn is refused, naming why).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentworks_daemon::config::Config;
use agentworks_daemon::ipc::server::PeerPolicy;
use agentworks_daemon::layout::{LayoutError, ensure_private_dir};
use agentworks_daemon::listener::{self, ListenFailed};
use agentworks_daemon::{shutdown, systemd};
use agentworks_sandbox::cgroup::CgroupLayout;
use agentworks_sandbox::limits::Limits;
use agentworks_sandbox::process::Launcher;
use caps::Capability;

use crate::bridge::endpoint::{BridgeEndpoint, EndpointError};
use crate::bridge::{Bridge, discover};
use crate::gateway::{GatewayError, ModelGateway};
use crate::provider::Providers;
use crate::turn::{Runner, RunnerPaths};

/// runnerd keeps no capability: it runs as the documents' user and needs none.
pub const KEPT_CAPABILITIES: &[Capability] = &[];

/// The names runnerd uses in the cgroup systemd delegates to it (`Delegate=yes`): its own
/// leaf, and one cgroup per turn.
pub const RUNNER_CGROUPS: CgroupLayout = CgroupLayout {
    owner: "runnerd",
    own_leaf: "agentworks-runnerd",
    command_prefix: "agentworks-turn-",
};

/// Why runnerd could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Listen(#[from] ListenFailed),
    #[error("cannot prepare runnerd's state directory {path}")]
    State {
        path: PathBuf,
        #[source]
        source: LayoutError,
    },
    #[error("cannot find the documents root {path}")]
    DocumentsRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot find runnerd's own executable (the sandbox's launcher)")]
    Executable(#[source] std::io::Error),
    #[error("cannot start the model gateway")]
    Gateway(#[source] GatewayError),
    #[error("cannot start the bridge endpoint")]
    Bridge(#[source] EndpointError),
    /// `[runnerd] serve_cluster` is set and the cluster cannot be joined.
    #[error("cannot serve agentd hosts over the cluster's NATS server")]
    Cluster(#[source] crate::cluster::ClusterError),
}

/// Run runnerd with `config` until a shutdown signal.
pub async fn run(config: Config, _kept: Vec<Capability>) -> Result<(), StartError> {
    let shutdown = shutdown::on_signals();
    let socket_path = config.runnerd_socket();
    let (listener, origin) = listener::unix_listener("runnerd.sock", &socket_path)
        .map_err(|e| e.at(socket_path.display()))?;
    let layout = config.layout();
    let runtimes = layout.runner_dir().join("runtimes");
    for dir in [layout.runner_dir(), runtimes.clone()] {
        ensure_private_dir(&dir, 0o700).map_err(|source| StartError::State {
            path: dir.clone(),
            source,
        })?;
    }
    let documents_root = std::fs::canonicalize(&config.documents_root).map_err(|source| {
        StartError::DocumentsRoot {
            path: config.documents_root.clone(),
            source,
        }
    })?;
    let providers = Providers::resolve(
        &config.runnerd.providers,
        std::env::var_os("PATH").as_deref(),
    );
    let launcher = Launcher::current_exe().map_err(StartError::Executable)?;
    let sandbox_unavailable = agentworks_sandbox::check_available()
        .err()
        .map(|e| e.to_string());
    let overmount = matches!(
        agentworks_sandbox::exclusion_mechanism(&launcher),
        agentworks_sandbox::ExclusionMechanism::Overmount
    );
    // Moves runnerd into a leaf of its delegated cgroup, when it has one.
    let limits = Limits::setup(
        config.runnerd.max_processes,
        config
            .runnerd
            .max_memory_mib
            .map(|m| m.saturating_mul(1024 * 1024)),
        false,
        RUNNER_CGROUPS,
    );
    let gateway = ModelGateway::start(shutdown.clone())
        .await
        .map_err(StartError::Gateway)?;
    // The bridge binary, found once (never in a CLI's cwd); without it turns run without the
    // bridge tools, and /v1/providers says so.
    let bridge_binary = discover::find(
        std::env::var_os(discover::OVERRIDE_ENV).as_deref(),
        std::env::current_exe().ok().as_deref(),
        std::env::var_os("PATH").as_deref(),
    );
    if let Err(why) = &bridge_binary {
        tracing::warn!(%why, "coding CLIs run without the agentworks bridge tools");
    }
    let bridge = Bridge {
        endpoint: BridgeEndpoint::start(shutdown.clone())
            .await
            .map_err(StartError::Bridge)?,
        binary: bridge_binary,
        scratch_root: layout.runner_dir().join("bridge"),
    };
    let mut denied = vec![
        layout.agent_dir(),
        layout.files_dir(),
        layout.gateway_dir(),
        config.runtime_dir.clone(),
        PathBuf::from("/etc/agentworks"),
    ];
    denied.extend(
        config
            .runnerd
            .providers
            .values()
            .filter_map(|p| p.key_file.clone()),
    );
    if let Ok(credentials) = std::env::var("CREDENTIALS_DIRECTORY") {
        denied.push(PathBuf::from(credentials));
    }
    // With serve_cluster, NATS and the database must answer now, before READY.
    let cluster = if config.runnerd.serve_cluster {
        Some(
            crate::cluster::join(&config)
                .await
                .map_err(StartError::Cluster)?,
        )
    } else {
        None
    };
    tracing::info!(
        socket = %socket_path.display(),
        cluster_subject = cluster.as_ref().map(|joined| joined.subject.as_str()),
        socket_activated = origin == listener::ListenerOrigin::Activated,
        providers = ?providers.info().iter().map(|p| (&p.name, p.unavailable.as_deref())).collect::<Vec<_>>(),
        gateway = %gateway.base_url(),
        bridge = %bridge.endpoint.url(),
        bridge_binary = ?bridge.binary,
        cgroups = ?limits.cgroups.as_ref().map(|t| t.base().display().to_string()),
        sandbox_unavailable = sandbox_unavailable.as_deref(),
        overmount,
        "runnerd ready"
    );
    let runner = Arc::new(Runner::new(
        RunnerPaths {
            runtimes,
            documents_root,
            denied,
        },
        providers,
        gateway,
        launcher,
        limits,
        bridge,
        overmount,
        sandbox_unavailable,
        Duration::from_secs(config.runnerd.turn_timeout_secs),
    ));
    systemd::notify_ready("serving runnerd.sock");
    systemd::spawn_watchdog(shutdown.clone());
    let policy = PeerPolicy::for_users(&config.runnerd.allowed_users);
    let bus = cluster.map(|joined| {
        tokio::spawn(crate::cluster::serve(
            runner.clone(),
            joined,
            shutdown.clone(),
        ))
    });
    crate::server::run(listener, runner, policy, shutdown).await;
    if let Some(bus) = bus {
        let _ = bus.await;
    }
    tracing::info!("runnerd stopped");
    Ok(())
}
