"""The operators' tools: the ``rocketstore`` command, ``produce``, ``lag``, the metrics, and
``verify`` (a package of its own).

May import: ``engine`` and below. Imported by ``console`` and the jobs; nothing in the engine
imports a tool.
"""
