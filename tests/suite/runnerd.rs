//! `agentworks-runnerd` on its own socket, as agentd calls it: its providers, and the turns it
//! refuses before any CLI starts (an unknown or missing provider, a project that is no folder,
//! a runtime whose `project` is something else than runnerd's link).

use super::harness::*;
use agentworks_contract::runnerd::Mode;
use agentworks_runner::runtime::RuntimeKey;
use serde_json::{Value, json};
use std::time::Duration;

/// A config with a provider whose executable is `executable`.
fn provider_config(name: &str, executable: &str) -> String {
    format!(
        "[runnerd.providers.{name}]\ndriver = \"codex\"\nexecutable = \"{executable}\"\nmodel = \"scripted\"\nupstream = \"http://127.0.0.1:9/v1\"\n"
    )
}

fn turn_request(project: &str, provider: &str, mode: &str) -> Value {
    json!({
        "chat_id": "chat-1",
        "user_id": "user-1",
        "project": project,
        "provider": provider,
        "mode": mode,
        "guard": {"write_paths": [""]},
        "prompt": "hello",
    })
}

fn only_error(events: &[Value]) -> (&str, &str) {
    assert_eq!(events.len(), 1, "one error event, not {events:#?}");
    assert_eq!(events[0]["type"], "error", "{events:#?}");
    (
        events[0]["code"].as_str().unwrap_or_default(),
        events[0]["message"].as_str().unwrap_or_default(),
    )
}

#[test]
fn runnerd_lists_its_providers_and_names_a_missing_executable() {
    let state = StateRoot::new();
    let present = state.root().join("bin/fake-codex");
    std::fs::create_dir_all(present.parent().unwrap()).unwrap();
    std::fs::write(&present, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(
        &present,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    state.set_config(&format!(
        "{}{}",
        provider_config("codex", &present.display().to_string()),
        provider_config("gone", "/nonexistent/codex")
    ));
    let runnerd = Runnerd::start(&state);
    let health = runnerd.get("/v1/health");
    assert_eq!(health["daemon"], "agentworks-runnerd");
    let providers = runnerd.get("/v1/providers");
    let list = providers["providers"].as_array().unwrap();
    let by_name = |name: &str| list.iter().find(|p| p["name"] == name).unwrap().clone();
    let codex = by_name("codex");
    assert_eq!(codex["driver"], "codex");
    assert_eq!(codex["executable"], present.display().to_string());
    assert!(codex.get("unavailable").is_none(), "{codex}");
    let gone = by_name("gone");
    let why = gone["unavailable"].as_str().unwrap();
    assert!(why.contains("/nonexistent/codex"), "{why}");

    // A turn with the missing one is refused by name; one with no such provider too.
    let events = runnerd
        .turn(&turn_request("p", "gone", "run"))
        .finish(Duration::from_secs(10));
    let (code, message) = only_error(&events);
    assert_eq!(code, "provider_unavailable");
    assert!(message.contains("gone"), "{message}");
    let events = runnerd
        .turn(&turn_request("p", "nope", "run"))
        .finish(Duration::from_secs(10));
    assert_eq!(only_error(&events).0, "unknown_provider");
}

#[test]
fn runnerd_refuses_a_project_that_is_no_folder_of_the_documents_root() {
    let state = StateRoot::new();
    let exe = "/bin/true";
    state.set_config(&provider_config("codex", exe));
    state.project("real", &[("a.txt", "a")]);
    // A symlink named like a project, to a folder outside the documents root.
    let outside = state.root().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, state.documents().join("linked")).unwrap();
    let runnerd = Runnerd::start(&state);
    for project in ["../outside", "linked", "missing", ".", ""] {
        let events = runnerd
            .turn(&turn_request(project, "codex", "run"))
            .finish(Duration::from_secs(10));
        let (code, message) = only_error(&events);
        assert_eq!(code, "project_unavailable", "{project:?}: {message}");
    }
}

#[test]
fn a_runtime_whose_project_is_not_runnerds_link_is_refused_and_left_alone() {
    let state = StateRoot::new();
    state.set_config(&provider_config("codex", "/bin/true"));
    state.project("real", &[("a.txt", "a")]);
    state.project("other", &[("b.txt", "b")]);
    let runnerd = Runnerd::start(&state);
    let runtime_of = |chat: &str| {
        let key = RuntimeKey {
            user_id: "user-1",
            project: "real",
            chat_id: chat,
            provider: "codex",
            mode: Mode::Run,
            laptop: false,
        };
        state.root().join("runner/runtimes").join(key.dir_name())
    };
    let request = |chat: &str| {
        let mut r = turn_request("real", "codex", "run");
        r["chat_id"] = json!(chat);
        r
    };
    // A file, a directory with a file in it, and a link to another project.
    let file_chat = runtime_of("file");
    std::fs::create_dir_all(&file_chat).unwrap();
    std::fs::write(file_chat.join("project"), "mine").unwrap();
    let dir_chat = runtime_of("dir");
    std::fs::create_dir_all(dir_chat.join("project")).unwrap();
    std::fs::write(dir_chat.join("project/kept.txt"), "kept").unwrap();
    let link_chat = runtime_of("link");
    std::fs::create_dir_all(&link_chat).unwrap();
    std::os::unix::fs::symlink(state.documents().join("other"), link_chat.join("project")).unwrap();
    for chat in ["file", "dir", "link"] {
        let events = runnerd.turn(&request(chat)).finish(Duration::from_secs(10));
        let (code, message) = only_error(&events);
        assert_eq!(code, "runtime_occupied", "{chat}: {message}");
    }
    assert_eq!(
        std::fs::read_to_string(file_chat.join("project")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(dir_chat.join("project/kept.txt")).unwrap(),
        "kept"
    );
    assert_eq!(
        std::fs::read_link(link_chat.join("project")).unwrap(),
        state.documents().join("other")
    );
    assert_eq!(
        std::fs::read_to_string(state.documents().join("other/b.txt")).unwrap(),
        "b"
    );
}
