//! What the runner's integration tests share: scripted model servers on loopback.
//!
//! Each test binary includes it with `mod support;` and uses only part of it.
#![allow(dead_code)]

pub mod responses;
