"""`python -m sweeps.preflight site=pod launcher.tpu_name=NAME launcher.zone=ZONE [key=value ...]`: first contact.

Asks the launcher for its preflight (Launcher.preflight); a pod's (sweeps/launchers/tpu/preflight.py) runs
sweeps/launchers/tpu/probe.py on every worker VM at once (one ssh each, all within `preflight.timeout_s`) and
prints one table, a row per worker, then one line per problem naming the worker and the fix: the interpreter
and its version, torch/torch_xla/libtpu as `preflight.expect` says and the same on every VM, the code version
(this checkout's), the chips visible and not held open, the control-plane port free on worker 0 and reachable
from every other, the dataset on every VM with one fingerprint (or buildable: generated data), free disk, and on
every VM where a trial's rank 0 runs: the checkpoint location writable, the study storage opened as the job opens
it, and W&B logging where this machine does (online needs a key on the VM). The driver runs it before a tpu_pod
study starts trials and refuses to start on a problem (`preflight.enabled=false` skips it).
"""

from __future__ import annotations

import sys

from storage.errors import exit_on_user_error
from sweeps.config.config_values import UserConfigError
from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import Launcher


class PreflightError(UserConfigError):
    """The launcher's machine is not ready for a study: one line per problem."""


def check_before_study(sweep: SweepConfig, launcher: Launcher) -> None:
    """The driver's hook: a study starts trials only on a machine whose launcher's preflight finds no problem (a
    tpu_pod study: the pod's; preflight.enabled=false skips it)."""
    report = launcher.preflight(sweep) if sweep.preflight.enabled else None
    if report is not None and report.problems:
        raise PreflightError(
            "the machine is not ready (python -m sweeps.preflight says the same; preflight.enabled=false skips it):\n"
            + report.shown
            + "\n"
            + "\n".join(report.problems)
        )


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    from contracts.hydra_app import train_values
    from sweeps.config.compose import compose_sweep_config
    from sweeps.config.typed_config import typed_sweep
    from sweeps.launchers.base import build_launcher
    from sweeps.validation.validate import storage_out_of_reach

    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):  # before composing: Hydra's override grammar refuses `--help` with a traceback
        from contracts.hydra_app import run_app
        from sweeps.config.help import sweep_group_lines

        run_app(lambda: print("\n".join([(__doc__ or "").strip(), "", *sweep_group_lines()])))  # `| head`: quietly
        return 0
    cfg = compose_sweep_config(args)
    sweep = typed_sweep(cfg)  # every block's checks, before any VM is asked
    launcher = build_launcher(sweep.launcher)
    # Every argument read before anything is asked of gcloud (the pod's preflight describes the slice first): a bad
    # training override or a storage its workers cannot reach is refused without a call.
    train = train_values(list(sweep.trial.overrides))  # plain values, as the driver's hook reads them
    unreachable = storage_out_of_reach(sweep.storage.url, launcher)
    if unreachable:
        print(unreachable, file=sys.stderr)
        return 2
    report = launcher.preflight(sweep, train)
    if report is None:
        print("sweeps.preflight checks a launcher's machine, and this launcher has no preflight: give site=pod "
              "(launcher=tpu_pod)", file=sys.stderr)  # fmt: skip
        return 2
    print(report.shown)
    print("\n".join(report.problems) if report.problems else "no problems: the machine is ready")
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
