//! The one integration-test binary: real daemons on temp state roots, real sockets, real
//! users, ACLs and signals. Each module of `suite` covers one domain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
