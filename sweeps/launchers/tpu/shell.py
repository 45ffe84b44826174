"""What the tpu_pod launcher (and the preflight) hand to a worker VM's shell: paths, the interpreter check, the stop.

gcloud passes `--command` to the VM's login shell, which parses it once. Every piece is `shlex.quote`d, except
that a path under the VM user's home (`~/...` or `$HOME/...`) keeps its home part for that shell to expand:
quoted whole, `~` would stay a literal directory name.
"""

from __future__ import annotations

import re
import shlex

from sweeps.launchers.base import LauncherConfigError

# The oldest Python the project runs on (pyproject.toml: requires-python). A TPU VM image's python3 may be older.
MIN_PYTHON = (3, 11)
VENV_FIX = (
    "make a Python >= {v} venv on every VM (e.g. `python3.11 -m venv ~/venv` and install trm-sweeps[tpu] there) "
    "and set launcher.python=~/venv/bin/python"
)
# Exit status of the interpreter check when the Python is too old (anything else: the interpreter did not run).
TOO_OLD = 3


def min_python() -> str:
    return ".".join(map(str, MIN_PYTHON))


def shell_path(path: str) -> str:
    """`path` quoted for the VM's shell, a leading `~` or `$HOME` left unquoted so that it expands there."""
    for home in ("~", "$HOME", "${HOME}"):
        if path == home:
            return '"$HOME"'
        if path.startswith(home + "/"):
            rest = path[len(home) + 1 :]
            return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"/'
    return shlex.quote(path)


def python_check(python: str) -> str:
    """A command that exits TOO_OLD, printing the version and the VM (its TPU_WORKER_ID where it has one, else its
    host name: a TPU VM's ssh session has no such variable), when `python` is older than MIN_PYTHON."""
    code = (
        "import os, socket, sys\n"
        f"if sys.version_info < {MIN_PYTHON!r}:\n"
        "    vm = os.environ.get('TPU_WORKER_ID') or socket.gethostname()\n"
        "    os.write(1, ('worker %s python %s\\n' % (vm, sys.version.split()[0])).encode())\n"
        f"    sys.exit({TOO_OLD})\n"
    )
    return f"{shell_path(python)} -c {shlex.quote(code)}"


def python_refusal(python: str, code: int, stdout: str, stderr: str) -> None:
    """Raise the one-line refusal of `python_check`'s answer from every worker (exit `code`); nothing when it ran."""
    if code == TOO_OLD:
        # One os.write per worker, in whatever order the workers answer: sorted so the message is stable.
        answers = sorted(
            re.findall(r"worker (\S+) python (\S+)", stdout), key=lambda a: (len(a[0]), a[0])
        )  # worker ids (or host names ending in them) in number order
        found = "; ".join(f"worker {w} python {v}" for w, v in answers)
        raise LauncherConfigError(
            f"launcher.python={python!r} is older than Python {min_python()} ({found}): "
            + VENV_FIX.format(v=min_python())
        )
    if code != 0:
        raise LauncherConfigError(
            f"launcher.python={python!r} did not run on every worker (exit {code}): {stderr.strip()[-500:]}; "
            + VENV_FIX.format(v=min_python())
        )


def job_pattern(tag: str) -> str:
    """A `pkill -f` pattern for the training process whose command line ends with `tag` (`sweep.job=NAME`, as
    quoted there: the job command's last argument). Not the VM shell that runs it (its command goes on after the
    tag: job_command) and not the shell running the pattern (`[s]weep...` matches `sweep...` but not itself)."""
    return "[" + tag[0] + "]" + re.escape(tag[1:]) + "$"


JOB_FILES_DIR = ".trm-jobs"  # under the job's directory on the VM: each launch's output, pid and exit status


