"""``rocketstore verify``: every record, unit and index entry checked against the CommitLog,
without changing a byte.

``check`` runs a scan and holds its entry points; ``report`` is what it finds; ``load``,
``units``, ``state``, ``log``, ``queues`` and ``index`` are its stages.

May import: ``engine`` and below. Imported by the rest of ``tools`` and by ``console``.
"""
