"""What a run measures of itself and stores with its trial: the phase stamps (clock), steady-state step speed
(throughput) with the compiles inside it (compile_counters), peak device memory (memory), rank 0's host memory
sampled onto the trial (memory_watch), and a profiler trace of chosen steps (profiling).

Beside the loop: these modules import nothing else of trm (an import contract in pyproject.toml).
"""
