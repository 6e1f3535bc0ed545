//! `agentworks`, the laptop CLI: not built yet (see the open issues); it says so and exits 2.

fn main() -> std::process::ExitCode {
    // Sandbox launcher mode (`agentworks __sandbox-exec <policy-json> -- <sh> -c <command>`):
    // must stay first in main, while the process is single-threaded. It only returns on error,
    // before any command ran.
    if std::env::args().nth(1).as_deref() == Some(agentworks::executor::sandbox::SUBCOMMAND) {
        let args: Vec<String> = std::env::args().collect();
        let error = agentworks::executor::sandbox::launcher_main(&args[2..]);
        eprintln!("{}{error}", agentworks::executor::sandbox::REFUSAL_PREFIX);
        return std::process::ExitCode::from(126);
    }

    eprintln!("agentworks (the laptop CLI) is not built yet");
    std::process::ExitCode::from(2)
}
