"""The one check of a whole-number option (a count, a size, a timeout in ms), shared by the
``rocketstore`` command, the sink's and the source's options and the jobs' flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rocketstore.pipeline.errors import ConfigError


def _expected(minimum: int) -> str:
    if minimum == 1:
        return "a positive integer"
    if minimum == 0:
        return "an integer >= 0"
    return f"an integer >= {minimum}"


def parse_count(value: object, name: str, minimum: int = 1) -> int:
    """``value`` (an int, or its decimal text) as an int of at least ``minimum``.

    Raises :class:`ConfigError` ``"<name>=<value>: expected a positive integer"`` (or ``"... an
    integer >= 0"``) otherwise; without a ``name`` the message is ``"expected ..., got ..."``,
    for callers that name the option themselves (argparse).
    """
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None or number < minimum:
        what = _expected(minimum)
        raise ConfigError(
            f"{name}={value!r}: expected {what}" if name else f"expected {what}, got {value!r}"
        )
    return number


def count_type(minimum: int = 1) -> Callable[[str], int]:
    """:func:`parse_count` as an argparse ``type=``; argparse prefixes the option's name."""

    def parse(text: str) -> int:
        try:
            return parse_count(text, "", minimum)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse
