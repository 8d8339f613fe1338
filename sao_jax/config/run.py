"""The main job (`sao-train`): outputs, initialisation, warm-start, evaluation, samplers."""

from __future__ import annotations

import dataclasses
import math
import pathlib

from sao_jax import storage
from sao_jax.config import hosts
from sao_jax.config.checks import check_positive, fail

# Where metrics go besides run_dir/metrics.jsonl, which is always written (resume,
# plots and the progress line read it): TensorBoard events in run_dir/tensorboard,
# Weights & Biases (`sao_jax.run.tracking`; needs the `wandb` extra).
LOGGERS = ("tensorboard", "wandb")
DEFAULT_LOGGERS = ("tensorboard",)
# What a launch does with checkpoints already in its checkpoint directory
# (`sao_jax.jobs.train.resume_decision`): "never" refuses them (a new run must not mix
# with an old one), "auto" resumes when they are of the same run (the fields of
# `RESUME_IDENTITY`, `learner.steps` aside) and refuses when not, "always"
# resumes whatever changed (a longer run, a new phase). All three start from
# step 0 when there is no checkpoint.
RESUME_MODES = ("never", "auto", "always")
# "The same run" for resume="auto": these fields (a section, or section.field) as
# saved in the newest checkpoint equal the launching config's, except those of
# RESUME_MAY_CHANGE (a run continued to more steps, or on a host needing smaller
# micro-batches, trains the same). The mesh, samplers, data transport,
# checkpoint schedule and evaluation may change: they decide how, not what, is trained.
RESUME_IDENTITY = ("seed", "model", "algorithm", "lora", "env", "learner", "run.init")
RESUME_MAY_CHANGE = ("learner.steps", "learner.micro_batches")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  """What `sao-train` does around the learner loop.

  `init`: "random" (from scratch), a Hugging Face checkpoint directory (a family of
  `sao_jax.config.families`; configs/qwen3_0_6b.py and friends), or a
  `sao-convert` params directory. `tokenizer`: a tokenizer.json (or directory);
  empty trains a byte-level BPE of `model.vocab_size` on the environment's texts
  and saves it in the run directory (for from-scratch runs without a hub).
  Episodes and demonstrations are rendered with the chat template the
  tokenizer's directory ships, else as ChatML (`sao_jax.chat`);
  `enable_thinking` is passed to the template (false: Qwen3's non-thinking
  mode, the empty think block in the generation prompt); false is refused for a
  template without that switch.
  Evaluation runs greedy decoding on `eval_episodes` held-out tasks (the task
  generator with `eval_seed` instead of `env.seed`) every `eval_every` steps,
  and writes the first `eval_transcripts` of those episodes as text to
  RUN_DIR/eval/episodes_step_<step>.jsonl (the same tasks every time, so what
  the policy writes can be compared across steps; 0 writes none).
  `sft_target_accuracy` > 0 ends the warm-start early, at the first multiple of
  `sft_check_every` steps where greedy accuracy on `sft_check_episodes`
  validation tasks (0: `eval_episodes`; seed `eval_seed + 1`, so the held-out
  set the run reports on plays no part in choosing the stop) reaches it: RL then starts from a chosen accuracy
  rather than from wherever `sft_steps` happen to land.
  `num_samplers` sampler processes run beside the learner; 0 starts none: the
  samplers run elsewhere (`sao-sampler` on another slice) and the learner reads
  their trajectories from `data.transport="directory"`.
  `sao-eval` (`sao_jax.jobs.evaluate.benchmark`) adds to the greedy pass@1
  `eval_samples` episodes per task sampled at `eval_temperature` and reports
  mean@eval_samples and pass@k for each k in `eval_pass_k` (0 samples: greedy only).
  `loggers` (from LOGGERS) receive every metrics row; W&B runs go to
  `wandb_project` (mode, entity and key from the usual WANDB_* variables).
  `resume` (RESUME_MODES): what a launch does when the checkpoint directory
  already holds checkpoints; "auto" makes relaunching the identical command
  after a preemption continue the run (`sao-train --resume auto`).
  `max_failure_fraction` and `failure_window` bound failed episodes: once at least
  that share of the last `failure_window` trajectories the learner judged on their
  own merits (admitted, or dropped as an environment failure, malformed or too
  long; a stale one is only late) were dropped, the run stops with an error naming
  each failure kind, its count and first message (`sao_jax.data.failures`): a
  reward function that fails on every episode ends the run instead of hanging it.
  While no learner step completes, the learner says every `waiting_report_s`
  seconds what it is waiting for and what it dropped so far (`sao_jax.run.waiting`).
  `max_wall_s` > 0 is a wall-clock budget: the run ends at it or at
  `learner.steps`, whichever comes first (`sao_jax.run.timing`).
  """

  # Directory of the run's outputs: metrics, checkpoints, tokenizer, plots; or a bucket
  # URL (gs://bucket/run; without tensorboard, with run.tokenizer: sao_jax.storage).
  run_dir: str = "runs/default"
  # Initial policy: random, a Hugging Face directory or a sao-convert params directory.
  init: str = "random"
  tokenizer: str = ""  # tokenizer.json or its directory ('': train a byte-level BPE for the run)
  enable_thinking: bool = True  # passed to the chat template (false: Qwen3's non-thinking mode)
  sft_steps: int = 0  # supervised warm-start on environment demonstrations
  sft_lr: float = 3e-3  # learning rate of the SFT warm-start
  sft_batch: int = 32  # demonstrations per SFT step
  sft_target_accuracy: float = 0.0  # stop SFT at this validation accuracy (0: all sft_steps)
  sft_check_every: int = 25  # also the interval of SFT progress lines in a log file
  sft_check_episodes: int = 0  # validation episodes per SFT check; 0: eval_episodes
  eval_every: int = 20  # steps between held-out evaluations (0: none)
  eval_episodes: int = 64  # held-out tasks per evaluation
  eval_seed: int = 1_000_003  # task seed of the held-out set (disjoint from env.seed's)
  eval_transcripts: int = 16  # held-out episodes written as text per evaluation (0: none)
  num_samplers: int = 1  # sampler processes beside the learner (0: samplers elsewhere, sao-sampler)
  # This host's devices, in order: the learner's count, then each local sampler
  # process's, e.g. (6, 2) on 8 chips (`sao_jax.sharding.device_split`); they must
  # add up to the host's devices. (): every process sees all of them.
  device_split: tuple[int, ...] = ()
  # The ready single-host layout this config was made for (`sao_jax.config.hosts`,
  # e.g. "v6e-8"; set by `hosts.on_host`): sao-plan compiles for its chips. "": none.
  host: str = ""
  # Sao-eval: sampled episodes per task besides the greedy one (0: greedy only).
  eval_samples: int = 0
  eval_pass_k: tuple[int, ...] = (1,)  # sao-eval: the k of pass@k
  eval_temperature: float = 1.0  # sao-eval: temperature of the sampled episodes
  # Metric sinks besides metrics.jsonl: tensorboard, wandb.
  loggers: tuple[str, ...] = DEFAULT_LOGGERS
  wandb_project: str = "sao-jax"  # W&B project of the run (with loggers including wandb)
  # Relaunching with checkpoints in the run directory: "never" refuses, "auto" resumes
  # the same config (refuses a changed one) or starts fresh, "always" resumes whatever changed.
  resume: str = "never"
  # Stop the run once at least this share of the last failure_window judged
  # trajectories were dropped as failures (1.0: only when every one of them was).
  max_failure_fraction: float = 0.95
  failure_window: int = 64  # judged trajectories the failure share is taken over
  # Seconds between "waiting for trajectories" reports while no step completes (0: none).
  waiting_report_s: float = 30.0
  # Wall-clock budget of the learner loop, seconds (0: none): once the run has trained
  # this long (counted from the first batch asked for, resumes included:
  # sao_jax.run.timing) it stops after the step in flight with a final checkpoint,
  # summary.json stopped_by "wall_clock", like learner.steps but in time.
  max_wall_s: float = 0.0

  @property
  def tokenizer_file(self) -> str:
    """The run's own tokenizer.json, which the learner writes (trained, or a copy of
    `tokenizer`) and `sao-eval` reads; a bucket run directory keeps no copy
    (`tokenizers` reads local files) and reads `tokenizer`, which it must set."""
    if storage.is_url(self.run_dir):
      return self.tokenizer
    return str(pathlib.Path(self.run_dir) / "tokenizer.json")

  @property
  def tokenizer_source(self) -> str:
    """Where a sampler on another host loads the tokenizer: `tokenizer` when set
    (the run directory may not be shared), else the run's own copy."""
    return self.tokenizer or self.tokenizer_file

  @property
  def default_checkpoint_dir(self) -> str:
    """Where checkpoints go unless `checkpoint.directory` says otherwise."""
    return storage.join(self.run_dir, "checkpoints")

  def validate(self) -> None:
    if not self.run_dir:
      fail("run", "run_dir", self.run_dir, "expected a directory for logs and checkpoints")
    self._validate_bucket()
    if not self.init:
      fail("run", "init", self.init, "expected 'random' or a model directory")
    if not isinstance(self.enable_thinking, bool):
      fail("run", "enable_thinking", self.enable_thinking, "expected true or false")
    for name in ("sft_steps", "eval_every", "num_samplers", "eval_samples", "eval_transcripts"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail("run", name, value, "expected an integer >= 0 (0 disables)")
    check_positive("run", self, "sft_batch", "eval_episodes", "sft_check_every")
    split = self.device_split
    if split and (any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in split)
                  or len(split) != 1 + self.num_samplers):
      fail("run", "device_split", split,
           f"expected 1 + run.num_samplers = {1 + self.num_samplers} device counts >= 1 (the "
           "learner's, then each sampler process's), e.g. (6, 2) for 8 devices and 1 sampler; "
           "() gives every process all devices")
    if self.host:
      if self.host not in hosts.HOSTS:
        fail("run", "host", self.host, f"expected a ready layout ({', '.join(hosts.HOSTS)}, "
             "sao_jax/config/hosts.py) or '' for none")
      spec = hosts.HOSTS[self.host]
      if split and sum(split) != spec.devices:
        fail("run", "device_split", split,
             f"run.host={self.host!r} has {spec.devices} devices: give out exactly that many, "
             f"e.g. {spec.split}, or set run.host='' for another machine")
    if (isinstance(self.sft_check_episodes, bool) or not isinstance(self.sft_check_episodes, int)
        or self.sft_check_episodes < 0):
      fail("run", "sft_check_episodes", self.sft_check_episodes,
           "expected an integer >= 0 (0: as many as run.eval_episodes)")
    if not 0.0 <= self.sft_target_accuracy <= 1.0:
      fail("run", "sft_target_accuracy", self.sft_target_accuracy,
           "expected an accuracy in [0, 1] (0 runs all run.sft_steps)")
    if self.sft_target_accuracy and not self.sft_steps:
      fail("run", "sft_target_accuracy", self.sft_target_accuracy,
           "a target needs a warm-start: set run.sft_steps to the most SFT steps to spend")
    if self.sft_lr <= 0:
      fail("run", "sft_lr", self.sft_lr, "expected a positive learning rate")
    self._validate_eval_and_loggers()
    self._validate_failure_bound()
    if self.resume not in RESUME_MODES:
      fail("run", "resume", self.resume, f"allowed values are {', '.join(map(repr, RESUME_MODES))}"
           " ('auto': continue a run of the same config, start fresh when there is none)")

  @property
  def sft_validation_episodes(self) -> int:
    """Greedy validation episodes per SFT check: `sft_check_episodes`, 0 meaning
    `eval_episodes`."""
    return self.sft_check_episodes or self.eval_episodes

  def _validate_bucket(self) -> None:
    """A bucket run_dir holds what `sao_jax.storage` lists; what needs local files is
    refused, not written to a local `gs:/bucket` directory (pathlib's reading)."""
    if storage.is_url(self.tokenizer):
      fail("run", "tokenizer", self.tokenizer, "the tokenizers library reads local files; "
           "copy the tokenizer.json (or the model directory) to this host and name that")
    if not storage.is_url(self.run_dir):
      return
    if "tensorboard" in self.loggers:
      fail("run", "loggers", self.loggers, f"run.run_dir={self.run_dir!r} is a bucket and "
           "TensorBoard writes local files; set run.loggers= (or wandb): metrics.jsonl in the "
           "bucket holds every row and `sao-train --plot RUN_DIR` draws them")
    if not self.tokenizer:
      fail("run", "tokenizer", self.tokenizer, f"run.run_dir={self.run_dir!r} is a bucket, "
           "which keeps no tokenizer copy (the tokenizers library reads local files): set "
           "run.tokenizer to a local tokenizer.json or model directory (run.init=DIR sets it "
           "when DIR holds one), or train the tokenizer in a local run directory first")

  def _validate_failure_bound(self) -> None:
    value = self.max_failure_fraction
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
      fail("run", "max_failure_fraction", value, "expected a fraction in (0, 1]: the run stops "
           "once at least that share of the last run.failure_window episodes failed (1.0: only "
           "when all of them did)")
    check_positive("run", self, "failure_window")
    value = self.waiting_report_s
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
        or not math.isfinite(value)):
      fail("run", "waiting_report_s", value, "expected a finite number of seconds >= 0 "
           "(0: no waiting reports)")
    value = self.max_wall_s
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
        or not math.isfinite(value)):
      fail("run", "max_wall_s", value, "expected a finite number of seconds >= 0 (0: no "
           "wall-clock budget; the run ends at learner.steps), e.g. --set run.max_wall_s=3600")

  def _validate_eval_and_loggers(self) -> None:
    ks = self.eval_pass_k
    if self.eval_samples and (
        not isinstance(ks, tuple) or not ks or list(ks) != sorted(set(ks))
        or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.eval_samples
               for k in ks)):
      fail("run", "eval_pass_k", ks, "expected increasing integers in 1..run.eval_samples="
           f"{self.eval_samples} (pass@k needs at least k samples per task)")
    value = self.eval_temperature
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
      fail("run", "eval_temperature", value, "expected a number > 0")
    if not isinstance(self.loggers, tuple) or len(set(self.loggers)) != len(self.loggers) or (
        any(name not in LOGGERS for name in self.loggers)):
      fail("run", "loggers", self.loggers, f"expected a tuple of distinct names from "
           f"{', '.join(map(repr, LOGGERS))} (metrics.jsonl is always written)")
    if "wandb" in self.loggers and (not isinstance(self.wandb_project, str)
                                    or not self.wandb_project):
      fail("run", "wandb_project", self.wandb_project, "the wandb logger needs a project name")
