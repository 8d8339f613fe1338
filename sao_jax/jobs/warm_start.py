"""SFT warm-start: from an initial policy to one that already plays the environment.

    chat = prepare_chat(cfg)                       # sao_jax.run.bootstrap
    policy    = initial_policy(cfg)                # sao_jax.run.bootstrap
    policy, record = sft_warm_start(cfg, chat, policy, demonstrations(cfg, chat))

Demonstrations are the environment's scripted ideal turns
(`sao_jax.envs.registry.demonstration`), played through the environment so the
transcripts carry its real observations, their tool calls written in the format
the run's episodes are parsed in (`sao_jax.chat.tool_calls`); they are encoded turn by turn in the
run's chat format (`sao_jax.chat`), exactly as the sampler builds episodes. SFT minimises the next-token loss on
action tokens only (`sao_jax.learner.sft`); with `run.sft_target_accuracy` it
stops at the first validation check that reaches the target. `sao-train` and
`experiments.warm_start` both warm-start through here.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

import jax
import tqdm

from sao_jax.chat import ChatFormat
from sao_jax.config import Config
from sao_jax.data import pipeline
from sao_jax.jobs.evaluate import Evaluator
from sao_jax.learner.sft import train_sft
from sao_jax.models.transformer import Params
from sao_jax.run.bootstrap import Demonstration
from sao_jax.types import Batch, Trajectory

def sft_batches(cfg: Config, chat: ChatFormat,
                demos: Iterator[Demonstration]) -> Iterator[Batch]:
  """`run.sft_batch` demonstration transcripts per batch, rendered with their tools
  as episodes are, padded to the smallest fitting length bucket."""
  length = cfg.data.length_buckets[-1]
  while True:
    rows = []
    for demo in itertools.islice(demos, cfg.run.sft_batch):
      tokens, action = chat.encode(demo.messages, tools=demo.tools or None)
      if tokens.size > length:
        raise ValueError(f"a demonstration has {tokens.size} tokens, more than "
                         f"data.length_buckets[-1]={length}; raise the largest bucket")
      rows.append(Trajectory(tokens=tokens, action_mask=action.astype("int8"),
                             behavior_logp=(action * 0).astype("float32"),
                             rewards=(action * 0).astype("float32"), prompt_id=0,
                             policy_versions=(0, 0)))
    longest = max(t.length for t in rows)
    bucket = next(b for b in cfg.data.length_buckets if b >= longest)
    yield pipeline.pad_batch(rows, cfg.run.sft_batch, bucket, cfg.data.pad_id)


def sft_warm_start(cfg: Config, chat: ChatFormat, policy: Params,
                   demos: Iterator[Demonstration], *,
                   log_metrics=lambda step, metrics: None, log=print) -> tuple[Params, dict]:
  """SFT of `policy` on `demos` (`bootstrap.demonstrations`) as `cfg.run` says;
  returns (policy, record).

  With `run.sft_target_accuracy` > 0, every `run.sft_check_every` steps the
  policy plays `run.sft_validation_episodes` greedy validation episodes (task seed
  `run.eval_seed + 1`, disjoint from the held-out evaluation set) and SFT stops
  at the first check whose accuracy reaches the target (each check is also
  passed to `log_metrics` as `sft/validation_accuracy`). The record holds the
  steps done, the last SFT loss and every (step, validation accuracy) check;
  `reached_target` is False when `run.sft_steps` ran out first (the last check
  is then taken at the end, so the record says where the policy landed).
  """
  run = cfg.run
  losses: list[float] = []
  checks: list[tuple[int, float]] = []
  validator = None

  def validate(steps_done: int, params: Params) -> bool:
    nonlocal validator
    params = jax.device_get(params)
    if validator is None:
      checks_cfg = dataclasses.replace(
          cfg, run=dataclasses.replace(run, eval_episodes=run.sft_validation_episodes))
      validator = Evaluator(checks_cfg, chat, params, seed=run.eval_seed + 1)
    accuracy = validator.evaluate(params, 0)["eval/accuracy"]
    checks.append((steps_done, accuracy))
    log_metrics(steps_done - 1, {"sft/validation_accuracy": accuracy})
    log(f"SFT step {steps_done}: validation accuracy {accuracy:.3f} "
        f"(target {run.sft_target_accuracy:.2f})")
    return accuracy >= run.sft_target_accuracy

  # A progress bar with the latest loss on a terminal; in a log file (stderr not a
  # terminal: the bar is off) a line every `run.sft_check_every` steps instead.
  bar = tqdm.tqdm(total=run.sft_steps, desc="SFT", unit="step", disable=None)

  def log_step(step: int, metrics: dict) -> None:
    losses.append(metrics["sft/loss"])
    log_metrics(step, metrics)
    bar.set_postfix(loss=f"{metrics['sft/loss']:.4f}", refresh=False)
    bar.update(1)
    if bar.disable and (step + 1) % run.sft_check_every == 0:
      log(f"SFT step {step + 1}/{run.sft_steps}: loss {metrics['sft/loss']:.4f}")

  target = run.sft_target_accuracy
  log(f"SFT warm-start: {run.sft_steps} steps on demonstrations"
      + (f", or fewer once validation accuracy reaches {target:.2f}" if target else ""))
  try:
    policy, steps_done = train_sft(
        policy, cfg.model, sft_batches(cfg, chat, demos), steps=run.sft_steps,
        learning_rate=run.sft_lr, log=log_step, stop=validate if target else None,
        check_every=run.sft_check_every)
  finally:
    bar.close()
  record = {"sft_steps": steps_done, "final_sft_loss": losses[-1] if losses else None}
  if target:
    reached = steps_done < run.sft_steps or validate(steps_done, policy)
    if not reached:
      log(f"SFT warm-start: validation accuracy {checks[-1][1]:.3f} after all "
          f"run.sft_steps={run.sft_steps} is below run.sft_target_accuracy={target}; "
          "RL starts from there (raise run.sft_steps to reach the target)")
    record.update(target_accuracy=target, reached_target=reached, validation=checks)
  return policy, record
