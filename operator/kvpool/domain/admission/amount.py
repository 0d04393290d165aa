"""``Amount``: KV tokens and sequence slots, the two dimensions admission accounts in.

Why this module exists: every capacity figure in admission is a pair (tokens, slots) that
is added, compared and clamped the same way in both dimensions. One small immutable type
says that once instead of every sum being written twice.

    >>> Amount(300, 1) + Amount(200, 2)
    Amount(tokens=500, slots=3)
    >>> Amount(500, 3).fits_in(Amount(400, 4))
    False
    >>> Amount(500, 3).min(Amount(400, 4))
    Amount(tokens=400, slots=3)
"""

from __future__ import annotations

from typing import Final


class Amount:
    """A quantity of KV capacity: tokens and slots (sequences). Immutable.

    Not a frozen dataclass: admission builds several of these per decision, and a frozen
    dataclass's ``__init__`` (``object.__setattr__`` per field) made decisions twice as
    slow. The fields are ``Final``, so mypy refuses any assignment after ``__init__``.
    """

    __slots__ = ("slots", "tokens")

    def __init__(self, tokens: int = 0, slots: int = 0) -> None:
        self.tokens: Final = tokens  # KV tokens
        self.slots: Final = slots  # running-batch places (one per sequence)

    def __repr__(self) -> str:
        return f"Amount(tokens={self.tokens}, slots={self.slots})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Amount):
            return NotImplemented
        return self.tokens == other.tokens and self.slots == other.slots

    def __hash__(self) -> int:
        return hash((self.tokens, self.slots))

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.tokens + other.tokens, self.slots + other.slots)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.tokens - other.tokens, self.slots - other.slots)

    def fits_in(self, other: Amount) -> bool:
        """Whether both dimensions are <= ``other``'s."""
        return self.tokens <= other.tokens and self.slots <= other.slots

    def min(self, other: Amount) -> Amount:
        """The smaller of each dimension."""
        return Amount(min(self.tokens, other.tokens), min(self.slots, other.slots))

    def max(self, other: Amount) -> Amount:
        """The larger of each dimension."""
        return Amount(max(self.tokens, other.tokens), max(self.slots, other.slots))

    def clamp0(self) -> Amount:
        """Negative parts set to zero."""
        return Amount(max(0, self.tokens), max(0, self.slots))

    @property
    def is_zero(self) -> bool:
        """Whether both dimensions are zero."""
        return self.tokens == 0 and self.slots == 0


ZERO = Amount()
