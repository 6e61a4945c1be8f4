//! `silt ring simulate`: the JSON contract the benchmark harness reads, and bad input.

use std::process::Command;

const SILT: &str = env!("CARGO_BIN_EXE_silt");

fn silt(args: &[&str]) -> std::process::Output {
    Command::new(SILT)
        .args(args)
        .output()
        .expect("running silt")
}

#[test]
fn simulate_json_reports_measured_moves() {
    let o = silt(&[
        "ring",
        "simulate",
        "--workers",
        "4",
        "--join",
        "1",
        "--pages",
        "20000",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    let moved = v["moved_fraction"].as_f64().expect("moved_fraction");
    assert!((0.15..=0.25).contains(&moved), "moved_fraction {moved}");
    let balance = v["balance_max_over_mean"].as_f64().expect("balance");
    assert!((1.0..1.2).contains(&balance), "balance {balance}");
    assert_eq!(v["scheme"], "rendezvous");
    assert_eq!(v["workers"], 4);
    assert_eq!(v["keys"], 20000);
    assert!((v["expected_moved_fraction"].as_f64().unwrap() - 0.2).abs() < 1e-9);
    // Rendezvous: a leave moves exactly the leaver's keys.
    assert_eq!(
        v["moved_fraction_leave"],
        v["expected_moved_fraction_leave"]
    );
}

#[test]
fn simulate_all_schemes_as_json_list() {
    let o = silt(&[
        "ring", "simulate", "--scheme", "all", "--pages", "2000", "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    let names: Vec<&str> = v
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["scheme"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["rendezvous", "ring", "ring-1000", "jump", "maglev"]);
}

#[test]
fn simulate_rejects_bad_input() {
    for (args, needle) in [
        (&["--workers", "0"][..], "--workers"),
        (&["--pages", "0"][..], "--pages"),
        (&["--workers", "3", "--leave", "3"][..], "--leave"),
        (&["--scheme", "nope"][..], "--scheme"),
        (&["--workers", "x"][..], "--workers"),
    ] {
        let mut all = vec!["ring", "simulate"];
        all.extend_from_slice(args);
        let o = silt(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}
