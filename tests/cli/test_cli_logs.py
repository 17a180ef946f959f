"""``agent-learn logs export`` and ``logs import``: DSJSON logs in and out of the embedded store."""

from __future__ import annotations

import json
from pathlib import Path

from cli_harness import cli, ok
from dsjson_logs import logged


def test_import_train_and_export_the_same_log(embedded_env: Path, tmp_path: Path) -> None:
    log = tmp_path / "log.dsjson"
    lines = logged(60)
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    imported = ok("logs", "import", "--agent-id", "warm", str(log))
    assert "60 events imported" in imported.stdout and "created warm v1" in imported.stdout
    assert json.loads(ok("logs", "import", "--agent-id", "warm", str(log), "--json").stdout)["already"] == 60
    ok("train", "--agent-id", "warm")
    assert ok("policy", "show", "--agent-id", "warm", "--json").stdout
    exported = ok("logs", "export", "--agent-id", "warm").stdout.splitlines()
    assert [json.loads(x) for x in exported] == [json.loads(x) for x in lines]
    out = tmp_path / "again.dsjson"
    assert "60 events written" in ok("logs", "export", "--agent-id", "warm", "--out", str(out)).stdout
    assert out.read_text(encoding="utf-8").splitlines() == exported


def test_a_bad_line_exits_2_naming_it_and_imports_nothing(embedded_env: Path, tmp_path: Path) -> None:
    lines = logged(3)
    bad = json.loads(lines[2])
    bad["_label_probability"] = 1.5
    log = tmp_path / "bad.dsjson"
    log.write_text("\n".join([*lines[:2], json.dumps(bad)]), encoding="utf-8")
    result = cli("logs", "import", "--agent-id", "warm", str(log))
    assert result.exit_code == 2 and "line 3: _label_probability: must be a number from 0 to 1" in result.output
    missing = cli("logs", "export", "--agent-id", "warm")
    assert missing.exit_code != 0 and "warm" in missing.output  # nothing was imported: no such agent
