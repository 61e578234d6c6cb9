"""Scripts the tests start as processes of their own, each with its usage in its docstring:
run by path (``python tests/procs/NAME.py``, ``spark-submit tests/procs/NAME.py``; a
launcher finds them through :data:`tests.kit.PROCS`) or, on hosts in network namespaces, as
``python -m tests.procs.NAME`` with the checkout on ``PYTHONPATH``.

A script run by path has its own folder first on ``sys.path``, not the checkout: one that
imports ``tests.kit`` puts the checkout on ``sys.path`` first. Tests import from a script only
what defines the script's own output (a batch size, a store's settings); what tests and
scripts share otherwise lives in ``tests.kit``.
"""
