use std::process::ExitCode;

fn main() -> ExitCode {
    captf::cli::main()
}
