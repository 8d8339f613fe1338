"""Small-scale reproductions of the paper's claims (docs/algorithm.md §7): one script per claim.

    .venv/bin/python -m experiments.claim1_ordering --seeds 3 [--quick] [--out DIR]
    .venv/bin/python -m experiments.report [--out DIR]      # docs/research/results.md + docs/research/results/*.png

Each claim script runs `sao-train` (configs/experiments/) once per (variant,
seed) in a subprocess, skips finished runs, resumes killed ones, then rewrites
the report. docs/research/claims.md lists the commands.
"""
