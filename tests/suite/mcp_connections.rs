//! A project's MCP connections over real HTTP against a real agentd: who may add, list and
//! remove them (the live role, checked at every request), the rules a connection must meet
//! (remote https only, no stdio, no refused address, no header value typed in), and what is
//! shown (no query string, no secret value). The connections' use in turns is not built yet.

use super::harness::{Stack, http};
use serde_json::{Value, json};

fn user(stack: &Stack, name: &str) -> String {
    stack.admin("users/add", json!({"name": name}));
    stack.token(name, &["workflows:write"], json!({}))
}

fn call(stack: &Stack, token: &str, method: &str, path: &str, body: Value) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let (status, _, text) = http(
        stack.port,
        method,
        path,
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ],
        &body.to_string(),
    );
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

fn code(answer: &(u16, Value)) -> (u16, Option<&str>) {
    (answer.0, answer.1["error"]["code"].as_str())
}

struct Setup {
    stack: Stack,
    owner: String,
    project: String,
}

impl Setup {
    fn start() -> Setup {
        let stack = Stack::start();
        let owner = user(&stack, "olive");
        stack.admin(
            "projects/add",
            json!({"name": "app", "kind": "code", "owner": "olive"}),
        );
        let project = stack
            .admin("projects/list", json!({}))
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "app")
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        Setup {
            stack,
            owner,
            project,
        }
    }

    fn path(&self) -> String {
        format!("/v1/projects/{}/mcp-connections", self.project)
    }

    fn add(&self, token: &str, body: Value) -> (u16, Value) {
        call(&self.stack, token, "POST", &self.path(), body)
    }

    fn list(&self, token: &str) -> (u16, Value) {
        call(&self.stack, token, "GET", &self.path(), json!(null))
    }

    fn remove(&self, token: &str, id: &str) -> (u16, Value) {
        let path = format!("{}/{id}", self.path());
        call(&self.stack, token, "DELETE", &path, json!(null))
    }
}

