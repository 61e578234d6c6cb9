"""What the tests of the pipeline jobs share: the store settings file the jobs are given, and
the files Spark's file sink committed (read from its manifest, as Spark does)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

STORE_TOML = """\
mappedFileSizeCommitLog = 1048576
maxHashSlotNum = 4096
maxIndexNum = 65536
"""


def committed_files(output: Path) -> list[Path]:
    """The files Spark's file sink committed, from its manifest (``_spark_metadata``): a file a
    failed or stopped batch left behind is not among them."""
    log = output / "_spark_metadata"
    batches = sorted(
        (p for p in log.iterdir() if p.name.split(".")[0].isdigit() and not p.name.startswith(".")),
        key=lambda p: int(p.name.split(".")[0]),
    )
    # A .compact file holds every entry up to its batch; later files add to it.
    compacts = [p for p in batches if p.name.endswith(".compact")]
    if compacts:
        batches = [compacts[-1]] + [
            p for p in batches if int(p.name.split(".")[0]) > int(compacts[-1].name.split(".")[0])
        ]
    files: dict[str, bool] = {}
    for p in batches:
        for line in p.read_text().splitlines()[1:]:
            entry = json.loads(line)
            files[entry["path"]] = entry["action"] == "add"
    return [Path(unquote(urlparse(path).path)) for path, keep in files.items() if keep]
