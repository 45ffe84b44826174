"""The choice of model_scaling's pruning rule over horizons is fixed here before the held-out table exists
(`choose_rule`, HELD_OUT: TRM-Bench-long's seed 1, whose curves were still being recorded when the rule was
committed): among the rules a user can select (a conf/pruner/ file), the one whose worst near-best share at the
shipped n_trials over every other table is the highest, among those that pay at most GOAL_SHARE of the grid on
every table with at least that many configurations (ties: the least worst pay). Until every REQUIRED
table is replayed whole (TRM-Bench-long's seed 0 with all its configurations), the choice is marked provisional.
The held-out table then says whether it holds: >= GOAL_FOUND near-best at <= GOAL_SHARE paid (on the
configurations recorded so far, until it is whole).

The near-best share each row carries is the seed-inclusive one where the table has a seed truth (bench/trm_bench/
truths.py): a long table's truth is the mean over both of its seeds, so the held-out seed's final values enter the
truth that long:0's rows are judged by (a seed mean needs both); its replays (the studies run on its curves) are
never an input to the choice. The judgment became seed-inclusive (issue 54's item 3) before any long table was
replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._results import ROOT
from bench.trm_bench.pod import SHIPPED_N_TRIALS
from bench.trm_bench.table_specs import LONG

HELD_OUT = "long:1"  # judged, never chosen on (committed before its curves were recorded)
# The tables the choice needs, with the configurations each holds whole: provisional until every one is replayed
# whole (a long table joins the replays from horizon.MIN_CURVES curves, long before it is recorded).
REQUIRED = {"tiny:0": 72, "tiny:1": 72, "tiny:2": 72, "1000": 27, "long:0": LONG.size}
GOAL_FOUND = 0.90  # issue 54: near-best in this share of studies ...
GOAL_SHARE = 0.40  # ... paying at most this share of the unpruned grid


@dataclass(frozen=True)
class RuleChoice:
    rule: str
    worst_near_best: float  # over the choice tables, at the shipped n_trials
    worst_paid: float  # over the budget tables (>= SHIPPED_N_TRIALS configurations), at the shipped n_trials
    tables: tuple[str, ...]
    provisional: bool  # a REQUIRED table is missing or not whole yet
    within_budget: bool  # False: no rule paid <= GOAL_SHARE on every budget table; the best worst case regardless
    held_out_holds: bool | None  # None: the held-out table is not replayed yet
    held_out_whole: bool = False  # its verdict is on every configuration of the table (False: on those recorded)
    missing: tuple[str, ...] = ()  # the REQUIRED tables not replayed whole (missing_tables)
    budget_tables: tuple[str, ...] = ()  # those worst_paid is over (none: worst_paid 0.0 means no pay was judged)


def selectable(rule: str, conf: Path = ROOT / "conf") -> bool:
    pruner = rule.partition("/")[0]  # "headroom/exact": the headroom pruner on another metric (horizon.parse_rule)
    return (conf / "pruner" / f"{pruner}.yaml").exists()


def choose_rule(rows: list[dict[str, Any]], conf: Path = ROOT / "conf") -> RuleChoice:
    """The rule in the module's docstring, on the rows of one run (every rule on every table)."""
    by_rule: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_rule.setdefault(r["rule"], {})[r["table"]] = r
    names = sorted({r["table"] for r in rows} - {HELD_OUT})
    candidates = {rule: t for rule, t in by_rule.items() if selectable(rule, conf) and set(names) <= set(t)}
    if not candidates:
        raise ValueError(f"no selectable rule (a conf/pruner/ file) is replayed on every table {names}")

    def worst_found(rule: str) -> float:
        return min(candidates[rule][n]["near_best_at_n_trials"] for n in names)

    sizes = next(iter(candidates.values()))  # every candidate ran on every table: any one's rows give their sizes
    budget = [n for n in names if sizes[n]["configurations"] >= SHIPPED_N_TRIALS]

    def worst_paid(rule: str) -> float:
        return max((candidates[rule][n]["paid_at_n_trials_median"] for n in budget), default=0.0)

    within = [rule for rule in candidates if worst_paid(rule) <= GOAL_SHARE]
    pool = within or list(candidates)
    rule = min(sorted(pool), key=lambda n: (-worst_found(n), worst_paid(n)))
    held = by_rule[rule].get(HELD_OUT)
    holds = (
        None
        if held is None
        else held["near_best_at_n_trials"] >= GOAL_FOUND and held["paid_at_n_trials_median"] <= GOAL_SHARE
    )
    missing = tuple(missing_tables(by_rule[rule]))
    return RuleChoice(
        rule,
        worst_found(rule),
        worst_paid(rule),
        tuple(names),
        provisional=bool(missing),
        within_budget=bool(within),
        held_out_holds=holds,
        held_out_whole=held is not None and held["configurations"] >= LONG.size,
        missing=missing,
        budget_tables=tuple(budget),
    )


def missing_tables(rows_by_table: dict[str, dict[str, Any]]) -> list[str]:
    """The REQUIRED tables not replayed, or replayed on fewer configurations than the whole table (with how many)."""
    out = []
    for name, whole in REQUIRED.items():
        got = rows_by_table.get(name, {}).get("configurations", 0)
        if got < whole:
            out.append(f"{name} ({got} of {whole})" if got else name)
    return out
