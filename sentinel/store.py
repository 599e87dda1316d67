"""Bounded in-memory series store.

Every series is a ring buffer of ``(step, time, value)`` with a fixed capacity, so the
store's memory depends on the number of series, never on the length of the run. The
number of series is bounded by the instrument's group cap and the rank count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Labels = tuple[tuple[str, str], ...]
Row = tuple[str, str, Labels, float]
"""An exported sample that lives outside the store: ``(name, kind, labels, value)``."""
"""Sorted ``(name, value)`` pairs; always includes ``job``, ``run`` and ``rank``."""
PlanKey = str | tuple[Any, ...]
"""A row of a :class:`Plan`: a metric name, or the name and further ``(label, value)`` pairs."""


def labels_of(**kv: object) -> Labels:
    """Build a :data:`Labels` key from keyword arguments."""
    return tuple(sorted((k, str(v)) for k, v in kv.items()))


@dataclass(frozen=True)
class Window:
    """The recent samples of one series, oldest first."""

    steps: np.ndarray
    times: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.values)


class Series:
    """A fixed-capacity ring buffer of samples."""

    __slots__ = ("_steps", "_times", "_values", "_n", "_head", "capacity", "_last", "count", "_put")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._steps = np.zeros(capacity, dtype=np.int64)
        self._times = np.zeros(capacity, dtype=np.float64)
        self._values = np.zeros(capacity, dtype=np.float64)
        # the rings as memoryviews: a Python number is stored through one at half the cost
        self._put: tuple[Any, Any, Any] = (self._steps.data, self._times.data, self._values.data)
        self._n = 0
        self._head = 0  # next write position
        self._last: tuple[int, float, float] | None = None  # the rules read it on every frame
        self.count = 0  # samples ever appended

    def append(self, step: int, t: float, value: float) -> None:
        last = self._last = (int(step), float(t), float(value))
        self.count += 1
        i = self._head
        steps, times, values = self._put
        steps[i], times[i], values[i] = last
        i += 1
        self._head = 0 if i == self.capacity else i
        if self._n < self.capacity:
            self._n += 1

    def last(self) -> tuple[int, float, float] | None:
        return self._last

    def window(self, n: int | None = None, copy: bool = True) -> Window:
        """The last ``n`` samples. With ``copy=False`` the arrays may be views of the ring,
        valid only until the next append (the rule engine reads them at once)."""
        k = self._n if n is None else min(n, self._n)
        start, end = self._head - k, self._head
        if start >= 0:  # one contiguous run: plain slices
            if not copy:
                return Window(self._steps[start:end], self._times[start:end], self._values[start:end])
            return Window(self._steps[start:end].copy(), self._times[start:end].copy(),
                          self._values[start:end].copy())
        cat = np.concatenate
        return Window(cat((self._steps[start:], self._steps[:end])), cat((self._times[start:], self._times[:end])),
                      cat((self._values[start:], self._values[:end])))

    def __len__(self) -> int:
        return self._n


class Block:
    """The series of several label sets written together, e.g. one metric of every group
    of a rank: one row per sample, so a report of 64 groups is one array write, not 64.

    Its columns (:class:`Column`) read like :class:`Series`.
    """

    __slots__ = ("_steps", "_times", "_values", "_n", "_head", "capacity", "last_step", "last_time", "last_row",
                 "count")

    def __init__(self, capacity: int, width: int) -> None:
        self.capacity = capacity
        self._steps = np.zeros(capacity, dtype=np.int64)
        self._times = np.zeros(capacity, dtype=np.float64)
        self._values = np.zeros((capacity, width), dtype=np.float64)
        self._n = 0
        self._head = 0
        self.last_step = -1
        self.last_time = 0.0
        self.last_row: list[float] = []
        self.count = 0  # rows ever appended

    def append(self, step: int, t: float, row: Sequence[float] | np.ndarray) -> None:
        self.last_step, self.last_time = int(step), float(t)
        self.count += 1
        i = self._head
        self._steps[i] = step
        self._times[i] = t
        self._values[i] = row
        self.last_row = self._values[i].tolist()
        i += 1
        self._head = 0 if i == self.capacity else i
        if self._n < self.capacity:
            self._n += 1


class Column:
    """One series of a :class:`Block`."""

    __slots__ = ("_block", "_col")

    def __init__(self, block: Block, col: int) -> None:
        self._block = block
        self._col = col

    @property
    def block(self) -> Block:
        return self._block

    @property
    def count(self) -> int:
        """Samples ever appended."""
        return self._block.count

    def last(self) -> tuple[int, float, float] | None:
        b = self._block
        if b._n == 0:
            return None
        return b.last_step, b.last_time, b.last_row[self._col]

    def window(self, n: int | None = None, copy: bool = True) -> Window:
        """As :meth:`Series.window` (the values are always copied: a column is strided)."""
        b, c = self._block, self._col
        k = b._n if n is None else min(n, b._n)
        start, end = b._head - k, b._head
        if start >= 0:
            if not copy:
                return Window(b._steps[start:end], b._times[start:end], b._values[start:end, c].copy())
            return Window(b._steps[start:end].copy(), b._times[start:end].copy(), b._values[start:end, c].copy())
        cat = np.concatenate
        return Window(cat((b._steps[start:], b._steps[:end])), cat((b._times[start:], b._times[:end])),
                      cat((b._values[start:, c], b._values[:end, c])))

    def __len__(self) -> int:
        return self._block._n


class Plan:
    """The gauge series one writer (a rank of a run) appends to at every frame, for
    :meth:`Store.add_planned`: each is looked up in the store once, not at every sample.

    A row's key is a metric name (its series is labelled ``base``) or a tuple of the metric
    name and the further ``(label, value)`` pairs of the series. The series found are kept
    until the store's :attr:`~Store.generation` moves (a series created, replaced or
    dropped anywhere), so a kept one is always the series the store holds for its key.
    """

    __slots__ = ("base", "series", "generation")

    def __init__(self, base: Labels) -> None:
        self.base = base
        self.series: dict[PlanKey, tuple[str, Series]] = {}
        self.generation = -1

    def labels(self, key: PlanKey) -> tuple[str, Labels]:
        """The metric and label set a key stands for."""
        if isinstance(key, str):
            return key, self.base
        return key[0], tuple(sorted(self.base + key[1:]))


@dataclass
class _Metric:
    kind: str  # "gauge" or "counter"
    series: dict[Labels, Series | Column] = field(default_factory=dict)
    totals: dict[Labels, float] = field(default_factory=dict)  # counters only
    # add_row's blocks, by the identity of the label-set tuple they were made for
    blocks: dict[int, tuple[tuple[Labels, ...], Block]] = field(default_factory=dict)


class Store:
    """Thread-safe store of gauges (ring buffers) and counters (running totals).

    Args:
        capacity: samples kept per gauge series.
    """

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self._metrics: dict[str, _Metric] = {}
        self.lock = threading.RLock()
        # bumped whenever a series object is created or replaced, so readers that keep
        # series objects (see :meth:`series`) know when to look them up again
        self.generation = 0
        # gauges written since the engine last cleared it: the rule engine judges only
        # rules whose metrics are among them
        self.written: set[str] = set()

    def add(self, name: str, labels: Labels, step: int, t: float, value: float) -> None:
        """Append a gauge sample."""
        with self.lock:
            self.written.add(name)
            self._gauge(name, labels).append(step, t, float(value))

    def add_many(self, name: str, rows: Iterable[tuple[Labels, float]], step: int, t: float) -> None:
        """Append one sample to each of several series of a gauge (one lock)."""
        with self.lock:
            self.written.add(name)
            for labels, value in rows:
                self._gauge(name, labels).append(step, t, value)

    def add_rows(self, rows: Iterable[tuple[str, Labels, float]], step: int, t: float) -> None:
        """Append one sample to each of several series, of any gauges (one lock)."""
        with self.lock:
            written = self.written
            for name, labels, value in rows:
                written.add(name)
                self._gauge(name, labels).append(step, t, value)

    def add_planned(self, plan: Plan, rows: Iterable[tuple[PlanKey, float]], step: int, t: float) -> None:
        """As :meth:`add_rows`, for rows keyed as ``plan`` says: one lock, and no lookup of
        a series the plan has found before."""
        with self.lock:
            if plan.generation != self.generation:
                plan.series.clear()
            found, written = plan.series, self.written
            for key, value in rows:
                hit = found.get(key)
                if hit is None:
                    name, labels = plan.labels(key)
                    hit = found[key] = (name, self._gauge(name, labels))
                written.add(hit[0])
                hit[1].append(step, t, value)
            plan.generation = self.generation  # the series it created replaced none it keeps

    def _gauge(self, name: str, labels: Labels) -> Series:
        """The series of a gauge's label set, created if there is none or if it is a column
        of a block (the block then no longer holds every series). Call with the lock held."""
        m = self._metrics.get(name)
        if m is None:
            m = self._metrics[name] = _Metric("gauge")
        s = m.series.get(labels)
        if not isinstance(s, Series):
            if s is not None:
                m.blocks.clear()
            s = m.series[labels] = Series(self.capacity)
            self.generation += 1
        return s

    def add_row(self, name: str, labels: tuple[Labels, ...], values: Sequence[float] | np.ndarray,
                step: int, t: float) -> None:
        """Append one sample to each series of ``labels``, all written together (a gauge).

        Pass the *same* ``labels`` tuple object each time (e.g. cached per rank): the
        series are kept as one :class:`Block` found by that object's identity. A new tuple
        starts a new block, and series it shares with an older block restart their history
        (the older block is dropped: its tuple passed again starts anew too).
        """
        with self.lock:
            self.written.add(name)
            m = self._metrics.get(name)
            if m is None:
                m = self._metrics[name] = _Metric("gauge")
            hit = m.blocks.get(id(labels))
            if hit is None or hit[0] is not labels:
                if len(m.blocks) > 1000:  # label tuples are cached by the caller; bound stale ones
                    m.blocks.clear()
                block = Block(self.capacity, len(labels))
                taken: set[int] = set()  # older blocks this one takes series from
                for col, ls in enumerate(labels):
                    old = m.series.get(ls)
                    if isinstance(old, Column):
                        taken.add(id(old.block))
                    m.series[ls] = Column(block, col)
                for key in [k for k, (_, b) in m.blocks.items() if id(b) in taken]:
                    del m.blocks[key]  # their label tuple, passed again, starts a block of its own
                self.generation += 1
                hit = m.blocks[id(labels)] = (labels, block)
            hit[1].append(step, t, values)

    def inc(self, name: str, labels: Labels, amount: float = 1.0) -> None:
        """Add to a counter (created at 0)."""
        with self.lock:
            m = self._metrics.get(name)
            if m is None:
                m = self._metrics[name] = _Metric("counter")
            m.totals[labels] = m.totals.get(labels, 0.0) + amount

    def set_counter(self, name: str, labels: Labels, total: float) -> None:
        """Set a counter from a monotonic total reported by a sender (never decreases)."""
        with self.lock:
            m = self._metrics.get(name)
            if m is None:
                m = self._metrics[name] = _Metric("counter")
            m.totals[labels] = max(m.totals.get(labels, 0.0), total)

    def counter(self, name: str, labels: Labels) -> float:
        with self.lock:
            m = self._metrics.get(name)
            return 0.0 if m is None else m.totals.get(labels, 0.0)

    def window(self, name: str, labels: Labels, n: int | None = None) -> Window | None:
        """The last ``n`` samples (all kept samples when ``n`` is None), or None."""
        with self.lock:
            m = self._metrics.get(name)
            s = None if m is None else m.series.get(labels)
            return None if s is None else s.window(n)

    def last(self, name: str, labels: Labels) -> tuple[int, float, float] | None:
        with self.lock:
            m = self._metrics.get(name)
            s = None if m is None else m.series.get(labels)
            return None if s is None else s.last()

    def series(self, name: str, labels: Labels) -> Series | Column | None:
        """The series object itself (gauges), for readers that call ``last()`` and
        ``window()`` on it often. Only the engine's thread writes series, so it may read
        them without the lock; look it up again when :attr:`generation` changes."""
        with self.lock:
            m = self._metrics.get(name)
            return None if m is None else m.series.get(labels)

    def labelsets(self, name: str) -> list[Labels]:
        """Every label set recorded for a metric."""
        with self.lock:
            m = self._metrics.get(name)
            if m is None:
                return []
            return list(m.series) if m.kind == "gauge" else list(m.totals)

    def remove(self, name: str, labels: Labels) -> None:
        """Forget one series (a run's info series whose tags changed)."""
        with self.lock:
            m = self._metrics.get(name)
            if m is not None and (m.series.pop(labels, None) is not None or m.totals.pop(labels, None) is not None):
                self.generation += 1

    def drop(self, job: str, run: str, rank: int | None = None) -> int:
        """Forget every series and counter of a run (one that ended), or of one rank of it
        (its training started over); returns how many."""
        pairs = (("job", job), ("run", run)) + ((("rank", str(rank)),) if rank is not None else ())
        dropped = 0
        with self.lock:
            for m in self._metrics.values():
                for table in (m.series, m.totals):
                    gone = [ls for ls in table if all(p in ls for p in pairs)]
                    for ls in gone:
                        del table[ls]
                    dropped += len(gone)
                for key in [k for k, (labels, _) in m.blocks.items() if labels and all(p in labels[0] for p in pairs)]:
                    del m.blocks[key]
            for name in [n for n, m in self._metrics.items() if not m.series and not m.totals]:
                del self._metrics[name]
            self.generation += 1
        return dropped

    def names(self) -> list[str]:
        with self.lock:
            return list(self._metrics)

    def snapshot(self) -> Iterator[tuple[str, str, Labels, float]]:
        """``(name, kind, labels, latest value)`` for every series; for the exporter."""
        with self.lock:
            rows = []
            for name, m in self._metrics.items():
                if m.kind == "gauge":
                    for labels, s in m.series.items():
                        last = s.last()
                        if last is not None:
                            rows.append((name, "gauge", labels, last[2]))
                else:
                    for labels, total in m.totals.items():
                        rows.append((name, "counter", labels, total))
        return iter(rows)
