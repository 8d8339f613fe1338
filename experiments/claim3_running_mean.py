"""Claim 3: a running-mean baseline lags SAO.

    .venv/bin/python -m experiments.claim3_running_mean [--seeds 3] [--quick] [--out DIR]

Variants: sao, running_mean (global window of 128 outcomes).
Setting: `configs/experiments/tool_math.py`. Runs `sao-train` per (variant, seed)
(`experiments.runner`), then rewrites docs/research/results.md.
"""

from experiments import claims, runner

if __name__ == "__main__":
  runner.main(claims.CLAIMS_BY_NAME["claim3_running_mean"])
