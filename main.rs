//! The `vkllm` binary; the commands live in `cli/`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
