r"""A reward function for verl-style rows, as plain Python (`env.reward_fn`).

    env.reward_fn = "arith_reward:compute_score"     # with examples/verl_reward on PYTHONPATH

sao_jax calls it once per episode with the policy's final reply, the task (its
`answer` is the row's `reward_model.ground_truth`, `metadata["source"]` its
`data_source`, `metadata["extra_info"]` its `extra_info`) and the conversation.
It returns the reward under "score" and other numbers, which are logged as
`episodes/metric/<name>`.

The reply is untrusted text written by the policy: it is parsed, never
evaluated (no `eval`, no `exec`; run code only through `sao_jax.envs.sandbox`).
"""

import re

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(response, task, messages):
  boxed = _BOXED.findall(response)
  numbers = _NUMBER.findall(boxed[-1] if boxed else response)
  correct = bool(numbers) and numbers[-1] == task.answer.strip()
  return {"score": float(correct), "boxed": float(bool(boxed)),
          "reply_words": float(len(response.split()))}
