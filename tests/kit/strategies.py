"""Hypothesis strategies for messages with every field the encoder takes, shared by the
encoder's tests and the native core's differential tests."""

from __future__ import annotations

from hypothesis import strategies as st

from rocketstore.pipeline.format.message import Message

SAFE_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\x01\x02"),
    max_size=12,
)
KEY = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\x01\x02 "),
    min_size=1,
    max_size=10,
)
USER_KEY = KEY.filter(lambda k: k not in ("KEYS", "TAGS", "UNIQ_KEY"))
HOSTS = st.sampled_from([None, "10.0.0.7:4000", "[::1]:5006", "[2001:db8::5]:80"])


@st.composite
def messages(draw: st.DrawFn, large: bool = False) -> Message:
    return Message(
        topic=draw(st.sampled_from(["TopicA", "T-b", "%RETRY%g|x"])),
        body=draw(st.binary(min_size=1500, max_size=3000) if large else st.binary(max_size=300)),
        queue_id=draw(st.integers(0, 3)),
        keys=draw(st.none() | st.lists(KEY, max_size=3)),
        tags=draw(st.none() | SAFE_TEXT),
        # Reserved names as properties: test_reserved_names_given_as_properties_fill_their_fields.
        properties=draw(st.none() | st.dictionaries(USER_KEY, SAFE_TEXT, max_size=3)),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        sys_flag=draw(st.sampled_from([0, 0, 0, 4, 8, 12])),
        born_timestamp=draw(st.none() | st.integers(0, 2**45)),
        born_host=draw(HOSTS),
        reconsume_times=draw(st.integers(0, 16)),
        prepared_transaction_offset=draw(st.integers(0, 2**40)),
        uniq_key=draw(st.none() | st.from_regex(r"[0-9A-F]{32}", fullmatch=True)),
    )
