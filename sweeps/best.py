"""`python -m sweeps.best study=NAME [trial=N] [format=text|json] [storage.url=...] [reeval=true ...] [confirm=true ...]
[paired=OTHER]`: reuse what a study found.

Prints the best trial (or trial N) as things a user can paste: its parameters as `trm.train` overrides (plain
keys: a conditional `optim.lr@adamw` becomes `optim.lr`), the whole command that re-trains it (append
`train.steps=...` or `seed=...` to train longer or with another seed: the last override wins), its best
checkpoint, its W&B run and the code version that produced it: the git commit (and whether the checkout had
uncommitted changes) where the job ran from a git checkout, and the content hash of trm/. Needs nothing but the
storage.

The best is the confirmed winner where the study's top configurations were trained again on fresh seeds
(sweeps/trials/confirm.py: the best mean over seeds, with its eval + seed standard error and each seed's checkpoint),
else the re-evaluated winner where its top trials were evaluated again (sweeps/trials/reeval.py), with the ranking
and its intervals. `confirm=true [confirm.top_k=K] [confirm.seeds=N] [confirm.first_seed=S]` runs the confirm stage
now, or resumes it (jobs on the sweep's launcher, up to `max_concurrent` at once, none started after `timeout`
seconds); with `dry_run=true` it prints what the stage would train and its cost, and runs nothing. `reeval=true [reeval.top_k=K] [reeval.examples=N]` runs that re-evaluation now
(jobs on the sweep's launcher: `site=`, `launcher=`, `launcher.python=`, `output_root=`, `study.seeds=`, `study.value=` as the study
was run with; defaults from conf/sweep.yaml, examples null = the whole test split). `paired=OTHER` compares the
study with another of the same draws in the same storage (the demo and `make demo-unpruned`): whether they trained
the same configurations and found the same re-evaluated winner, or winners within one eval standard error.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from hydra.errors import HydraException
from optuna.trial import FrozenTrial, TrialState

from storage.cli import (
    STORAGE_KEYS,
    ArgumentError,
    parse_args,
    parse_bool,
    run_cli,
    storage_from_args,
    study_from_args,
)
from storage.confirm_record import COMPLETE, confirmations
from storage.record import Reeval
from storage.study_record import StudyAttrs
from storage.trial_record import TrialLaunch, TrialOutcome
from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import Launcher
from sweeps.search.space import params_to_values, to_overrides
from sweeps.trials.confirm import ConfirmStageRun, cost_lines
from sweeps.trials.confirm_rank import tie_line
from sweeps.trials.confirmed import confirmed_lines, confirmed_ranking, confirmed_rows, trials_winner
from sweeps.trials.paths import StudyRoots, url_exists
from sweeps.trials.reeval import (
    interval,
    overlap_line,
    paired_lines,
    ranking,
    ranking_lines,
    ranking_rows,
    reevaluate,
)

USAGE = __doc__.split("\n\n")[0].strip() + "\n\n" + __doc__.split("\n\n", 1)[1].strip()
# Passed to the re-eval's and the confirm stage's sweep config.
SWEEP_KEYS = (
    "site",
    "launcher",
    "launcher.python",  # the jobs' interpreter, where it is not the one running sweeps.best
    "output_root",
    "study.seeds",
    "study.value",
    "max_concurrent",
    "timeout",
    "wandb.enabled",
)
REEVAL_KEYS = {"reeval": "false", "reeval.top_k": None, "reeval.examples": None, **dict.fromkeys(SWEEP_KEYS)}
CONFIRM_SETTINGS = ("top_k", "seeds", "first_seed", "own_variance_at")
CONFIRM_KEYS = {"confirm": "false", "dry_run": "false", **{f"confirm.{k}": None for k in CONFIRM_SETTINGS}}
KNOWN: dict[str, str | None] = {
    "study": None,
    "trial": None,
    "format": "text",
    "paired": None,
    **STORAGE_KEYS,
    **REEVAL_KEYS,
    **CONFIRM_KEYS,
}
FORMATS = ("text", "json")


def pick(study: optuna.Study, number: str | None) -> FrozenTrial:
    """Trial `number`, or the study's best (single objective)."""
    if number is not None:
        trials = study.get_trials(deepcopy=False)
        try:
            index = int(number)
            if index < 0:  # not Python's count from the end: a trial number
                raise IndexError(index)
            return trials[index]
        except (ValueError, IndexError):
            raise ArgumentError(f"trial={number!r}: the study has trials 0..{len(trials) - 1}") from None
    if len(study.directions) > 1:
        raise ArgumentError(
            f"study {study.study_name!r} has {len(study.directions)} objectives: name one Pareto trial with trial=N"
        )
    if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        raise ArgumentError(f"study {study.study_name!r} has no completed trial yet")
    confirmed = confirmed_ranking(study)  # the confirmed winner, else the re-evaluated one, else Optuna's best
    if confirmed:
        return study.get_trials(deepcopy=False)[confirmed[0].trial]
    ranked = ranking(study)
    return ranked[0].trial if ranked else study.best_trial


