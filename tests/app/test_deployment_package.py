"""The deployment package: the app as `.funcignore` leaves it, with `requirements.txt`
installed from nothing into `.python_packages`, imports with nothing else on the path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pathspec")

import pathspec

from agent_learning.app import http

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(900)


def packaged_files() -> list[Path]:
    """Tracked and untracked (not git-ignored) files that `.funcignore` keeps."""
    spec = pathspec.PathSpec.from_lines("gitignore", (ROOT / ".funcignore").read_text().splitlines())
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / p for p in listed if (ROOT / p).is_file() and not spec.match_file(p)]


def test_funcignore_keeps_the_app_and_the_library_only() -> None:
    rel = {str(p.relative_to(ROOT)) for p in packaged_files()}
    assert {
        "function_app.py",
        "host.json",
        "requirements.txt",
        "shared/pyproject.toml",
        "shared/agent_learning/pipeline/__init__.py",
    } <= rel
    assert not any(r.startswith(("tests/", ".ci/", "docs/", ".git")) for r in rel)
    assert "local.settings.json" not in rel


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    app = tmp_path_factory.mktemp("package") / "app"
    for src in packaged_files():
        dst = app / src.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    target = app / ".python_packages" / "lib" / "site-packages"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            # Compiling the ~200 MB installed would cost more than installing it; the test of the
            # import compiles what the app imports before it times the import.
            "--no-compile",
            "-r",
            "requirements.txt",
            "--target",
            str(target),
        ],
        cwd=app,
        check=True,
    )
    return app


def run_isolated(app: Path, code: str) -> dict:
    """Run ``code`` with only the app root and its packages on sys.path (no site-packages)."""
    target = app / ".python_packages" / "lib" / "site-packages"
    prologue = f"import sys; sys.path[:0] = [{str(app)!r}, {str(target)!r}]\n"
    out = subprocess.run(
        [sys.executable, "-S", "-c", prologue + code], cwd=app, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_packaged_app_imports_fast_without_heavy_modules(package: Path) -> None:
    # The bytecode of what the app imports, as the install would have written it (see ``package``).
    run_isolated(package, f"""
import function_app, py_compile
for module in list(sys.modules.values()):
    source = getattr(module, "__file__", None) or ""  # None for namespace packages
    if source.startswith({str(package)!r}) and source.endswith(".py"):
        py_compile.compile(source, doraise=True)
print("{{}}")
""")
    result = run_isolated(
        package,
        """
import json, time
t = time.perf_counter()
import function_app
elapsed = time.perf_counter() - t
names = sorted(f.get_function_name() for f in function_app.app.get_functions())
heavy = ("numpy", "azure.ai.evaluation", "azure.cosmos", "azure.servicebus", "pydantic", "opentelemetry",
         "azure.monitor")
heavy = [m for m in heavy if m in sys.modules]
print(json.dumps({"seconds": elapsed, "functions": names, "heavy": heavy,
                  "file": function_app.__file__, "lib": __import__("agent_learning").__file__}))
""",
    )
    print(f"\ncold import of function_app from the deployment package: {result['seconds'] * 1000:.0f} ms")
    assert result["functions"] == sorted(["enqueue", "score", "train", "train_agent", *http.BY_NAME])
    assert result["heavy"] == []
    assert result["file"].startswith(str(package)) and result["lib"].startswith(str(package))


def test_the_package_holds_everything_the_handlers_import(package: Path) -> None:
    result = run_isolated(
        package,
        """
import json
from agent_learning.store.cosmos import CosmosStore
from agent_learning.queue.servicebus import ServiceBusQueue
from agent_learning.learning.reinforce import Reinforce
from agent_learning.app import handlers
import azure.identity, azure.ai.evaluation, azure.monitor.opentelemetry, opentelemetry.sdk
print(json.dumps({"ok": True}))
""",
    )
    assert result == {"ok": True}
