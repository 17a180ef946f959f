"""A batch's context features as columns: each feature's values read from every row's context in
one pass, a categorical feature's segments found once per distinct value (the categorical features
together, once per distinct tuple of their values, where every row's context is a plain dict), a
numeric feature's values turned into one array; and small integers (action indices, correction
flags) read in one pass. What :func:`agent_learning.learning.reinforce.prepare` reads rows with; a
value reads as :class:`~agent_learning.policy.features.FeatureReader` reads it, row by row
(:func:`segment_column_rowwise` and :func:`number_column_rowwise` do exactly that, for values of
kinds the column readers do not take in one pass). Rows that share their context objects, as the
scores the trainer reads do, are read once per distinct object (:func:`shared_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, islice, repeat
from operator import itemgetter
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent_learning.policy.features import NUMBER_CLIP, FeatureReader

ABSENT: Any = object()
"""A feature the row's context does not have (a context may hold the value None)."""
NO_SEGMENT = 0
"""The code of a row without a segment: the feature absent, or a value of no segment."""
NONE_VALUE = 1
"""The code of the value None: not counted as a segment, read as the segment its name gives."""
FIRST_SEGMENT = 2
"""The code of the first segment name seen; each new name gets the next."""


Contexts = Sequence[Mapping[str, Any] | None]
"""Each row's context (None: none)."""


def feature_values(contexts: Contexts, name: str, default: Any = None) -> list[Any]:
    """Each row's value of the feature ``name`` (``default`` where its context has none)."""
    try:
        return list(map(dict.get, contexts, repeat(name), repeat(default)))  # type: ignore[call-overload]
    except TypeError:  # a row without context (None), or one whose context is another Mapping
        return [c.get(name, default) if c else default for c in contexts]


@dataclass(frozen=True)
class SegmentColumn:
    """A categorical (or binned) feature's rows: per row the code of its segment name, and the
    names in code order (from :data:`FIRST_SEGMENT`)."""

    codes: NDArray[np.int64]
    names: list[str]
    none_segment: str | None
    """The segment the value None reads as (its name, for a category; none for bins)."""

    def counts(self, rows: NDArray[np.int64] | None = None) -> dict[str, int]:
        """Per segment name, the rows whose value is in it (the value None not counted); with
        ``rows``, each row of the column stands for that many (a distinct context, its rows)."""
        tally = np.bincount(self.codes, rows, minlength=len(self.names) + FIRST_SEGMENT)[FIRST_SEGMENT:]
        return {name: int(k) for name, k in zip(self.names, tally, strict=True) if k}

    def indices(self, segments: Sequence[str]) -> NDArray[np.int64]:
        """Per row, the index of its segment among ``segments`` (−1 for none, or one not among them)."""
        index = {name: k for k, name in enumerate(segments)}
        none = -1 if self.none_segment is None else index.get(self.none_segment, -1)
        remap = np.array([-1, none, *(index.get(n, -1) for n in self.names)], dtype=np.int64)
        return remap[self.codes]


class _Codes(dict[Any, int]):
    """Value → the code of its segment name, each distinct value read once (on first sight)."""

    def __init__(self, reader: FeatureReader) -> None:
        super().__init__()
        self.reader = reader
        self.names: dict[str, int] = {}

    def __missing__(self, value: Any) -> int:
        code = self[value] = self.code(value)
        return code

    def code(self, value: Any) -> int:
        if value is ABSENT:
            return NO_SEGMENT
        if value is None:
            return NONE_VALUE
        name = self.reader.segment(value)
        return NO_SEGMENT if name is None else self.names.setdefault(name, len(self.names) + FIRST_SEGMENT)


SEGMENT_KINDS = frozenset({str, type(None), type(ABSENT)})
"""Kinds of values whose equal values have one segment name (1, 1.0 and True are equal keys but
name ``1``, ``1.0`` and ``true``; 0.0 and −0.0 name ``0.0`` and ``-0.0``)."""
BIN_KINDS = SEGMENT_KINDS | {int, float}
"""Kinds of values whose equal values fall in one bin (a boolean falls in none: read apart)."""