@dataclass(frozen=True)
class BestTrial:
    """What a user needs to reuse a trial (`describe`), as plain values: the text, the report and the JSON read it.
    The JSON is `as_dict()`, its keys the fields' names in their order."""

    study: str
    trial: int
    state: str  # Optuna's state name (COMPLETE, PRUNED, ...)
    value: float | list[float] | None  # a multi-objective trial's values, else its value
    objective: str | None  # the study's (first) objective
    best_step: int | None
    overrides: list[str]  # its sampled parameters as plain `trm.train` overrides
    retrain: list[str]  # the whole command that re-trains it
    best_checkpoint: str | None  # its chain's best.pt
    # False: not there as seen from here (never written, or on the workers' own disks); None: not known.
    best_checkpoint_found: bool | None
    best_checkpoint_note: str | None  # set when best.pt is not the best
    wandb: dict[str, str]  # the run's group and name (trm/tracking/run_config.py)
    workdir: str | None
    code_version: str | None  # the content hash of trm/: what checkpoint.resume checks
    code_commit: str | None  # None: not a git checkout's code, or not recorded
    code_dirty: bool | None
    # Its re-evaluation (a Reeval's dict), the study's re-evaluated ranking and the overlap line (sweeps/trials/reeval.py).
    reeval: dict[str, Any] | None
    ranking: list[dict[str, Any]]
    overlap: str | None
    # Its configuration confirmed on fresh seeds (sweeps/trials/confirm.py): its row, each confirm seed's best.pt,
    # the confirmed ranking, the line when its top two cannot be told apart, and the trials' own winner (without
    # confirmation: re-evaluated, or best).
    confirmed: dict[str, Any] | None
    confirm_checkpoints: dict[str, str]  # {seed: its best.pt}
    confirmed_ranking: list[dict[str, Any]]
    confirmed_tie: str | None
    trials_winner: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def commit_text(self) -> str:
        """Its git commit as one phrase, or why there is none (the text and the report)."""
        if not self.code_commit:
            return "none recorded (a job run from a git checkout records its commit)"
        return str(self.code_commit) + (" with uncommitted changes" if self.code_dirty else "")


