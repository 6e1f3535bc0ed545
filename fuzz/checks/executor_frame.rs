//! The executor WebSocket, as each end decodes what the other sent. The input's first byte
//! picks the end (even: gatewayd reading an executor, odd: the laptop reading gatewayd) and
//! whether the rest is raw bytes off the socket (bit 1 clear: read by tungstenite with that
//! end's limits, `gateway::executor::ws_config` or `laptop::connect::ws_config`) or one text
//! frame's payload (bit 1 set). Every text message is decoded as that end does
//! (`serde_json::from_str` into `ExecutorFrame` or `GatewayFrame`; a hello then goes through
//! `check_hello`).
//!
//! It must never panic or allocate past the limits: no message longer than `MAX_FRAME_BYTES`
//! reaches the decoder; a decoded frame re-serialises to text that decodes to the same frame;
//! an accepted hello names a clean device and unique, path-free folder aliases; and the
//! deadline of any requested operation is a bounded `Duration` (agentd and gatewayd add it to
//! `Instant::now()`).

use std::io::{Cursor, Read, Write};
use std::time::Instant;

use agentworks_contract::executor::{
    ExecutorFrame, GatewayFrame, MAX_ALIAS_CHARS, MAX_DEVICE_NAME_CHARS, MAX_FOLDERS,
    MAX_FRAME_BYTES, MAX_TIMEOUT_SECS, PATCH_DEADLINE, SHELL_GRACE, check_hello,
};
use tokio_tungstenite::tungstenite::protocol::{Message, Role, WebSocket, WebSocketConfig};

/// The socket: the input to read, and a sink for whatever the end writes back (pongs, closes).
struct Wire {
    input: Cursor<Vec<u8>>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// gatewayd's decoding of one text frame from an executor.
fn executor_text(text: &str) {
    let Ok(frame) = serde_json::from_str::<ExecutorFrame>(text) else {
        return;
    };
    let again = serde_json::to_string(&frame).expect("a frame serialises");
    assert_eq!(
        serde_json::from_str::<ExecutorFrame>(&again).as_ref().ok(),
        Some(&frame),
        "{again}"
    );
    if let ExecutorFrame::Hello {
        device_name,
        version,
        folders,
    } = &frame
        && check_hello(device_name, version, folders).is_ok()
    {
        let chars = device_name.chars().count();
        assert!((1..=MAX_DEVICE_NAME_CHARS).contains(&chars));
        assert!(!device_name.chars().any(char::is_control));
        assert!(folders.len() <= MAX_FOLDERS);
        for (i, folder) in folders.iter().enumerate() {
            let alias = folder.alias.as_str();
            assert!((1..=MAX_ALIAS_CHARS).contains(&alias.chars().count()));
            assert!(!alias.contains(['/', '\\', '\0']) && alias != "." && alias != "..");
            assert!(!alias.chars().any(char::is_control), "{alias:?}");
            assert!(folders[..i].iter().all(|f| f.alias != folder.alias));
        }
    }
}

/// The laptop's decoding of one text frame from gatewayd.
fn gateway_text(text: &str) {
    let Ok(frame) = serde_json::from_str::<GatewayFrame>(text) else {
        return;
    };
    let again = serde_json::to_string(&frame).expect("a frame serialises");
    assert_eq!(
        serde_json::from_str::<GatewayFrame>(&again).as_ref().ok(),
        Some(&frame),
        "{again}"
    );
    if let GatewayFrame::Request { operation, .. } = &frame {
        let deadline = operation.deadline();
        let longest =
            SHELL_GRACE.max(PATCH_DEADLINE) + std::time::Duration::from_secs(MAX_TIMEOUT_SECS);
        assert!(deadline <= longest, "{deadline:?}");
        assert!(tokio::time::Instant::now().checked_add(deadline).is_some());
        assert!(Instant::now().checked_add(deadline).is_some());
    }
}

/// Reads `bytes` as one end of the socket with `config`, decoding every text message.
fn read_socket(bytes: &[u8], role: Role, config: WebSocketConfig, decode: fn(&str)) {
    let wire = Wire {
        input: Cursor::new(bytes.to_vec()),
    };
    let mut socket = WebSocket::from_raw_socket(wire, role, Some(config));
    // Every message consumes at least two bytes, so this bound is never what ends the loop
    // on real input; it only keeps a reader bug from spinning forever.
    for _ in 0..=bytes.len() {
        let message = match socket.read() {
            Ok(message) => message,
            Err(_) => return,
        };
        assert!(message.len() <= MAX_FRAME_BYTES, "{} bytes", message.len());
        if let Message::Text(text) = message {
            decode(text.as_str());
        }
    }
}

pub fn run(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let laptop = selector & 1 == 1;
    let decode: fn(&str) = if laptop { gateway_text } else { executor_text };
    if selector & 2 == 2 {
        if let Ok(text) = std::str::from_utf8(rest) {
            decode(text);
        }
        return;
    }
    if laptop {
        read_socket(
            rest,
            Role::Client,
            agentworks_laptop::connect::ws_config(),
            decode,
        );
    } else {
        read_socket(
            rest,
            Role::Server,
            agentworks_gateway::executor::ws_config(),
            decode,
        );
    }
}
