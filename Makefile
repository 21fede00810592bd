# vmapbench: the two commands are `make bench` and `make test`; the rest is documented in README.md.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# Threads are pinned for stable timings on small machines; override on the command line.
export OMP_NUM_THREADS ?= 2
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.inductor-cache

.PHONY: bench test dashboard profile continuous coverage list clean venv

# (Re)install only when the project metadata changed: a second run does not touch torch.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

bench: $(STAMP)
	$(PY) -m vmapbench.bench

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

dashboard: $(STAMP)
	$(PY) -m vmapbench dashboard

# make profile W=<workload> M=<method> [ARGS="--device cpu --seconds 5"]
profile: $(STAMP)
	$(PY) -m vmapbench profile $(W) --method $(M) $(ARGS)

# make continuous BASE=<rev> HEAD=<rev>
continuous: $(STAMP)
	$(PY) -m vmapbench.continuous $(or $(BASE),HEAD~1) $(or $(HEAD),HEAD)

coverage: $(STAMP)
	$(PY) -m vmapbench coverage

list: $(STAMP)
	$(PY) -m vmapbench list

clean:
	rm -rf .asv dashboards/out results/html results/profiles .pytest_cache .inductor-cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
