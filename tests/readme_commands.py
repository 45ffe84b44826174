"""The README's commands, extracted, and a dry run of each of this project's commands (tests/test_readme.py).

`python -m tests.readme_commands` dry-runs the commands given on stdin, one after the other in one interpreter (so
torch and the rest are imported once): it runs each MODULE as `python -m` would,
except that the point where the command has parsed its arguments ends it (exit 0, "dry run: parsed" on stdout):
argparse's `parse_args`, the key=value CLIs' `storage.cli.parse_args`, `contracts.hydra_app.compose_train_config`. A Hydra
app is given `--cfg job` instead (Hydra parses and applies every override, composes the config, and stops); a
Hydra multirun (`-m`) ends where its first job starts training (`trm.runtime.init_runtime`). So an
argument the command would refuse fails the dry run the same way, and nothing runs: no study, no training.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import shlex
import sys
import traceback
from dataclasses import dataclass
from typing import Any, NoReturn

# Console scripts (pyproject.toml [project.scripts]) and the modules they run.
SCRIPTS = {"trm-sweep": "sweeps.run", "trm-train": "trm.train"}
OUR_PACKAGES = ("sweeps.", "trm.", "dashboards.", "storage.", "bench.")
HYDRA_APPS = ("sweeps.run", "trm.train")  # @hydra.main apps: dry-run with --cfg job
SHELL_SETUP = ("mkdir", "cat")  # shell commands a README block uses to write files its next commands read
DRY_RUN_MARK = "dry run: parsed"
_FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


@dataclass(frozen=True)
class Command:
    text: str  # the command as written (continuations joined, heredoc body kept)
    argv: list[str]  # its words, up to the first pipe or redirection, comments and usage notation removed


def bash_blocks(markdown: str) -> list[str]:
    return [m.group(1) for m in _FENCE.finditer(markdown)]


def commands(block: str) -> list[Command]:
    """The commands of a ```bash block: one per line after joining `\\` continuations; a heredoc's body stays
    with its command."""
    lines = block.replace("\\\n", " ").splitlines()
    found, i = [], 0
    while i < len(lines):
        text = lines[i]
        heredoc = re.search(r"<<-?\s*'?\"?(\w+)", text)
        if heredoc:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == heredoc.group(1))
            text, i = "\n".join(lines[i : end + 1]), end
        i += 1
        words = _words(text.split("\n")[0])
        if words:
            found.append(Command(text, words))
    return found


def _words(line: str) -> list[str]:
    """A command line's words: shell quoting undone, comments dropped, cut at the first pipe, redirection, `;` or
    `&&`; usage notation left out (an optional `[key=value]`, an ellipsis `...`)."""
    words = []
    for word in shlex.split(line, comments=True):
        if word in ("|", "||", "&&", ";", "&") or word[0] in "<>" or word.startswith("2>"):
            break
        if word == "..." or (word.startswith("[") and word.endswith("]") and "=" in word and "=[" not in word):
            continue
        words.append(word)
    return words


def module_of(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) if the command runs one of this project's modules (`python -m M`, a console
    script), else None."""
    if argv and argv[0] in SCRIPTS:
        return SCRIPTS[argv[0]], argv[1:]
    if (
        len(argv) >= 3
        and re.search(r"(^|/)python3?$", argv[0])
        and argv[1] == "-m"
        and argv[2].startswith(OUR_PACKAGES)
    ):
        return argv[2], argv[3:]
    return None


def inline_overrides(markdown: str) -> list[str]:
    """The Hydra overrides the prose shows in `inline code`: every word of an inline span of the form
    `key=value` (quoting undone as a shell would), outside the bash blocks."""
    prose = _FENCE.sub("", markdown)
    found = []
    for span in _INLINE.findall(prose):
        try:
            words = shlex.split(span)
        except ValueError:
            continue
        found += [w for w in words if re.match(r"^[+~]?[A-Za-z_][\w.@/]*=(?!=)", w) and "..." not in w]
    return found


def _stop(*args: Any, **kwargs: Any) -> NoReturn:
    print(DRY_RUN_MARK, flush=True)
    raise SystemExit(0)


def _patch() -> None:
    """Make each way a command has of parsing its arguments end the command once they are parsed."""
    import argparse

    import contracts.hydra_app
    import storage.cli
    import trm.runtime

    parse = argparse.ArgumentParser.parse_args
    key_values = storage.cli.parse_args
    compose = contracts.hydra_app.compose_train_config

    def parse_then_stop(self: argparse.ArgumentParser, *a: Any, **k: Any) -> NoReturn:
        parse(self, *a, **k)
        _stop()

    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign,assignment]
    storage.cli.parse_args = lambda *a, **k: _stop(key_values(*a, **k))  # type: ignore[assignment]
    contracts.hydra_app.compose_train_config = lambda *a, **k: _stop(compose(*a, **k))  # type: ignore[assignment]
    trm.runtime.init_runtime = _stop  # a training job's first act: a multirun ends as its first job starts
    os._exit = _exit_by_exception  # trm.train's __main__ leaves by os._exit: here it must end one command only


def _exit_by_exception(code: int) -> NoReturn:
    raise SystemExit(code)


def dry_run(module: str, args: list[str], cwd: str) -> tuple[int, str]:
    """Dry-run one command in this process (after `_patch`): its exit status and everything it printed."""
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()  # each Hydra app initialises it afresh
    if module in HYDRA_APPS and not {"-m", "--multirun"} & set(args):  # --cfg cannot go with --multirun
        args = [*args, "--cfg", "job"]
    sys.argv, printed, code = [module, *args], io.StringIO(), 0
    os.chdir(cwd)
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as end:
            code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
        except Exception:  # a traceback is a failed command: its text is the message
            code = 1
            traceback.print_exc()
    return code, printed.getvalue()


if __name__ == "__main__":  # stdin: one JSON [module, args, cwd] per line; stdout: one JSON [code, output] per line
    _patch()
    requests = [json.loads(line) for line in sys.stdin if line.strip()]
    results = [dry_run(*request) for request in requests]
    sys.__stdout__.write("".join(json.dumps(r) + "\n" for r in results))
