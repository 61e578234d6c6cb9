"""The import contracts in pyproject.toml (import-linter; ``make lint`` runs ``lint-imports``):
the real import graph keeps them, and each would catch what it is there for: an import that
runs up a layer, an engine module reaching into a Spark face, a circle inside a layer. Each
case adds one import to the real graph and checks the contract breaks."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")

from importlinter.api import read_configuration  # noqa: E402
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract  # noqa: E402
from importlinter.contracts.forbidden import ForbiddenContract  # noqa: E402
from importlinter.contracts.layers import LayersContract  # noqa: E402

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
KINDS: dict[str, Any] = {
    "layers": LayersContract,
    "acyclic_siblings": AcyclicSiblingsContract,
    "forbidden": ForbiddenContract,
}


@functools.cache
def configuration() -> dict[str, Any]:
    config: dict[str, Any] = read_configuration(str(PYPROJECT))
    return config


def contracts() -> list[Any]:
    config = configuration()
    made = []
    for options in config["contracts_options"]:
        fields = {k: v for k, v in options.items() if k not in ("id", "name", "type")}
        made.append(
            KINDS[options["type"]](
                name=options["name"],
                session_options=config["session_options"],
                contract_options=fields,
            )
        )
    return made


def graph() -> Any:
    return grimp.build_graph(*configuration()["session_options"]["root_packages"])


def broken(extra: tuple[str, str] | None = None) -> list[str]:
    g = graph()
    if extra is not None:
        importer, imported = extra
        assert g.find_modules_directly_imported_by(importer) is not None
        g.add_import(importer=importer, imported=imported, line_number=1, line_contents="import")
    return [c.name for c in contracts() if not c.check(g, verbose=False).kept]


def test_the_code_keeps_every_contract() -> None:
    assert len(contracts()) >= 3
    assert broken() == []


@pytest.mark.parametrize(
    ("importer", "imported", "contract"),
    [
        # the engine reaching up into the tools
        (
            "rocketstore.pipeline.engine.store",
            "rocketstore.pipeline.tools.lag",
            "pipeline's layers",
        ),
        # a record codec reaching for a file
        (
            "rocketstore.pipeline.format.record",
            "rocketstore.pipeline.files.commitlog",
            "pipeline's layers",
        ),
        # the settings asking the engine (the circle config -> storehost that was broken)
        (
            "rocketstore.pipeline.config",
            "rocketstore.pipeline.engine.storehost",
            "pipeline's layers",
        ),
        # the console's entry point is the command line, not the reverse
        ("rocketstore.pipeline.console.server", "rocketstore.pipeline.cli", "pipeline's layers"),
        # the tier reaching up into the engine
        (
            "rocketstore.pipeline.tier.upload",
            "rocketstore.pipeline.engine.store",
            "pipeline's layers",
        ),
        # a writer talking to the bucket: the engine reads only the tier's local record
        (
            "rocketstore.pipeline.engine.retention.service",
            "rocketstore.pipeline.tier.objects",
            "The engine reads only",
        ),
        # the engine importing a Spark face
        ("rocketstore.pipeline.engine.store", "rocketstore.sink.writer", "The Spark faces"),
        # a circle inside one layer: segments is what commitlog is built on
        (
            "rocketstore.pipeline.files.segments",
            "rocketstore.pipeline.files.commitlog",
            "No import circles",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    importer: str, imported: str, contract: str
) -> None:
    names = broken((importer, imported))
    assert any(name.startswith(contract) for name in names), names
