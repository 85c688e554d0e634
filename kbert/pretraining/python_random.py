"""`random.shuffle` and `random.randint`, drawing exactly what CPython's `random` draws, faster.

Why copy CPython's internals: create-data must make the original create_pretraining_data.py's
records for the same --random_seed, so every draw has to be the one `random.Random`'s own
methods make, in the same order. CPython's `shuffle` and `randint` (-> `randrange` ->
`_randbelow_with_getrandbits`) draw `getrandbits(k)` until the value is in range; these
functions make those same `getrandbits` calls with fewer Python layers around them. The
tests check them against `random` itself (tests/pretraining/test_create_data.py), so a Python whose
`random` draws differently fails there rather than silently changing the records.
"""

from __future__ import annotations

import random


def shuffle(items: list, rng: random.Random) -> None:
    """`rng.shuffle(items)`: the same permutation from the same draws, about twice as fast.

    Args:
        items: list. Shuffled in place.
        rng: random.Random. Left in the state `rng.shuffle` would leave it in.

    Example:
    >>> a, b = list(range(10)), list(range(10))
    >>> random.Random(1).shuffle(a); shuffle(b, random.Random(1)); a == b
    True
    """
    # random.shuffle calls _randbelow(i + 1) per position, which draws getrandbits(k) until
    # the value is below i + 1; doing that inline saves a Python call per element, and masked
    # LM shuffles every instance's ~125 candidate positions.
    getrandbits, bits = rng.getrandbits, _bit_lengths(len(items))
    for i in range(len(items) - 1, 0, -1):
        j = getrandbits(bits[i + 1])
        while j > i:
            j = getrandbits(bits[i + 1])
        items[i], items[j] = items[j], items[i]


_BIT_LENGTHS = [0]


def _bit_lengths(n: int) -> list:
    """[m.bit_length() for m in range(n + 1)] (grown as needed, shared)."""
    while len(_BIT_LENGTHS) <= n:
        _BIT_LENGTHS.extend(m.bit_length() for m in range(len(_BIT_LENGTHS), 2 * len(_BIT_LENGTHS)))
    return _BIT_LENGTHS


def randbelow(rng: random.Random, n: int) -> int:
    """`rng.randint(0, n - 1)`, or `rng.randint(a, a + n - 1) - a`: the same draws, no Python
    layers of randint -> randrange -> _randbelow.

    Example:
    >>> randbelow(random.Random(7), 30522) == random.Random(7).randint(0, 30521)
    True
    """
    k = n.bit_length()
    r = rng.getrandbits(k)
    while r >= n:
        r = rng.getrandbits(k)
    return r
