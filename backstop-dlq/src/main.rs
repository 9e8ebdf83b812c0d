//! `backstop-dlq`: look into a tower-backstop dead-letter store, and re-drive or purge from it on
//! purpose. The commands live in the library's `cli` module; run `backstop-dlq --help`.

fn main() -> std::process::ExitCode {
    backstop_dlq::cli::main()
}
