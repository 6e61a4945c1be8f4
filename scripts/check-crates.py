#!/usr/bin/env python3
"""Checks the workspace's crate graph: it points one way, and no dependency is unused.

Each crate has a layer (LAYERS below); a crate depends only on crates of lower layers, and
its dev-dependencies add only `silt-testkit` (the real servers the tests start). A new crate
gets its line there, which is where its place in the graph is decided (docs/architecture.md
draws it).

Front ends (FRONT_ENDS) reach the cache only through the client's calls: a call of
`.page_reader()` or `page_store()` in their sources fails the check (silt-node built the page
reader and keeps that reach).

Unused dependencies: like cargo-machete (not installed here: it would be one more build in the test command), it
looks for the crate's Rust name (`foo-bar` -> `foo_bar`) in the crate's sources, build script
and, for dev-dependencies, its tests, examples and benches. A dependency used only through a
macro's expansion or for a feature it switches on is listed in the crate's
`[package.metadata.unused-deps] ignore = [...]` with why beside it.
"""
import pathlib
import re
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    sys.exit("scripts/check-crates.py needs Python >= 3.11 (tomllib)")

LAYERS = {
    "silt-common": 0,
    "silt-ufs": 1,
    "silt-cache": 1,
    "silt-proto": 1,
    "silt-resident": 2,
    "silt-reader": 2,
    "silt-testkit": 2,
    "silt-client": 3,
    "silt-cluster": 3,
    "silt-node": 4,
    "silt-fuse": 4,
    "silt-bench": 4,
    "silt-gateway": 5,
    "silt-py": 5,
    "silt-ops": 5,
    "silt-csi": 5,
    "silt": 6,
}

FRONT_ENDS = ["silt", "silt-fuse", "silt-gateway", "silt-py", "silt-csi", "silt-ops", "silt-bench"]
PAST_THE_CLIENT = re.compile(r"\.page_reader\(\)|\bpage_store\(\)")

root = pathlib.Path(__file__).resolve().parent.parent
workspace = tomllib.loads((root / "Cargo.toml").read_text())
bad = []
for member in workspace["workspace"]["members"]:
    crate = root / member
    manifest = tomllib.loads((crate / "Cargo.toml").read_text())
    ignore = set(
        manifest.get("package", {})
        .get("metadata", {})
        .get("unused-deps", {})
        .get("ignore", [])
    )

    def text(dirs):
        out = []
        for d in dirs:
            p = crate / d
            if p.is_file():
                out.append(p.read_text())
            elif p.is_dir():
                out.extend(f.read_text() for f in p.rglob("*.rs"))
        return "\n".join(out)

    own = manifest["package"]["name"]
    if own not in LAYERS:
        bad.append(f"{member}: {own} has no layer in scripts/check-crates.py")
        continue
    for name in manifest.get("dependencies", {}):
        if name in LAYERS and LAYERS[name] >= LAYERS[own]:
            bad.append(f"{member}: {own} (layer {LAYERS[own]}) depends on {name} (layer {LAYERS[name]}): the graph points down only")
    for name in manifest.get("dev-dependencies", {}):
        if name in LAYERS and name != "silt-testkit" and LAYERS[name] >= LAYERS[own]:
            bad.append(f"{member}: {own}'s tests depend on {name}: only silt-testkit may be added for tests")

    if own in FRONT_ENDS:
        for f in sorted((crate / "src").rglob("*.rs")):
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if PAST_THE_CLIENT.search(line) and not line.lstrip().startswith("//"):
                    bad.append(f"{f.relative_to(root)}:{n}: a front end reaches past the client into the page store: {line.strip()}")

    main = text(["src", "build.rs"])
    dev = main + text(["tests", "examples", "benches"])
    sections = [("dependencies", main), ("dev-dependencies", dev), ("build-dependencies", text(["build.rs"]))]
    for section, code in sections:
        for name, spec in manifest.get(section, {}).items():
            if name in ignore:
                continue
            lib = spec.get("package", name) if isinstance(spec, dict) else name
            ident = name.replace("-", "_")
            if not re.search(r"\b" + re.escape(ident) + r"\b", code):
                bad.append(f"{member}: [{section}] {name} is never named in its code")
if bad:
    print("crate graph: (an unused dependency: remove it, or list it under [package.metadata.unused-deps] ignore with why)")
    print("\n".join(bad))
    sys.exit(1)
print(f"crate graph: {len(workspace['workspace']['members'])} crates, every arrow points down, every dependency is named in its code, no front end reaches past the client")
