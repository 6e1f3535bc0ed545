//! The bridge (DESIGN.md, "The bridge"): the agentworks tools a coding CLI gets besides its
//! own, offered by `agentworks-mcpbridge`, a stdio MCP server the CLI spawns inside its
//! sandbox, and answered by runnerd.
//!
//! - [`mcp`]: the stdio MCP server (both protocol eras), run by the `agentworks-mcpbridge`
//!   binary; it forwards each `tools/call` to runnerd ([`client`]) and holds no other authority.
//! - [`client`]: the one HTTP request the bridge makes, to runnerd's loopback bridge endpoint,
//!   with the turn's bridge capability.
//! - [`endpoint`]: runnerd's side: the loopback listener, the per-turn capabilities, a
//!   server-mode shell command run in a fresh sandbox, every other call handed to agentd on the
//!   turn's stream and its answer awaited.
//! - [`discover`]: where runnerd finds the bridge binary.
//!
//! This file holds what both sides share: the environment variables, the tools' definitions
//! and the wire types between the bridge and runnerd.
//!
//! Must never: give the bridge a credential beyond its turn's bridge capability, or let a path
//! the agent controls decide which binary is the bridge.

use agentworks_contract::runnerd::LaptopFolder;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub mod client;
pub mod discover;
pub mod endpoint;
pub mod mcp;

/// The bridge binary's file name.
pub const BINARY_NAME: &str = "agentworks-mcpbridge";
/// runnerd's bridge endpoint, e.g. `http://127.0.0.1:PORT/v1/bridge` (the bridge posts to
/// `<url>/call` and reads its tool list from `<url>/tools`).
pub const URL_ENV: &str = "AGENTWORKS_BRIDGE_URL";
/// The turn's bridge capability (distinct from its model capability).
pub const TOKEN_ENV: &str = "AGENTWORKS_BRIDGE_TOKEN";

/// The shell tool: runs in runnerd (server mode) or on the laptop.
pub const SHELL_TOOL: &str = "execute_shell_command";
/// The patch tool: agentd applies it through workspaced's guarded patch.
pub const PATCH_TOOL: &str = "diff_patch_workspace_file";

/// The most bytes of one bridge call's body (a diff is most of it), and of one MCP line.
pub const MAX_CALL_BYTES: usize = 4 * 1024 * 1024;
/// The most bytes of runnerd's answer to one call (two 1 MiB streams and some words fit).
pub const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// What the bridge posts to runnerd for one `tools/call`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeCall {
    pub tool: String,
    #[serde(default)]
    pub arguments: Value,
}

/// runnerd's answer to a [`BridgeCall`]: the text the CLI's model sees, and whether it is a
/// tool error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeReply {
    pub is_error: bool,
    pub text: String,
}

impl BridgeReply {
    pub fn ok(text: impl Into<String>) -> BridgeReply {
        BridgeReply {
            is_error: false,
            text: text.into(),
        }
    }

    pub fn error(text: impl Into<String>) -> BridgeReply {
        BridgeReply {
            is_error: true,
            text: text.into(),
        }
    }
}

/// The most extra tools one turn's bridge offers (a project's connections offer at most 64).
pub const MAX_EXTRA_TOOLS: usize = 128;

/// runnerd's answer to the bridge's `GET <url>/tools`: every tool the turn's bridge offers, as
/// MCP `tools/list` describes them (the built-ins first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolList {
    pub tools: Vec<Value>,
    /// The turn works in a laptop folder: the built-ins are the laptop's
    /// ([`builtin_tools`]). Absent for a server-mode turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub laptop: Option<LaptopFolder>,
}

/// Whether `name` is one of the two built-in tools.
pub fn is_builtin(name: &str) -> bool {
    name == SHELL_TOOL || name == PATCH_TOOL
}

/// An extra tool of a turn, as MCP `tools/list` describes it.
pub fn extra_tool(tool: &agentworks_contract::runnerd::BridgeTool) -> Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
    })
}

