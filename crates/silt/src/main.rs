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
            eprintln!("silt: error: {}", one_line(&e));
            ExitCode::from(1)
        }
    }
}

/// The error as one line: each context, down to the first Silt error, whose message already
/// says what its foreign sources mean (an OpenDAL error's request dump, with headers, stays
/// in the debug log).
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        // Contexts repeat their inner message when built with `{e}`: keep each once.
        if !parts.last().is_some_and(|p| p.ends_with(&text)) {
            parts.push(text);
        }
        if cause.downcast_ref::<silt_common::Error>().is_some() {
            break;
        }
    }
    parts.join(": ")
}
