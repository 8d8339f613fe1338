"""The opening probe's arithmetic: the forced tokens become actions, and its bias
column is the lambda-weighted critic error along the path (module docstring)."""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import opening_probe
from sao_jax import config as C
from sao_jax.learner import state as state_lib
from sao_jax.types import Trajectory

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = C.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, logits_chunk=8)


def traj(seed: int, prompt: int, turns: tuple[int, ...], outcome: float) -> Trajectory:
  """`prompt` tokens, then action turns separated by 2 observation tokens."""
  rng = np.random.default_rng(seed)
  mask = [0] * prompt
  for i, n in enumerate(turns):
    mask += ([0, 0] if i else []) + [1] * n
  mask = np.array(mask, np.int8)
  rewards = np.zeros(mask.size, np.float32)
  rewards[np.flatnonzero(mask)[-1]] = outcome
  return Trajectory(rng.integers(0, 64, mask.size).astype(np.int32), mask,
                    np.zeros(mask.size, np.float32), rewards, 0, (0, 0))


def test_forced_tokens_before_the_first_action_become_actions():
  t = traj(0, 6, (3,), 1.0)
  forced = opening_probe._with_forced_actions(t, 2)
  np.testing.assert_array_equal(forced.action_mask, [0, 0, 0, 0, 1, 1, 1, 1, 1])
  assert forced.outcome == 1.0


def sao_state_and_trajectories(seed: int):
  """A tiny SAO config, its initial state (critic seeded by `seed`) and three
  trajectories of one, two and three turns, failed or not."""
  cfg = C.Config(model=MODEL, algorithm=C.AlgorithmConfig.for_variant("sao"),
                 learner=C.LearnerConfig(batch_trajectories=4)).validate()
  state = state_lib.init_state(cfg, jax.random.key(seed))
  return cfg, state, [traj(1, 4, (5,), 1.0), traj(2, 3, (2, 4), 0.0), traj(3, 5, (3, 1, 2), 1.0)]


def test_bias_is_the_lambda_weighted_critic_error_along_the_path():
  cfg, state, trajs = sao_state_and_trajectories(0)
  got = opening_probe.opening_advantages(cfg, state, trajs)
  from sao_jax.models.forward import value_forward
  forward = jax.jit(lambda params, tokens: value_forward(params, cfg.model, tokens,
                                                        jnp.ones(tokens.shape, jnp.int32)))
  for i, t in enumerate(trajs):
    values = np.asarray(forward(state.value_params, t.tokens[None]))[0]
    v = values[t.action_mask.astype(bool)]  # V_k over the action tokens, k = 0..K-1
    lam = 1 - 1 / (cfg.algorithm.lam_alpha * v.size)  # docs/algorithm.md §3
    g = t.outcome
    want = (1 - lam) * sum(lam ** (k - 1) * (v[k] - g) for k in range(1, v.size))
    np.testing.assert_allclose(got["a_gae"][i] - got["a_mc"][i], want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["a_mc"][i], g - v[0], rtol=1e-5)
    assert got["g"][i] == g


@pytest.mark.slow
def test_the_probe_runs_on_a_checkpoint_of_a_quick_run(tmp_path):
  """End to end: a 4-step tool-math SAO run (10 SFT steps), then the probe on its
  last checkpoint prints a table per path and a RESULT line."""
  from experiments import runner
  sets = [*runner.quick_overrides("tool_math"), f"run.run_dir={tmp_path / 'run'}"]
  config = runner.setting_path("tool_math")
  train = subprocess.run([sys.executable, "-m", "sao_jax.cli.train", "--config", str(config),
                          *[a for s in sets for a in ("--set", s)]],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
  assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-2000:]
  probe = subprocess.run([sys.executable, "-m", "experiments.opening_probe", "--config",
                          str(config), *[a for s in sets for a in ("--set", s)],
                          "--steps", "4", "--episodes", "4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
  assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-2000:]
  result = json.loads(probe.stdout.split("RESULT ", 1)[1])
  (step,) = result["results"]
  assert step["step"] == 4 and step["paths"]["forced opening"]["episodes"] == 4
  assert sum(p["episodes"] for name, p in step["paths"].items() if name != "forced opening") == 4
  assert "| forced opening | 4 |" in probe.stdout
  assert step["left_out"] == {"natural": {"env_failure": 0, "no_action": 0},
                              "forced opening": {"env_failure": 0, "no_action": 0}}


def test_episodes_left_out_are_counted_and_a_path_with_none_left_is_an_error():
  import dataclasses
  ok, failed = traj(1, 4, (5,), 1.0), dataclasses.replace(traj(2, 3, (2,), 0.0),
                                                           env_failure="TypeError: prompt()")
  silent = dataclasses.replace(ok, action_mask=np.zeros_like(ok.action_mask))
  kept, left_out = opening_probe._probed([ok, failed, silent], "natural")
  assert kept == [ok] and left_out == {"env_failure": 1, "no_action": 1}
  with pytest.raises(RuntimeError, match=r"none of the 2 forced episodes.*TypeError: prompt\(\)"):
    opening_probe._probed([failed, failed], "forced")


def test_turn_advantages_group_each_turns_tokens_by_outcome():
  cfg, state, trajs = sao_state_and_trajectories(1)
  got = opening_probe.turn_advantages(cfg, state, trajs)
  _, _, adv = opening_probe._values_and_advantages(cfg, state, trajs)
  # Walk each row: the k-th run of action tokens is turn k.
  by_turn = {}
  for i, t in enumerate(trajs):
    k, previous = 0, 0
    for j, m in enumerate(t.action_mask):
      k += bool(m and not previous)
      previous = m
      if m:
        by_turn.setdefault((k, t.outcome > 0), []).append(adv[i, j])
  assert set(got) == {"turn 1", "turn 2", "turn 3"}
  np.testing.assert_allclose(got["turn 2"]["success"], np.mean(by_turn[(2, True)]), rtol=1e-4)
  np.testing.assert_allclose(got["turn 1"]["failure"], np.mean(by_turn[(1, False)]), rtol=1e-4)
  np.testing.assert_allclose(got["turn 1"]["all"],
                             np.mean(by_turn[(1, True)] + by_turn[(1, False)]), rtol=1e-4)
  assert got["turn 3"]["failure_tokens"] == 0 and np.isnan(got["turn 3"]["failure"])
  assert got["turn 1"]["success_tokens"] == 5 + 3 and got["turn 2"]["all_tokens"] == 4 + 1
