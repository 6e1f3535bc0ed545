//! libFuzzer entry for `checks/executor_frame.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/executor_frame.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
