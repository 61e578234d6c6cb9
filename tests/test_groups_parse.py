"""``config/consumerOffset.json``'s two readers (rocketstore.pipeline.engine.groups): the fast one (the C
JSON decoder once fastjson's bare integer keys are quoted) against the recursive-descent reader
that reports errors by line and column, on generated files: well-formed ones in fastjson's and
JSON's spelling, files with strings that look like keys, repeated keys, values of the wrong kind,
and damaged text. Whenever the fast reader answers, its table is the slow reader's (entries in
the same order); it answers for every well-formed file; it leaves every other one to the slow
reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.engine.groups import _fast_table, _read_table, parse_consumer_offsets
from rocketstore.pipeline.errors import ConsumerOffsetsError

PATH = Path("config/consumerOffset.json")
NAME = st.text(alphabet="ab%_-|1", min_size=1, max_size=4)
# Strings that are not topic@group keys and that hold what a key looks like, escapes included.
TRICKY = st.text(alphabet='ab,:{}"\\ 0123@\t\n\u00e9', max_size=12)


@st.composite
def members(draw: st.DrawFn, valid: bool) -> list[tuple[str, str]]:
    """One offsetTable's ``(key, value)`` texts; with ``valid`` nothing a broker would refuse."""
    out: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, 4))):
        if valid or draw(st.booleans()):
            key = json.dumps(f"{draw(NAME)}@{draw(NAME)}")
        else:
            key = json.dumps(draw(st.one_of(TRICKY, st.just("t@g@h"), st.just("@g"))))
        queues: list[str] = []
        for _ in range(draw(st.integers(0, 4))):
            qid = draw(st.integers(0, 40))
            spelled = draw(
                st.sampled_from(
                    [str(qid), json.dumps(str(qid)), f"0{qid}"]
                    + ([] if valid else ["-1", '"x"', '"\u0661"'])
                )
            )
            value = draw(
                st.one_of(st.integers(-3, 2**40).map(str))
                if valid
                else st.sampled_from(["1.5", "true", "null", '"3"', "{}", "[1]", "1e3", "NaN"])
            )
            queues.append(f"{spelled}:{value}")
        out.append((key, "{" + ",".join(queues) + "\n\t\t}"))
    return out


def render(draw: st.DrawFn, entries: list[tuple[str, str]], extra: list[str]) -> str:
    table = ",\n\t\t".join(f"{k}:{v}" for k, v in entries)
    top = [*extra, f'"offsetTable":{{\n\t\t{table}\n\t}}']
    if draw(st.booleans()):
        top.reverse()
    return "{\n\t" + ",\n\t".join(top) + "\n}"


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, bool]:
    """A file's text and whether it is well-formed."""
    valid = draw(st.booleans())
    entries = draw(members(valid))
    if valid and entries and draw(st.booleans()):
        entries.append(entries[0])  # a repeated key: the last wins, in both readers
    extra = [
        f'"dataVersion":{{"note":{json.dumps(draw(TRICKY))},"counter":{draw(st.integers(0, 9))}}}'
    ]
    text = render(draw, entries, extra)
    if not valid and draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        text = (
            text[:at]
            + draw(st.sampled_from(["", ",", "}", '"', "{0:1}", ":", "\\"]))
            + text[at + 1 :]
        )
    return text, valid


def slow(text: str) -> dict[str, dict[str, dict[int, int]]] | None:
    try:
        return _read_table(PATH, text)
    except ConsumerOffsetsError:
        return None


def ordered(table: dict[str, Any]) -> list[Any]:
    return [(g, [(t, list(q.items())) for t, q in topics.items()]) for g, topics in table.items()]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_the_fast_reader_is_the_slow_one_or_stands_aside(doc: tuple[str, bool]) -> None:
    text, valid = doc
    fast = _fast_table(text)
    expected = slow(text)
    if valid:
        assert fast is not None, text
        assert expected is not None, text
    if fast is not None:
        assert expected is not None, text
        assert ordered(fast) == ordered(expected)


def test_the_file_a_broker_writes_takes_the_fast_reader() -> None:
    raw = '{\n\t"offsetTable":{\n\t\t"Orders@billing":{2:5,3:12\n\t\t},"A@b":{0:-1}\n\t}\n}'
    assert _fast_table(raw) == {"billing": {"Orders": {2: 5, 3: 12}}, "b": {"A": {}}}
    assert parse_consumer_offsets(PATH, raw.encode()).table == _fast_table(raw)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # A repeated key whose first value is wrong: the slow reader sees both and refuses.
        ('{"offsetTable":{"t@g":5,"t@g":{0:1}}}', "offsetTable.t@g is the number 5"),
        ('{"offsetTable":{"t@g":{0:1.5,0:2}}}', "offset is the number 1.5"),
        # Key-like text in a string is not a key: the string stays as it is.
        ('{"note":",1:", "offsetTable":{"t@g":{-1:2}}}', "queue id -1 is not a number"),
        ('{"offsetTable":{"t@g":{0:NaN}}}', "expected a value"),
    ],
)
def test_what_the_fast_reader_leaves_is_refused_with_its_place(text: str, message: str) -> None:
    assert _fast_table(text) is None
    with pytest.raises(ConsumerOffsetsError, match=f"^{PATH}: line 1, column .*{message}"):
        parse_consumer_offsets(PATH, text.encode())