def job_command(setup: str, job: str, launch_id: str) -> str:
    """The VM shell's command: `setup`, then `job` detached from the ssh session, its output followed there, and
    the shell exits with the job's status; run again with the same `launch_id`, it attaches instead.

    Why detached: gcloud's `tpu-vm ssh` answers ssh's 255 (a dropped connection: a laptop asleep, a network
    blip) by running the whole command again, up to 10 attempts 5 s apart (its AttemptRunWithRetries). A job in
    the session would lose its output pipe and die at its next line, or go on beside a second copy of itself.
    Here the job runs in a session of its own (setsid) writing to `.trm-jobs/<launch_id>.log`; the command run
    again finds the launch's pid file, follows the log from the first byte no earlier session handed to sshd
    (`.sent`, replaced whole: what was written once the dropped session stopped copying is printed then; what it
    handed to sshd on a connection already dead, until sshd noticed, is lost, and bytes in flight may repeat) and
    waits for the status file. Not `exec job`, and never the job's signal as the session's end: a job that dies by
    a signal (an OOM kill, SIGKILL) gives its wrapper the status 128+N, which the shell exits with; a signal death
    of the shell would be ssh's 255 again."""
    f = f"{JOB_FILES_DIR}/{launch_id}"
    wrapped = shlex.quote(f"{job}; echo $? > {f}.status")
    # The job has ended once its status is written, or its wrapper is gone or a zombie (an init may not reap it).
    running = f"[ ! -s {f}.status ] && ps -o stat= -p \"$(cat {f}.pid)\" | grep -q '^[^Z]'"

    def follow(first_byte: str) -> str:
        """The log from `first_byte` on, printed as it grows until the job has ended, then the rest: every byte
        once, by this shell itself (no follower process to outlive a dropped session, or to be stopped before
        it printed the last lines, which name what went wrong)."""
        copy = (
            f'n=$(stat -c %s {f}.log); [ "$n" -gt "$o" ] && tail -c +$((o+1)) {f}.log | head -c $((n-o)) && '
            f"echo $n > {f}.sent.new && mv -f {f}.sent.new {f}.sent; o=$n"
        )
        return f'o={first_byte}; [ -n "$o" ] || o=0; while {running}; do {copy}; sleep 0.5; done; {copy}'

    return (
        f"{setup} && mkdir -p {JOB_FILES_DIR} && "
        f"if [ -e {f}.pid ]; then "
        f'echo "attached to the job this command started here before (pid $(cat {f}.pid))" >&2; '
        f"{follow(f'$(cat {f}.sent 2>/dev/null || echo 0)')}; "
        "else "
        f": > {f}.log; setsid sh -c {wrapped} >> {f}.log 2>&1 < /dev/null & echo $! > {f}.pid; "
        f"{follow('0')}; "
        "fi; "
        f"[ -s {f}.status ] && exit $(cat {f}.status); "
        'echo "the job ended without an exit status" >&2; exit 1'
    )


# A grouped session's tags (sweeps/launchers/tpu/sessions.py reads them): each line a VM prints arrives as
# `[trm-worker N] line`, and its status last as `[trm-worker N exit S]`.
WORKER_TAG = "trm-worker"
# Where a TPU VM learns its worker number: what torch_xla and JAX read (the ssh session has no TPU_WORKER_ID).
WORKER_NUMBER_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number"


