//! libFuzzer entry for `checks/acl_decode.rs` (the body, shared with the stable regression test).
#![no_main]

#[path = "../checks/acl_decode.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
