//! `agentworks-gatewayd`: not built yet (see the open issues); it says so and exits 2.

fn main() -> std::process::ExitCode {
    eprintln!("agentworks-gatewayd is not built yet");
    std::process::ExitCode::from(2)
}
