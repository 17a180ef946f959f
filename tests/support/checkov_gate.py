"""The gate on checkov's JSON report of ``infra/`` (``make infra-check``).

checkov already exits non-zero on a failed check. This also fails when a file could not be
parsed (checkov then scans nothing in it and reports no failure) and when a check is skipped
without a reason. Usage: ``python tests/support/checkov_gate.py results_json.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def reports(data: Any) -> list[dict[str, Any]]:
    """checkov writes one report object, or a list of them when several frameworks ran."""
    return data if isinstance(data, list) else [data]


def problems(data: Any) -> list[str]:
    """Everything that must fail CI in a checkov JSON report."""
    found: list[str] = []
    for report in reports(data):
        summary = report.get("summary", {})
        results = report.get("results", {})
        if summary.get("parsing_errors", 0):
            found.append(f"{summary['parsing_errors']} file(s) could not be parsed: {results.get('parsing_errors')}")
        for check in results.get("failed_checks", []):
            found.append(f"failed {check['check_id']} on {check['resource']} ({check['file_path']})")
        for check in results.get("skipped_checks", []):
            reason = (check.get("check_result", {}).get("suppress_comment") or "").strip()
            if not reason or reason == "No comment provided":
                found.append(f"skipped {check['check_id']} on {check['resource']} without a reason")
    if not any(report.get("summary", {}).get("resource_count", 0) for report in reports(data)):
        found.append("checkov scanned no resource")
    return found


def main(argv: list[str]) -> int:
    data = json.loads(Path(argv[1]).read_text())
    found = problems(data)
    for report in reports(data):
        for check in report.get("results", {}).get("skipped_checks", []):
            reason = (check.get("check_result", {}).get("suppress_comment") or "").strip()
            print(f"checkov gate: skipped {check['check_id']} on {check['resource']}: {reason}")
    for problem in found:
        print(f"checkov gate: {problem}", file=sys.stderr)
    summary = [r.get("summary", {}) for r in reports(data)]
    print(
        "checkov gate: "
        + ", ".join(
            f"{s.get('passed', 0)} passed, {s.get('failed', 0)} failed, {s.get('skipped', 0)} skipped" for s in summary
        )
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
