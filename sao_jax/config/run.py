"""The main job (`sao-train`): outputs, initialisation, warm-start, evaluation, samplers."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_positive, fail


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  """What `sao-train` does around the learner loop.

  `init`: "random" (from scratch), a Hugging Face Qwen3 directory, or a
  `sao-convert` params directory. `tokenizer`: a tokenizer.json (or directory);
  empty trains a byte-level BPE of `model.vocab_size` on the environment's texts
  and saves it in the run directory (for from-scratch runs without a hub).
  Evaluation runs greedy decoding on `eval_episodes` held-out tasks (the task
  generator with `eval_seed` instead of `env.seed`) every `eval_every` steps.
  `num_samplers` sampler processes run beside the learner; 0 starts none: the
  samplers run elsewhere (`sao-sampler` on another slice) and the learner reads
  their trajectories from `data.transport="directory"`.
  """

  run_dir: str = "runs/default"
  init: str = "random"
  tokenizer: str = ""
  sft_steps: int = 0  # supervised warm-start on environment demonstrations
  sft_lr: float = 3e-3
  sft_batch: int = 32
  eval_every: int = 20
  eval_episodes: int = 64
  eval_seed: int = 1_000_003
  num_samplers: int = 1

  def validate(self) -> None:
    if not self.run_dir:
      fail("run", "run_dir", self.run_dir, "expected a directory for logs and checkpoints")
    if not self.init:
      fail("run", "init", self.init, "expected 'random' or a model directory")
    for name in ("sft_steps", "eval_every", "num_samplers"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail("run", name, value, "expected an integer >= 0 (0 disables)")
    check_positive("run", self, "sft_batch", "eval_episodes")
    if self.sft_lr <= 0:
      fail("run", "sft_lr", self.sft_lr, "expected a positive learning rate")