def segment_column(contexts: Contexts, reader: FeatureReader) -> SegmentColumn:
    """The rows' segments of a feature learned as segments: a dict lookup per row, the reader
    once per distinct value; values of other kinds (numbers for a category, booleans for bins,
    unhashable ones) are read row by row."""
    values = feature_values(contexts, reader.name, ABSENT)
    codes = _Codes(reader)
    try:
        column = np.fromiter(map(codes.__getitem__, values), dtype=np.int64, count=len(values))
    except TypeError:  # an unhashable value
        return segment_column_rowwise(values, reader)
    if _kinds_apart(codes) or (_booleans_hide(codes) and bool in set(map(type, values))):
        return segment_column_rowwise(values, reader)
    return SegmentColumn(column, list(codes.names), reader.segment(None))


def _kinds_apart(codes: _Codes) -> bool:
    """Whether a value read may stand for equal values of other kinds read apart (its kind is
    not among :data:`SEGMENT_KINDS`, or :data:`BIN_KINDS` for bins)."""
    return not set(map(type, codes)) <= (BIN_KINDS if codes.reader.edges else SEGMENT_KINDS)


def _booleans_hide(codes: _Codes) -> bool:
    """Whether a boolean may share the entry of a number read into a bin (one equal to 0 or 1)."""
    return bool(codes.reader.edges) and (0 in codes or 1 in codes)


class _Index(dict[Any, int]):
    """Key → its place among the distinct keys, in the order first seen."""

    def __missing__(self, key: Any) -> int:
        index = self[key] = len(self)
        return index


def _places(keys: Iterable[Any], n: int) -> tuple[list[Any], NDArray[np.int64]]:
    """The ``n`` keys' distinct ones, in the order first seen, and each key's place among them."""
    distinct = _Index()
    index = np.fromiter(map(distinct.__getitem__, keys), dtype=np.int64, count=n)
    return list(distinct), index


SHARING_PROBE = 4_096
"""The first rows :func:`shared_rows` looks at to tell whether a batch's rows share their contexts."""


def shared_rows(contexts: Contexts) -> tuple[list[Mapping[str, Any] | None], NDArray[np.int64]] | None:
    """The distinct context objects of rows that share them and each row's place among them; None
    where the first :data:`SHARING_PROBE` rows hold more distinct objects than half their number
    (then reading every row costs about as much), or there are no rows. Scores read from the store
    share one dict per distinct context of category strings
    (:func:`~agent_learning.documents.context.shared_context`), so a batch of 100,000 holds a few
    hundred objects, and reading each once replaces reading every row's values: the rows of one
    object have its values, whatever they are."""
    probe = list(map(id, islice(contexts, SHARING_PROBE)))
    if not probe or 2 * len(set(probe)) > len(probe):
        return None
    ids, index = _places(map(id, contexts), len(contexts))  # each object alive in ``contexts``: ids unique
    some_row = np.empty(len(ids), dtype=np.int64)
    some_row[index] = np.arange(len(contexts))
    return [contexts[i] for i in some_row.tolist()], index


def segment_columns(contexts: Contexts, readers: Sequence[FeatureReader]) -> list[SegmentColumn]:
    """:func:`segment_column` of each of ``readers``, read together: one pass gives each row's
    tuple of values (:data:`ABSENT` for a feature it lacks) and its place among the distinct
    tuples, and each feature's segments are found from the distinct tuples (a batch holds few
    distinct contexts). Where a row's context is not a plain dict or a value is unhashable, the
    features are read one by one; so is a feature whose values are of kinds read apart (equal
    tuples may hold 1 and True)."""
    if len(readers) < 2 or set(map(type, contexts)) != {dict}:  # a dict subclass may answer a missing key
        return [segment_column(contexts, reader) for reader in readers]
    names = [reader.name for reader in readers]
    try:
        try:
            rows, index = _places(map(itemgetter(*names), contexts), len(contexts))
        except KeyError:  # a row without one of the features: each value looked up with a default
            values = zip(*(map(dict.get, contexts, repeat(name), repeat(ABSENT)) for name in names), strict=True)
            rows, index = _places(values, len(contexts))
    except TypeError:  # an unhashable value
        return [segment_column(contexts, reader) for reader in readers]
    columns = []
    for f, reader in enumerate(readers):
        codes = _Codes(reader)
        table = np.fromiter(map(codes.__getitem__, [row[f] for row in rows]), dtype=np.int64, count=len(rows))
        if _kinds_apart(codes) or _booleans_hide(codes):
            columns.append(segment_column(contexts, reader))
        else:
            columns.append(SegmentColumn(table[index], list(codes.names), reader.segment(None)))
    return columns


