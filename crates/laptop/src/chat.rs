//! `agentworks chat`: a line-oriented terminal client for agentd's chats.
//!
//! Creates or resumes a chat in a project, optionally binds it to this person's shared laptop
//! folder (showing the consequences first and asking for an explicit "yes"; the folder is
//! found and confirmed before a new chat is created, so a wrong `--local` or a "no" leaves no
//! empty chat), then reads one
//! message per line and shows the turn's streamed events readably: model text as it arrives,
//! each tool call and its result folded to one line, with a spinner while a tool runs.
//! A resumed chat first shows its earlier turns, folded the same way.
//!
//! A result's ✓/✗ is the server's `state` (`done` or `failed`: a command that exits non-zero,
//! times out or is cancelled is failed, with the exit code and the first line of stderr in its
//! `summary`); from an older server without `state`, its `ok`.
//!
//! It talks to agentd's REST API with a personal token that has a `workflows:*` scope (the
//! laptop's `devices:connect` credential cannot use chats). It never runs anything itself.
//!
//! Everything it prints that came from the server (the model's text, a tool's arguments and
//! result, a command's output, names, error messages) goes through [`shown`] first: C0 and
//! C1 controls but newline and tab, and bidirectional formatting characters, are stripped, so
//! the model cannot write the clipboard (OSC 52), move the cursor over lines already printed
//! (a forged ✓ line), or retitle the terminal. The only escape sequences on the screen are the
//! client's own (the spinner's line rewrite).

use crate::connect::BaseUrl;
use crate::login::{self, LoginError};
use agentworks_contract::public_api::CONFIRMATION;
use agentworks_core::text::strip_controls;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error(transparent)]
    Http(#[from] LoginError),
    #[error("{code}: {message}")]
    Refused { code: String, message: String },
    #[error("the answer of {what} is not what agentd sends: {detail}")]
    Protocol { what: String, detail: String },
    #[error("{0}")]
    Usage(String),
    #[error("reading the terminal: {0}")]
    Input(#[from] std::io::Error),
}

/// What the person asked for on the command line.
pub struct ChatOptions {
    pub server: BaseUrl,
    pub token: String,
    pub project: String,
    pub chat: Option<String>,
    pub local: Option<String>,
    pub device: Option<String>,
    pub assume_yes: bool,
}

struct Api<'a> {
    server: &'a BaseUrl,
    token: &'a str,
}

impl Api<'_> {
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ChatError> {
        let response = login::send(
            self.server,
            method,
            path,
            body.as_ref().map(|_| "application/json"),
            body.map(|b| b.to_string()).unwrap_or_default(),
            Some(self.token),
            &[],
        )
        .await?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| ChatError::Protocol {
                what: path.into(),
                detail: e.to_string(),
            })?
            .to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            Ok(value)
        } else {
            Err(refusal(status, &value))
        }
    }
}

fn refusal(status: u16, value: &Value) -> ChatError {
    ChatError::Refused {
        code: value["error"]["code"]
            .as_str()
            .unwrap_or("http_error")
            .to_owned(),
        message: value["error"]["message"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("agentd answered HTTP {status}")),
    }
}

/// Text from the server as the terminal may show it (see the module doc).
fn shown(text: &str) -> Cow<'_, str> {
    strip_controls(text)
}

/// One line for a tool call's arguments: the command or the file, shortened.
fn summarize_call(name: &str, arguments: &Value) -> String {
    let args: Value = match arguments {
        Value::String(s) => serde_json::from_str(s).unwrap_or(Value::Null),
        other => other.clone(),
    };
    let detail = match name {
        "execute_shell_command" => args["command"].as_str().unwrap_or("").to_owned(),
        "diff_patch_workspace_file" => args["filepath"].as_str().unwrap_or("").to_owned(),
        _ => args["path"]
            .as_str()
            .or(args["query"].as_str())
            .unwrap_or("")
            .to_owned(),
    };
    let one_line = detail.replace('\n', " ⏎ ");
    let short: String = one_line.chars().take(70).collect();
    if short.len() < one_line.len() {
        format!("{short}…")
    } else {
        short
    }
}