/// What the bridge offers, from the list runnerd answered (`None`: runnerd could not answer):
/// always its own built-ins, as it defines them for the turn's place ([`builtin_tools`]: the
/// server's project, or the laptop folder runnerd names), then each fetched tool that is well
/// formed (a non-empty string name, an object `inputSchema`), not a built-in's name and not a
/// name already listed, at most [`MAX_EXTRA_TOOLS`].
pub fn offered_tools(fetched: Option<ToolList>) -> Vec<Value> {
    let (fetched, laptop) = match fetched {
        Some(list) => (list.tools, list.laptop),
        None => (Vec::new(), None),
    };
    let mut offered = builtin_tools(laptop);
    let mut extras = 0;
    for tool in fetched {
        let Some(name) = tool["name"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
        let listed = offered.iter().any(|t| t["name"].as_str() == Some(name));
        if is_builtin(name) || listed || !tool["inputSchema"].is_object() {
            continue;
        }
        if extras == MAX_EXTRA_TOOLS {
            break;
        }
        extras += 1;
        offered.push(tool);
    }
    offered
}

/// The built-in tools of a turn: in server mode [`tools`]; in a laptop folder the shell, and
/// the patch tool only when the folder is shared writable, described as working there.
pub fn builtin_tools(laptop: Option<LaptopFolder>) -> Vec<Value> {
    let Some(folder) = laptop else {
        return tools();
    };
    let mut tools = tools();
    tools.truncate(if folder.writable { 2 } else { 1 });
    tools[0]["title"] = json!("Run a shell command in the person's folder");
    tools[0]["description"] = json!(
        "Run a shell command (/bin/sh -c) in the folder the person shared from their own \
         computer (its working directory), sandboxed to that folder on their computer, not on \
         this server. The network is reachable. Returns the exit code, stdout and stderr. \
         Paths are relative to the folder."
    );
    if let Some(patch) = tools.get_mut(1) {
        patch["title"] = json!("Patch one file in the person's folder");
        patch["description"] = json!(
            "Apply a unified diff to one file of the folder the person shared writable from \
             their computer (a receipt is kept there). `filepath` is relative to the folder; a \
             diff against /dev/null creates the file."
        );
    }
    tools
}

/// The bridge tools as MCP `tools/list` describes them (paths are relative to the project).
pub fn tools() -> Vec<Value> {
    vec![
        json!({
            "name": SHELL_TOOL,
            "title": "Run a shell command in the project",
            "description": "Run a shell command (/bin/sh -c) with the project's folder as its \
                working directory, in a fresh sandbox of this chat's mode: read-only in Run mode, \
                writable within the person's write grants in Builder mode. The network is \
                reachable. Returns the exit code, stdout and stderr (each cut at 1 MiB). Paths \
                are relative to the project.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the shell command"},
                    "timeout": {"type": "integer", "minimum": 1, "maximum": 300,
                                "description": "seconds before the command is killed; default 60"}
                },
                "required": ["command"],
                "additionalProperties": false
            },
            "annotations": {"openWorldHint": true}
        }),
        json!({
            "name": PATCH_TOOL,
            "title": "Patch one project file",
            "description": "Apply a unified diff to one file of the project through agentworks' \
                guarded patch (a receipt is kept; blocked, read-only and protected files are \
                refused). Builder mode only. `filepath` is relative to the project's root; the \
                diff's hunks are applied to that file (a diff against /dev/null creates it).",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "filepath": {"type": "string",
                                 "description": "the file's path relative to the project's root"},
                    "diff": {"type": "string", "description": "a unified diff of that file"}
                },
                "required": ["filepath", "diff"],
                "additionalProperties": false
            },
            "annotations": {"destructiveHint": true, "idempotentHint": false}
        }),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn names(tools: &[Value]) -> Vec<&str> {
        tools.iter().map(|t| t["name"].as_str().unwrap()).collect()
    }

    #[test]
    fn the_offered_list_is_the_builtins_then_the_well_formed_extras() {
        let schema = json!({"type": "object", "properties": {}});
        let fetched = vec![
            // runnerd's list starts with the built-ins: kept once, as the bridge defines them.
            json!({"name": SHELL_TOOL, "description": "changed", "inputSchema": schema}),
            json!({"name": PATCH_TOOL, "inputSchema": schema}),
            json!({"name": "mcp_linear_a1b2c3__search", "description": "d", "inputSchema": schema}),
            json!({"name": "mcp_linear_a1b2c3__search", "description": "twice", "inputSchema": schema}),
            json!({"name": "", "inputSchema": schema}),
            json!({"name": 7, "inputSchema": schema}),
            json!({"name": "no_schema"}),
            json!({"name": "mcp_docs_d4e5f6__get", "description": "g", "inputSchema": schema}),
        ];
        let offered = offered_tools(Some(ToolList {
            tools: fetched,
            laptop: None,
        }));
        assert_eq!(
            names(&offered),
            [
                SHELL_TOOL,
                PATCH_TOOL,
                "mcp_linear_a1b2c3__search",
                "mcp_docs_d4e5f6__get"
            ]
        );
        assert_eq!(offered[0], tools()[0], "a built-in is never redefined");
        assert_eq!(offered[2]["description"], "d");
        // runnerd did not answer: the built-ins alone.
        assert_eq!(names(&offered_tools(None)), [SHELL_TOOL, PATCH_TOOL]);
        // At most MAX_EXTRA_TOOLS extras.
        let many = (0..MAX_EXTRA_TOOLS + 5)
            .map(|i| json!({"name": format!("t{i}"), "inputSchema": schema}))
            .collect();
        let many = ToolList {
            tools: many,
            laptop: None,
        };
        assert_eq!(offered_tools(Some(many)).len(), 2 + MAX_EXTRA_TOOLS);
    }

    #[test]
    fn a_laptop_turn_offers_the_patch_tool_only_for_a_writable_folder() {
        let list = |writable| {
            offered_tools(Some(ToolList {
                tools: tools(),
                laptop: Some(LaptopFolder { writable }),
            }))
        };
        assert_eq!(names(&list(true)), [SHELL_TOOL, PATCH_TOOL]);
        assert_eq!(names(&list(false)), [SHELL_TOOL]);
        let described = list(true)[0]["description"].as_str().unwrap().to_owned();
        assert!(described.contains("their own computer"), "{described}");
    }
}

/// The bridge every turn of this runnerd gets: the endpoint, and the binary found at start
/// (or why there is none: turns then run without the bridge tools).
#[derive(Debug)]
pub struct Bridge {
    pub endpoint: endpoint::BridgeEndpoint,
    pub binary: Result<std::path::PathBuf, String>,
    /// Where server-mode shell commands get their scratch directories
    /// (`<state>/runner/bridge`, never inside a runtime).
    pub scratch_root: std::path::PathBuf,
}

impl Bridge {
    /// The bridge binary's path as the CLI's config names it, when there is one (a path that is
    /// not UTF-8 cannot be written to the config: no bridge then).
    pub fn command(&self) -> Option<&str> {
        self.binary.as_ref().ok().and_then(|p| p.to_str())
    }
}
