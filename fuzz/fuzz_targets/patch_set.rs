//! libFuzzer entry for `checks/patch_set.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/patch_set.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
