//! libFuzzer entry for `checks/client_metadata.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/client_metadata.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
