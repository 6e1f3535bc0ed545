//! libFuzzer entry for `checks/claude_events.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/claude_events.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
