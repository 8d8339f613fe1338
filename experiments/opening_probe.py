"""Does the critic steer the path choice? The learner's advantage at an episode's
opening token, per path, against what each path really earns.

    .venv/bin/python -m experiments.opening_probe --config configs/experiments/stability.py \
        --set run.run_dir=RUN [--set ...] --steps 100,200 [--episodes 128] \
        [--opening "The program prints"]

For each checkpoint step of the run (policy and critic as the learner had them)
it samples `--episodes` episodes of the run's environment at the run's sampler
settings twice, on the same tasks: as the policy plays them ("natural"), and
with the first assistant turn forced to open with `--opening` ("forced"; the
math_tool warm-starts' second-turn text, which the collapsed SAO runs of claim 6
learned to write in the first turn instead of calling the tool). The forced
tokens count as action tokens, as if the policy had sampled them. It then runs
the learner's own value forward and advantage estimator (`learner.step`, without
batch-mean centring, which shifts every token alike) and reports per path the
share of episodes that ran a tool and:

  A_gae   the advantage on the opening token, what the policy gradient sees
  A_mc    G - V_open: the same with lambda = 1 (no bootstrapping); V_open =
          V(prompt) is the same for both paths, so A_mc ranks them as G does
  bias    A_gae - A_mc = (1 - lam) * sum_k lam^(k-1) (V_k - G) for gamma = 1
          and a terminal reward: the lambda-weighted critic error along the path

The policy gradient favours a path at its opening when its A_gae is higher; an
unbiased estimator ranks the paths by their rewards G. A path whose A_gae beats
another's while its G is lower is chosen by the critic's error, not the reward.
A second table gives the natural tool episodes' mean advantage per token of each
turn, over successes, failures and all (`turn_advantages`). Prints both tables
per step and one line `RESULT {...}`.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments import stats
from sao_jax.chat import load_chat
from sao_jax.config import load_config
from sao_jax.data.pipeline import pad_batch
from sao_jax.envs.registry import make_env, make_tasks
from sao_jax.jobs import startup
from sao_jax.jobs.evaluate import restore_state
from sao_jax.learner import step as step_lib
from sao_jax.learner.state import policy_weights
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion
from sao_jax.types import Trajectory


class _ForcedOpening:
  """A chat format whose first-turn prompt ends with `opening`'s tokens."""

  def __init__(self, chat, opening: str):
    self._chat = chat
    self.opening_ids = np.asarray(chat.tokenizer.encode(opening, add_special_tokens=False).ids,
                                  np.int32)

  def __getattr__(self, name):
    return getattr(self._chat, name)

  def prompt(self, messages, *, tools=None) -> np.ndarray:
    return np.concatenate([self._chat.prompt(messages, tools=tools), self.opening_ids])


def _play(cfg, chat, params, version: int, tasks, seed: int, path: str
          ) -> tuple[list[Trajectory], dict[str, int]]:
  """The episodes of `tasks` that can be probed, and how many were left out and why:
  "env_failure" (the environment failed: no outcome) and "no_action" (no action token
  to take an advantage at). A path none of whose episodes can be probed is an error
  naming the first failure, never an empty row (a broken forced chat once made every
  forced episode fail, and the probe reported no forced path without a word)."""
  engine = make_engine(cfg.sampler, cfg.model, params, chat, version=version)
  engine.warmup()
  runner = EpisodeRunner(engine, chat, lambda: make_env(cfg.env), max_episodes=cfg.sampler.slots,
                         env_threads=cfg.sampler.num_env_threads())
  trajs = run_to_completion(runner, iter(tasks), len(tasks),
                            num_slots=cfg.algorithm.running_mean_slots, seed=seed)
  return _probed(trajs, path)


