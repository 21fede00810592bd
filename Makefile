# vmapbench: the two commands are `make bench` and `make test`; the rest is documented in docs/ (`make docs`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# Peers (Opacus, BackPACK, JAX; pyproject's `peers` extra): `make bench PEERS=0` leaves them out
# (their methods are then skipped with a reason); `make test` always installs them.
PEERS  ?= 1
PEERS_STAMP := $(VENV)/.peers-stamp
BACKPACK := backpack-for-pytorch==1.7.1
# The torch that `make` installs, exactly (pyproject requires none, the engine runs on 2.13-2.15; a loose spec here would
# pull the newest release with several GB of CUDA wheels). .ci/torch-versions tests the newest.
TORCH_PIN := torch==2.13.0
# Threads are pinned for stable timings on small machines; override on the command line.
export OMP_NUM_THREADS ?= 2
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.inductor-cache

.PHONY: bench bench-full headlines peers test dashboard docs profile continuous gate-calibrate coverage list clean venv

# (Re)install only when the project metadata changed: a second run does not touch torch.
define venv_base
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
endef

$(STAMP): pyproject.toml
	$(venv_base)
	$(PY) -m pip install -q --disable-pip-version-check '$(TORCH_PIN)' -e '.[test]'
	@touch $(STAMP)

# The project and its peers in one pip run (a second run for the extra would resolve and install
# again), then BackPACK with --no-deps: its torchvision requirement does
# not import against the CPU torch. It stands for the base install too (both stamps are touched).
$(PEERS_STAMP): pyproject.toml
	$(venv_base)
	$(PY) -m pip install -q --disable-pip-version-check '$(TORCH_PIN)' -e '.[test,peers]'
	$(PY) -m pip install -q --disable-pip-version-check --no-deps '$(BACKPACK)'
	@touch $(STAMP) $(PEERS_STAMP)

venv: $(STAMP)

peers: $(PEERS_STAMP)

# When make started (read once, before the prerequisites install anything): bench.py prints the
# install apart from the run.
ifneq ($(filter bench,$(MAKECMDGOALS)),)
BENCH_STARTED := $(shell date +%s.%N)
endif

# The project's own modules compiled up front (into __pycache__/, git-ignored): where
# PYTHONDONTWRITEBYTECODE is set, as on CI's machines, every process that the tests and asv start
# would compile them from source again. A file that does not compile is left to the run to report.
SOURCES := dashboards engine measuring suite vmapbench workloads
define compile_sources
	@$(PY) -m compileall -q $(SOURCES) >/dev/null || true
endef

# make bench TORCH="2.13.0 2.15.0": the quick selection once per torch release, each in the environment
# .ci/torch-versions keeps for it; each release's results are a file of their own (...-torch<version>.json).
ifneq ($(strip $(TORCH)),)
bench:
	GOAL=bench bash .ci/torch-versions $(TORCH)
else
bench: $(if $(filter 1,$(PEERS)),$(PEERS_STAMP),$(STAMP))
	$(compile_sources)
	$(PY) -m vmapbench.bench $(if $(BENCH_STARTED),--started-at $(BENCH_STARTED))
endif

# Every size, cpu and cuda (the cuda cases skip without a GPU), the cold compiles included.
bench-full: $(if $(filter 1,$(PEERS)),$(PEERS_STAMP),$(STAMP))
	$(PY) -m vmapbench.bench --profile full

# make headlines [HEADLINE_ARGS="--only time_to_n"]: the README's headline runs (time to N, peer
# ratios) measured again at HEAD into results/, the tables pointed at the new files and rendered.
# Commit engine/ first: the files are named after HEAD. Commit the results and pages it changed.
headlines: $(PEERS_STAMP)
	$(PY) -m vmapbench.headlines $(HEADLINE_ARGS)

# make test runs the tests in TEST_WORKERS processes (pytest-xdist), each test file in one of them
# (module fixtures built once); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: $(PEERS_STAMP)
	$(compile_sources)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

dashboard: $(STAMP)
	$(PY) -m vmapbench dashboard

# The documentation site, offline, into site/: the results tables are rendered from results/ first
# (commit what changed; `python -m vmapbench.docs_tables --check` only names the stale ones), then
# MkDocs builds in strict mode (a broken link or an orphan page fails).
docs: $(STAMP)
	$(PY) -m vmapbench.docs_tables
	$(PY) -m mkdocs build --strict

# make profile W=<workload> M=<method> [ARGS="--device cpu --seconds 5"]
profile: $(STAMP)
	$(PY) -m vmapbench profile $(W) --method $(M) $(ARGS)

# make continuous BASE=<rev> HEAD=<rev> [GATE_ARGS="--summary-md FILE"]: the regression
# gate (vmapbench/gate.py). Its exit code survives make: 0 no regression, 1 regression, 2 a failed
# case. GNU make turns any failed recipe into 2, so the gate runs while the Makefile is read
# (its output on stderr), and a 1 is passed on through make's --question mode. The gate's 3, too
# noisy to decide, comes out as make's 2 with that message (`python -m vmapbench.continuous`
# exits 3 itself). It needs the
# environment of `make venv` (not built from here: a parse-time install would also run under -n).
GATE_CMD = $(PY) -m vmapbench.continuous $(or $(BASE),HEAD~1) $(or $(HEAD),HEAD) $(GATE_ARGS)
ifneq ($(filter continuous,$(MAKECMDGOALS)),)
ifeq ($(findstring n,$(firstword -$(MAKEFLAGS))),)
GATE_RC := $(shell if [ -x $(PY) ]; then $(GATE_CMD) 1>&2; echo $$?; else echo novenv; fi)
ifeq ($(GATE_RC),1)
MAKEFLAGS += --question
else ifeq ($(GATE_RC),3)
$(error make continuous: the gate exited 3: too noisy to decide (its noise is printed above); run it again on a quieter machine)
else ifeq ($(GATE_RC),novenv)
$(error make continuous: $(PY) does not exist; run `make venv` first)
else ifneq ($(GATE_RC),0)
$(error make continuous: the gate exited $(GATE_RC) (2: a case failed, or the gate could not compare; see above))
endif
endif
endif

continuous:
	@echo "make continuous: the gate exited $(GATE_RC) ($(GATE_CMD))"

# make gate-calibrate [CAL_ARGS="--aa 5 --aa-busy 5 --planted 3"]: A/A and planted-slowdown runs
# (uniform 1.1x, engine.hessian 1.2x, the nn/Bayesian/tutorial workloads' engine calls 1.5x);
# prints the false-alarm and detection rates and writes results/noise/<machine>.json.
gate-calibrate: $(STAMP)
	$(PY) -m vmapbench gate --calibrate $(CAL_ARGS)

coverage: $(STAMP)
	$(PY) -m vmapbench coverage

list: $(STAMP)
	$(PY) -m vmapbench list

clean:
	rm -rf .asv dashboards/out site results/html results/profiles .pytest_cache .inductor-cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
