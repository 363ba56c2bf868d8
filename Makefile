# fused-geglu: every target sets itself up (virtual environment with pinned packages) first.
#   make demo    build -> stage -> load through kernels -> run -> kernelize a tiny Gemma
#   make test    build -> stage -> pytest (the command .ci/run runs)
# On a machine whose Python already has torch/triton/kernels (e.g. the GPU box), use the system
# interpreter instead of a venv:  make test VENV=none PYTHON=python3
PYTHON ?= python3
VENV ?= .venv

ifeq ($(VENV),none)
PY := $(PYTHON)
SETUP :=
else
PY := $(VENV)/bin/python
SETUP := $(VENV)/.installed
endif

ENV := PYTHONPATH=$(CURDIR)/src$(if $(PYTHONPATH),:$(PYTHONPATH))
FG := $(ENV) $(PY) -m fused_geglu_tools
PYTEST_ARGS ?=

.PHONY: venv build build-matrix stage test demo bench clean

venv: $(SETUP)

$(VENV)/.installed: requirements/dev.txt requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements/dev.txt -c requirements/constraints.txt
	@# The CLI as a command (README's `fused-geglu ...`): this checkout's tools, on the venv's Python.
	printf '#!/bin/sh\nPYTHONPATH="%s/src$${PYTHONPATH:+:$$PYTHONPATH}" exec "%s/bin/python" -m fused_geglu_tools "$$@"\n' \
		"$(CURDIR)" "$(abspath $(VENV))" > $(VENV)/bin/fused-geglu
	chmod +x $(VENV)/bin/fused-geglu
	touch $@

build: $(SETUP)
	$(FG) build $(BUILD_ARGS)

# The compiled variants of several torch releases in one build/, each built in its own environment under
# .venvs/ (torch==<version> + requirements/build.txt): make build-matrix TORCH="2.12.1 2.15.0". Each torch
# then loads its own variants through kernels and checks them against float64 (MATRIX_ARGS=--no-check skips
# that). A later `make build` or `make stage` keeps them (same sources); MATRIX_ARGS passes options through.
TORCH ?=
MATRIX_ARGS ?=
build-matrix: $(SETUP)
	$(if $(strip $(TORCH)),,$(error name the torch releases: make build-matrix TORCH="2.12.1 2.15.0"))
	$(FG) build-matrix --torch $(TORCH) $(MATRIX_ARGS)

stage: build
	$(FG) stage

# Two passes. The whole suite against the staged build, which kernels loads as a user's would (this
# torch's compiled variant); then the kernel-facing files against the noarch build this torch would
# load with no compiled variant, staged alone: torch-cpu (ATen only) on a CPU torch (2.14, 2.15, ...),
# torch-cuda on a CUDA torch (kernels resolves the cuda backend for it, GPU or not), Triton-only tests
# left out (the first pass ran them on the same Python). NOARCH_PASS=0 skips the second pass;
# NOARCH_PYTEST_ARGS passes arguments to it. pytest's exit code 5 (no tests collected) is a failure
# here, like any other.
NOARCH_PASS ?= 1
NOARCH_TESTS := $(addprefix tests/test_,geglu.py linear.py mlp.py layers.py loading.py transformers_integration.py \
	training_nodes.py autograd_contract.py compile.py eager_entries.py fsdp.py tensor_parallel.py)
NOARCH_PYTEST_ARGS ?=

test: stage
	$(ENV) $(PY) -m pytest $(PYTEST_ARGS)
ifneq ($(NOARCH_PASS),0)
	$(FG) stage --variants $$($(PY) -c "import torch; print('torch-cuda' if torch.version.cuda else 'torch-cpu')") \
		--cache $(CURDIR)/.hub-cache-noarch
	FUSED_GEGLU_TEST_NOARCH=1 FUSED_GEGLU_TEST_CACHE=$(CURDIR)/.hub-cache-noarch \
		$(ENV) $(PY) -m pytest -k "not triton" $(NOARCH_TESTS) $(NOARCH_PYTEST_ARGS)
endif

demo: stage
	$(FG) demo

bench: $(SETUP)
	$(FG) bench $(BENCH_ARGS)

clean:
	rm -rf build .hub-cache .hub-cache-noarch
