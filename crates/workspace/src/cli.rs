//! The command line of `agentworks-workspaced`.

use clap::{CommandFactory, Parser};
use std::path::PathBuf;

/// Serve guarded reads and writes of the documents tree on workspaced.sock.
///
/// Configuration comes from --config, else $AGENTWORKS_CONFIG, else
/// /etc/agentworks/agentworks.toml (section [workspaced]); AGENTWORKS_STATE_ROOT,
/// AGENTWORKS_DOCUMENTS_ROOT and AGENTWORKS_RUNTIME_DIR override the file. Under systemd the
/// socket comes from socket activation (FileDescriptorName=workspaced.sock); otherwise the
/// daemon binds it itself.
// The doc comment is the --help text (clap): its "[section]" names are not links.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Debug, Parser)]
#[command(name = "agentworks-workspaced", version)]
pub struct Args {
    /// The TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The clap definition of `agentworks-workspaced` (for man pages and completions).
pub fn command() -> clap::Command {
    Args::command()
}
