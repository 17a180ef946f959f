# Two commands: `make demo` (set up, then run the demo on the embedded default) and
# `make test` (set up, then run every test and the checkov scan of infra/). Both create .venv from
# nothing; checkov gets its own .venv-checkov because it pins many dependencies of its own.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
CHECKOV_VENV    := .venv-checkov
CHECKOV_VERSION := 3.3.30

.PHONY: demo test lint infra-check pytest local-settings clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11 or newer is needed, found " + sys.version' \
		|| (echo "set PYTHON=/path/to/python3.11"; exit 1)
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: $(BIN)/python shared/pyproject.toml
	$(PIP) install --quiet --disable-pip-version-check -e './shared[plot,serve]'
	@touch $@

# Everything the Functions app needs (requirements.txt, minus the library itself, which is
# installed editable): what `func start` runs with (docs/deploying.md).
$(VENV)/.app-installed: $(BIN)/python shared/pyproject.toml requirements.txt
	grep -v -e '^\./shared' -e '^#' -e '^$$' requirements.txt > $(VENV)/app-requirements.txt
	$(PIP) install --quiet --disable-pip-version-check -r $(VENV)/app-requirements.txt -e './shared[azure,judges]'
	@touch $@

# The app's dependencies plus the test tools (Node.js for the local Cosmos server, Debian's
# headless Chromium and its driver for the dashboard's browser test).
$(VENV)/.test-installed: $(VENV)/.app-installed tests/fakes/cosmos_server/package-lock.json
	$(PIP) install --quiet --disable-pip-version-check -e './shared[azure,judges,plot,serve,dev]'
	cd tests/fakes/cosmos_server && npm ci --no-audit --no-fund --loglevel=error
	command -v chromium >/dev/null && command -v chromedriver >/dev/null \
		|| ! command -v apt-get >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)
	@command -v chromedriver >/dev/null || echo "no Chromium and no apt-get: the dashboard's browser test will be skipped"
	@touch $(VENV)/.demo-installed $@

demo: $(VENV)/.demo-installed
	$(BIN)/agent-learn demo
	@echo "agent-learn is in $(BIN): 'source $(BIN)/activate' puts it on your PATH for the next commands"

# local.settings.json for `func start` against the resources `azd up` created (docs/deploying.md).
local-settings: $(VENV)/.app-installed
	$(BIN)/python infra/local_settings.py

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .

$(CHECKOV_VENV)/.installed: $(BIN)/python Makefile
	$(BIN)/python -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'checkov==$(CHECKOV_VERSION)'
	@touch $@

# The gate fails on a failed check, on a file checkov could not parse (it would scan nothing in
# it) and on a skip without a reason; skips are `// checkov:skip=CKV_...: reason` comments inside
# the resource. --soft-fail leaves that decision, and the report, to the gate.
infra-check: $(CHECKOV_VENV)/.installed
	$(CHECKOV_VENV)/bin/checkov --directory infra --framework bicep --skip-download --soft-fail \
		-o json --output-file-path $(CHECKOV_VENV)/report > /dev/null
	$(CHECKOV_VENV)/bin/python tests/support/checkov_gate.py $(CHECKOV_VENV)/report/results_json.json

# Everything is installed here, so a test skipped for a missing module is a failed install step.
# The tests run in one pytest-xdist worker per CPU, each test file on one worker (its module
# fixtures are made once), the slowest files first (tests/conftest.py); PYTEST_WORKERS=0 runs
# them in this process.
PYTEST_WORKERS ?= logical
pytest: $(VENV)/.test-installed
	REQUIRE_TEST_DEPENDENCIES=1 $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# .ci/run runs these three one by one, to time each.
test: lint infra-check pytest

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .agent-learning agent-learning-demo.png agent-learning-report.png agent-learning-report.html .pytest_cache .ruff_cache
