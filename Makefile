# Two commands: `make demo` (set up, then run the demo on the embedded default) and
# `make test` (set up, then run every test). Both create .venv from nothing.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip

.PHONY: demo test lint clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11 or newer is needed, found " + sys.version' \
		|| (echo "set PYTHON=/path/to/python3.11"; exit 1)
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: $(BIN)/python shared/pyproject.toml
	$(PIP) install --quiet --disable-pip-version-check -e './shared[plot]'
	@touch $@

# Everything the Functions app needs (requirements.txt, minus the library itself, which is
# installed editable) plus the test tools.
$(VENV)/.test-installed: $(BIN)/python shared/pyproject.toml requirements.txt tests/cosmos_server/package-lock.json
	grep -v -e '^\./shared' -e '^#' -e '^$$' requirements.txt > $(VENV)/app-requirements.txt
	$(PIP) install --quiet --disable-pip-version-check -r $(VENV)/app-requirements.txt -e './shared[azure,judges,plot,dev]'
	cd tests/cosmos_server && npm ci --no-audit --no-fund --loglevel=error
	@touch $(VENV)/.demo-installed $@

demo: $(VENV)/.demo-installed
	$(BIN)/agent-learn demo

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .agent-learning agent-learning-demo.png agent-learning-report.png agent-learning-report.html .pytest_cache .ruff_cache