def tagged_command(job: str) -> str:
    """`job` (job_command's) for a session to several VMs at once (`--worker=i,j,k`): gcloud runs one command on
    each and merges their output into its own, and its exit status is one worker's at most. So each VM tags its
    lines and reports its status in a last tagged line, by its worker number: TPU_WORKER_ID where set (GKE), else
    the metadata server's agent-worker-number, else a host name ending in -w-N (a TPU VM's). A VM that finds none
    refuses to start the job, saying so, untagged."""
    number = (
        'w=${TPU_WORKER_ID:-}; [ -n "$w" ] || '
        f"w=$(curl -sf -m 10 -H 'Metadata-Flavor: Google' {WORKER_NUMBER_URL} 2>/dev/null); "
        "[ -n \"$w\" ] || w=$(hostname | sed -n 's/.*-w-\\([0-9][0-9]*\\)$/\\1/p'); "
        'case "$w" in ""|*[!0-9]*) echo "a VM of this ssh session could not tell its worker number (TPU_WORKER_ID, '
        "the metadata server's agent-worker-number, a host name ending in -w-N): set launcher.ssh_sessions to at "
        "least the slice's VM count, a session per VM\"; exit 1;; esac; "
    )
    tag = f"[{WORKER_TAG} $w"
    return (
        f'{number}s=$(mktemp) && {{ ( {job} ); echo $? > "$s"; }} 2>&1 | sed -u "s/^/{tag}] /"; '
        f'c=$(cat "$s"); rm -f "$s"; [ -n "$c" ] || c=1; echo "{tag} exit $c]"; exit $c'
    )


def stop_command(pattern: str, grace_s: float) -> str:
    """SIGTERM to the job's processes (they checkpoint), SIGKILL to those left after `grace_s` (a job stuck in
    compilation, TPU start-up or a collective never acts on SIGTERM and would keep its chips), then wait until
    they are gone: exit 1 if any is still there, so the caller knows the chips are not free."""
    p = shlex.quote(pattern)
    ticks = max(0, round(grace_s / 0.2))
    return (
        f"pkill -TERM -f -- {p} ; i=0; while pgrep -f -- {p} >/dev/null && [ $i -lt {ticks} ]; do sleep 0.2; "
        f"i=$((i+1)); done; pkill -KILL -f -- {p}; i=0; while pgrep -f -- {p} >/dev/null && [ $i -lt 50 ]; do "
        "sleep 0.2; i=$((i+1)); done; "
        f"! pgrep -f -- {p} >/dev/null"
    )


def chips_free_check(visible_chips: str | None) -> str:
    """A command that exits 1, naming the pid, while a training process of this VM user still runs on the slot's
    chips (`visible_chips`: its TPU_VISIBLE_CHIPS; None: the whole VM): a job that outlived its stop would make
    the next trial find the TPU busy. Only the user's own jobs count (HOME), as on a VM every process is the VM's."""
    chips = ""
    if visible_chips:
        chips = f"grep -qzx {shlex.quote('TPU_VISIBLE_CHIPS=' + visible_chips)} /proc/$p/environ || continue; "
    return (
        "for p in $(pgrep -f -- '[t]rm[.]train'); do "
        'grep -qzx "HOME=$HOME" /proc/$p/environ 2>/dev/null || continue; '
        + chips
        + 'echo "worker ${TPU_WORKER_ID:-$(hostname)}: pid $p still runs on the slot\'s chips"; exit 1; done; exit 0'
    )


# The file, in launcher.remote_dir, that `prepare` leaves on every VM: the prepare's id. A VM without it (or with
# another id) was not set up by this driver's latest prepare: one recreated under a slice that still read READY.
PREPARED_FILE = ".trm-prepared"


def prepared_mark(remote_dir: str, prepare_id: str) -> str:
    """A command that leaves `prepare_id` in remote_dir's PREPARED_FILE (the directory made if need be)."""
    here = shell_path(remote_dir)
    return f"mkdir -p {here} && echo {shlex.quote(prepare_id)} > {here}/{PREPARED_FILE}"


def prepared_check(remote_dir: str, prepare_id: str) -> str:
    """A command that exits 1, saying so, unless remote_dir's PREPARED_FILE holds `prepare_id`: the VM was set up
    by the latest prepare (its venv, its code); then nothing is printed and the next command runs."""
    return (
        f"grep -qx {shlex.quote(prepare_id)} {shell_path(remote_dir)}/{PREPARED_FILE} 2>/dev/null || "
        "{ echo \"worker ${TPU_WORKER_ID:-$(hostname)}: not set up by this study's latest prepare (a VM recreated "
        'under the slice)"; exit 1; }'
    )
