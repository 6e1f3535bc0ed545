//! libFuzzer entry for `checks/acp_session.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/acp_session.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
