"""Kill and relaunch: a `sao-train --resume auto` run SIGKILLed mid-step (learner and
samplers, as a preempted VM loses them) and started again with the exact same
command line ends at the requested step, each step trained and logged once."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from sao_jax.models import tokenizer as tokenizer_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 4


def _command(run_dir, tokenizer):
  overrides = [
      "model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
      "model.vocab_size=384", "learner.batch_trajectories=8", "learner.critic_warmup_steps=1",
      f"learner.steps={STEPS}", "checkpoint.save_every_steps=1", "checkpoint.async_save=False",
      "run.sft_steps=0", "run.eval_every=0", "sampler.slots=4", "sampler.max_new_tokens=24",
      f"run.tokenizer={tokenizer}", f"run.run_dir={run_dir}"]
  return [sys.executable, "-u", "-m", "sao_jax.cli.train", "--config",
          str(ROOT / "configs" / "demo_cpu.py"), *[a for o in overrides for a in ("--set", o)],
          "--resume", "auto"]


@pytest.mark.slow  # two launches of a compiled learner and its sampler (minutes on 2 cores)
def test_sigkill_mid_step_then_the_same_command_continues(tmp_path):
  tokenizer = tmp_path / "tokenizer.json"
  tokenizer_lib.train_tokenizer(["What is 2 + 3? \\boxed{5} ```python\nprint(2 + 3)\n```"],
                                384).save(str(tokenizer))
  run_dir = tmp_path / "run"
  command = _command(run_dir, tokenizer)
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
  seen = []
  deadline = time.monotonic() + 900
  for line in first.stdout:  # killed once step 1 is done: in step 2 (or its checkpoint)
    seen.append(line)
    if line.startswith(f"step 2/{STEPS}") or time.monotonic() > deadline:
      os.killpg(first.pid, signal.SIGKILL)  # learner and samplers: the whole VM goes
      break
  first.wait()
  assert first.returncode == -signal.SIGKILL, "".join(seen[-30:])
  second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
  out = second.stdout + second.stderr
  assert second.returncode == 0, out[-3000:]
  assert f"done: {STEPS} steps" in out and "resuming from step" in out, out[-3000:]
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "reward/mean" in r] == list(range(STEPS))
  saved = {int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()}
  assert max(saved) == STEPS
