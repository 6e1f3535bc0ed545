//! `agentworks`, the laptop CLI: not built yet (see the open issues); it says so and exits 2.

fn main() -> std::process::ExitCode {
    eprintln!("agentworks (the laptop CLI) is not built yet");
    std::process::ExitCode::from(2)
}
