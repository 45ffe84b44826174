"""What "near-best" means for each table the horizon replays judge on (issue 54: "judge near-best against the mean
over seeds, with an SE that includes the training-seed variance").

The training seed moves a configuration's accuracy 2-4x more than the eval's binomial noise (issue 55's audit), so a
study's reported winner is judged by its mean over the training seeds a table family holds, within one
seed-inclusive SE of the best mean (bench.trm_bench.table.seed_truth):
- TRM-Bench-tiny (tiny:S): the mean over its three seeds;
- TRM-Bench-long (long:S): the mean over its two seeds, on the configurations both hold so far;
- the saved 1,000-step studies ("1000"): one training seed, so its own values, within one SE of a single seed's
  value: the training-seed SD at the same horizon, borrowed from TRM-Bench-long's curves cut at step 1,000 (that SD
  carries a 512-puzzle eval's noise; the 1,000-step evals ran 256 puzzles, whose extra noise is left out: the
  band is, if anything, narrow). Without two long seeds to borrow from, it has no seed truth, and is judged on its
  eval SE alone (the row says which).
"""

from __future__ import annotations

from collections.abc import Mapping

from bench.trm_bench.table import Curve, SeedTruth, Table, seed_truth

EVAL_ONLY = "eval SE"


def truncated(table: Table, step: int) -> Table:
    """The table as if every curve had stopped at `step` (curves with no eval by then are left out)."""
    cut = {
        c: Curve(curve.params, tuple(p for p in curve.points if p.step <= step)) for c, curve in table.curves.items()
    }
    return Table(table.seed, {c: curve for c, curve in cut.items() if curve.points}, table.eval_examples)


def shared(tables: list[Table]) -> list[Table]:
    """The tables restricted to the configurations every one of them holds (a recording's seeds grow unevenly)."""
    common = set.intersection(*(set(t.curves) for t in tables)) if tables else set()
    return [Table(t.seed, {c: t.curves[c] for c in t.curves if c in common}, t.eval_examples) for t in tables]


def family(name: str) -> str:
    return name.partition(":")[0]


def truths(named: Mapping[str, Table], every: Mapping[str, Table]) -> dict[str, tuple[SeedTruth, str]]:
    """For each table in `named` that has one: its seed truth and a line saying which SE judges it. `every` holds
    all the tables there are (a subset may be replayed, but a family's truth always takes all its seeds)."""
    by_family: dict[str, list[Table]] = {}
    for name, table in every.items():
        by_family.setdefault(family(name), []).append(table)
    out: dict[str, tuple[SeedTruth, str]] = {}
    for fam in ("tiny", "long"):
        seeds = by_family.get(fam, [])
        if len(seeds) >= 2:
            truth = seed_truth(shared(seeds))
            said = f"eval + seed SE ({fam}: mean over seeds {', '.join(map(str, truth.seeds))})"
            out.update({n: (truth, said) for n in named if family(n) == fam})
    thousand = named.get("1000")
    longs = by_family.get("long", [])
    if thousand is not None and len(longs) >= 2:
        steps = thousand.steps
        borrowed = seed_truth(shared([truncated(t, steps) for t in longs]))
        means = {c: curve.value for c, curve in thousand.curves.items()}
        truth = SeedTruth((thousand.seed,), means, borrowed.seed_sd, borrowed.pooled_over)
        out["1000"] = (truth, f"eval + seed SE (one seed; the seed SD of long at step {steps})")
    return out
