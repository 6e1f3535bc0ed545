//! The command-line definitions of every program, one module each: the clap parsers the
//! binaries in `src/bin/` parse their arguments with, public so that the man pages and shell
//! completions (`examples/gen_docs.rs`) are generated from the very same definitions.
//!
//! Each module exposes its parser type(s) and `command()`, the program's [`clap::Command`].
//!
//! - `agentworks-workspaced`: [`workspaced`].
//! - `agentworks-agentd`: [`agentd`].
//! - `agentworks-gatewayd`: [`gatewayd`].
//! - `agentworksctl`, the operator CLI: [`ctl`].
//! - `agentworks`, the laptop CLI: [`laptop`] (its hidden `__sandbox-exec` and `__apply-patch`
//!   modes are dispatched by hand before clap and are not part of this definition).

pub mod agentd;
pub mod ctl;
pub mod gatewayd;
pub mod laptop;
pub mod workspaced;
