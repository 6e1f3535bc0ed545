//! The config loader (`/etc/agentworks/agentworks.toml`): the input is the file's text, loaded
//! through `Config::from_text` (what `Config::load` runs once it has read the file) without and
//! with `AGENTWORKS_STATE_ROOT` set. It must never panic; whatever it accepts must hold what
//! the daemons rely on: absolute roots and sockets, positive limits, the environment winning
//! over the file, and timers gatewayd can schedule (`now + 3 × heartbeat` must not overflow).

use std::path::Path;
use std::time::Instant;

use agentworks_daemon::config::{Config, ENV_STATE_ROOT};

const STATE_ROOT: &str = "/fuzz/state";

fn holds(config: &Config) {
    for path in [
        config.state_root.as_path(),
        &config.documents_root,
        &config.runtime_dir,
        &config.workspaced_socket(),
        &config.agentd_socket(),
        &config.gatewayd_socket(),
    ] {
        assert!(path.is_absolute(), "{path:?}");
    }
    let ws = &config.workspaced;
    assert!(ws.max_file_bytes > 0 && ws.lock_timeout_ms > 0 && ws.search_max_results > 0);
    assert!(ws.allowed_users.iter().all(|u| !u.trim().is_empty()));
    assert!(config.agentd.max_connections > 0 && config.agentd.max_sessions_per_token > 0);
    if let Some(model) = &config.agentd.model {
        assert!(model.max_tool_rounds > 0 && model.request_timeout_secs > 0);
        assert!(model.api_key_file.as_deref().is_none_or(Path::is_absolute));
    }
    let gateway = agentworks_gateway::Settings::from_config(config);
    for period in [gateway.heartbeat, gateway.token_recheck] {
        let deadline = period
            .checked_mul(3)
            .and_then(|margin| Instant::now().checked_add(margin));
        assert!(deadline.is_some(), "gatewayd cannot schedule {period:?}");
    }
}

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/agentworks/agentworks.toml");
    let plain = Config::from_text(text, path, &|_| None);
    let with_root = Config::from_text(text, path, &|name| {
        (name == ENV_STATE_ROOT).then(|| STATE_ROOT.to_owned())
    });
    if let Ok(config) = &plain {
        holds(config);
        // The environment only replaces a root with an absolute one: it cannot make a file
        // that loads on its own fail.
        assert!(with_root.is_ok(), "{:?}", with_root.err());
    }
    if let Ok(config) = &with_root {
        holds(config);
        assert_eq!(config.state_root, Path::new(STATE_ROOT));
        if let Ok(plain) = &plain {
            // A root the file sets stays; one it leaves out follows the state root.
            for (mine, theirs, default) in [
                (&config.runtime_dir, &plain.runtime_dir, "run"),
                (&config.documents_root, &plain.documents_root, "documents"),
            ] {
                assert!(
                    mine == theirs || *mine == Path::new(STATE_ROOT).join(default),
                    "{mine:?} vs {theirs:?}"
                );
            }
        }
    }
}
