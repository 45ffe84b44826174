"""Benchmarks: `python -m bench.<name>` or `python -m bench.<room>.<name>` (rooms: trm_bench, pruning, gpu, trainer;
the Makefile's bench-* targets); results in bench/results and docs/benchmarks.md."""