def describe(study: optuna.Study, trial: FrozenTrial) -> BestTrial:
    """What a user needs to reuse `trial`."""
    launch, outcome = TrialLaunch.of(trial.user_attrs), TrialOutcome.of(trial.user_attrs)
    values = params_to_values(trial.params)
    overrides = to_overrides(values)
    train_overrides = launch.train_overrides or overrides  # the whole set the job trained with
    checkpoint_url = launch.checkpoint_url
    best_checkpoint = f"{checkpoint_url.rstrip('/')}/best.pt" if checkpoint_url else None
    ranked = ranking(study)
    mine = next((r.reeval for r in ranked if r.trial.number == trial.number), None)
    rows = confirmed_rows(study)
    seeds = confirmations(study.user_attrs).get(trial.number, {})
    own = trials_winner(study)
    return BestTrial(
        study=study.study_name,
        trial=trial.number,
        state=trial.state.name,
        value=trial.values if trial.values and len(trial.values) > 1 else trial.value,
        objective=StudyAttrs.of(study.user_attrs).objective,
        best_step=outcome.best_step,
        overrides=overrides,
        retrain=["python", "-m", "trm.train", *train_overrides],
        best_checkpoint=best_checkpoint,
        best_checkpoint_found=url_exists(best_checkpoint) if best_checkpoint else None,
        best_checkpoint_note=outcome.best_checkpoint_note,
        wandb={"group": study.study_name, "name": f"{study.study_name}-{trial.number}"},
        workdir=launch.workdir,
        code_version=outcome.code_version,
        code_commit=outcome.code_commit,
        code_dirty=outcome.code_dirty,
        reeval=mine.as_dict() if mine else None,
        ranking=ranking_rows(ranked),
        overlap=overlap_line(ranked),
        confirmed=next((row for row in rows if row["trial"] == trial.number), None),
        confirm_checkpoints={
            str(seed): f"{record.checkpoint_url.rstrip('/')}/best.pt"
            for seed, record in sorted(seeds.items())
            if record.outcome == COMPLETE and record.checkpoint_url
        },
        confirmed_ranking=rows,
        confirmed_tie=tie_line(confirmed_ranking(study)),
        trials_winner=own.number if own is not None else None,
    )


def render_text(info: BestTrial) -> str:
    value = info.value
    shown = (
        "none"
        if value is None
        else (", ".join(f"{v:.4f}" for v in value) if isinstance(value, list) else f"{value:.4f}")
    )
    lines = [
        f"study {info.study}, trial {info.trial} ({info.state}): {info.objective} = {shown}"
        + (f" at step {info.best_step}" if info.best_step is not None else ""),
        f"overrides:  {shlex.join(info.overrides)}",
        f"retrain:    {shlex.join(info.retrain)}",
        f"checkpoint: {info.best_checkpoint or 'not recorded'}"
        + (" (not found from here)" if info.best_checkpoint_found is False else "")
        + (f"\n  warning:  {info.best_checkpoint_note}" if info.best_checkpoint_note else ""),
        f"wandb:      group={info.wandb['group']} name={info.wandb['name']}",
        f"workdir:    {info.workdir or 'not recorded'}",
        f"commit:     {info.commit_text()}",
        f"code:       {info.code_version or 'not recorded'} (content hash of trm/)",
    ]
    again = Reeval.of(info.reeval)
    if again:
        lines.insert(1, f"reeval:     {again.metric} = {interval(again)}")
    mine = info.confirmed
    if mine:
        shown_se = f"{mine['mean']:.4f} ± {mine['se']:.4f} ({mine['se_kind']} SE, {mine['n']} seeds)"
        differs = (
            "the trials' own winner too"
            if info.trials_winner == info.trial
            else f"differs from the trials' own winner, trial {info.trials_winner}"
        )
        lines.insert(1, f"confirmed:  {info.objective} = {shown_se}, rank {mine['rank']}; {differs}")
        lines += [f"seed {seed}:    {url}" for seed, url in info.confirm_checkpoints.items()]
        if info.confirmed_tie:
            lines.append(info.confirmed_tie)
    return "\n".join(lines)


@dataclass(frozen=True)
class Stage:
    """What a stage run on demand needs: the sweep config as the study was run with, its launcher, roots and link."""

    sweep: SweepConfig
    launcher: Launcher
    roots: StudyRoots
    uid: str
    url: str


