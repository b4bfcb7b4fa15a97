"""RowView: a sequence of rows made on demand from a step's columns (StepInputs, StepResults)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


class RowView(Sequence[T]):
    """Indexing and iteration over `_row(b)`, for columns kept in `len(self)` rows; slices give lists, and negative
    indices count from the end."""

    __slots__ = ()

    @abstractmethod
    def _row(self, b: int) -> T: ...

    def __iter__(self) -> Iterator[T]:
        return (self._row(b) for b in range(len(self)))

    def __getitem__(self, b: int) -> T:  # type: ignore[override]
        if isinstance(b, slice):
            return [self._row(i) for i in range(*b.indices(len(self)))]  # type: ignore[return-value]
        return self._row(range(len(self))[b])  # out of range: IndexError
