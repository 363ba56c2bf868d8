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

.PHONY: venv build stage test demo bench clean

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

stage: build
	$(FG) stage

# pytest's exit code 5 (no tests collected) is a failure here, like any other non-zero code.
test: stage
	$(ENV) $(PY) -m pytest $(PYTEST_ARGS)

demo: stage
	$(FG) demo

bench: $(SETUP)
	$(FG) bench $(BENCH_ARGS)

clean:
	rm -rf build .hub-cache