/// Whether a tool result failed: the server's `state`, else (an older server) not `ok`.
fn failed(event: &Value) -> bool {
    match event["state"].as_str() {
        Some(state) => state != "done",
        None => event["ok"] != Value::Bool(true),
    }
}

/// The ✓/✗ line of a finished tool call: `call` is its name and arguments, folded.
fn result_line(call: &str, event: &Value) -> String {
    let mark = if failed(event) { "✗" } else { "✓" };
    format!("  {mark} {call} — {}", summarize_result(event))
}

/// One line for a tool result: a failure as the server summarised it (the exit code and the
/// first line of stderr, a timeout, a cancel or the error's message), else what it did.
fn summarize_result(event: &Value) -> String {
    if failed(event)
        && let Some(summary) = event["summary"].as_str()
    {
        return summary.to_owned();
    }
    if event["ok"] != Value::Bool(true) {
        return format!(
            "{}: {}",
            event["error"]["code"].as_str().unwrap_or("error"),
            event["error"]["message"].as_str().unwrap_or("")
        );
    }
    let result = &event["result"];
    match event["name"].as_str().unwrap_or("") {
        "execute_shell_command" => {
            let lines = result["stdout"].as_str().unwrap_or("").lines().count();
            let mut s = format!(
                "exit {}, {} line{} of output",
                result["exit_code"]
                    .as_i64()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "?".into()),
                lines,
                if lines == 1 { "" } else { "s" }
            );
            for (flag, note) in [("timed_out", ", timed out"), ("cancelled", ", cancelled")] {
                if result[flag] == true {
                    s.push_str(note);
                }
            }
            if result["stdout_truncated"] == true || result["stderr_truncated"] == true {
                s.push_str(", truncated");
            }
            if let Some(undone) = result["undone"].as_array().filter(|u| !u.is_empty()) {
                s.push_str(&format!(
                    ", {} change{} to project config undone",
                    undone.len(),
                    if undone.len() == 1 { "" } else { "s" }
                ));
            }
            s
        }
        "diff_patch_workspace_file" => match result["files"].as_array() {
            Some(files) => files
                .iter()
                .map(|f| {
                    format!(
                        "{} → {}",
                        f["path"].as_str().unwrap_or("?"),
                        f["revision"].as_str().unwrap_or("?")
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
            None => "patched".into(),
        },
        "read_file" => format!(
            "{} bytes, {}",
            result["size"],
            result["revision"].as_str().unwrap_or("")
        ),
        "write_file" => format!(
            "{} ({})",
            result["state"].as_str().unwrap_or(""),
            result["revision"].as_str().unwrap_or("")
        ),
        "list_files" => format!(
            "{} entries",
            result["entries"].as_array().map_or(0, Vec::len)
        ),
        "search_files" => format!(
            "{} matches",
            result["matches"].as_array().map_or(0, Vec::len)
        ),
        _ => "done".into(),
    }
}

/// Prints events readably; rewrites the running tool's line in place on a terminal.
struct Screen {
    tty: bool,
    running: Option<String>,
    spin: usize,
    /// An `agent>` line is open: streamed text continues it.
    in_text: bool,
}

impl Screen {
    fn event(&mut self, kind: &str, data: &Value) {
        let mut out = std::io::stdout().lock();
        if kind != "text" && std::mem::take(&mut self.in_text) {
            let _ = writeln!(out);
        }
        match kind {
            // Streamed text arrives in pieces: one `agent>` line, continued until another
            // event ends it.
            "text" => {
                if !self.in_text {
                    self.finish_line(&mut out);
                    let _ = write!(out, "agent> ");
                    self.in_text = true;
                }
                let _ = write!(out, "{}", shown(data["text"].as_str().unwrap_or("")));
            }
            "tool_call" => {
                self.finish_line(&mut out);
                let line = shown(&format!(
                    "{} {}",
                    data["name"].as_str().unwrap_or("tool"),
                    summarize_call(data["name"].as_str().unwrap_or(""), &data["arguments"])
                ))
                .into_owned();
                if self.tty {
                    let _ = write!(out, "  ⠋ {line}");
                } else {
                    let _ = writeln!(out, "  … {line}");
                }
                self.running = Some(line);
            }
            "tool_result" => {
                let line = self
                    .running
                    .take()
                    .unwrap_or_else(|| data["name"].as_str().unwrap_or("tool").to_owned());
                if self.tty {
                    let _ = write!(out, "\r\x1b[2K");
                }
                let _ = writeln!(out, "{}", shown(&result_line(&line, data)));
            }
            "error" => {
                self.finish_line(&mut out);
                let line = format!(
                    "error: {}: {}",
                    data["code"].as_str().unwrap_or("error"),
                    data["message"].as_str().unwrap_or("")
                );
                let _ = writeln!(out, "{}", shown(&line));
            }
            "end" => {
                self.finish_line(&mut out);
                if data["reason"] != "completed" {
                    let _ = writeln!(
                        out,
                        "(turn ended: {})",
                        shown(data["reason"].as_str().unwrap_or("?"))
                    );
                }
            }
            _ => {}
        }
        let _ = out.flush();
    }

    /// Advance the spinner of the running tool (terminals only).
    fn tick(&mut self) {
        const FRAMES: [&str; 8] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧"];
        if let (true, Some(line)) = (self.tty, &self.running) {
            self.spin = (self.spin + 1) % FRAMES.len();
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r  {} {line}", FRAMES[self.spin]);
            let _ = out.flush();
        }
    }

    fn finish_line(&mut self, out: &mut impl Write) {
        if self.tty && self.running.is_some() {
            let _ = writeln!(out);
        }
    }
}

/// Run one turn and show its events as they stream.
async fn turn(
    api: &Api<'_>,
    chat: &str,
    message: &str,
    screen: &mut Screen,
) -> Result<(), ChatError> {
    let path = format!("/v1/chats/{chat}/turns");
    let response = login::send(
        api.server,
        "POST",
        &path,
        Some("application/json"),
        json!({ "message": message }).to_string(),
        Some(api.token),
        &[("accept", "text/event-stream")],
    )
    .await?;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    if status != 200 {
        let bytes = body
            .collect()
            .await
            .map_err(|e| ChatError::Protocol {
                what: path.clone(),
                detail: e.to_string(),
            })?
            .to_bytes();
        return Err(refusal(
            status,
            &serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ));
    }
    let mut pending = String::new();
    let mut ticker = tokio::time::interval(Duration::from_millis(120));
    let mut cancel_asked = false;
    loop {
        tokio::select! {
            // Ctrl-C asks the server to cancel the turn (its command on the laptop is killed);
            // the stream then ends with "cancelled". A second Ctrl-C stops waiting for that.
            _ = tokio::signal::ctrl_c() => {
                if cancel_asked {
                    eprintln!("\nstopped waiting; the turn ends on the server");
                    return Ok(());
                }
                cancel_asked = true;
                eprintln!("\ncancelling the turn… (Ctrl-C again to stop waiting)");
                if let Err(error) = api.call("POST", &format!("/v1/chats/{chat}/cancel"), None).await {
                    eprintln!("cannot cancel: {}", shown(&error.to_string()));
                }
            }
            frame = body.frame() => {
                let Some(frame) = frame else { break };
                let frame = frame.map_err(|e| ChatError::Protocol { what: path.clone(), detail: e.to_string() })?;
                let Ok(chunk) = frame.into_data() else { continue };
                pending.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = pending.find("\n\n") {
                    let block: String = pending.drain(..end + 2).collect();
                    let mut kind = "";
                    let mut data = Value::Null;
                    for line in block.lines() {
                        if let Some(k) = line.strip_prefix("event: ") {
                            kind = k;
                        } else if let Some(d) = line.strip_prefix("data: ") {
                            data = serde_json::from_str(d).unwrap_or(Value::Null);
                        }
                    }
                    screen.event(kind, &data);
                }
            }
            _ = ticker.tick() => screen.tick(),
        }
    }
    Ok(())
}

/// Find the device sharing `alias` (and named `device`, when given), preferring online ones.
fn pick_device(
    devices: &Value,
    alias: &str,
    device: Option<&str>,
) -> Result<(Value, Value), ChatError> {
    let all = devices["devices"].as_array().cloned().unwrap_or_default();
    let mut candidates: Vec<(Value, Value)> = all
        .iter()
        .filter(|d| device.is_none_or(|n| d["name"] == n || d["device_id"] == n))
        .filter_map(|d| {
            d["folders"]
                .as_array()?
                .iter()
                .find(|f| f["alias"] == alias)
                .map(|f| (d.clone(), f.clone()))
        })
        .collect();
    candidates.sort_by_key(|(d, _)| d["online"] != true);
    match candidates.len() {
        0 => {
            let shared: Vec<String> = all
                .iter()
                .flat_map(|d| {
                    let name = d["name"].as_str().unwrap_or("?").to_owned();
                    d["folders"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .map(move |f| format!("{}:{}", name, f["alias"].as_str().unwrap_or("?")))
                })
                .collect();
            Err(ChatError::Usage(format!(
                "no device of yours shares a folder named {alias:?}{}; shared now: {}. Run `agentworks executor connect --write-folder …` first",
                device.map(|d| format!(" on {d:?}")).unwrap_or_default(),
                if shared.is_empty() {
                    "nothing".into()
                } else {
                    shared.join(", ")
                }
            )))
        }
        1 => Ok(candidates.remove(0)),
        // Two devices of one name are two credentials (a device id belongs to the credential
        // that created it): never pick one of them for the person by online state.
        _ if candidates[1..]
            .iter()
            .any(|(d, _)| d["name"] == candidates[0].0["name"]) =>
        {
            let ids: Vec<String> = candidates
                .iter()
                .map(|(d, _)| {
                    format!(
                        "{} ({}, {})",
                        d["device_id"].as_str().unwrap_or("?"),
                        d["name"].as_str().unwrap_or("?"),
                        if d["online"] == true {
                            "online"
                        } else {
                            "offline"
                        }
                    )
                })
                .collect();
            Err(ChatError::Usage(format!(
                "several devices with the same name share {alias:?} (they connected with different credentials); choose one with --device DEVICE_ID: {}",
                ids.join(", ")
            )))
        }
        _ if candidates[0].0["online"] == true && candidates[1].0["online"] != true => {
            Ok(candidates.remove(0))
        }
        _ => Err(ChatError::Usage(format!(
            "several devices share {alias:?}; choose one with --device NAME"
        ))),
    }
}

fn confirm(question: &str, assume_yes: bool) -> Result<bool, ChatError> {
    if assume_yes {
        return Ok(true);
    }
    eprint!("{question} [type yes]: ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim() == "yes")
}

/// The whole session: chat, optional binding, then one turn per line until EOF or `/quit`.
pub async fn run(options: ChatOptions) -> Result<(), ChatError> {
    let api = Api {
        server: &options.server,
        token: &options.token,
    };
    // The folder is found and the consequences confirmed before a chat exists: a wrong
    // `--local` (or a "no") leaves no empty chat behind.
    let folder = match &options.local {
        Some(alias) => Some(
            choose_folder(&api, alias, options.device.as_deref(), options.assume_yes)
                .await
                .map_err(|error| match (error, &options.chat) {
                    (ChatError::Usage(why), None) => {
                        ChatError::Usage(format!("{why} (no chat was started)"))
                    }
                    (error, _) => error,
                })?,
        ),
        None => None,
    };
    let (chat_id, chat) = open_chat(&api, &options).await?;
    println!("chat {} in {}", shown(&chat_id), shown(&options.project));
    let earlier = history_lines(&chat);
    if !earlier.is_empty() {
        println!("— earlier in this chat —");
        for line in earlier {
            println!("{}", shown(&line));
        }
        println!("— now —");
    }
    if let Some(folder) = folder {
        bind(&api, &chat_id, &folder).await?;
    }
    converse(&api, &chat_id).await
}

/// The earlier turns of a chat as `GET /v1/chats/{id}` answers it, as the lines a turn shows:
/// the person's messages, the model's text, and each tool call folded to its ✓/✗ line.
fn history_lines(chat: &Value) -> Vec<String> {
    let mut calls: std::collections::HashMap<&str, (&str, String)> = Default::default();
    let mut lines = Vec::new();
    for message in chat["messages"].as_array().into_iter().flatten() {
        match message["role"].as_str() {
            Some("user") => lines.push(format!(
                "you> {}",
                message["content"].as_str().unwrap_or("")
            )),
            Some("assistant") => {
                if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
                    lines.push(format!("agent> {text}"));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    let name = call["function"]["name"].as_str().unwrap_or("tool");
                    let folded = format!(
                        "{name} {}",
                        summarize_call(name, &call["function"]["arguments"])
                    );
                    calls.insert(call["id"].as_str().unwrap_or(""), (name, folded));
                }
            }
            Some("tool") => {
                let id = message["tool_call_id"].as_str().unwrap_or("");
                let (name, folded) = calls
                    .get(id)
                    .cloned()
                    .unwrap_or(("tool", "tool".to_owned()));
                // The stored content is the result as the model got it ({ok, result|error});
                // with the name and the server's state it reads like the turn's event.
                let mut event = message["content"]
                    .as_str()
                    .and_then(|c| serde_json::from_str::<Value>(c).ok())
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                event["name"] = json!(name);
                for field in ["state", "summary"] {
                    if !message[field].is_null() {
                        event[field] = message[field].clone();
                    }
                }
                lines.push(result_line(&folded, &event));
            }
            _ => {}
        }
    }
    lines
}

/// Resume the chat given (with its messages), or create one in the project; returns its id
/// and the chat as agentd answered it.
async fn open_chat(api: &Api<'_>, options: &ChatOptions) -> Result<(String, Value), ChatError> {
    let chat = match &options.chat {
        Some(id) => api.call("GET", &format!("/v1/chats/{id}"), None).await?,
        None => {
            api.call(
                "POST",
                "/v1/chats",
                Some(json!({ "project": options.project })),
            )
            .await?
        }
    };
    let id = chat["chat_id"]
        .as_str()
        .or(chat["chat"]["chat_id"].as_str())
        .ok_or_else(|| ChatError::Protocol {
            what: "the chat".into(),
            detail: chat.to_string(),
        })?
        .to_owned();
    Ok((id, chat))
}

/// A folder of the person's device that a chat is to be bound to, its consequences confirmed.
struct ChosenFolder {
    device_id: Value,
    /// The device's name as the terminal may show it.
    device_name: String,
    alias: String,
}

/// The device folder shared as `alias`, once the consequences are shown and an explicit "yes"
/// (or `assume_yes`) is given; without it nothing is chosen (and nothing will be bound).
async fn choose_folder(
    api: &Api<'_>,
    alias: &str,
    device: Option<&str>,
    assume_yes: bool,
) -> Result<ChosenFolder, ChatError> {
    let devices = api.call("GET", "/v1/devices", None).await?;
    let (device, folder) = pick_device(&devices, alias, device)?;
    let access = folder["access"].as_str().unwrap_or("read_only");
    let device_name = shown(device["name"].as_str().unwrap_or("?")).into_owned();
    let shown_alias = shown(alias);
    eprintln!(
        "Binding this chat to {device_name}:{shown_alias} ({}, {}).",
        if access == "read_write" {
            "files and commands may change the folder"
        } else {
            "read-only: commands run in a read-only sandbox"
        },
        if device["online"] == true {
            "online"
        } else {
            "offline: tool calls will fail until it reconnects"
        }
    );
    eprintln!(
        "Consequences: file contents and command output go to the server and the model; commands can reach the network."
    );
    eprintln!(
        "Server files, MCP connections and secrets are not available in this chat while it is bound."
    );
    if !confirm("Use this folder?", assume_yes)? {
        return Err(ChatError::Usage(
            "not bound: the consequences were not confirmed".into(),
        ));
    }
    Ok(ChosenFolder {
        device_id: device["device_id"].clone(),
        device_name,
        alias: alias.to_owned(),
    })
}

/// Bind the chat to the folder chosen (and confirmed) with [`choose_folder`].
async fn bind(api: &Api<'_>, chat_id: &str, folder: &ChosenFolder) -> Result<(), ChatError> {
    api.call(
        "PUT",
        &format!("/v1/chats/{chat_id}/binding"),
        Some(json!({ "device_id": folder.device_id, "folder": folder.alias, "confirm": CONFIRMATION })),
    )
    .await?;
    println!("bound to {}:{}", folder.device_name, shown(&folder.alias));
    Ok(())
}

/// One turn per line (`/unbind` switches back to server files) until EOF, `/quit`, `/exit` or
/// Ctrl-C at the prompt. A failed turn is shown and the chat goes on.
async fn converse(api: &Api<'_>, chat_id: &str) -> Result<(), ChatError> {
    let mut screen = Screen {
        tty: std::io::stdout().is_terminal(),
        running: None,
        spin: 0,
        in_text: false,
    };
    let mut lines = stdin_lines();
    loop {
        if std::io::stdin().is_terminal() {
            eprint!("you> ");
            let _ = std::io::stderr().flush();
        }
        let line = tokio::select! {
            line = lines.recv() => match line {
                Some(line) => line?,
                None => break,
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!();
                break;
            }
        };
        let message = line.trim();
        match message {
            "" => continue,
            "/quit" | "/exit" => break,
            "/unbind" => unbind(api, chat_id).await,
            _ => {
                if let Err(e) = turn(api, chat_id, message, &mut screen).await {
                    println!("error: {}", shown(&e.to_string()));
                }
            }
        }
    }
    Ok(())
}

/// Stdin's lines, read on their own thread so Ctrl-C at the prompt still ends the chat once a
/// turn has taken over SIGINT (tokio keeps its handler for the rest of the process).
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<std::io::Result<String>> {
    let (lines_sender, lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            if lines_sender.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// `/unbind`: the chat works on server files again; a failure is shown, not fatal.
async fn unbind(api: &Api<'_>, chat_id: &str) {
    eprintln!(
        "Switching back to server files: the agent reads and writes the project on the server again."
    );
    match api
        .call("DELETE", &format!("/v1/chats/{chat_id}/binding"), None)
        .await
    {
        Ok(_) => println!("unbound: server files"),
        Err(e) => println!("error: {}", shown(&e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_and_results_fold_to_one_line() {
        let call = summarize_call(
            "execute_shell_command",
            &json!("{\"command\":\"cargo test\\n--all\"}"),
        );
        assert_eq!(call, "cargo test ⏎ --all");
        let ok = json!({"name": "execute_shell_command", "ok": true,
            "result": {"exit_code": 0, "stdout": "a\nb\n", "stdout_truncated": true}});
        assert_eq!(
            summarize_result(&ok),
            "exit 0, 2 lines of output, truncated"
        );
        let err = json!({"name": "execute_shell_command", "ok": false, "error": {"code": "device_offline", "message": "offline"}});
        assert_eq!(summarize_result(&err), "device_offline: offline");
        assert!(result_line("x", &err).starts_with("  ✗ x — "));
        let long = summarize_call("read_file", &json!({"path": "x".repeat(100)}));
        assert!(long.ends_with('…') && long.chars().count() == 71);
    }

    #[test]
    fn the_servers_state_decides_the_mark_and_older_servers_fall_back_to_ok() {
        // A command that ran and exited 2: `ok` (it ran) but failed, with the server's summary.
        let exited = json!({"name": "execute_shell_command", "ok": true, "state": "failed",
            "summary": "exit 2: ls: cannot access 'x'",
            "result": {"exit_code": 2, "stdout": "", "stderr": "ls: cannot access 'x'\n"}});
        assert_eq!(
            result_line("execute_shell_command ls x", &exited),
            "  ✗ execute_shell_command ls x — exit 2: ls: cannot access 'x'"
        );
        let timed_out = json!({"name": "execute_shell_command", "ok": true, "state": "failed",
            "summary": "timed out after 30 s", "result": {"exit_code": null, "timed_out": true}});
        assert_eq!(
            result_line("execute_shell_command sleep 99", &timed_out),
            "  ✗ execute_shell_command sleep 99 — timed out after 30 s"
        );
        let done = json!({"name": "execute_shell_command", "ok": true, "state": "done",
            "summary": "exit 0", "result": {"exit_code": 0, "stdout": "a\n"}});
        assert_eq!(
            result_line("execute_shell_command echo a", &done),
            "  ✓ execute_shell_command echo a — exit 0, 1 line of output"
        );
        // An older server: no state, so `ok` decides.
        let old = json!({"name": "execute_shell_command", "ok": true,
            "result": {"exit_code": 2, "stdout": ""}});
        assert!(result_line("c", &old).starts_with("  ✓ c — exit 2"));
        let old_error = json!({"name": "read_file", "ok": false,
            "error": {"code": "not_found", "message": "no such file"}});
        assert_eq!(
            result_line("read_file a", &old_error),
            "  ✗ read_file a — not_found: no such file"
        );
    }

    #[test]
    fn a_resumed_chat_shows_its_earlier_turns() {
        let content = |v: Value| Value::String(v.to_string());
        let chat = json!({"chat_id": "c1", "messages": [
            {"seq": 1, "turn": 1, "role": "user", "content": "run the tests"},
            {"seq": 2, "turn": 1, "role": "assistant", "content": null, "tool_calls": [
                {"id": "k1", "type": "function", "function": {"name": "execute_shell_command",
                 "arguments": "{\"command\":\"make test\"}"}},
                {"id": "k2", "type": "function", "function": {"name": "execute_shell_command",
                 "arguments": "{\"command\":\"echo ok\"}"}}]},
            {"seq": 3, "turn": 1, "role": "tool", "tool_call_id": "k1", "state": "failed",
             "summary": "exit 2: make: *** No rule to make target 'test'",
             "content": content(json!({"ok": true, "result": {"exit_code": 2, "stdout": ""}}))},
            {"seq": 4, "turn": 1, "role": "tool", "tool_call_id": "k2", "state": "done",
             "summary": "exit 0",
             "content": content(json!({"ok": true, "result": {"exit_code": 0, "stdout": "ok\n"}}))},
            {"seq": 5, "turn": 1, "role": "assistant", "content": "there is no test target"},
        ]});
        assert_eq!(
            history_lines(&chat),
            [
                "you> run the tests",
                "  ✗ execute_shell_command make test — exit 2: make: *** No rule to make target 'test'",
                "  ✓ execute_shell_command echo ok — exit 0, 1 line of output",
                "agent> there is no test target",
            ]
        );
        assert!(history_lines(&json!({"chat_id": "c2", "messages": []})).is_empty());
    }

    #[test]
    fn picks_the_online_device_sharing_the_alias() {
        let devices = json!({"devices": [
            {"device_id": "d1", "name": "old", "online": false, "folders": [{"alias": "site", "access": "read_write"}]},
            {"device_id": "d2", "name": "laptop", "online": true, "folders": [{"alias": "site", "access": "read_write"}]},
        ]});
        assert_eq!(
            pick_device(&devices, "site", None).unwrap().0["device_id"],
            "d2"
        );
        assert_eq!(
            pick_device(&devices, "site", Some("old")).unwrap().0["device_id"],
            "d1"
        );
        assert!(pick_device(&devices, "other", None).is_err());
    }

    #[test]
    fn never_picks_between_two_devices_of_one_name() {
        // Another credential connected with the name "laptop": online, while the person's own
        // laptop is offline. Nothing is picked by online state; an id picks.
        let devices = json!({"devices": [
            {"device_id": "d-other", "name": "laptop", "online": true, "folders": [{"alias": "site", "access": "read_write"}]},
            {"device_id": "d-mine", "name": "laptop", "online": false, "folders": [{"alias": "site", "access": "read_write"}]},
        ]});
        let refused = pick_device(&devices, "site", None).unwrap_err().to_string();
        assert!(
            refused.contains("d-other") && refused.contains("d-mine"),
            "{refused}"
        );
        assert!(pick_device(&devices, "site", Some("laptop")).is_err());
        assert_eq!(
            pick_device(&devices, "site", Some("d-mine")).unwrap().0["device_id"],
            "d-mine"
        );
    }
}
