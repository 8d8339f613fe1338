"""Claim 4: skip-observation GAE beats plain GAE on multi-turn traces.

    .venv/bin/python -m experiments.claim4_skip_obs_gae [--seeds 3] [--quick] [--out DIR]

Variants: sao, sao_plain_gae (the same, GAE over the whole response span), ppo
(plain GAE, PPO clip, K=1, attention not frozen).
Setting: `configs/experiments/tool_math.py`. Runs `sao-train` per (variant, seed)
(`experiments.runner`), then rewrites docs/research/results.md.
"""

from experiments import claims, runner

if __name__ == "__main__":
  runner.main(claims.CLAIMS_BY_NAME["claim4_skip_obs_gae"])
