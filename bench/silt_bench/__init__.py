"""Reusable pieces of Silt's benchmark harness (stdlib only): data generators, statistics and
the goal table of shared/brief/benchmarks.md, and reporting (table, JSON, picture)."""