#[test]
fn owners_manage_connections_editors_only_see_them_and_outsiders_see_nothing() {
    let s = Setup::start();
    let added = s.add(
        &s.owner,
        json!({"name": "Linear", "url": "https://mcp.linear.example/mcp?workspace=k-123",
               "headers": {"Authorization": {"secret": "LINEAR_API_KEY", "format": "Bearer {}"}}}),
    );
    assert_eq!(added.0, 201, "{}", added.1);
    let id = added.1["connection_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("mcpc_"), "{id}");
    // The query string is never shown; the header shows the secret's name only.
    assert_eq!(added.1["url"], "https://mcp.linear.example/mcp");
    assert_eq!(
        added.1["headers"],
        json!({"authorization": {"secret": "LINEAR_API_KEY", "format": "Bearer {}"}})
    );
    assert!(!added.1.to_string().contains("k-123"), "{}", added.1);

    let editor = user(&s.stack, "eddie");
    s.stack.admin(
        "members/add",
        json!({"project": "app", "user": "eddie", "role": "editor"}),
    );
    let listed = s.list(&editor);
    assert_eq!(listed.0, 200, "{}", listed.1);
    assert_eq!(listed.1["connections"].as_array().unwrap().len(), 1);
    assert_eq!(listed.1["connections"][0]["connection_id"], id.as_str());
    assert!(!listed.1.to_string().contains("k-123"));
    // An editor can neither add nor remove.
    let refused = s.add(
        &editor,
        json!({"name": "Mine", "url": "https://mcp.example/mcp"}),
    );
    assert_eq!(code(&refused), (403, Some("forbidden")), "{}", refused.1);
    assert_eq!(code(&s.remove(&editor, &id)), (403, Some("forbidden")));

    // A co-owner may; promoted live, the same token now can.
    s.stack.admin(
        "members/add",
        json!({"project": "app", "user": "eddie", "role": "co-owner"}),
    );
    let second = s.add(
        &editor,
        json!({"name": "Linear", "url": "https://mcp.example/mcp"}),
    );
    assert_eq!(second.0, 201, "{}", second.1);
    // The same display name, another internal name.
    assert_ne!(second.1["connection_id"], id.as_str());

    // A read-scoped token of the owner cannot manage.
    let reader = s.stack.token("olive", &["workflows:read"], json!({}));
    assert_eq!(
        code(&s.add(
            &reader,
            json!({"name": "x", "url": "https://mcp.example/mcp"})
        )),
        (403, Some("insufficient_scope"))
    );
    assert_eq!(s.list(&reader).0, 200);

    // Someone outside the project learns nothing: not the list, not whether it exists.
    let outsider = user(&s.stack, "mallory");
    assert_eq!(code(&s.list(&outsider)).0, 404);
    assert_eq!(code(&s.remove(&outsider, &id)).0, 404);
    // Removed from the project, the former co-owner can do nothing either.
    s.stack
        .admin("members/remove", json!({"project": "app", "user": "eddie"}));
    assert_eq!(code(&s.remove(&editor, &id)).0, 404);

    // The owner removes it; it is gone, and a second removal says so.
    let removed = s.remove(&s.owner, &id);
    assert_eq!(removed, (200, json!({"removed": id})));
    assert_eq!(code(&s.remove(&s.owner, &id)), (404, Some("not_found")));
    let left = s.list(&s.owner).1;
    assert_eq!(left["connections"].as_array().unwrap().len(), 1, "{left}");
}

#[test]
fn stdio_plain_http_refused_addresses_and_typed_header_values_are_refused_each_with_its_reason() {
    let s = Setup::start();
    let cases = [
        (
            json!({"name": "fs", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem"]}),
            "stdio_not_supported",
        ),
        (
            json!({"name": "fs", "transport": "stdio", "url": "https://mcp.example/"}),
            "stdio_not_supported",
        ),
        (
            json!({"name": "a", "url": "http://127.0.0.1:8470/mcp"}),
            "invalid_url",
        ),
        (
            json!({"name": "a", "url": "https://127.0.0.1/mcp"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://localhost/mcp"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://10.1.2.3/mcp"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://192.168.1.1/mcp"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://169.254.169.254/latest"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://100.100.100.200/"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://metadata.google.internal/"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://[::ffff:127.0.0.1]/mcp"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://[fe80::1]/mcp"}),
            "address_refused",
        ),
        (
            json!({"name": "a", "url": "https://user:pw@mcp.example/mcp"}),
            "invalid_url",
        ),
        (
            json!({"name": "a", "url": "https://mcp.example/mcp",
                   "headers": {"Authorization": "Bearer sk-live-typed-in"}}),
            "invalid_header",
        ),
        (
            json!({"name": "a", "url": "https://mcp.example/mcp",
                   "headers": {"Host": {"secret": "KEY"}}}),
            "invalid_header",
        ),
        (
            json!({"name": "", "url": "https://mcp.example/mcp"}),
            "invalid_name",
        ),
    ];
    for (body, expected) in cases {
        let answer = s.add(&s.owner, body.clone());
        assert_eq!(
            code(&answer),
            (400, Some(expected)),
            "{body} → {}",
            answer.1
        );
        // The refusal never echoes a typed-in secret.
        assert!(
            !answer.1.to_string().contains("sk-live-typed-in"),
            "{}",
            answer.1
        );
    }
    assert!(
        s.list(&s.owner).1["connections"]
            .as_array()
            .unwrap()
            .is_empty(),
        "a refused connection was stored"
    );
    // A workflow project has no chats, so no connections.
    s.stack.admin(
        "projects/add",
        json!({"name": "flows", "kind": "workflow", "owner": "olive"}),
    );
    let answer = call(
        &s.stack,
        &s.owner,
        "POST",
        "/v1/projects/flows/mcp-connections",
        json!({"name": "a", "url": "https://mcp.example/mcp"}),
    );
    assert_eq!(
        code(&answer),
        (400, Some("not_a_code_project")),
        "{}",
        answer.1
    );
}
