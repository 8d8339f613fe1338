"""Claim 5: SAO re-aligns faster than a running-mean baseline after a switch.

    .venv/bin/python -m experiments.claim5_realignment [--seeds 3] [--quick] [--out DIR]

Variants: sao, running_mean (global window of 128 outcomes).
Setting: `configs/experiments/style.py`. Runs `sao-train` per (variant, seed)
(`experiments.runner`), then rewrites docs/research/results.md.
"""

from experiments import claims, runner

if __name__ == "__main__":
  runner.main(claims.CLAIMS_BY_NAME["claim5_realignment"])
