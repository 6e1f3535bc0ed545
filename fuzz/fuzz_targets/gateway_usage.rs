//! libFuzzer entry for `checks/gateway_usage.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/gateway_usage.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
