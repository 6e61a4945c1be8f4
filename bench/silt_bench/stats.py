"""Medians, ranges, ratios of medians, and the goals of shared/brief/benchmarks.md as data.

Figures are compared side by side in one run, so a result is always a ratio of medians
(Silt's median over a baseline's median, or for B6 a plain measured value), checked against
a goal with a direction: ">=" (higher is better) or "<=" (lower is better).
"""
import statistics
from dataclasses import dataclass


def median(values):
    values = list(values)
    if not values:
        raise ValueError("median of no values")
    return statistics.median(values)


def min_max(values):
    values = list(values)
    if not values:
        raise ValueError("min-max of no values")
    return min(values), max(values)


def summary(values):
    """{"median", "min", "max", "runs"} for one figure measured over several repetitions."""
    values = list(values)
    lo, hi = min_max(values)
    return {"median": median(values), "min": lo, "max": hi, "runs": values}


def ratio_of_medians(numerator, denominator):
    """median(numerator) / median(denominator); each may be a list of runs or one number."""
    n = median(numerator) if not isinstance(numerator, (int, float)) else numerator
    d = median(denominator) if not isinstance(denominator, (int, float)) else denominator
    if d == 0:
        raise ZeroDivisionError("median of the denominator is zero")
    return n / d


@dataclass(frozen=True)
class Goal:
    id: str          # key used in results, e.g. "B1 warm 1 reader"
    metric: str      # what the ratio compares, e.g. "local page cache"
    goal: float      # the bar
    direction: str   # ">=" higher is better, "<=" lower is better
    unit: str = "of" # how the value reads: "0.42 of direct", "1.30 × local walk", "250 bytes/file"
    shown: str = ""  # the goal as benchmarks.md writes it ("0.90"); default: formatted from goal

    def met(self, value):
        return value >= self.goal if self.direction == ">=" else value <= self.goal

    def gap(self, value):
        """How far the value is from the goal (0 when met), in the goal's units."""
        d = self.goal - value if self.direction == ">=" else value - self.goal
        return max(0.0, d)


def _pages_move(n_workers):
    return 1.25 / n_workers


# The "Where we aim" table of shared/brief/benchmarks.md. B6 rebalance: the 5th worker joins a
# ring of 4, so at most 1.25 / 5 of the pages may move.
GOALS = [
    Goal("B1 warm", "local page cache", 0.90, ">=", "of", "0.90"),
    Goal("B1 cold", "best direct parallel reader", 1.0, ">="),
    Goal("B1 cold single", "single-stream GET", 4.0, ">=", "×"),
    Goal("B1F cold", "reading the source directly (file://, 4 readers)", 0.5, ">="),
    Goal("B1F CPU per GB", "daemon CPU seconds per cold GB (file://, 4 readers)", 0.8, "<=", "s"),
    Goal("B1 cold CPU per GB", "daemon CPU seconds per cold GB (S3, 4 readers)", 0.8, "<=", "s"),
    Goal("B1F peak RSS ÷ budget, 4 readers", "memory tier + fetch buffers", 1.10, "<=", "×"),
    Goal("B2 warm", "local files/s", 0.5, ">="),
    Goal("B2 warm peer", "best peer", 2.0, ">=", "×"),
    Goal("B2 cold", "direct, same concurrency", 1.0, ">="),
    Goal("B3 second", "local walk", 1.5, "<=", "×"),
    Goal("B3 first", "one recursive listing", 1.2, "<=", "×"),
    Goal("B4 cached", "synthetic", 0.97, ">="),
    Goal("B4 hit ratio", "hit ratio per epoch at half-size cache", 0.45, ">=", "="),
    Goal("B4 sampler", "random sampler, half-size cache, epochs 2-3", 1.5, ">=", "×"),
    # B5 through the mount and through the client library: the same shuffle ÷ tmpfs, and peak
    # RSS ÷ the memory budget (write memory + memory tier; the worst repetition).
    Goal("B5", "tmpfs", 0.6, ">="),
    Goal("B5 memory", "memory budget", 1.10, "<=", "×"),
    Goal("B5 client", "tmpfs (client library)", 0.6, ">="),
    Goal("B5 client memory", "memory budget (client library)", 1.10, "<=", "×"),
    Goal("B6 per file", "bytes of worker memory per cached file", 300, "<=", "bytes"),
    Goal("B6 rebalance", "fraction of pages that move (5th worker)", _pages_move(5), "<=", "="),
    # B7 (issue 44): client memory per cached entry after a find-style walk, the largest walk.
    Goal("B7 per entry", "bytes of client memory per cached entry", 150, "<=", "bytes"),
    # G (issue 19 §3): cached objects through the gateway ÷ an unshaped local S3 server of the
    # same bytes, read by the same client.
    Goal("G cached large", "unshaped local S3 (8 × 8 MiB ranged GETs)", 1.0, ">="),
    Goal("G cached small", "unshaped local S3 (objects/s, 8 threads)", 2.0, ">=", "×"),
]
GOALS_BY_ID = {g.id: g for g in GOALS}


def _fmt(x, whole=False):
    return f"{x:.0f}" if whole or abs(x) >= 100 else f"{x:.2f}"


def describe(goal, value):
    """One line stating the value, the goal and the gap, e.g.
    "0.42 of direct, goal ≥ 1.0: gap 0.58" or "0.97 of local, goal ≥ 0.90: met (+0.07)"."""
    if isinstance(goal, str):
        goal = GOALS_BY_ID[goal]
    whole = goal.goal >= 100
    sym = "≥" if goal.direction == ">=" else "≤"
    if goal.unit == "of":
        what = f"{_fmt(value)} of {goal.metric}"
    elif goal.unit == "×":
        what = f"{_fmt(value)} × {goal.metric}"
    elif goal.unit == "=":
        what = f"{goal.metric} {_fmt(value)}"
    else:
        what = f"{_fmt(value, whole)} {goal.metric}"
    g = goal.shown or (f"{goal.goal:.1f}" if goal.goal == round(goal.goal, 1) and not whole else _fmt(goal.goal, whole))
    head = f"{what}, goal {sym} {g}"
    if goal.met(value):
        margin = value - goal.goal if goal.direction == ">=" else goal.goal - value
        return f"{head}: met (+{_fmt(margin, whole)})"
    return f"{head}: gap {_fmt(goal.gap(value), whole)}"


def gaps(measured):
    """{goal id: value} -> list of describe() lines, in the order of GOALS; unknown ids and
    goals without a value are skipped."""
    return [describe(g, measured[g.id]) for g in GOALS if g.id in measured]
