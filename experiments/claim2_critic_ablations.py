"""Claim 2: removing K=2 value updates or frozen attention hurts SAO.

    .venv/bin/python -m experiments.claim2_critic_ablations [--seeds 3] [--quick] [--out DIR]

Variants: sao, sao_k1 (value_updates_per_step=1),
sao_unfrozen (frozen_attention=False).
Setting: `configs/experiments/tool_math.py`. Runs `sao-train` per (variant, seed)
(`experiments.runner`), then rewrites docs/research/results.md.
"""

from experiments import claims, runner

if __name__ == "__main__":
  runner.main(claims.CLAIMS_BY_NAME["claim2_critic_ablations"])
