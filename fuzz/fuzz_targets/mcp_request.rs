//! libFuzzer entry for `checks/mcp_request.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/mcp_request.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
