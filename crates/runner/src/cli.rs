//! The command line of `agentworks-runnerd`.

use clap::{CommandFactory, Parser};
use std::path::PathBuf;

/// Run coding CLIs (Codex) as a chat's agent for agentd, sandboxed, on runnerd.sock.
///
/// Configuration comes from --config, else $AGENTWORKS_CONFIG, else
/// /etc/agentworks/agentworks.toml (section [runnerd] and its [runnerd.providers.NAME]
/// tables); AGENTWORKS_STATE_ROOT, AGENTWORKS_DOCUMENTS_ROOT and AGENTWORKS_RUNTIME_DIR
/// override the file. Under systemd the socket comes from socket activation
/// (FileDescriptorName=runnerd.sock); otherwise the daemon binds it itself.
// The doc comment is the --help text (clap): its "[section]" names are not links.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Debug, Parser)]
#[command(name = "agentworks-runnerd", version)]
pub struct Args {
    /// The TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The clap definition of `agentworks-runnerd` (for man pages and completions).
pub fn command() -> clap::Command {
    Args::command()
}
