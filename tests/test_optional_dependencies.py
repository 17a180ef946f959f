"""A plain ``pytest`` without the optional packages skips the tests that need them, naming the
missing module (docs/development.md); a test module that imports one unguarded would instead
stop the whole run at collection.

The suite is collected in a subprocess in which importing any of :data:`OPTIONAL` fails as if the
package were not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OPTIONAL = ("azure", "aiohttp", "opentelemetry.sdk", "proton", "matplotlib", "pycep")
"""The Azure SDKs (and azure-functions), the evaluators, the telemetry SDK, the AMQP broker's
proton, the charts and the Bicep parser: what ``make test`` installs beyond ``shared[dev]``'s core."""

COLLECT_WITHOUT = """
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith(tuple(sys.argv[1].split(","))):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"]))
"""


def test_collecting_without_the_optional_packages_skips_and_never_errors() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REQUIRE_TEST_DEPENDENCIES"}
    done = subprocess.run([sys.executable, "-c", COLLECT_WITHOUT, ",".join(OPTIONAL)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "could not import 'azure.functions'" in done.stdout  # the guard names what is missing
