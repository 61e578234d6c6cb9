"""Which streaming query a ``foreachBatch`` call belongs to: the sink's identity for replay
detection (:mod:`rocketstore.sink.append`).

The identity is the streaming query's id. Spark keeps it in the checkpoint (its ``metadata``
file), so a run restarted from the same checkpoint has the same id as the run it replaces, and
a re-run of a micro-batch recognises what the interrupted run stored. Different queries have
different ids, so two queries writing one topic never take each other's rows for their own.

* **Classic session.** Spark calls the function on the query's own thread, which carries the
  id as the local property ``sql.streaming.queryId``.
* **Spark Connect.** The function runs in a Python process beside the server, as a client of
  a clone of the query's session, and nothing it can reach carries the id. The query is found
  among the active queries of the session that started it (the sink keeps that session when
  it is unpickled, see :class:`QueryIdentity`): while the function runs, the query's current
  execution is this micro-batch, and its plan names the ``ForeachBatchSink`` and the batch id.
  When more than one query of the session is at this batch id, the one whose plan produced
  this DataFrame is taken: the micro-batch's columns are that query's attributes, whose ids
  (``name#17``) are unique in the server. A query that cannot be told apart fails the batch
  rather than guess, since a wrong identity could skip rows.

Runs where the ``foreachBatch`` function runs (the driver, or the Connect server's Python
process); not thread-safe, one call at a time per sink.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import uuid
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from rocketstore.pipeline.errors import QueryIdentityError

QUERY_ID_PROPERTY = "sql.streaming.queryId"
# The sink node of a micro-batch's plan, e.g.
# ``WriteToMicroBatchDataSourceV1 ForeachBatchSink, <query id>, [<options>], Append, 7``.
_SINK_LINE = re.compile(
    r"WriteToMicroBatchDataSource(?:V1)? ForeachBatchSink, "
    r"(?P<id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}), .*, (?P<batch>\d+)$",
    re.MULTILINE,
)
_ATTRIBUTE_ID = re.compile(r"#(\d+)")


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (it has no ``sparkContext``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


class QueryIdentity:
    """The id of the streaming query a ``foreachBatch`` function is called for.

    Lives in the sink. Pickled (Spark Connect sends the sink to the server that way) it
    forgets what it knew; unpickled it keeps the Spark Connect session active at that moment,
    which in Spark Connect's ``foreachBatch`` worker is the session that started the query.
    """

    def __init__(self) -> None:
        self._starter: Any = None
        self._found: dict[str, str] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Not empty: pickle skips __setstate__ for a false state.
        return {"_found": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._starter = _active_connect_session()
        self._found = {}

    def id_of(self, df: DataFrame, batch_id: int) -> str:
        """The id of the query whose micro-batch ``batch_id`` is ``df``; a new random id when
        the function was called outside a streaming query (no replay to recognise then)."""
        spark: Any = df.sparkSession
        if not is_connect(spark):
            found: str | None = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
            return found if found is not None else str(uuid.uuid4())
        if self._starter is None:
            # Called by a Connect client itself, not by Spark Connect's foreachBatch worker.
            return str(uuid.uuid4())
        # The session clone the batch runs in belongs to one run of one query: the lookup is
        # done once per run.
        run: str = spark.session_id
        if run not in self._found:
            self._found[run] = connect_query_id(df, batch_id, self._starter)
        return self._found[run]


def _active_connect_session() -> Any:
    from pyspark.sql.utils import is_remote

    if not is_remote():
        return None
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.getActiveSession()


def connect_query_id(df: DataFrame, batch_id: int, starter: Any) -> str:
    """The id of the query, among ``starter``'s active queries, whose micro-batch ``batch_id``
    is ``df`` (see the module docstring)."""
    at_batch: list[tuple[str, str]] = []
    for query in starter.streams.active:
        plan = _printed(functools.partial(query.explain, extended=True))
        sink = _SINK_LINE.search(plan)
        if sink is not None and sink["id"] == query.id and int(sink["batch"]) == batch_id:
            at_batch.append((sink["id"], plan))
    if len(at_batch) == 1:
        return at_batch[0][0]
    produced = set(_ATTRIBUTE_ID.findall(_printed(df.explain)))
    ours = [
        qid for qid, plan in at_batch if produced and produced <= set(_ATTRIBUTE_ID.findall(plan))
    ]
    if len(ours) == 1:
        return ours[0]
    found = ", ".join(qid for qid, _ in at_batch) or "none"
    raise QueryIdentityError(
        f"foreachBatch over Spark Connect, batch {batch_id}: cannot tell which streaming query "
        f"this sink writes for (queries of the session at this batch: {found}); give each "
        "query's sink its own sinkId option"
    )


def _printed(show: Callable[[], None]) -> str:
    # DataFrame.explain and StreamingQuery.explain print their plan; they return nothing.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        show()
    return out.getvalue()
