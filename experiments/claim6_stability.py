"""Claim 6: SAO trains ~1000 steps without collapse (GRPO alongside).

    .venv/bin/python -m experiments.claim6_stability [--seeds 3] [--quick] [--out DIR]

Variants: sao, grpo.
Setting: `configs/experiments/stability.py`. Runs `sao-train` per (variant, seed)
(`experiments.runner`), then rewrites docs/research/results.md.
"""

from experiments import claims, runner

if __name__ == "__main__":
  runner.main(claims.CLAIMS_BY_NAME["claim6_stability"])
