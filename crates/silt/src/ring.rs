//! `silt ring simulate`: measures placement schemes (balance, keys moved on join and leave)
//! with `silt_cluster::placement::compare::simulate`. Silt places page groups by rendezvous
//! hashing; the other schemes are there for comparison.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{value_parser, Arg, ArgAction, ArgMatches, Command};
use silt_cluster::placement::compare::{simulate, Scheme, SimResult};

/// Most workers (before + joining) a simulation takes.
const MAX_WORKERS: usize = 4096;

pub fn command() -> Command {
    Command::new("ring")
        .about("Placement of page groups on workers (rendezvous hashing)")
        .subcommand_required(true)
        .subcommand(
            Command::new("simulate")
                .about(
                    "Simulate a placement scheme: balance, and keys moved when workers join or leave",
                )
                .arg(
                    Arg::new("workers")
                        .long("workers")
                        .value_name("N")
                        .value_parser(value_parser!(usize))
                        .default_value("4")
                        .help("Workers before the change"),
                )
                .arg(
                    Arg::new("join")
                        .long("join")
                        .value_name("J")
                        .value_parser(value_parser!(usize))
                        .default_value("1")
                        .help("Workers that join"),
                )
                .arg(
                    Arg::new("leave")
                        .long("leave")
                        .value_name("L")
                        .value_parser(value_parser!(usize))
                        .default_value("1")
                        .help("Workers that leave (fewer than --workers)"),
                )
                .arg(
                    Arg::new("pages")
                        .long("pages")
                        .value_name("N")
                        .value_parser(value_parser!(u64))
                        .default_value("1000000")
                        .help("Page-group keys to place"),
                )
                .arg(
                    Arg::new("scheme")
                        .long("scheme")
                        .value_name("SCHEME")
                        .default_value("rendezvous")
                        .help(
                            "rendezvous (what Silt uses), ring (100 vnodes), ring-N (N vnodes), \
                             jump, maglev (65537 entries), maglev-N, or all",
                        ),
                )
                .arg(
                    Arg::new("seed")
                        .long("seed")
                        .value_name("SEED")
                        .value_parser(value_parser!(u64))
                        .default_value("1")
                        .help("Seed of the worker ids and keys"),
                )
                .arg(
                    Arg::new("json")
                        .long("json")
                        .action(ArgAction::SetTrue)
                        .help("Print JSON (a list with --scheme all)"),
                ),
        )
}

pub fn run(m: &ArgMatches) -> Result<ExitCode> {
    match m.subcommand() {
        Some(("simulate", s)) => simulate_cmd(s),
        _ => bail!("missing ring subcommand (simulate)"),
    }
}

fn simulate_cmd(m: &ArgMatches) -> Result<ExitCode> {
    let get = |name: &str| m.get_one::<usize>(name).copied().unwrap_or_default();
    let (workers, join, leave) = (get("workers"), get("join"), get("leave"));
    let pages = m.get_one::<u64>("pages").copied().unwrap_or_default();
    let seed = m.get_one::<u64>("seed").copied().unwrap_or_default();
    let scheme = m
        .get_one::<String>("scheme")
        .map(String::as_str)
        .unwrap_or("rendezvous");
    let json = m.get_flag("json");

    // The rest of the input is checked by `simulate`.
    if workers.saturating_add(join) > MAX_WORKERS {
        bail!("--workers + --join must be at most {MAX_WORKERS}");
    }
    let schemes: Vec<Scheme> = if scheme == "all" {
        Scheme::ALL.to_vec()
    } else {
        match Scheme::parse(scheme) {
            Some(s) => vec![s],
            None => bail!(
                "unknown --scheme {scheme:?}: rendezvous, ring, ring-N, jump, maglev, maglev-N or all"
            ),
        }
    };

    let mut results = Vec::with_capacity(schemes.len());
    for s in schemes {
        results.push(simulate(s, workers, join, leave, pages, seed).map_err(anyhow::Error::msg)?);
    }

    if json {
        // The JSON contract (bench/silt_bench/scenarios.py reads `moved_fraction`) is
        // `SimResult`'s serialization.
        let out = if scheme == "all" {
            serde_json::to_string_pretty(&results)?
        } else {
            serde_json::to_string_pretty(&results[0])?
        };
        println!("{out}");
    } else {
        print_table(&results);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(results: &[SimResult]) {
    let Some(first) = results.first() else {
        return;
    };
    println!(
        "{} workers, +{} joining, -{} leaving, {} keys (seed {})",
        first.workers, first.join, first.leave, first.keys, first.seed
    );
    println!(
        "{:<12} {:>8} {:>8} {:>19} {:>8} {:>18} {:>8} {:>10} {:>7}",
        "scheme",
        "max/mean",
        "(joined)",
        "join moved (ideal)",
        "excess",
        "leave moved (min)",
        "excess",
        "leave last",
        "secs"
    );
    for r in results {
        println!(
            "{:<12} {:>8.4} {:>8.4} {:>19} {:>8.4} {:>18} {:>8.4} {:>10.4} {:>7.2}",
            r.scheme,
            r.balance_max_over_mean,
            r.balance_after_join,
            format!(
                "{:.4} ({:.4})",
                r.moved_fraction_join, r.expected_moved_join
            ),
            r.excess_moved_join,
            format!(
                "{:.4} ({:.4})",
                r.moved_fraction_leave, r.expected_moved_leave
            ),
            r.excess_moved_leave,
            r.moved_fraction_leave_last,
            r.seconds
        );
    }
    println!(
        "join: `join` new workers appended; leave: the first `leave` workers removed \
         (jump renumbers the rest: it can only remove the last bucket, see `leave last`).\n\
         (ideal) = join/(workers+join), the share of an even spread; (min) = the leavers' own keys;\n\
         excess = keys moved between workers that stayed."
    );
}
