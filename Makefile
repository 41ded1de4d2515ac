# Everything a newcomer needs: `make demo` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is only installed when the venv lacks it.  On a CPU-only machine point
# TORCH_INDEX at PyTorch's CPU wheel index so pip does not fetch CUDA wheels:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?=
# The unit and dashboard tiers run in this many pytest-xdist workers: their tests are independent, and a third of
# their time is spent waiting on the dashboard's refreshes.
WORKERS ?= 3
# Of tests/integration, the plumbing runs in four, handed one test at a time (one group at a time where tests share a
# build, `xdist_group`) in the order of tests/integration/conftest.py, longest first: much of its time is spent
# waiting on jobs (a hang held on purpose, a rank's start), which a fourth worker fills (docs/performance.md).
# The handful marked `alone` (a verdict or a share of time on a job run now) run one at a time, with nothing beside
# them: another job would change what they measure (tests/integration/__init__.py).
PLUMBING_WORKERS ?= 4
# FAST_TIER=0: `make test` leaves out the fast tier (CI runs it on Python 3.10 and 3.13, which have no torch), but
# still runs the fast tier's few modules that need torch (they call importorskip("torch")), in a process of their
# own as in the fast tier: the integration tests' workers have compiled models and watched others by then.
FAST_TIER ?= 1
# ALONE_TIER=0: `make test` leaves out the tests marked alone (CI runs them first, with `make test-alone`).
ALONE_TIER ?= 1
TORCH_FAST_TESTS := $(if $(filter 0,$(FAST_TIER)),$(shell grep -l 'importorskip("torch")' tests/unit/*.py tests/tui/*.py))
# pip byte-compiles every module it installs, ~13,000 for torch, Transformers and the rest (~35 s of CPU), where a
# test run imports a fifth of them.  Where Python may write bytecode, the imports compile what they use, once;
# under PYTHONDONTWRITEBYTECODE they could not keep it, so pip compiles ahead as before.
PIP_COMPILE := $(if $(PYTHONDONTWRITEBYTECODE),,--no-compile)
GPU_CHECK_ARGS ?=
SCENARIO ?= healthy

.PHONY: demo test test-fast test-alone test-torch check fmt clean gpu-check gpu-bundle system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@# Before it was gputop-train this project installed as "gputop"; that install (or the
	@# unrelated PyPI gputop) owns bin/gputop too, so it goes first, before ours writes it.
	@$(BIN)/pip uninstall -q -y gputop 2>/dev/null || true
	@# test and dev are PEP 735 dependency groups, not extras: pip installs them from 25.1 on.
	@$(BIN)/python -m pip install -q 'pip>=25.1'
	$(BIN)/pip install -q $(PIP_COMPILE) -e '.[mcp]' --group test --group dev
	@$(BIN)/python -c 'import torch' 2>/dev/null || \
	  $(BIN)/pip install -q $(PIP_COMPILE) '$(TORCH_SPEC)' numpy $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	@# Lightning only after torch: installed first, it would pull the newest (CUDA) torch.
	@$(BIN)/python -c 'import lightning' 2>/dev/null || $(BIN)/pip install -q $(PIP_COMPILE) -e '.[lightning]'
	@# The same for the Hugging Face Trainer and TensorBoard, which the integration tests run for real.
	@$(BIN)/python -c 'import transformers, accelerate, tensorboard' 2>/dev/null || \
	  $(BIN)/pip install -q $(PIP_COMPILE) -e '.[transformers,tensorboard]'
	@touch $@

demo: $(VENV)/.installed
	$(BIN)/gputop demo --scenario $(SCENARIO)

# Prometheus, promtool, iproute2 and a C compiler: installed as root, else one line saying how.
system-deps:
	@bash scripts/system-deps

# Everything: tests/unit and tests/tui in parallel, then tests/integration (real DDP jobs, Prometheus, namespaces,
# installs): its plumbing in $(WORKERS) workers, then the jobs marked alone one at a time.
test: system-deps $(VENV)/.installed
ifneq ($(FAST_TIER),0)
	$(BIN)/python -m pytest -n $(WORKERS) tests/unit tests/tui $(PYTEST_ARGS)
endif
ifneq ($(TORCH_FAST_TESTS),)
	$(BIN)/python -m pytest $(TORCH_FAST_TESTS) $(PYTEST_ARGS)
endif
	$(BIN)/python -m pytest -n $(PLUMBING_WORKERS) --dist loadgroup --no-loadscope-reorder -m 'not alone' \
	  tests/integration $(PYTEST_ARGS)
ifneq ($(ALONE_TIER),0)
	$(BIN)/python -m pytest -m alone tests/integration $(PYTEST_ARGS)
endif

# The integration tests marked alone, one at a time: `make test` runs them last.
test-alone: system-deps $(VENV)/.installed
	$(BIN)/python -m pytest -m alone tests/integration $(PYTEST_ARGS)

# The unit and dashboard tiers: no training job, no Prometheus, no namespaces; under a minute on
# two cores (docs/performance.md).  Only a C compiler from the system, for the NVML stand-in.
test-fast: $(VENV)/.installed
	@bash scripts/system-deps cc
	$(BIN)/python -m pytest -n $(WORKERS) tests/unit tests/tui $(PYTEST_ARGS)

# The stacks' real-job tests against another torch release, in .venv-torch-RELEASE, and docs/torch.md's table
# of what gputop reads under it (scripts/test-torch): make test-torch TORCH=2.11.0
test-torch: system-deps
	@test -n "$(TORCH)" || { echo "make test-torch TORCH=2.11.0: name a torch release" >&2; exit 2; }
	TORCH_INDEX='$(TORCH_INDEX)' PYTEST_ARGS='$(PYTEST_ARGS)' bash scripts/test-torch $(TORCH)

# ruff (lint + format), mypy, and the import contracts in pyproject.toml ([tool.importlinter]).
# They read the source: no torch, Lightning or Transformers needed, so this is seconds on a fresh clone
# (the MCP SDK is, so that mypy checks gputop.mcp against its types).
$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	@$(BIN)/pip uninstall -q -y gputop 2>/dev/null || true
	@$(BIN)/python -m pip install -q 'pip>=25.1'
	$(BIN)/pip install -q $(PIP_COMPILE) -e '.[mcp]' --group dev
	@touch $@

check: $(VENV)/.dev-installed
	$(BIN)/ruff check gputop tests demos benchmarks
	$(BIN)/ruff format --check gputop tests demos benchmarks
	$(BIN)/mypy gputop tests
	$(BIN)/lint-imports

# Every GPU-side claim checked on a real GPU (benchmarks/gpu_check.py); exits 2 where there is none.
gpu-check: $(VENV)/.installed
	$(BIN)/python benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# What the lent GPU machine lacks (gputop's wheel, textual, msgspec…) for Python 3.12 there, in .gpu-bundle/;
# the device call runs scripts/gpu-device with it (docs/gpu.md).  Needs only python3 and the package index.
gpu-bundle:
	bash scripts/gpu-bundle

fmt: $(VENV)/.installed
	$(BIN)/ruff format gputop tests demos benchmarks
	$(BIN)/ruff check --fix gputop tests demos benchmarks

clean:
	rm -rf $(VENV) .venv-* .gpu-bundle gpu-out .pytest_cache .mypy_cache .ruff_cache build *.egg-info
