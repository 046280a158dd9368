"""Variable stream lengths: the ``population.lengths`` syntax, each batch's drawn length, and the
length buckets a captured executor keeps one graph for (docs/lengths.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LENGTHS_SYNTAX = "null (every batch has the population's fixed length), a list such as [64,128,256], or uniform:MIN:MAX"
BUCKETS_SYNTAX = (
    "pow2half (powers of two and the midpoints 1.5x them, below the longest length, and the longest), "
    "pow2 (powers of two only), or a list such as [64,128,256]"
)
BUCKET_RULES = {"pow2": (1.0,), "pow2half": (1.0, 1.5)}
"""Rule -> the multiples of each power of two that are buckets."""
DEFAULT_BUCKETS = "pow2half"


@dataclass(frozen=True)
class Lengths:
    """Where each batch's length comes from: a set of ``choices``, or integers ``low``..``high``."""

    choices: tuple[int, ...] | None
    low: int
    high: int

    def draw(self, count: int, generator: torch.Generator) -> list[int]:
        """``count`` lengths, uniformly from the set or the range, from ``generator``."""
        import torch

        if self.choices is not None:
            picks = torch.randint(0, len(self.choices), (count,), generator=generator)
            return [self.choices[int(index)] for index in picks]
        return [int(value) for value in torch.randint(self.low, self.high + 1, (count,), generator=generator)]


def _positive_ints(items: Sequence[object], key: str, value: object, syntax: str) -> tuple[int, ...]:
    """The items as integers; a ``ValueError`` naming those that are not positive integers, or saying there are none."""
    numbers, bad = [], []
    for item in items:
        try:
            number = int(str(item).strip())
        except ValueError:
            bad.append(repr(item))
            continue
        numbers.append(number)
        if number < 1:
            bad.append(str(number))
    if bad:
        named = (
            f"{bad[0]} is not a positive integer" if len(bad) == 1 else f"{', '.join(bad)} are not positive integers"
        )
        raise ValueError(f"{key}={value!r}: {named} ({syntax})")
    if not numbers:
        raise ValueError(f"{key}={value!r} is empty ({syntax})")
    return tuple(numbers)


def parse_lengths(value: object, key: str = "population.lengths") -> Lengths | None:
    """The lengths a ``population.lengths`` value names; ``None`` for null. A bad value raises
    ``ValueError`` with one line naming the key, the value and the syntax; so does a bare number,
    which is no list (a population that sets one length for every batch otherwise says which key)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().startswith("uniform:"):
        parts = value.strip().split(":")
        if len(parts) != 3:
            raise ValueError(f"{key}={value!r} is not {LENGTHS_SYNTAX}")
        low, high = _positive_ints(parts[1:], key, value, LENGTHS_SYNTAX)
        if low > high:
            raise ValueError(f"{key}={value!r}: MIN {low} exceeds MAX {high} ({LENGTHS_SYNTAX})")
        return Lengths(None, low, high)
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(value, (bool, float)) or not isinstance(items, Sequence):
        raise ValueError(f"{key}={value!r} is not {LENGTHS_SYNTAX}")
    choices = tuple(sorted(set(_positive_ints(items, key, value, LENGTHS_SYNTAX))))
    return Lengths(choices, choices[0], choices[-1])


def buckets_for(rule: object, lengths: Sequence[int], key: str = "executor.buckets") -> tuple[int, ...]:
    """The buckets a rule gives for the lengths the batches have, smallest first.

    ``pow2``: the powers of two from the largest one not above the shortest length up to, but
    not including, the longest length, and the longest length itself (so a fixed length is one
    bucket of exactly that length: no padding); ``pow2half`` adds 1.5x each power of two. A list:
    those buckets, as given. A length longer than every bucket raises ``ValueError`` (never
    truncated)."""
    shortest, longest = min(lengths), max(lengths)
    if isinstance(rule, str) and rule in BUCKET_RULES:
        power = 1
        while power * 2 <= shortest:
            power *= 2
        chosen = set()
        while power < longest:
            chosen |= {int(power * factor) for factor in BUCKET_RULES[rule] if shortest <= power * factor < longest}
            power *= 2
        return (*sorted(chosen), longest)
    if isinstance(rule, str) and not rule.replace(",", "").replace(" ", "").isdigit():
        raise ValueError(f"{key}={rule!r} is not {BUCKETS_SYNTAX}")
    items = rule.split(",") if isinstance(rule, str) else [rule] if isinstance(rule, int) else rule
    if isinstance(rule, bool) or not isinstance(items, Sequence):
        raise ValueError(f"{key}={rule!r} is not {BUCKETS_SYNTAX}")
    buckets = tuple(sorted(set(_positive_ints(items, key, rule, BUCKETS_SYNTAX))))
    if longest > buckets[-1]:
        raise ValueError(
            f"{key}={rule!r}: the population has batches of {longest} steps, longer than the largest bucket "
            f"{buckets[-1]}; add a bucket of at least {longest} (lengths are never truncated)"
        )
    return buckets


def bucket_of(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``length`` steps (planning refuses a longer one)."""
    holding = [bucket for bucket in buckets if bucket >= length]
    if not holding:
        raise ValueError(f"a batch of {length} steps is longer than the largest bucket, {max(buckets)}")
    return min(holding)


def padding_overhead(lengths: Sequence[int], buckets: Sequence[int]) -> float:
    """Padded steps over real steps when each length runs in its bucket (1.0: no padding)."""
    return sum(bucket_of(length, buckets) for length in lengths) / sum(lengths)


def by_bucket(latencies_ms: Sequence[float], lengths: Sequence[int], buckets: Sequence[int]) -> dict[int, list[float]]:
    """The latencies of the updates whose lengths (``lengths[i]``: update ``i``'s) fall in each bucket."""
    grouped: dict[int, list[float]] = {}
    for latency, length in zip(latencies_ms, lengths, strict=True):
        grouped.setdefault(bucket_of(length, buckets), []).append(latency)
    return dict(sorted(grouped.items()))
