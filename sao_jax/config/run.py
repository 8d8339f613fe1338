"""The main job (`sao-train`): outputs, initialisation, warm-start, evaluation, samplers."""

from __future__ import annotations

import dataclasses
import pathlib

from sao_jax.config.checks import check_positive, fail


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  """What `sao-train` does around the learner loop.

  `init`: "random" (from scratch), a Hugging Face Qwen3 directory, or a
  `sao-convert` params directory. `tokenizer`: a tokenizer.json (or directory);
  empty trains a byte-level BPE of `model.vocab_size` on the environment's texts
  and saves it in the run directory (for from-scratch runs without a hub).
  Episodes and demonstrations are rendered with the chat template the
  tokenizer's directory ships, else as ChatML (`sao_jax.chat`);
  `enable_thinking` is passed to the template (false: Qwen3's non-thinking
  mode, the empty think block in the generation prompt); false is refused for a
  template without that switch.
  Evaluation runs greedy decoding on `eval_episodes` held-out tasks (the task
  generator with `eval_seed` instead of `env.seed`) every `eval_every` steps.
  `sft_target_accuracy` > 0 ends the warm-start early, at the first multiple of
  `sft_check_every` steps where greedy accuracy on `eval_episodes` validation
  tasks (seed `eval_seed + 1`, so the held-out set the run reports on plays no
  part in choosing the stop) reaches it: RL then starts from a chosen accuracy
  rather than from wherever `sft_steps` happen to land.
  `num_samplers` sampler processes run beside the learner; 0 starts none: the
  samplers run elsewhere (`sao-sampler` on another slice) and the learner reads
  their trajectories from `data.transport="directory"`.
  """

  run_dir: str = "runs/default"
  init: str = "random"
  tokenizer: str = ""
  enable_thinking: bool = True
  sft_steps: int = 0  # supervised warm-start on environment demonstrations
  sft_lr: float = 3e-3
  sft_batch: int = 32
  sft_target_accuracy: float = 0.0  # 0: all sft_steps
  sft_check_every: int = 25
  eval_every: int = 20
  eval_episodes: int = 64
  eval_seed: int = 1_000_003
  num_samplers: int = 1

  @property
  def tokenizer_file(self) -> str:
    """The run's own tokenizer.json, which the learner writes (trained, or a copy of
    `tokenizer`) and `sao-eval` reads."""
    return str(pathlib.Path(self.run_dir) / "tokenizer.json")

  @property
  def tokenizer_source(self) -> str:
    """Where a sampler on another host loads the tokenizer: `tokenizer` when set
    (the run directory may not be shared), else the run's own copy."""
    return self.tokenizer or self.tokenizer_file

  @property
  def default_checkpoint_dir(self) -> str:
    """Where checkpoints go unless `checkpoint.directory` says otherwise."""
    return str(pathlib.Path(self.run_dir) / "checkpoints")

  def validate(self) -> None:
    if not self.run_dir:
      fail("run", "run_dir", self.run_dir, "expected a directory for logs and checkpoints")
    if not self.init:
      fail("run", "init", self.init, "expected 'random' or a model directory")
    if not isinstance(self.enable_thinking, bool):
      fail("run", "enable_thinking", self.enable_thinking, "expected true or false")
    for name in ("sft_steps", "eval_every", "num_samplers"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail("run", name, value, "expected an integer >= 0 (0 disables)")
    check_positive("run", self, "sft_batch", "eval_episodes", "sft_check_every")
    if not 0.0 <= self.sft_target_accuracy <= 1.0:
      fail("run", "sft_target_accuracy", self.sft_target_accuracy,
           "expected an accuracy in [0, 1] (0 runs all run.sft_steps)")
    if self.sft_target_accuracy and not self.sft_steps:
      fail("run", "sft_target_accuracy", self.sft_target_accuracy,
           "a target needs a warm-start: set run.sft_steps to the most SFT steps to spend")
    if self.sft_lr <= 0:
      fail("run", "sft_lr", self.sft_lr, "expected a positive learning rate")
