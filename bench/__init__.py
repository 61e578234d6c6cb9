"""Benchmarks of rocketstore: ``python -m bench`` runs every part, ``python -m bench store`` one.

Each part is a module with a ``run(options) -> PartResult`` function registered in
:data:`bench.cli.PARTS`; it prints a table and writes its figures as JSON to ``bench/out/``.
The method and the latest figures are in ``bench/README.md``.
"""
