# One venv, everything pinned. `make demo` and `make test` set themselves up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: help setup check lint demo demo-unpruned test test-xla dashboard report bench bench-trainer bench-data bench-storage bench-sweep bench-pruning bench-table bench-replay bench-check bench-reference ref-given soak soak-pod clean

help:                     ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  \1\t\2/' | expand -t 20

setup: $(STAMP)            ## the venv (.venv): pinned CPU torch first, then the project with its test extras

# torch first and pinned: an unpinned torch resolved by pip is a multi-GB CUDA build. triton beside it (the CPU lane
# only: the XLA lane's torch 2.9.0 pins its own): its interpreter runs the fused kernels (trm/kernels/fused_mix.py) in the tests.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 triton==3.6.0
	$(PY) -m pip install -q -c requirements.lock -e '.[cpu,test]'
	touch $(STAMP)

# A real small study on this machine: SQLite, local processes (2 at once), the tiny CPU preset, model_scaling's
# sampler and pruner (TPE, the median rule from half the trial: chosen on TRM-Bench-tiny, docs/benchmarks.md), then
# the re-evaluation and the confirm stage, within 10 minutes on 2 cores. It overrides three laptop defaults, each
# said with its reason in docs/benchmarks.md, The demo study: n_trials=5 (of 40), confirm.top_k=2 (of 5; the top two
# trained again on a fresh seed), launcher.warm=true (one torch import for all the jobs; default: one per job).
# demo-unpruned runs the same study with pruner=none under its own name (the sampler's later draws follow the
# values seen, so the two may train other configurations); its last command says whether the two re-evaluated
# winners agree.
DEMO := study=model_scaling n_trials=5 confirm.top_k=2 launcher.warm=true
demo: setup               ## a real small study: SQLite, local processes, the tiny CPU preset, pruning
	$(PY) -m sweeps.run $(DEMO)

demo-unpruned: setup      ## the demo with pruner=none; compares its re-evaluated winner with the demo's
	$(PY) -m sweeps.run $(DEMO) pruner=none study.name=model_scaling_unpruned
	$(PY) -m sweeps.best study=model_scaling_unpruned paired=model_scaling

# What CI enforces before any test: ruff (lint + format) and mypy on the packages (settings in pyproject.toml).
lint: setup               ## ruff, mypy (strict), the import layers (lint-imports)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# tests/prereqs.py first: it installs Chromium / starts a PostgreSQL server where missing (or says in one
# line what to run), then runs pytest with TRM_SWEEPS_TEST_PG pointing at the server.
# Tests run many training processes at once on few cores: OpenMP must not spin-wait (docs/benchmarks.md).
# TEST_WORKERS pytest-xdist workers, a test file each at a time (--dist loadfile: a file's module fixtures and
# process names stay in one worker); each worker gets its own PostgreSQL database. TEST_WORKERS=0: serial.
# --no-loadscope-reorder: files are handed out in the suite's own order, the longest first (tests/conftest.py).
# PYTHONDONTWRITEBYTECODE emptied (some machines set it): the suite starts hundreds of processes, each of which
# would compile the project's modules again.
TEST_WORKERS ?= 2
PYTEST := OMP_WAIT_POLICY=PASSIVE PYTHONDONTWRITEBYTECODE= $(PY) -m tests.prereqs $(PY) -m pytest -q

# The inner loop: lint, then the tests that start no process (tests/conftest.py makes starting one an error there).
# It installs nothing and starts no server (tests.prereqs --no-install): one line names what the slow lane lacks.
check: setup lint          ## lint + the fast lane (tests not marked slow); installs nothing, starts no server
	TRM_SWEEPS_FAST_LANE=1 OMP_WAIT_POLICY=PASSIVE PYTHONDONTWRITEBYTECODE= $(PY) -m tests.prereqs --no-install \
		$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS)

test: setup lint           ## lint + the whole suite, as CI runs it
	$(PYTEST) --durations=20 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The XLA lane: its own venv (torch_xla pins its own torch), XLA on the CPU (PJRT_DEVICE=CPU).
# torch and torch_xla are named in the same install as the project so pip can never pick another torch.
XLA_VENV  ?= .venv-xla
XLA_PY    := $(XLA_VENV)/bin/python
XLA_STAMP := $(XLA_VENV)/.installed
XLA_PINS  := torch==2.9.0 torch_xla==2.9.0

