//! libFuzzer entry for `checks/bridge_mcp.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/bridge_mcp.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
