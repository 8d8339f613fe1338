"""experiments.drift.sampled_entropy is a function of the checkpoint alone (issue #48).

The drift route test (tests/cli/test_sanity_learns.py) compares two checkpoints'
entropies for exact equality; it failed by 1.2e-7 (0.92069405 vs 0.92069417) on
bit-identical policies because the measurement followed the machine's timing: with
environment steps overlapping decoding, the order episodes finished in (the float32
sum's order) and which of them prefilled or shared prompt pages together (the last
bits of a log-prob) changed from run to run. Here the sanity environment's steps
sleep in a different pattern per run, as a loaded machine would make them, and neither
the episodes measured nor the entropy may change in any bit.
"""

import importlib.util
import pathlib
import random
import time

import jax
import numpy as np
import pytest

from experiments import drift
from sao_jax.chat import chat_format
from sao_jax.config.loading import apply_overrides
from sao_jax.envs import sanity
from sao_jax.jobs import evaluate
from sao_jax.models import transformer
from sao_jax.models.tokenizer import train_tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_SLEEP_S = 0.02
SANITY_STEP = sanity.SanityEnv._step


def drift_config():
  """The drift study's setting (replies of up to 4 tokens) on the sanity model."""
  spec = importlib.util.spec_from_file_location("sanity_cpu", ROOT / "configs" / "sanity_cpu.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return apply_overrides(module.sanity_config("sao"), list(drift.SETTING))


@pytest.fixture
def checkpoint(monkeypatch):
  """`evaluate.checkpoint_policy` answering with a random policy over a tokenizer of the
  sanity task's words, as a checkpoint of the run would (the policy, not its origin,
  is what the measurement reads)."""
  cfg = drift_config()
  text = [f"{sanity.SYSTEM_PROMPT} Answer with the word {w}. {' '.join(sanity.WORDS)}"
          for w in sanity.WORDS]
  chat = chat_format(None, train_tokenizer(text * 4, vocab_size=cfg.model.vocab_size))
  params = transformer.init_params(cfg.model, jax.random.key(1))
  monkeypatch.setattr(evaluate, "checkpoint_policy",
                      lambda cfg: (cfg, None, chat, params, {"policy_version": 1}))
  return cfg


def sleepy_steps(monkeypatch, salt):
  """Each sanity step sleeps a time drawn from (salt, task) first; salt None: no sleep."""
  def sleepy(self, action):
    if salt is not None:
      time.sleep(random.Random(f"{salt}/{self.task.id}").random() * MAX_SLEEP_S)
    return SANITY_STEP(self, action)

  monkeypatch.setattr(sanity.SanityEnv, "_step", sleepy)


def test_the_measured_entropy_does_not_depend_on_the_environments_timing(checkpoint,
                                                                         monkeypatch):
  """The episodes the measurement reads (spied on where it runs them) come in the same
  order with the same tokens and log-probs to the bit, so the entropy is one value. A
  float32 mean only sometimes shows a changed order; the episodes always do."""
  run, episodes = evaluate.run_to_completion, []

  def spied(*args, **kwargs):
    episodes.append(run(*args, **kwargs))
    return episodes[-1]

  monkeypatch.setattr(evaluate, "run_to_completion", spied)
  measured = {}
  for salt in (None, 1, 2):
    sleepy_steps(monkeypatch, salt)
    measured[salt] = drift.sampled_entropy(checkpoint)
  reference = episodes[0]
  assert len(reference) == 64
  for salt, got in zip((1, 2), episodes[1:]):
    assert [t.info["episode"] for t in got] == [t.info["episode"] for t in reference], salt
    for traj, want in zip(got, reference):
      assert np.array_equal(traj.tokens, want.tokens), (salt, traj.info["episode"])
      assert np.array_equal(traj.behavior_logp, want.behavior_logp), (salt, traj.info["episode"])
  assert len(set(measured.values())) == 1, measured
  assert 1.0 < measured[None] < 6.0  # a random policy over 384 tokens: near ln 384 = 5.95
