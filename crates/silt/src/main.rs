//! `silt`: one binary, many roles. Thin: argument parsing and wiring; the logic lives in the
//! library crates.

mod cli;
mod cluster;
mod control;
mod csi;
mod daemon;
mod gateway;
mod ring;

use std::process::ExitCode;

fn main() -> ExitCode {
    let result = cli::run();
    // Counts of rate-limited warnings not logged yet (a daemon role that is stopping).
    silt_common::log::flush();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("silt: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