$(XLA_STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(XLA_VENV)
	$(XLA_PY) -m pip install -q $(XLA_PINS)
	$(XLA_PY) -m pip install -q -c requirements.lock -e '.[test]' $(XLA_PINS)
	$(XLA_PY) -c "import torch, torch_xla; assert torch.__version__.split('+')[0] == '2.9.0', torch.__version__"
	touch $(XLA_STAMP)

test-xla: $(XLA_STAMP)   ## the XLA lane: torch_xla on this CPU
	PJRT_DEVICE=CPU $(XLA_PY) -m pytest -q tests/xla

STUDY ?= model_scaling
dashboard: setup          ## optuna-dashboard on the study storage (127.0.0.1:8080)
	$(PY) -m dashboards.serve

report: setup             ## one self-contained HTML report: make report STUDY=optimizer
	$(PY) -m dashboards.report study=$(STUDY)

# Benchmarks (docs/benchmarks.md): each prints a table and writes bench/results/<name>.json and .md.
# Run them on a quiet machine, one at a time: they measure time on shared cores.
BENCH_ENV := OMP_WAIT_POLICY=PASSIVE
bench: bench-data bench-storage bench-sweep bench-pruning bench-trainer   ## all of them, one at a time (docs/benchmarks.md)

bench-trainer: setup      ## paper MLP-t / attention steps: fp32/bf16, eager/compile, vs matmul peak
	$(BENCH_ENV) $(PY) -m bench.trainer.step --compile
	$(BENCH_ENV) $(PY) -m bench.trainer.step --compile --arch trm_att_sudoku --out bench/results/trainer_att.json

bench-data: setup         ## 1,000 x 1,000 build from a CSV; loader headroom over the trainer
	$(BENCH_ENV) $(PY) -m bench.data_pipeline

bench-storage: setup      ## report+should_prune and ask+tell latency, 1/8/32 clients, PostgreSQL (TRM_SWEEPS_TEST_PG)
	$(BENCH_ENV) $(PY) -m bench.storage_latency

bench-sweep: setup        ## per-trial overhead of the local (fresh and warm) and torchrun launchers
	$(BENCH_ENV) $(PY) -m bench.sweep_overhead --launchers local,local+launcher.warm=true,torchrun

bench-pruning: setup      ## the CPU proxy study with and without the Hyperband pruner
	$(BENCH_ENV) $(PY) -m bench.pruning.studies

# TRM-Bench-tiny (docs/benchmarks.md, Pruning): hours on 2 cores; the same command resumes, export runs any time.
bench-table: setup        ## record (or resume) every tiny configuration's curve, 3 seeds; then export the table
	$(BENCH_ENV) $(PY) -m bench.trm_bench.tiny record
	$(PY) -m bench.trm_bench.tiny export

bench-replay: setup       ## every sampler x pruner replayed on the table; seeds 0 and 1 choose, seed 2 reports
	$(PY) -m bench.trm_bench.replay --seed 0
	$(PY) -m bench.trm_bench.replay --seed 1
	$(PY) -m bench.trm_bench.replay --seed 2 --only tpe/median_late/blank
	$(PY) -m bench.trm_bench.choice

bench-check: setup        ## a real study of model_scaling's defaults on the table's held-out seed, beside its replays
	$(BENCH_ENV) $(PY) -m bench.trm_bench.check run --seed 1
	$(PY) -m bench.trm_bench.check report --seed 1

# Our train step vs the TRM reference's (a TinyRecursiveModels checkout at REF, imported from there, never copied),
# side by side per mode. The reference's side runs under its own venv: torch pinned first, as in setup, then what
# its model imports (einops, pydantic). REF_ARGS: sizes for a 2-core CPU without bf16 units (docs/benchmarks.md).
REF_VENV  ?= .venv-ref
REF_PY    := $(REF_VENV)/bin/python
REF_STAMP := $(REF_VENV)/.installed
REF_ARGS  ?= --compile --batch 8 --bf16-batch 2 --matmul-size 1024 --matmul-seconds 1

ref-given:
	@test -n "$(REF)" || { echo "bench-reference: REF=<path to a TinyRecursiveModels checkout> is required"; exit 2; }

$(REF_STAMP): requirements.lock
	$(PYTHON) -m venv $(REF_VENV)
	$(REF_PY) -m pip install -q torch==2.13.0
	$(REF_PY) -m pip install -q -c requirements.lock torch==2.13.0 einops==0.8.2 pydantic numpy
	touch $(REF_STAMP)

bench-reference: ref-given setup $(REF_STAMP)  ## ours vs the TRM reference: make bench-reference REF=path/to/TinyRecursiveModels
	$(BENCH_ENV) $(PY) -m bench.trainer.vs_reference --ref $(REF) --ref-python $(REF_PY) $(REF_ARGS)

# The long soak (docs/reliability.md, Soak): the chaos suite (tests/chaos) at 20 trials, faults at random points;
# every invariant checked. Exits 1 if one fails.
soak: setup               ## SOAK_ARGS="--trials 40 --seed 7" for another run
	$(BENCH_ENV) $(PY) -m tests.chaos $(SOAK_ARGS)

# The pod soak (issue 56; docs/reliability.md, Pod soak): a 30-minute study on the stand-in gcloud's slice under
# describe errors, a spot preemption, a VM that vanishes and one that goes silent; writes bench/results/pod_soak_<shape>.json.
soak-pod: setup           ## v4-32, 30 min; POD_SOAK_ARGS="--shape v5litepod-16 --seed 2" for the other
	$(BENCH_ENV) $(PY) -m tests.chaos --pod $(POD_SOAK_ARGS)

clean:                    ## remove the venvs, outputs/ and pytest's cache
	rm -rf $(VENV) $(XLA_VENV) outputs .pytest_cache
