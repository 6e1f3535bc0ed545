//! workspaced's request bodies: the input's first byte picks a `/v1/...` endpoint, the rest is
//! the POST body, parsed by `server::parse_body` into that endpoint's request type as the
//! server does before any operation runs. It must never panic; a refused body is the
//! `invalid_request` answer (400); an accepted one re-serialises to JSON that parses to the same
//! request; and the guard it carries, when it resolves, never lets a path be written that it
//! would not let be read, nor a protected file (`workflow.json`, `product.json`) be written.

use agentworks_contract::workspaced::{
    Context, DeleteRequest, EditRequest, EnsureProjectRequest, HistoryRequest, ListRequest,
    MoveRequest, PatchRequest, PatchSetRequest, ReadRequest, ReceiptRequest, RestoreRequest,
    SearchRequest, StatRequest, WriteRequest,
};
use agentworks_core::guard::{PROTECTED_FILE_NAMES, RelPath};
use agentworks_workspace::server::parse_body;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Parses `body` as `Req` and checks the refusal or the round trip; the accepted request as
/// JSON.
fn round_trip<Req: DeserializeOwned + Serialize>(body: &[u8]) -> Option<Value> {
    let request = match parse_body::<Req>(body) {
        Ok(request) => request,
        Err(error) => {
            assert_eq!(error.code(), "invalid_request", "{error}");
            assert_eq!(error.status().as_u16(), 400, "{error}");
            return None;
        }
    };
    let value = serde_json::to_value(&request).expect("a request serialises");
    let text = serde_json::to_vec(&value).expect("JSON serialises");
    let again = parse_body::<Req>(&text)
        .unwrap_or_else(|e| panic!("a re-serialised request is refused: {e}: {value}"));
    let again = serde_json::to_value(&again).expect("a request serialises");
    assert_eq!(again, value, "serialise → parse is not the identity");
    Some(value)
}

/// The guard of an accepted request against the paths it names.
fn check_guard(request: &Value) {
    let Some(context) = request.get("context") else {
        return;
    };
    let context: Context =
        serde_json::from_value(context.clone()).expect("an accepted context parses alone");
    let Ok(guard) = context.guard.resolve() else {
        return;
    };
    for key in ["path", "to_path"] {
        let Some(Ok(path)) = request.get(key).and_then(Value::as_str).map(RelPath::parse) else {
            continue;
        };
        if guard.check_write(&path).is_ok() {
            assert!(
                guard.check_read(&path).is_ok(),
                "writable, not readable: {path}"
            );
            assert!(
                !guard.root_blocked(),
                "writable in a blocked project: {path}"
            );
            assert!(
                path.components()
                    .all(|c| !PROTECTED_FILE_NAMES.contains(&c)),
                "a protected file is writable: {path}"
            );
        }
        if guard.root_blocked() {
            assert!(
                guard.check_read(&path).is_err(),
                "readable in a blocked project"
            );
        }
    }
}

pub fn run(data: &[u8]) {
    let Some((&endpoint, body)) = data.split_first() else {
        return;
    };
    let accepted = match endpoint % 14 {
        0 => round_trip::<ReadRequest>(body),
        1 => round_trip::<StatRequest>(body),
        2 => round_trip::<ListRequest>(body),
        3 => round_trip::<SearchRequest>(body),
        4 => round_trip::<WriteRequest>(body),
        5 => round_trip::<PatchRequest>(body),
        6 => round_trip::<PatchSetRequest>(body),
        7 => round_trip::<EditRequest>(body),
        8 => round_trip::<MoveRequest>(body),
        9 => round_trip::<DeleteRequest>(body),
        10 => round_trip::<ReceiptRequest>(body),
        11 => round_trip::<HistoryRequest>(body),
        12 => round_trip::<RestoreRequest>(body),
        _ => round_trip::<EnsureProjectRequest>(body),
    };
    if let Some(request) = accepted {
        check_guard(&request);
    }
}
