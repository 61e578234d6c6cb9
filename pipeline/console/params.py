"""Validation of the console's request parameters.

Every value a request carries goes through one of these functions before it reaches the store:
topics by RocketMQ's rule, numbers as bounded integers, brokers only by a name the root's own
listing holds (the path is taken from that listing, never from the request). A bad value raises
:class:`BadRequestError` (HTTP 400), a well-formed name the store does not have
:class:`~rocketstore.pipeline.errors.NotFoundError` (HTTP 404).

Pure functions; thread-safe.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from rocketstore.pipeline.errors import BadRequestError, NotFoundError
from rocketstore.pipeline.format.batchcolumns import TOPIC_PATTERN
from rocketstore.pipeline.format.record import MAX_TOPIC_LENGTH

# Java's long: every offset and timestamp the store keeps fits in it.
MAX_LONG = 2**63 - 1
MAX_KEY_LENGTH = 255  # RocketMQ's CHARACTER_MAX_LENGTH for a key
MAX_PAGE = 50  # messages per page
_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")


def short(value: str) -> str:
    """``value`` quoted for an error message, cut so that a huge value makes a short page."""
    return repr(value if len(value) <= 40 else value[:40] + "…")


def topic(value: str | None, name: str = "topic") -> str:
    """A topic name by RocketMQ's rule: 1 to 127 characters of ``[%|a-zA-Z0-9_-]``."""
    if not value:
        raise BadRequestError(f"parameter {name} is required")
    if len(value) > MAX_TOPIC_LENGTH or not TOPIC_PATTERN.fullmatch(value):
        raise BadRequestError(
            f"parameter {name}={short(value)}: a topic is 1 to {MAX_TOPIC_LENGTH} characters "
            "of [%|a-zA-Z0-9_-]"
        )
    return value


def integer(
    value: str | None,
    name: str,
    *,
    low: int = 0,
    high: int = MAX_LONG,
    default: int | None = None,
) -> int:
    """A decimal integer in ``[low, high]``; ``default`` when absent or empty (else required)."""
    if value is None or value == "":
        if default is None:
            raise BadRequestError(f"parameter {name} is required")
        return default
    text = value.strip()
    # Digits only, and few enough of them: int() of a huge string costs quadratic time.
    if not re.fullmatch(r"-?[0-9]{1,19}", text):
        raise BadRequestError(
            f"parameter {name}={short(value)}: expected an integer from {low} to {high}"
        )
    number = int(text)
    if not low <= number <= high:
        raise BadRequestError(f"parameter {name}={number}: expected {low} to {high}")
    return number


def timestamp(value: str | None, name: str = "time") -> int | None:
    """A time as milliseconds since the epoch, or ISO 8601 (UTC unless it says otherwise);
    ``None`` when absent."""
    if value is None or value.strip() == "":
        return None
    text = value.strip()
    if re.fullmatch(r"[0-9]{1,19}", text):
        return integer(text, name)
    if len(text) > 40:
        raise BadRequestError(f"parameter {name}={short(value)}: not a time")
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadRequestError(
            f"parameter {name}={short(value)}: expected milliseconds since the epoch or "
            "an ISO 8601 time such as 2026-01-31T12:00:00"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    ms = int(when.timestamp() * 1000)
    if not 0 <= ms <= MAX_LONG:
        raise BadRequestError(f"parameter {name}={short(value)}: before 1970")
    return ms


def key(value: str | None) -> str:
    """A message key (a KEYS token or a UNIQ_KEY): 1 to 255 characters, no space or NUL."""
    if not value:
        raise BadRequestError("parameter key is required")
    if len(value) > MAX_KEY_LENGTH or any(c in value for c in " \x00"):
        raise BadRequestError(
            f"parameter key={short(value)}: a key is 1 to {MAX_KEY_LENGTH} characters "
            "without spaces"
        )
    return value


def msg_id(value: str | None) -> str:
    """An offset msgId: 32 (IPv4 host) or 56 (IPv6 host) hex digits."""
    if not value:
        raise BadRequestError("parameter msgid is required")
    text = value.strip()
    if not _MSG_ID.fullmatch(text):
        raise BadRequestError(
            f"parameter msgid={short(value)}: an offset msgId is 32 or 56 hex digits"
        )
    return text.upper()


def broker(value: str | None, brokers: Sequence[tuple[str, Path]]) -> tuple[str, Path]:
    """The broker of the root's own listing named ``value`` (name and directory)."""
    if not value:
        raise BadRequestError("parameter broker is required")
    for entry in brokers:
        if entry[0] == value:
            return entry
    names = ", ".join(n for n, _ in brokers) or "none"
    raise NotFoundError(f"no broker {short(value)} in this root (its brokers: {names})")


def choice(value: str | None, name: str, allowed: Mapping[str, str] | Sequence[str]) -> str:
    """One of ``allowed`` (the first when absent)."""
    options = list(allowed)
    if value is None or value == "":
        return options[0]
    if value not in options:
        raise BadRequestError(f"parameter {name}={short(value)}: one of {', '.join(options)}")
    return value
