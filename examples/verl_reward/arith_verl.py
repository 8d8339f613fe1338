r"""A reward function in verl's calling convention, as verl's own scorers
(`verl/utils/reward_score/*.py`) and verl `custom_reward_function`s are written:

    PYTHONPATH=examples/verl_reward .venv/bin/sao-train --config examples/verl_reward/config.py \
        --set env.reward_fn=arith_verl:compute_score --set run.tokenizer=TOKENIZER_DIR

sao_jax sees the parameter `solution_str` and calls it as verl does, by keyword
(`env.reward_fn_convention="auto"`; docs/guides/datasets.md): `data_source` is
the row's `data_source`, `solution_str` the policy's final reply, `ground_truth`
the row's `reward_model.ground_truth`, `extra_info` the row's `extra_info`. With
verl installed, its scorers are used the same way, unmodified, e.g.
`env.reward_fn="verl.utils.reward_score.gsm8k:compute_score"` for GSM8K rows.

The reply is untrusted text written by the policy: it is parsed, never evaluated.
"""

import re

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  """1.0 for the right number in the last \\boxed{}, else 0.0; a dict as verl's
  scorers that report more return it ("score" plus numbers logged as metrics)."""
  boxed = _BOXED.findall(solution_str)
  correct = bool(boxed) and boxed[-1].strip() == str(ground_truth).strip()
  return {"score": 1.0 if correct else 0.0, "boxed": bool(boxed),
          "row": (extra_info or {}).get("index", -1), "source": data_source}