def _probed(trajs: list[Trajectory], path: str) -> tuple[list[Trajectory], dict[str, int]]:
  """`_play`'s selection (its docstring)."""
  failed = [t for t in trajs if t.env_failure is not None]
  silent = [t for t in trajs if t.env_failure is None and not t.action_mask.any()]
  kept = [t for t in trajs if t.env_failure is None and t.action_mask.any()]
  if trajs and not kept:
    first = failed[0].env_failure if failed else "no action token in any episode"
    raise RuntimeError(f"opening probe: none of the {len(trajs)} {path} episodes can be "
                       f"probed ({len(failed)} failed, {len(silent)} without an action "
                       f"token); the first failure: {first}")
  return kept, {"env_failure": len(failed), "no_action": len(silent)}


def _with_forced_actions(traj: Trajectory, forced: int) -> Trajectory:
  """`traj` with the `forced` prompt tokens before its first action token as actions."""
  first = int(np.argmax(traj.action_mask))
  mask = traj.action_mask.copy()
  mask[first - forced:first] = 1
  return dataclasses.replace(traj, action_mask=mask)


def _values_and_advantages(cfg, state, trajs: list[Trajectory]):
  """(batch, V, A) of `trajs` as the learner computes them (no centring), one row each."""
  cfg = dataclasses.replace(
      cfg, algorithm=dataclasses.replace(cfg.algorithm, advantage_centering="none"),
      learner=dataclasses.replace(cfg.learner, micro_batches=1))
  length = max(t.length for t in trajs)
  batch = jax.tree.map(jnp.asarray, pad_batch(trajs, len(trajs), length, cfg.data.pad_id))

  @jax.jit
  def values_and_advantages(value_params, baseline, batch):
    values = step_lib._values(cfg.model, cfg.learner.micro_batches, value_params, batch)
    return values, step_lib.advantages(cfg.algorithm, batch, values, baseline)[0]

  values, adv = values_and_advantages(state.value_params, state.baseline, batch)
  return batch, np.asarray(values), np.asarray(adv)


def opening_advantages(cfg, state, trajs: list[Trajectory]) -> dict[str, np.ndarray]:
  """Per trajectory: A_gae and A_mc on the opening token, the outcome G, and whether
  a tool ran."""
  batch, values, adv = _values_and_advantages(cfg, state, trajs)
  first = np.argmax(np.asarray(batch.action_mask), axis=1)
  rows = np.arange(len(trajs))
  outcome = np.array([t.outcome for t in trajs])
  return {"a_gae": adv[rows, first], "a_mc": outcome - values[rows, first], "g": outcome,
          "tool": np.array([t.info.get("tool_calls", 0) > 0 for t in trajs], np.float64)}


def turn_advantages(cfg, state, trajs: list[Trajectory]) -> dict[str, dict[str, float]]:
  """Mean advantage per action token of each assistant turn (turn k = the k-th run of
  action tokens), over successful (G > 0) and failed episodes and over all, with the
  token counts. A turn whose text recurs elsewhere (an answer template) is pushed up
  there too when its all-episode mean is above 0; GRPO's one advantage per episode
  gives text that successes and failures share a mean of about 0."""
  batch, _, adv = _values_and_advantages(cfg, state, trajs)
  action = np.asarray(batch.action_mask).astype(bool)
  after_action = np.pad(action[:, :-1], ((0, 0), (1, 0)))
  turn = np.cumsum(action & ~after_action, axis=1) * action
  success = np.array([t.outcome > 0 for t in trajs])[:, None]
  out = {}
  for k in range(1, int(turn.max()) + 1):
    for name, rows in (("success", success), ("failure", ~success), ("all", True)):
      tokens = (turn == k) & rows
      out.setdefault(f"turn {k}", {})[name] = (
          float(adv[tokens].mean()) if tokens.any() else float("nan"))
      out[f"turn {k}"][name + "_tokens"] = int(tokens.sum())
  return out


