"""Pytest plugin: the reliability report, and the store each reliability scenario runs on.

Registered in ``tests/conftest.py``. The reliability tests (``tests/reliability/``)
record what each scenario did with :func:`record`: how many faults they injected, how many
episodes the agents wrote, and how many of those the audit found lost or learned from more
than once (see ``faults.account``). At the end of the session a table of these counts is
printed, one row per scenario and store (under pytest-xdist, by the controller, from every
worker's counts); nothing is printed when no reliability test ran.

The ``backend`` fixture gives a reliability test a fresh store of each kind in turn: the
embedded SQLite store, and the Cosmos DB adapter (the real azure-cosmos SDK) against the
patched local Cosmos server, in a new database.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from adapters import store_adapter


@dataclass
class Row:
    """Counts of one scenario on one store, summed over its tests."""

    tests: int = 0
    faults: int = 0
    episodes: int = 0
    lost: int = 0
    double: int = 0
    kept: int = 0


_ROWS: dict[tuple[str, str], Row] = {}
_LOCK = threading.Lock()


def _add(scenario: str, store: str, counts: dict[str, int]) -> None:
    with _LOCK:
        row = _ROWS.setdefault((scenario, store), Row())
        for name, value in counts.items():
            setattr(row, name, getattr(row, name) + value)


def record(scenario: str, store: str, *, faults: int, episodes: int, lost: int, double: int, kept: int = 0) -> None:
    """Add one test's counts to the report (call it before asserting, so failures show too)."""
    _add(scenario, store, {"tests": 1, "faults": faults, "episodes": episodes, "lost": lost, "double": double,
                           "kept": kept})


def rows() -> dict[tuple[str, str], Row]:
    """A copy of the counts so far."""
    with _LOCK:
        return {k: Row(**vars(v)) for k, v in _ROWS.items()}


def format_report(table: dict[tuple[str, str], Row]) -> list[str]:
    """The report as text lines."""
    header = ("scenario", "store", "tests", "faults injected", "episodes", "lost", "double-counted", "kept aside")
    body = [
        (s, st, str(r.tests), str(r.faults), str(r.episodes), str(r.lost), str(r.double), str(r.kept))
        for (s, st), r in sorted(table.items())
    ]
    total = Row()
    for r in table.values():
        for name in vars(total):
            setattr(total, name, getattr(total, name) + getattr(r, name))
    body.append(("total", "", *(str(getattr(total, n)) for n in ("tests", "faults", "episodes", "lost", "double",
                                                                   "kept"))))
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*line) for line in body)]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker, hand the counts to the controller, which prints the report."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["reliability_rows"] = [[scenario, store, vars(row)] for (scenario, store), row in rows().items()]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the pytest-xdist controller, add a finished worker's counts to the report."""
    for scenario, store, counts in getattr(node, "workeroutput", {}).get("reliability_rows", []):
        _add(scenario, store, counts)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    table = rows()
    if not table:
        return
    terminalreporter.section("reliability report")
    for line in format_report(table):
        terminalreporter.write_line(line)
    terminalreporter.write_line(
        "kept aside: rejected input held for inspection (dead-lettered or never sendable), not lost"
    )


@dataclass
class Backend:
    """A store for one reliability test, with what the test needs to know about it."""

    kind: str  # "sqlite" or "cosmos"
    store: Any
    path: Path  # a folder for this test's SQLite files (the queue's, and the store's on sqlite)

    def put_raw(self, container: str, doc: dict[str, Any]) -> None:
        """Write a document as it is, unvalidated, the way a foreign or buggy writer could."""
        if self.kind == "cosmos":
            from agent_learning.store.cosmos import SCORES  # azure-cosmos: only for the Cosmos backend

            name = SCORES if container == "scores" else container  # the score slots' container
            self.store.database.get_container_client(name).upsert_item(doc)
        elif container == "episodes":
            self.store.add_raw_episode(doc)
        elif container == "scores":
            self.store.put_raw_score(doc)
        elif container == "policies":
            self.store.put_raw_current_policy(str(doc.get("agent_id")), doc)
        else:
            raise ValueError(f"no raw write for container {container!r}")


@pytest.fixture
def backend(durable_store: Any, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh store of each kind (``durable_store``, tests/support/adapters.py): embedded SQLite, then
    Cosmos DB over the wire."""
    return Backend(store_adapter(request), durable_store, tmp_path)
