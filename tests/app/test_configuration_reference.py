"""The configuration reference (docs/configuration.md) against the code: every setting is
documented, and every default the table states is the default the code has, so the table can
never drift from `Settings` (whose tunables take their defaults from the component dataclasses)."""

from __future__ import annotations

import re
from pathlib import Path

from agent_learning.app.settings import PREFIX, Settings, environment_names

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def table() -> dict[str, str]:
    """Variable → the default the table states for it (rows naming several variables, like
    ``A`` / ``_B``, state one default each, in the same order)."""
    rows: dict[str, str] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) < 3:
            continue
        names = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[0].split("(")[0])
        full = [n if not n.startswith("_") else expand(names[0], n) for n in names]
        defaults = [d.strip() for d in cells[1].removesuffix(" s").split(" / ")]
        for i, name in enumerate(full):
            rows[name] = defaults[i] if len(defaults) == len(full) else defaults[0]
    return rows


def expand(first: str, short: str) -> str:
    """``_RETRY_AFTER_CAP`` after ``AGENT_LEARNING_JUDGE_MAX_ATTEMPTS`` is the known setting that
    ends so and shares the longest head of the first name (here ``AGENT_LEARNING_JUDGE``)."""
    known = set(environment_names().values())
    heads = [first[:i] for i, c in enumerate(first) if c == "_"]
    matches = [head + short for head in sorted(heads, key=len, reverse=True) if head + short in known]
    return matches[0] if matches else PREFIX + short.lstrip("_")


def stated(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict) and not value:
        return "`{}`"
    if isinstance(value, tuple) and not value:  # a comma-separated list, empty
        return '`""`'
    if isinstance(value, str):
        return '`""`' if value == "" else f"`{value}`"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def test_every_setting_is_in_the_configuration_reference() -> None:
    documented = table()
    missing = sorted(set(environment_names().values()) - set(documented))
    assert not missing, f"docs/configuration.md does not document {missing}"


def test_every_default_in_the_reference_is_the_codes() -> None:
    documented = table()
    wrong = []
    for field, name in environment_names().items():
        default = Settings.model_fields[field].default
        doc = documented[name]
        if doc == "—" and default is None:
            continue
        number = re.fullmatch(r"`(-?[0-9.]+)`", doc)
        if number and isinstance(default, int | float) and not isinstance(default, bool):
            if float(number.group(1)) != float(default):
                wrong.append((name, doc, default))
        elif doc != stated(default):
            wrong.append((name, doc, default))
    assert not wrong, f"defaults in docs/configuration.md differ from the code: {wrong}"
