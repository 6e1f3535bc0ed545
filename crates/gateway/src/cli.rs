//! The command line of `agentworks-gatewayd`.

use clap::{CommandFactory, Parser};
use std::path::PathBuf;

/// Serve the executor WebSocket (/v1/executor) and the dispatch socket (gatewayd.sock).
///
/// Configuration comes from --config, else $AGENTWORKS_CONFIG, else
/// /etc/agentworks/agentworks.toml (section [gatewayd]); AGENTWORKS_STATE_ROOT and
/// AGENTWORKS_RUNTIME_DIR override the file. Under systemd both listeners come from socket
/// activation (FileDescriptorName=gatewayd-ws and gatewayd.sock); otherwise gatewayd binds them.
// The doc comment is the --help text (clap): its "[section]" names are not links.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Debug, Parser)]
#[command(name = "agentworks-gatewayd", version)]
pub struct Args {
    /// The TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The clap definition of `agentworks-gatewayd` (for man pages and completions).
pub fn command() -> clap::Command {
    Args::command()
}
