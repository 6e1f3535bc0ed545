//! libFuzzer entry for `checks/workspaced_body.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/workspaced_body.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
