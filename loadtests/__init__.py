"""Benchmarks of preft-serve, each run by a Make target (``make help``), and their shared
helpers; ``studies/`` holds the quality and RL studies, ``experiments/`` one-off A/B
scripts kept with the results the docs cite.

Every run writes its JSON and plots under :data:`RESULTS`.
"""

from pathlib import Path

RESULTS = Path(__file__).parent / "results"
