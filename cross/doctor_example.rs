//! `hsiedge doctor` as a standalone program, for checking systems before the binary's subcommand is wired
//! (and inside the arm64 root of `cross/run deb-install-test`): `cargo run --example hsiedge-doctor -- --help`.

use clap::Parser;

/// Checks that the configured hsiedge deployment can run here.
#[derive(Parser)]
#[command(name = "hsiedge-doctor", version)]
struct Cli {
    #[command(flatten)]
    args: hsiedge::doctor::DoctorArgs,
}

fn main() {
    std::process::exit(hsiedge::doctor::main(&Cli::parse().args));
}
