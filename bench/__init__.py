"""Benchmarks: `python -m bench.<name>` (the Makefile's bench-* targets); results in bench/results and docs/benchmarks.md."""