def segment_column_rowwise(values: Sequence[Any], reader: FeatureReader) -> SegmentColumn:
    """:func:`segment_column` reading every value (``values``: the column, :data:`ABSENT` where a
    row has none)."""
    codes = _Codes(reader)
    column = np.fromiter(map(codes.code, values), dtype=np.int64, count=len(values))
    return SegmentColumn(column, list(codes.names), reader.segment(None))


@dataclass(frozen=True)
class NumberColumn:
    """A numeric feature's rows: whether each gives a number, and t(x) where it does (0 elsewhere)."""

    present: NDArray[np.bool_]
    transformed: NDArray[np.float64]

    def taken(self, index: NDArray[np.int64]) -> NumberColumn:
        """The column of the rows whose values are these rows' at ``index``."""
        return NumberColumn(self.present[index], self.transformed[index])

    def standardised(self, center: float, scale: float) -> NDArray[np.float64]:
        """x̃ per row (0 where none), as :func:`~agent_learning.policy.features.standardise` gives
        it: clip((t − m) / s, ±NUMBER_CLIP), NaN to +NUMBER_CLIP (max(−c, min(c, NaN)) is c)."""
        x = np.zeros(len(self.present))
        z = np.clip((self.transformed[self.present] - center) / scale, -NUMBER_CLIP, NUMBER_CLIP)
        x[self.present] = np.where(np.isnan(z), NUMBER_CLIP, z)
        return x


NUMBER_KINDS = frozenset({int, float, type(None)})
"""Kinds of values a numeric column reads in one pass (others row by row)."""


def number_column(contexts: Contexts, reader: FeatureReader) -> NumberColumn:
    """The rows' t(x) of a numeric feature (:meth:`FeatureReader.transformed`) as one array."""
    values = feature_values(contexts, reader.name)
    kinds = set(map(type, values))
    if not kinds <= NUMBER_KINDS:
        return number_column_rowwise(values, reader)
    if type(None) in kinds:
        column = np.array(values, dtype=object)
        present = column != None  # noqa: E711 - elementwise, on an object array
        x = column[present].astype(np.float64)
    else:
        present = np.ones(len(values), dtype=bool)
        x = np.array(values, dtype=np.float64)
    if reader.log:
        read = x >= 0
        present[present] = read
        x = np.array(list(map(math.log1p, x[read].tolist())), dtype=np.float64)  # math's log1p, as the reader
    transformed = np.zeros(len(values))
    transformed[present] = x
    return NumberColumn(present, transformed)


def number_column_rowwise(values: Sequence[Any], reader: FeatureReader) -> NumberColumn:
    """:func:`number_column` reading every value."""
    read = [reader.transformed(v) for v in values]
    present = np.array([t is not None for t in read], dtype=bool)
    return NumberColumn(present, np.array([0.0 if t is None else t for t in read], dtype=np.float64))


def byte_column(values: Sequence[Any], width: int = 0) -> NDArray[np.uint8] | None:
    """``values`` read in one pass as integers in [0, 256): the values themselves (``width`` 0),
    or each a tuple or list of ``width`` of them, as an (N, width) array; None where one is of
    another kind, shape or range (then numpy reads them, and the caller names what is wrong).
    A boolean reads as 0 or 1, as numpy reads one beside integers."""
    if not isinstance(values, list | tuple):
        return None
    if width and (set(map(type, values)) - {tuple, list} or set(map(len, values)) != {width}):
        return None
    try:
        read = np.frombuffer(bytearray(chain.from_iterable(values) if width else values), dtype=np.uint8)
    except (TypeError, ValueError):  # no integer (no __index__), or one outside [0, 256)
        return None
    return read.reshape(-1, width) if width else read
