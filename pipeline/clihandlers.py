"""Which function runs each ``rocketstore`` command, imported only when the command runs.

Each function here imports one command's implementation (and with it numpy, pyarrow and the
store) and returns it; :mod:`.cli` gives each command's parser one of them. So
``rocketstore --help`` and a usage error import nothing heavy, while every implementation is
still named in code that checkers see: mypy checks each one against :data:`Handler` where it is
returned, and ``tests/test_cli_usage.py`` loads every command's and checks its signature.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]
"""A command's implementation: its parsed arguments in, its exit status out (see
:data:`rocketstore.pipeline.cli.EPILOG`)."""


def dump() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_dump

    return cmd_dump


def queues() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_queues

    return cmd_queues


def topics() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_topics

    return cmd_topics


def get() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_get

    return cmd_get


def query_key() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_query_key

    return cmd_query_key


def query_time() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_query_time

    return cmd_query_time


def query_offset() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_query_offset

    return cmd_query_offset


def query_msgid() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_query_msgid

    return cmd_query_msgid


def produce() -> Handler:
    from rocketstore.pipeline.tools.produce import cmd_produce

    return cmd_produce


def recover() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_recover

    return cmd_recover


def verify() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_verify

    return cmd_verify


def clean() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_clean

    return cmd_clean


def lag() -> Handler:
    from rocketstore.pipeline.tools.lag import cmd_lag

    return cmd_lag


def console() -> Handler:
    from rocketstore.pipeline.console.server import cmd_console

    return cmd_console


def exporter() -> Handler:
    from rocketstore.pipeline.console.server import cmd_exporter

    return cmd_exporter


def config() -> Handler:
    from rocketstore.pipeline.tools.commands import cmd_config

    return cmd_config


def tier() -> Handler:
    from rocketstore.pipeline.tools.tier import cmd_tier

    return cmd_tier
