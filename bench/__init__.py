"""Benchmarks of preft-serve, each run by a Make target (``make help``), and their shared
helpers; ``studies/`` holds the quality, RL and KV-fidelity studies, ``experiments/`` one-off
A/B scripts, ``soak/`` the chaos soak (``make soak``).

Every run writes its JSON and plots under ``--result-dir`` (default ``var/results/``, outside
the source tree: :mod:`bench.results`); the results the docs show are kept in
``docs/results/``.
"""
