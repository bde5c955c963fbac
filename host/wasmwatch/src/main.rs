//! The `wasmwatch` binary: everything lives in the library.
fn main() -> std::process::ExitCode {
    wasmwatch::cli::main()
}
