//! The body of every fuzz target, one module each, shared by the libFuzzer binaries in
//! `fuzz_targets/` (nightly, `cargo fuzz`) and by the stable regression test
//! (`tests/suite/fuzz_regressions.rs`), which feeds each target's committed corpus
//! (`fuzz/corpus/<target>/`) and crashing inputs (`fuzz/regressions/<target>/`) through the same
//! `run` function. A regression therefore fails `cargo test` without nightly or cargo-fuzz.
//!
//! Why files included with `#[path]` rather than a crate: a check calls into several domain
//! crates (agentd's MCP transport, gatewayd, the laptop, workspaced, runnerd), so as a workspace
//! crate it would be a normal dependency joining domains the crate graph keeps apart
//! (`.ci/crate_graph.py`), and as a `fuzz/` crate it would have to belong to two workspaces.
//! As product modules (`#[doc(hidden)] pub mod fuzzing`) the assertions would ship in the
//! daemons. Included files need neither: the fuzz package and the main package's integration
//! test already depend on every crate involved, and each compiles the same source.
//!
//! Each module has `pub fn run(data: &[u8])`, which returns on input it does not accept and
//! panics (an assertion) when an invariant breaks. It must stay deterministic and fast: no
//! files, no network, no sleeping.

pub mod acl_decode;
pub mod acp_session;
pub mod bridge_mcp;
pub mod claude_events;
pub mod client_metadata;
pub mod codex_events;
pub mod config_load;
pub mod executor_frame;
pub mod gateway_usage;
pub mod mcp_request;
pub mod patch_apply;
pub mod patch_set;
pub mod rel_path;
pub mod workspaced_body;

/// A target's body: returns, or panics when an invariant breaks.
pub type Check = fn(&[u8]);

/// Every target by name (the name of its `fuzz_targets/` binary and its corpus folder).
pub const TARGETS: [(&str, Check); 14] = [
    ("acl_decode", acl_decode::run),
    ("acp_session", acp_session::run),
    ("bridge_mcp", bridge_mcp::run),
    ("claude_events", claude_events::run),
    ("client_metadata", client_metadata::run),
    ("codex_events", codex_events::run),
    ("config_load", config_load::run),
    ("executor_frame", executor_frame::run),
    ("gateway_usage", gateway_usage::run),
    ("mcp_request", mcp_request::run),
    ("patch_apply", patch_apply::run),
    ("patch_set", patch_set::run),
    ("rel_path", rel_path::run),
    ("workspaced_body", workspaced_body::run),
];
