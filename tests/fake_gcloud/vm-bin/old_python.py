"""python3 3.10 on a fake TPU VM (vm-bin/python3): its version, `-c` code, and refusing the project."""

import sys

VERSION = (3, 10, 12, "final", 0)


def main(args: list[str]) -> int:
    if args[:1] in (["--version"], ["-V"]):
        print("Python 3.10.12")
        return 0
    if args[:1] == ["-c"] and len(args) > 1:
        sys.version_info = _VersionInfo(VERSION)  # type: ignore[assignment]
        sys.version = "3.10.12 (main, fake TPU VM image) [GCC 11.4.0]"
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    if args[:3] == ["-m", "pip", "install"] and any("trm_sweeps" in a for a in args):
        print("ERROR: Package 'trm-sweeps' requires a different Python: 3.10.12 not in '>=3.11'", file=sys.stderr)
        return 1
    if args[:1] == ["-m"] and len(args) > 1 and args[1].split(".")[0] in ("trm", "sweeps"):
        print(
            f"/usr/bin/python3: Error while finding module specification for {args[1]!r} "
            f"(ModuleNotFoundError: No module named {args[1].split('.')[0]!r})",
            file=sys.stderr,
        )
        return 1
    print(f"python3 (fake 3.10): not emulated: {args[:3]}", file=sys.stderr)
    return 2


class _VersionInfo(tuple):
    """sys.version_info of 3.10: a tuple with the named fields code reads."""

    major, minor, micro = VERSION[:3]
    releaselevel, serial = VERSION[3:]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
