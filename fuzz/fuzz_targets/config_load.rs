//! libFuzzer entry for `checks/config_load.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/config_load.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
