# One venv, everything pinned. `make demo` and `make test` set themselves up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

# torch first and pinned: an unpinned torch resolved by pip is a multi-GB CUDA build.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c requirements.lock -e '.[cpu,test]'
	touch $(STAMP)

demo: setup
	$(PY) -m trm.train arch=tiny

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/trainer.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
