//! `agentworks-runnerd`: runs coding CLIs as a chat's agent (being written).

fn main() -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}
