"""Shared fixtures.

The tests mirror the package: ``store/``, ``queue/``, ``pipeline/``, ``judges/``, ``app/`` (the Functions
app, its deployment package and ``infra/``), ``cli/``, ``reliability/``, and the top-level modules of
the library here. ``fakes/`` holds the local servers and broker the wire tests run against (with the
tests of those fakes), ``support/`` the factories, fault injection and pytest plugins; both folders are
on ``pytest.ini``'s ``pythonpath`` (``from factories import make_episode``). The folders are not
packages: pytest imports each test module by its file name, so file names stay unique across folders
(pytest refuses a duplicate); as packages, ``queue/`` would shadow the standard library's ``queue``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from clean_settings import clear_settings

from agent_learning.core.clock import ManualClock

# Local servers from tests/fakes/, helpers from tests/support/ (both on pytest.ini's pythonpath).
# The AMQP broker is imported by the tests that use it.
pytest_plugins = ["cosmos_fixture", "judge_server", "adapters", "reliability_report", "telemetry_capture"]


# Property tests draw new cases on every local run, to keep exploring; under HYPOTHESIS_PROFILE=ci
# (.ci/run sets it) they draw the same cases every run, so CI fails for a change, not for a draw.
# A failure prints the blob that replays it (@reproduce_failure).
try:
    from hypothesis import settings
except ImportError:  # a development dependency; without it the property tests fail to import
    pass
else:
    settings.register_profile("dev", print_blob=True)
    settings.register_profile("ci", derandomize=True, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config: pytest.Config) -> None:
    """The CLI's tables wrap at COLUMNS when it is set, and a terminal or a pytest-xdist worker
    may set it (and LINES): clear both, so every test sees the CLI's own width."""
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


SLOWEST_FILES = ("test_newcomer.py", "test_deployment_package.py", "test_judge_evaluators.py", "test_docs_blocks.py",
                 "test_telemetry.py")
"""Test files of half a minute or more each (a `make demo` and a `pip install` from nothing first),
run first, slowest first: under pytest-xdist (`make pytest`, which keeps this order) a long file
that starts last keeps one worker busy after the others are done."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests of :data:`SLOWEST_FILES` first, in that order, each file's tests in their own."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


MISSING_MODULE = "could not import"  # how pytest.importorskip words its skip


def _fail_missing_modules(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Where every dependency must be installed (``make test`` sets REQUIRE_TEST_DEPENDENCIES),
    a test skipped because a module is missing fails instead: an install step is missing."""
    if report.skipped and os.environ.get("REQUIRE_TEST_DEPENDENCIES") and MISSING_MODULE in str(report.longrepr):
        report.outcome = "failed"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_missing_modules(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_missing_modules(outcome.get_result())


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No setting of the outer environment leaks into the test: it sees the defaults and what it sets."""
    clear_settings(monkeypatch)
    return monkeypatch


@pytest.fixture
def embedded_env(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """:func:`clean_env`, with the embedded store in the test's own folder; returns the store's path."""
    path = tmp_path / "local.db"
    clean_env.setenv("AGENT_LEARNING_SQLITE_PATH", str(path))
    return path


@pytest.fixture
def clock() -> ManualClock:
    """A clock that only moves when a test advances it."""
    return ManualClock()

