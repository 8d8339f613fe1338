"""Soak: a short real training run while its peers misbehave.

`sao-train` (the demo config, shrunk) with the directory transport and the
network weight channel, on one machine. During the run a client connects to the
learner's weight channel, sends garbage (an oversized length, nested JSON, a
request without the handshake, random bytes) and disconnects, in a loop; and a
malformed record lands in the transport directory every second (truncated,
garbage, a stray name, a zip bomb). The run must finish its steps with its
sampler never restarted, and its counters must say why data was dropped and
which connections were refused.
"""

import io
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest

from sao_jax.channel import records

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "demo_cpu.py"
STEPS = 4
TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
    "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.vocab_size=384",
    "learner.batch_trajectories=8", "learner.critic_warmup_steps=1", f"learner.steps={STEPS}",
    "run.sft_steps=0", "run.eval_every=0", "sampler.slots=4", "sampler.max_new_tokens=24",
    "checkpoint.save_every_steps=100",
]


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def frame(payload: bytes) -> bytes:
  return len(payload).to_bytes(8, "big") + payload


def zip_bomb() -> bytes:
  """A record archive whose 8M-token arrays (~100 MB) deflate to well under 1 MB."""
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
    for name, dtype in [("meta", np.uint8), ("tokens", np.int32), ("action_mask", np.int8),
                        ("behavior_logp", np.float32), ("rewards", np.float32)]:
      member = io.BytesIO()
      np.lib.format.write_array(member, np.zeros(3 if name == "meta" else 8 << 20, dtype))
      out.writestr(f"{name}.npy", member.getvalue())
  return buffer.getvalue()


def garbage_client(port: int, stop: threading.Event, sent: list) -> None:
  """Connects, sends one kind of garbage, disconnects; again until `stop`."""
  attacks = [(1 << 40).to_bytes(8, "big"),  # "a 1 TiB request follows": oversized
             frame(b"[" * 200 + b"]" * 200),  # nesting: bad_frame
             frame(b"\xff\xfe not JSON"),  # bad_frame
             frame(json.dumps({"op": "get", "version": 0}).encode()),  # no handshake: bad_hello
             os.urandom(64)]
  while not stop.wait(0.1):
    try:
      with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(attacks[len(sent) % len(attacks)])
        sent.append(len(sent) % len(attacks))
    except OSError:
      pass  # not listening yet, or it hung up on us first: both fine


def poison_writer(directory: pathlib.Path, stop: threading.Event, written: list) -> None:
  """Drops a record the learner must not train on into the transport directory every
  second: a well-formed one with a perfect reward but no seal (a forgery), broken ones,
  a stray name, a zip bomb."""
  good = records.to_bytes(records.Trajectory(
      tokens=np.arange(8, dtype=np.int32), action_mask=np.ones(8, np.int8),
      behavior_logp=np.full(8, -1.0, np.float32), rewards=np.ones(8, np.float32),
      prompt_id=0, policy_versions=(0, 0)))
  poisons = [("forged", good), ("truncated", good[:len(good) // 2]),
             ("garbage", os.urandom(4096)), ("stray", good), ("bomb", zip_bomb())]
  while not stop.wait(1.0):
    kind, data = poisons[len(written) % len(poisons)]
    name = f"junk{len(written)}.traj" if kind == "stray" else f"poison-{len(written)}.p0.traj"
    (directory / f"{name}.tmp").write_bytes(data)
    (directory / f"{name}.tmp").rename(directory / name)
    written.append(name)


@pytest.mark.slow  # a real training run (sampler process, learner compile) on 2 cores
def test_training_survives_garbage_peers_and_poisoned_records(tmp_path):
  transport_dir = tmp_path / "trajectories"
  transport_dir.mkdir()
  port = free_port()
  overrides = TINY + [
      f"run.run_dir={tmp_path / 'run'}", "data.transport=directory",
      f"data.transport_dir={transport_dir}", "sampler.weights=network",
      f"sampler.weights_port={port}"]
  stop, sent, written = threading.Event(), [], []
  attackers = [threading.Thread(target=garbage_client, args=(port, stop, sent), daemon=True),
               threading.Thread(target=poison_writer, args=(transport_dir, stop, written),
                                daemon=True)]
  for thread in attackers:
    thread.start()
  log = tmp_path / "train.log"
  args = [sys.executable, "-m", "sao_jax.cli.train", "--config", str(CONFIG)]
  args += [a for o in overrides for a in ("--set", o)]
  try:  # a subprocess, so a hang fails the test instead of stalling the suite
    with log.open("w") as out:
      process = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=1200,
                               env={**os.environ, "JAX_PLATFORMS": "cpu",
                                    "PYTHONUNBUFFERED": "1"})
  finally:
    stop.set()
    for thread in attackers:
      thread.join(timeout=10)
  assert process.returncode == 0, log.read_text()[-3000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())

  assert summary["steps_done"] == STEPS and summary["stopped_by"] == "steps", summary
  assert summary["sampler_restarts"] == 0, summary
  assert len(sent) > 20 and len(written) >= 4, (len(sent), written)
  errors = summary["weight_channel_errors"]
  assert {"oversized", "bad_frame", "bad_hello"} <= set(errors), errors
  quarantined = {p.name for p in (transport_dir / "quarantine").iterdir()}
  left = {p.name for p in transport_dir.glob("*.traj")}
  for name in written:  # each poison is quarantined, or was still unread when the run ended
    assert name in left or any(q.startswith(name + ".") for q in quarantined), name
  dropped = {k: v for k, v in summary["dropped"].items() if k.startswith("quarantined_")}
  assert dropped and set(dropped) <= {
      "quarantined_bad_signature", "quarantined_bad_name", "quarantined_oversized",
      "quarantined_earlier_run"}, summary["dropped"]  # the last: written before it started
  assert "quarantined_bad_signature" in dropped, summary["dropped"]
  assert sum(dropped.values()) == len(quarantined)
  metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  rows = [json.loads(line) for line in metrics]
  last = [r for r in rows if "reward/mean" in r][-1]
  assert any(k.startswith("dropped/quarantined_") for k in last), last
  assert any(k.startswith("weights/errors/") for k in last), last