def stage_of(args: dict[str, str], study: optuna.Study, extra: list[str]) -> Stage:
    """The sweep config (SWEEP_KEYS from the command line, and `extra`), its launcher (prepared) and the study's
    roots, for a stage run after the study."""
    from sweeps.config.compose import compose_sweep_config
    from sweeps.config.typed_config import typed_sweep
    from sweeps.launchers.base import build_launcher  # the driver's own check that the config builds a launcher

    url, _ = storage_from_args(args)
    overrides = [f"study.name={study.study_name}", *(f"{k}={args[k]}" for k in SWEEP_KEYS if k in args), *extra]
    overrides += [f"storage.password_env={args['storage.password_env']}"] if args.get("storage.password_env") else []
    try:
        cfg = compose_sweep_config(overrides)
        sweep = typed_sweep(cfg)
        launcher = build_launcher(sweep.launcher)
    except HydraException as err:  # Hydra's own (a UserConfigError is a UserError already: run_cli's line)
        raise ArgumentError(str(err)) from None
    launcher.prepare()
    uid = str(StudyAttrs.of(study.user_attrs).uid or "")
    if not uid:
        raise ArgumentError(f"study {study.study_name!r} has no uid: it was not written by sweeps.run")
    roots = StudyRoots.of(sweep.output_root, sweep.trial.run_root, sweep.trial.checkpoint_root, study.study_name, uid)
    return Stage(sweep, launcher, roots, uid, url)


def run_reeval(args: dict[str, str], study: optuna.Study) -> list[str]:
    """Re-evaluate the study's top trials now (sweeps/trials/reeval.py) on the launcher the sweep config names; the
    ranking's lines."""
    extra = [f"reeval.{k}={args[f'reeval.{k}']}" for k in ("top_k", "examples") if f"reeval.{k}" in args]
    stage = stage_of(args, study, extra)
    reevaluate(study, stage.sweep, stage.launcher, stage.roots, stage.uid, stage.url)
    return ranking_lines(study)


def run_confirm(args: dict[str, str], study: optuna.Study, dry: bool) -> list[str]:
    """Run (or resume) the confirm stage now (sweeps/trials/confirm.py) on the launcher the sweep config names, or
    with `dry` print what it would train and its cost; the lines to show."""
    if len(study.directions) != 1:
        raise ArgumentError(f"study {study.study_name!r} has {len(study.directions)} objectives: confirm ranks one")
    extra = [f"confirm.{k}={args[f'confirm.{k}']}" for k in CONFIRM_SETTINGS if f"confirm.{k}" in args]
    stage = stage_of(args, study, extra)
    if dry:
        return cost_lines(study, stage.sweep.confirm)
    timeout = stage.sweep.timeout
    run = ConfirmStageRun(study, stage.sweep, stage.launcher, stage.roots, stage.uid, stage.url)
    run.run(deadline=time.time() + timeout if timeout else None)
    return confirmed_lines(study)


def main_body(argv: list[str]) -> int:
    args = parse_args(argv, KNOWN, USAGE)
    if args["format"] not in FORMATS:
        raise ArgumentError(f"format={args['format']!r}: expected one of {list(FORMATS)}")
    study = study_from_args(args)
    other = study_from_args({**args, "study": args["paired"]}) if args.get("paired") else None  # missing: refused first
    out = sys.stderr if args["format"] == "json" else sys.stdout
    if parse_bool("reeval", args["reeval"]):
        for line in run_reeval(args, study):
            print(line, file=out)
    dry = parse_bool("dry_run", args["dry_run"])
    if dry and not parse_bool("confirm", args["confirm"]):
        raise ArgumentError("dry_run=true: prints the confirm stage's plan and cost, so it goes with confirm=true")
    if parse_bool("confirm", args["confirm"]):  # after a re-evaluation: it chooses the configurations
        for line in run_confirm(args, study, dry):
            print(line, file=out)
        if dry:
            return 0
    info = describe(study, pick(study, args.get("trial")))
    print(json.dumps(info.as_dict()) if args["format"] == "json" else render_text(info))
    if other is not None:
        for line in paired_lines(study, other):
            print(f"paired: {line}", file=sys.stderr if args["format"] == "json" else sys.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(main_body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
