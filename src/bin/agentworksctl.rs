//! `agentworksctl`.

fn main() {}
