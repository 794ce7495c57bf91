"""Sweeps over train.py runs: the grid (grid.py), launching (launch.py), the tidy table (collect.py),
provenance (provenance.py) and the command line (cli.py).

``python -m vispe.sweep --help`` for the command line; ``python -m vispe.report SWEEP_DIR`` for tables
and plots of a sweep folder.
"""
