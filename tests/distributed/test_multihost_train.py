"""`sao-train` as a 2-process learner cluster plus one `sao-sampler`, all on CPU.

The real command-line path: the learner's hosts join one JAX cluster from the
SAO_* environment (gloo CPU collectives), start no samplers (`run.num_samplers=0`),
publish weights over the network channel or a shared directory (each host
signing its shards there) and read their own shares of the
directory transport; `sao-sampler` adopts the weights and writes trajectories.
Both learner hosts must run the same steps on the same global batches: their
per-step learner metrics (computed from the global params and batch) must agree
exactly, and the shared checkpoint must hold the final step. The hosts split
the sampler's records by record index (even/odd), so the first
`steps x batch_trajectories` records must be consumed, each exactly once, and
every later one left unread.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "demo_cpu.py")
STEPS = 3
MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
         "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.vocab_size=384"]


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def device_metrics(run_dir: pathlib.Path) -> list[dict]:
  """Per-step metrics of the train step itself (not the host's data metrics)."""
  rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  host = ("staleness/", "batch/", "dropped/", "time/", "perf/", "episodes/", "learner/",
          "data/", "groups/")  # learner/: each host's own wait for data (run.timing)
  # NaN (an undefined metric, e.g. mismatch/lag0_abs_logp without lag-0 tokens)
  # as text, so that equal rows compare equal.
  return [{k: "nan" if v != v else v for k, v in row.items()
           if k != "time" and not k.startswith(host)}
          for row in rows if "loss/value" in row or "reward/mean" in row]


@pytest.mark.slow  # three JAX processes on 2 cores, a train step compiled per learner host
@pytest.mark.parametrize("channel", ["network", "directory"])
def test_two_process_learner_and_remote_sampler(tmp_path, channel):
  from sao_jax.config import load_config
  from sao_jax.run import bootstrap

  tokenizer = tmp_path / "tokenizer"  # shared by all three: written as that run's own copy
  bootstrap.prepare_chat(load_config(CONFIG, MODEL + [f"run.run_dir={tokenizer}"]))
  ports = [free_port() for _ in range(2)]
  secret = tmp_path / "weights.secret"  # what `head -c 32 /dev/urandom > weights.secret` makes
  secret.write_bytes(os.urandom(32))
  common = MODEL + [
      f"run.tokenizer={tokenizer / 'tokenizer.json'}", "run.num_samplers=0", "run.eval_every=0",
      "run.sft_steps=0", f"learner.steps={STEPS}", "learner.batch_trajectories=4",
      "learner.critic_warmup_steps=1", "sampler.slots=4", "sampler.max_new_tokens=24",
      "data.transport=directory", f"data.transport_dir={tmp_path / 'trajectories'}",
      f"sampler.weights_secret_file={secret}",
      *([f"sampler.weights_dir={tmp_path / 'weights'}"] if channel == "directory" else [
          f"sampler.weights_addresses={tuple(f'127.0.0.1:{p}' for p in ports)}"]),
      f"sampler.weights={channel}",
      f"checkpoint.directory={tmp_path / 'checkpoints'}", "checkpoint.save_every_steps=2"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "SAO_NUM_PROCESSES": "2",
         "SAO_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}"}
  processes, logs = {}, {}

  def start(name, module, overrides, **extra):
    logs[name] = tmp_path / f"{name}.log"
    args = [sys.executable, "-m", module, "--config", CONFIG]
    args += [a for o in common + overrides for a in ("--set", o)]
    processes[name] = subprocess.Popen(args, stdout=logs[name].open("w"),
                                       stderr=subprocess.STDOUT, env={**env, **extra})

  def report() -> str:
    return "\n".join(f"--- {n} (exit {p.poll()}):\n{logs[n].read_text()[-3000:]}"
                     for n, p in processes.items())

  try:
    start("sampler", "sao_jax.cli.sampler", [])
    for i in range(2):
      start(f"learner{i}", "sao_jax.cli.train",
            [f"run.run_dir={tmp_path / f'run{i}'}", f"sampler.weights_port={ports[i]}"],
            SAO_PROCESS_ID=str(i))
    deadline = time.monotonic() + 600
    for name in ("learner0", "learner1", "sampler"):  # the sampler exits when the run closes
      while processes[name].poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
      assert processes[name].poll() == 0, report()
  finally:
    for process in processes.values():
      if process.poll() is None:
        process.kill()
        process.wait()

  summaries = [json.loads((tmp_path / f"run{i}" / "summary.json").read_text()) for i in range(2)]
  assert [s["steps_done"] for s in summaries] == [STEPS, STEPS], summaries
  assert {s["stopped_by"] for s in summaries} == {"steps"}
  metrics = [device_metrics(tmp_path / f"run{i}") for i in range(2)]
  assert [m["step"] for m in metrics[0]] == list(range(STEPS)), metrics[0]
  assert metrics[0] == metrics[1], "the learner hosts disagree on the steps they ran"
  saved = {int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()}
  assert max(saved) == STEPS
  assert "closed the transport" in logs["sampler"].read_text()
  assert [s["dropped"] for s in summaries] == [{}, {}], summaries
  # One sampler worker, one writer: records are numbered 0, 1, ... in write order.
  left = sorted(int(p.name.split(".p")[0].rpartition("-")[2])
                for p in (tmp_path / "trajectories").glob("*.traj"))
  consumed = STEPS * 4
  assert left and left == list(range(consumed, consumed + len(left))), left
  if channel == "directory":  # every kept version signed by both hosts, and its head
    kept = sorted(int(p.name) for p in (tmp_path / "weights").iterdir() if p.name.isdigit())
    signed = sorted(p.name for p in (tmp_path / "weights" / "signatures").iterdir())
    assert kept and signed == sorted(f"{v}.{n}" for v in kept for n in ("0", "1", "head"))
