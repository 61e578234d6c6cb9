"""Errors the Spark source raises beyond the engine's own (:mod:`rocketstore.pipeline.errors`)."""

from __future__ import annotations

from rocketstore.pipeline.errors import StoreError


class DataLossError(StoreError):
    """Messages a query had not read yet are gone (retention deleted their files).

    Raised only with ``failOnDataLoss=true`` (the default); the message names every queue
    affected, the offsets lost and how many messages that is.
    """