def _summary(per: dict[str, np.ndarray]) -> dict[str, float]:
  """Mean and 95% half-width (NaN for one episode) of each quantity over the episodes."""
  out = {"episodes": int(per["g"].size)}
  for key, values in (("tool", per["tool"]), ("g", per["g"]), ("a_gae", per["a_gae"]),
                      ("a_mc", per["a_mc"]), ("bias", per["a_gae"] - per["a_mc"])):
    summary = stats.summarize(values)
    out[key], out[key + "_ci"] = round(summary.mean, 4), round(summary.half_width, 4)
  return out


def probe(cfg, step: int | None, episodes: int, opening: str, seed: int) -> dict:
  chat = load_chat(cfg.run.tokenizer_file, enable_thinking=cfg.run.enable_thinking)
  state, meta = restore_state(cfg, step)
  params, version = policy_weights(cfg, state), int(state.policy_version)
  tasks = list(itertools.islice(make_tasks(dataclasses.replace(cfg.env, seed=seed)), episodes))
  natural, natural_left_out = _play(cfg, chat, params, version, tasks, seed, "natural")
  forced_chat = _ForcedOpening(chat, opening)
  forced, forced_left_out = _play(cfg, forced_chat, params, version, tasks, seed, "forced")
  forced = [_with_forced_actions(t, forced_chat.opening_ids.size) for t in forced]
  paths = {"natural, tool": [t for t in natural if t.info.get("tool_calls", 0) > 0],
           "natural, no tool": [t for t in natural if t.info.get("tool_calls", 0) == 0],
           "forced opening": forced}
  return {"step": meta["step"], "paths": {
      name: _summary(opening_advantages(cfg, state, trajs)) for name, trajs in paths.items()
      if trajs}, "turns": turn_advantages(cfg, state, paths["natural, tool"] or natural),
      "left_out": {"natural": natural_left_out, "forced opening": forced_left_out}}


def _table(result: dict) -> str:
  lines = [f"step {result['step']}",
           "| path | episodes | ran a tool | G | A_gae | A_mc | bias |",
           "|---|---|---|---|---|---|---|"]
  for name, s in result["paths"].items():
    cell = lambda k: stats.Summary(s[k], s[k + "_ci"], s["episodes"]).format()
    lines.append(f"| {name} | {s['episodes']} | {s['tool']:.2f} | {cell('g')} | {cell('a_gae')} | "
                 f"{cell('a_mc')} | {cell('bias')} |")
  lines += ["", "Left out (not probed): " + "; ".join(
      f"{path} {n['env_failure']} failed, {n['no_action']} without an action token"
      for path, n in result["left_out"].items())]
  lines += ["", "Mean advantage per action token of natural tool episodes, by turn:", "",
            "| turn | success (tokens) | failure (tokens) | all (tokens) |", "|---|---|---|---|"]
  for turn, t in result["turns"].items():
    lines.append(f"| {turn} | " + " | ".join(f"{t[k]:+.3f} ({t[k + '_tokens']})"
                                            for k in ("success", "failure", "all")) + " |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="the run's config file")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="the run's overrides (run.run_dir at least)")
  parser.add_argument("--steps", default="", help="checkpoint steps, comma-separated "
                      "(default: the latest)")
  parser.add_argument("--episodes", type=int, default=128)
  parser.add_argument("--opening", default="The program prints")
  parser.add_argument("--seed", type=int, default=7_000_000, help="task stream seed")
  args = parser.parse_args(argv)
  if args.episodes < 2:
    parser.error(f"--episodes {args.episodes}: at least 2 give a confidence interval")
  cfg = startup.check(load_config(args.config, args.set).with_run_paths())
  steps = [int(s) for s in args.steps.split(",") if s] or [None]
  results = [probe(cfg, step, args.episodes, args.opening, args.seed) for step in steps]
  for result in results:
    print(_table(result), flush=True)
  print("RESULT " + json.dumps({"name": "opening_probe", "results": results}))


if __name__ == "__main__":
  main()
