//! libFuzzer entry for `checks/rel_path.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/rel_path.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
