"""Finding a foreachBatch call's streaming query over Spark Connect, on plans as Spark 4.3
prints them (stand-in queries and DataFrames; tests/test_connect.py runs the real thing)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest

from rocketstore.pipeline.errors import QueryIdentityError
from rocketstore.sink.identity import QueryIdentity, connect_query_id

ID_A = "7e6b2833-d614-497d-84f6-97090e99eccb"
ID_B = "c87bc22f-cb90-4510-89d4-e886438a36bc"
ID_C = "9d2f5357-0f88-4aa1-8e3e-2b07f72c9975"


def query_plan(query_id: str, batch: int, first: int, sink: str = "ForeachBatchSink") -> str:
    """``StreamingQuery.explain(extended=True)`` of a query in micro-batch ``batch`` whose
    output columns are ``value#first`` and ``v2#first+1``."""
    write = (
        f"~WriteToMicroBatchDataSourceV1 {sink}, {query_id}, "
        f"[checkpointLocation=/ck/{query_id[:4]}, path=/out, x=1], Append, {batch}"
    )
    body = (
        f"+- ~Project [value#{first}L, (value#{first}L * cast(2 as bigint)) AS v2#{first + 1}L]\n"
        f"   +- ~StreamingDataSourceV2ScanRelation[timestamp#{first - 1}, value#{first}L] "
        "RateStream(rowsPerSecond=5, rampUpTimeSeconds=0, numPartitions=2)\n"
    )
    return (
        f"== Parsed Logical Plan ==\n{write}\n{body}\n== Analyzed Logical Plan ==\n"
        f"value: bigint, v2: bigint\n{write}\n{body}\n== Physical Plan ==\n"
        f"*(1) Project [value#{first}L, (value#{first}L * 2) AS v2#{first + 1}L]\n"
    )


@dataclass
class Query:
    id: str
    plan: str

    def explain(self, extended: bool = False) -> None:
        assert extended, "the sink line is in the logical plans only"
        print(self.plan)


@dataclass
class Streams:
    active: list[Query] = field(default_factory=list)


@dataclass
class Session:
    streams: Streams


@dataclass
class BatchFrame:
    """A micro-batch DataFrame whose columns are ``value#first`` and ``v2#first+1``."""

    first: int

    def explain(self) -> None:
        print(
            f"== Physical Plan ==\n*(1) Scan ExistingRDD[value#{self.first}L,v2#{self.first + 1}L]"
        )


def session(*queries: Query) -> Session:
    return Session(Streams(list(queries)))


def test_the_one_foreach_batch_query_at_this_batch() -> None:
    starter = session(
        Query(ID_A, query_plan(ID_A, 3, 10)),
        Query(ID_B, query_plan(ID_B, 4, 20)),
        Query(ID_C, query_plan(ID_C, 4, 30, sink="FileSink[/out]")),
        Query(ID_C, "No physical plan. Waiting for data.\n"),
    )
    assert connect_query_id(BatchFrame(20), 4, starter) == ID_B
    assert connect_query_id(BatchFrame(10), 3, starter) == ID_A


def test_queries_at_the_same_batch_told_apart_by_their_columns() -> None:
    starter = session(Query(ID_A, query_plan(ID_A, 2, 10)), Query(ID_B, query_plan(ID_B, 2, 20)))
    assert connect_query_id(BatchFrame(20), 2, starter) == ID_B
    assert connect_query_id(BatchFrame(10), 2, starter) == ID_A


def test_queries_that_cannot_be_told_apart_fail_naming_them() -> None:
    # Two queries started from one cached plan share its attributes.
    starter = session(Query(ID_A, query_plan(ID_A, 2, 10)), Query(ID_B, query_plan(ID_B, 2, 10)))
    with pytest.raises(QueryIdentityError, match=rf"batch 2: .*{ID_A}, {ID_B}.*sinkId"):
        connect_query_id(BatchFrame(10), 2, starter)


def test_no_query_at_this_batch_fails() -> None:
    starter = session(Query(ID_A, query_plan(ID_A, 5, 10)))
    with pytest.raises(QueryIdentityError, match=r"batch 4: .*at this batch: none\)"):
        connect_query_id(BatchFrame(10), 4, starter)


def test_a_pickled_identity_forgets_the_session_and_what_it_found() -> None:
    identity = QueryIdentity()
    identity._starter = session()
    identity._found["run"] = ID_A
    copy = pickle.loads(pickle.dumps(identity))
    # Outside Spark Connect no session is active while it is unpickled.
    assert copy._starter is None and copy._found == {}
