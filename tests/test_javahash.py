"""pipeline/format/javahash.py: Java String.hashCode, the scalar reference and the native batch
hash (which must agree with it and with values Java itself gives), and the derived hashes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.format.javahash import (
    index_key_hash,
    java_hash,
    java_hash_array,
    tags_code,
)
from tests.kit.javaref import INT_MIN, KNOWN, reference_hash

# Any character except lone surrogates (which have no UTF-8 or UTF-16 encoding).
CHARS = st.characters(blacklist_categories=("Cs",))
TEXT = st.text(alphabet=CHARS, max_size=40)
ASCII = st.text(alphabet=st.characters(max_codepoint=127), max_size=40)


def test_the_reference_agrees_with_java() -> None:
    assert {text: reference_hash(text) for text in KNOWN} == KNOWN


@pytest.mark.parametrize(("text", "expected"), sorted(KNOWN.items()))
def test_known_values(text: str, expected: int) -> None:
    assert java_hash(text) == expected
    assert java_hash_array([text]).tolist() == [expected]


def test_non_bmp_hashes_surrogate_pair() -> None:
    # U+1F600 is the UTF-16 pair D83D DE00: Java hashes the two code units.
    high, low = 0xD83D, 0xDE00
    assert java_hash("😀") == 31 * high + low == 1772899
    # "a😀b": ((97*31 + high)*31 + low)*31 + 98, wrapped to a signed int
    expected = (((97 * 31 + high) * 31 + low) * 31 + 98) % 2**32
    expected -= 2**32 if expected >= 2**31 else 0
    assert java_hash("a😀b") == expected
    assert java_hash_array(["a😀b", "😀", "x"]).tolist() == [expected, 1772899, 120]


def test_wraps_like_java_int() -> None:
    long_text = "x" * 1000 + "é" * 3
    assert java_hash(long_text) == reference_hash(long_text)
    assert -(2**31) <= java_hash(long_text) < 2**31


def test_tags_code() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("TagA") == 2598919
    assert tags_code("polygenelubricants") == INT_MIN


def key_hashing_to_min_value(topic: str) -> str:
    """A key with ("topic#key").hashCode() == Integer.MIN_VALUE, from 7 characters 'A'..'_'."""
    n = 7
    prefix = java_hash(topic + "#") % 2**32
    # hash(prefix + key) = prefix*31^n + sum((65 + d_i) * 31^(n-1-i))  (mod 2^32)
    offset = sum(65 * 31**i for i in range(n))
    target = (2**31 - prefix * 31**n - offset) % 2**32
    digits = []
    for _ in range(n):
        target, d = divmod(target, 31)
        digits.append(d)
    assert target == 0  # 2^32 < 31^7, so 7 base-31 digits suffice
    return "".join(chr(65 + d) for d in reversed(digits))


def test_index_key_hash() -> None:
    assert index_key_hash("TopicTest", "k1") == abs(java_hash("TopicTest#k1"))
    neg_key = next(k for k in (f"key{i}" for i in range(1000)) if java_hash(f"T#{k}") < 0)
    assert index_key_hash("T", neg_key) == -java_hash(f"T#{neg_key}") > 0
    key = key_hashing_to_min_value("TopicTest")
    assert java_hash(f"TopicTest#{key}") == INT_MIN
    assert index_key_hash("TopicTest", key) == 0


@settings(max_examples=150)
@given(st.lists(TEXT, max_size=30))
def test_array_equals_scalar_any_text(values: list[str]) -> None:
    out = java_hash_array(values)
    assert out.dtype == np.int32
    assert out.tolist() == [java_hash(v) for v in values]
    assert out.tolist() == [reference_hash(v) for v in values]


@settings(max_examples=150)
@given(st.lists(ASCII, max_size=30))
def test_array_equals_scalar_ascii(values: list[str]) -> None:
    assert java_hash_array(pa.array(values, pa.string())).tolist() == [java_hash(v) for v in values]


@settings(max_examples=100)
@given(st.lists(st.one_of(st.none(), TEXT), max_size=20), st.data())
def test_sliced_arrays_with_nulls(values: list[str | None], data: st.DataObject) -> None:
    arr = pa.array(values, pa.string())
    start = data.draw(st.integers(0, len(values)))
    length = data.draw(st.integers(0, len(values) - start))
    sliced = arr.slice(start, length)
    expected = [java_hash(v) if v is not None else 0 for v in values[start : start + length]]
    assert java_hash_array(sliced).tolist() == expected
    assert java_hash_array(sliced.cast(pa.large_string())).tolist() == expected


def test_nulls_hash_as_zero() -> None:
    arr = pa.array([None, "TagA", None, "é", None], pa.string())
    assert java_hash_array(arr).tolist() == [0, 2598919, 0, java_hash("é"), 0]
    assert java_hash_array(pa.array([None, None], pa.string())).tolist() == [0, 0]
    assert java_hash_array(pa.array([], pa.string())).tolist() == []


def test_sliced_ascii_array_ignores_neighbours() -> None:
    arr = pa.array(["zzzz", "TagA", "hello", "qqqq"])
    assert java_hash_array(arr.slice(1, 2)).tolist() == [2598919, 99162322]
    assert java_hash_array(arr.slice(3)).tolist() == [java_hash("qqqq")]
    assert java_hash_array(arr.slice(2, 0)).tolist() == []


def test_chunked_and_dictionary_arrays() -> None:
    chunked = pa.chunked_array([["TagA", None], ["é😀", "hello"]])
    expected = [2598919, 0, java_hash("é😀"), 99162322]
    assert java_hash_array(chunked).tolist() == expected
    dict_arr = pa.array(["x", "TagB", "TagA", "TagB"]).dictionary_encode().slice(1)
    assert java_hash_array(dict_arr).tolist() == [2598920, 2598919, 2598920]


def test_dictionary_array_with_nulls_hashes_nulls_as_zero() -> None:
    dict_arr = pa.array(["TagB", "TagA", "TagB", None]).dictionary_encode()
    assert java_hash_array(dict_arr).tolist() == [2598920, 2598919, 2598920, 0]


def repeated_text_hash(ch: str, n: int) -> int:
    """hashCode of ``ch * n`` for a BMP character, from the geometric series (no loop)."""
    # sum(31**k, k < n) = (31**n - 1) / 30, reduced mod 2**32 without losing the division
    series = (pow(31, n, 30 * 2**32) - 1) // 30
    h = ord(ch) * series % 2**32
    return h - 2**32 if h >= 2**31 else h


def test_repeated_text_hash_reference() -> None:
    for n in (0, 1, 2, 17, 100):
        assert repeated_text_hash("a", n) == java_hash("a" * n)
        assert repeated_text_hash("é", n) == java_hash("é" * n)


@pytest.mark.parametrize("ch", ["a", "é"])
def test_large_batch_crossing_internal_chunks(ch: str) -> None:
    # More than 4M code units in total, with string boundaries at varied positions, plus one
    # string longer than any internal chunk, next to short and empty neighbours.
    distinct = [ch * n for n in (0, 1, 7, 999, 4093, 65_537, 123_457)]
    values = distinct * 25 + [ch * 5_000_011, "", ch * 3] + distinct
    expected_of = {v: repeated_text_hash(ch, len(v)) for v in set(values)}
    assert sum(map(len, values)) - 5_000_011 > 1 << 22 < 5_000_011
    out = java_hash_array(pa.array(values, pa.string()))
    assert out.tolist() == [expected_of[v] for v in values]


@given(st.integers(1, 40), st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=50))
def test_equal_length_strings_agree(width: int, seeds: list[int]) -> None:
    strings = [f"{s:040x}"[:width] for s in seeds]
    assert all(len(s) == width for s in strings)
    got = java_hash_array(pa.array(strings).slice(0))
    assert [int(x) for x in got] == [java_hash(s) for s in strings]
    # a sliced array whose values do not start at 0
    sliced = pa.array(["x" * 7, *strings]).slice(1)
    assert [int(x) for x in java_hash_array(sliced)] == [java_hash(s) for s in strings]
