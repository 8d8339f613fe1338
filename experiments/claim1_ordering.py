"""Claim 1: SAO >= GRPO+DIS > GRPO at equal sample budget.

    .venv/bin/python -m experiments.claim1_ordering [--seeds 3] [--quick] [--out DIR]

Variants: sao, grpo_dis, grpo.
Setting: `configs/experiments/tool_math.py`. Runs `sao-train` per (variant, seed)
(`experiments.runner`), then rewrites docs/research/results.md.
"""

from experiments import claims, runner

if __name__ == "__main__":
  runner.main(claims.CLAIMS_BY_NAME["claim1_ordering"])
