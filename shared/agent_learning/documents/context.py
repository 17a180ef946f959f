"""A decision's context: the features an agent passes to ``choose`` and logs with its episode,
their limits and their check (:func:`check_context`)."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from agent_learning.documents.fields import NOT_UNICODE, is_unicode

MAX_CONTEXT_FEATURES = 20
"""Features one decision's context may carry (a request's task type, language, tier, length...)."""
MAX_CONTEXT_VALUE_CHARS = 128
"""The longest categorical context value: a segment name, not free text."""
CONTEXT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
"""A context feature's name: a letter or ``_`` first, then letters, digits, ``_``, ``.``, ``-``; at most 64."""
EXACT_INTEGERS = 2**53
"""Integers in a context or metadata are below this in magnitude: each is exactly a float, so every
JSON reader (Cosmos DB's included) reads back the number written."""
NUMBER_RULE = "a finite number (an integer must be below 2**53 in magnitude, so that a float holds it exactly)"


def check_context(context: Any) -> dict[str, str | int | float | bool]:
    """A decision's context, checked: at most :data:`MAX_CONTEXT_FEATURES` features, each named by
    :data:`CONTEXT_NAME`, each a category (a string of at most :data:`MAX_CONTEXT_VALUE_CHARS`
    characters, or a boolean) or a finite number (an integer below :data:`EXACT_INTEGERS` in
    magnitude). Raises ``ValueError`` naming the feature.

    It runs on every ``choose(context=...)``, so the common types are checked first and names
    already found valid are remembered (:data:`_VALID_NAMES`)."""
    if not isinstance(context, dict):
        if not isinstance(context, Mapping):
            raise ValueError(f"must be an object of feature names to values, got {type(context).__name__}")
        context = dict(context)
    if len(context) > MAX_CONTEXT_FEATURES:
        raise ValueError(f"has {len(context)} features; the limit is {MAX_CONTEXT_FEATURES}")
    normalised: dict[str, Any] | None = None  # a copy, once a value is not of a plain type
    for name, value in context.items():
        if name not in _VALID_NAMES:
            if not isinstance(name, str):
                raise ValueError(f"feature names must be strings, got {type(name).__name__} {name!r:.80}")
            if not CONTEXT_NAME.fullmatch(name):
                raise ValueError(
                    f"{str(name)[:80]!r} is not a feature name: use a letter or '_' first, then letters, digits, "
                    "'_', '.' or '-', at most 64 characters"
                )
            if len(_VALID_NAMES) < 4_096:
                _VALID_NAMES.add(name)
        kind = type(value)
        if kind is str:
            ok = 0 < len(value) <= MAX_CONTEXT_VALUE_CHARS
            if ok and not is_unicode(value):
                raise ValueError(f"{name}: {value!r:.80} {NOT_UNICODE}")
        elif kind is bool:
            ok = True
        elif kind is float:
            ok = math.isfinite(value)
        elif kind is int:
            ok = abs(value) < EXACT_INTEGERS
        else:
            plain = _plain_scalar(value)
            ok = plain is not None and (
                type(plain) is bool
                or (type(plain) is int and abs(plain) < EXACT_INTEGERS)
                or (type(plain) is float and math.isfinite(plain))
                or (type(plain) is str and 0 < len(plain) <= MAX_CONTEXT_VALUE_CHARS and is_unicode(plain))
            )
            if ok:
                if normalised is None:
                    normalised = dict(context)
                normalised[name] = plain
        if not ok:
            raise ValueError(
                f"{name}: must be a category (a non-empty string of at most {MAX_CONTEXT_VALUE_CHARS} characters, "
                f"or a boolean) or {NUMBER_RULE}, got {value!r:.80}"
            )
    return dict(context) if normalised is None else normalised


MAX_SHARED_CONTEXTS = 4_096
"""Distinct contexts :func:`shared_context` keeps (all forgotten when full): a batch of scores
holds few distinct contexts (a few task types × languages × tiers)."""
_SHARED: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}


def shared_context(context: dict[str, Any]) -> dict[str, str | int | float | bool]:
    """:func:`check_context` of a stored document's context, one dict for equal contexts whose
    values are all category strings: such a context is checked once per process, not once per
    document, and the trainer reads the rows that share it once
    (:func:`agent_learning.learning.columns.shared_rows`). The dict is shared: read it, never change
    it. A context with a boolean or a number is checked and copied each time (``1 == True``, and
    numbers rarely repeat)."""
    try:
        key = tuple(context.items())
        shared = _SHARED.get(key)
    except TypeError:  # an unhashable value: check_context names it
        return check_context(context)
    if shared is not None:  # equal to a context of plain strings: its values are strings, already checked
        return shared
    checked = check_context(context)
    if all(type(value) is str for value in checked.values()):
        if len(_SHARED) >= MAX_SHARED_CONTEXTS:
            _SHARED.clear()
        _SHARED[tuple(checked.items())] = checked
    return checked


def _plain_scalar(value: Any) -> str | bool | int | float | None:
    """``value`` as the plain Python type it stands for, or None. A numpy or pandas scalar (a
    ``numpy.int64`` read from a data frame, a ``numpy.bool_``) or a subclass of ``str``/``float``
    becomes the built-in type, so that its segment name, the logged episode and the number the
    learner reads agree (``repr(numpy.float64(1.5))`` is not ``"1.5"``). numpy is not imported."""
    if isinstance(value, str):
        return str.__str__(value)  # the characters, not the subclass's str(): a str Enum's value
    if isinstance(value, bool | float | int):
        for plain in (bool, int, float):  # bool before int: a bool is an int
            if isinstance(value, plain):
                return plain(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "ndim", None) == 0:
        return bool(value)
    return None


_VALID_NAMES: set[str] = set()
"""Context feature names that passed :data:`CONTEXT_NAME` (bounded: at most 4,096 are kept)."""


def feature_kinds(context: Mapping[str, Any] | None) -> dict[str, str]:
    """The kind a new policy learns each feature of ``context`` as: a number (not a boolean) is a
    ``"number"``, anything else a ``"category"``."""
    return {name: "number" if isinstance(v, int | float) and not isinstance(v, bool) else "category"
            for name, v in (context or {}).items()}
