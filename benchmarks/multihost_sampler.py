"""One engine over 2 CPU processes vs one process holding the same devices.

  .venv/bin/python benchmarks/multihost_sampler.py [--devices 8 --slots 8 --episodes 32
      --new 64 --hidden 256 --layers 4 --repeats 2]

Both sides run the same paged engine (`--slots` slots, steps_per_call 8, no stop
tokens, so every episode samples `--new` tokens) on a mesh fsdp=-1 x tensor=2 over
`--devices` CPU devices, through the same calls (`workload`): `--episodes` prompts
of 16 tokens, submitted while slots free up, stepped with dispatch/complete until
all finished. "one_process": one process holding all `--devices` devices. "two_processes":
two processes holding half each, joined by jax.distributed (gloo collectives),
process 0 leading a `multihost.LeaderEngine` and process 1 replaying its calls
(`multihost.follow`). Each side runs in subprocesses of its own, one after the
other; compilation (warmup) is excluded, and the best of `--repeats` timed runs
is kept.

Keys: `tokens_per_s_one_process`, `tokens_per_s_two_processes` (sampled tokens /
wall seconds of the workload on the leader), `two_over_one` (their ratio: the
cost of spanning processes, broadcast and gloo collectives together),
`broadcast_ms_per_step` (the leader's seconds writing engine messages to the
runtime's key-value store, per engine step) and `broadcast_share` (those seconds
over the workload's wall time). On one machine the two processes share its cores:
the ratio is an upper bound on the broadcast's cost and a lower bound on a real
pod's (whose collectives cross hosts, over ICI or DCN). The last line is
`RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

PROMPT_TOKENS, VOCAB = 16, 512


def model(args):
  from sao_jax.config import ModelConfig

  return ModelConfig(vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=args.hidden * 2,
                     num_hidden_layers=args.layers, head_dim=32,
                     num_attention_heads=args.hidden // 32, num_key_value_heads=2)


def sampler(args):
  from sao_jax.config.sampler import SamplerConfig

  return SamplerConfig(kv_layout="paged", slots=args.slots, max_seq_len=PROMPT_TOKENS + args.new + 8,
                       prefill_buckets=(PROMPT_TOKENS,), steps_per_call=8, max_new_tokens=args.new,
                       kv_page_size=8, stop_tokens=(), stop_patterns=(), sharded=True)


def engine(args, mesh):
  import jax

  from sao_jax.models import transformer
  from sao_jax.sampler.paged_engine import PagedEngine

  cfg = model(args)
  return PagedEngine(sampler(args), cfg, transformer.init_params(cfg, jax.random.key(0)),
                     mesh=mesh)


def workload(eng, args, first_id: int) -> tuple[int, int]:
  """Runs `--episodes` episodes to the end; (sampled tokens, engine steps)."""
  import numpy as np

  rng = np.random.default_rng(0)
  todo = list(range(first_id, first_id + args.episodes))
  running, tokens, steps = 0, 0, 0
  while todo or running:
    while todo and running < args.slots:
      episode = todo.pop(0)
      eng.submit(episode, rng.integers(0, VOCAB, PROMPT_TOKENS), seed=episode)
      running += 1
    for turn in eng.complete(eng.dispatch()):
      tokens += eng.finish(turn.episode_id).action_mask.sum()
      running -= 1
    steps += 1
  return int(tokens), steps


def role(args) -> None:
  """One process of a side (`--role one|lead|follow`); process 0 writes its timings."""
  import jax

  jax.config.update("jax_platforms", "cpu")
  processes = 1 if args.role == "one" else 2
  jax.config.update("jax_num_cpu_devices", args.devices // processes)
  from sao_jax.config import MeshConfig
  from sao_jax.sampler import multihost
  from sao_jax.sharding import distributed
  from sao_jax.sharding.mesh import make_mesh

  if processes > 1:
    distributed.join(args.address, 2, int(args.role == "follow"), heartbeat_s=120)
  eng = engine(args, make_mesh(MeshConfig(fsdp=-1, tensor=2), jax.devices()))
  if args.role == "follow":
    multihost.follow(eng, multihost.Group(timeout_s=600), params_for=lambda v: None)
    return
  if args.role == "lead":
    eng = multihost.LeaderEngine(eng, multihost.Group(timeout_s=600))
  eng.warmup()
  runs = []
  for repeat in range(args.repeats + 1):  # the first run is a warm-up
    sent = getattr(eng, "broadcast_s", 0.0)
    start = time.perf_counter()
    tokens, steps = workload(eng, args, first_id=repeat * args.episodes)
    runs.append({"seconds": time.perf_counter() - start, "tokens": tokens, "steps": steps,
                 "broadcast_s": getattr(eng, "broadcast_s", 0.0) - sent})
  if args.role == "lead":
    eng.close()
  pathlib.Path(args.out).write_text(json.dumps(min(runs[1:], key=lambda r: r["seconds"])))


def side(args, roles: list[str], out: pathlib.Path) -> dict:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
           if k in ("devices", "slots", "episodes", "new", "hidden", "layers", "repeats")]
  processes = [subprocess.Popen([sys.executable, __file__, *flags, f"--role={r}",
                                 f"--address={address}", f"--out={out}"], env=env)
               for r in roles]
  codes = [p.wait() for p in processes]
  if any(codes):
    raise SystemExit(f"{roles} exited {codes}")
  return json.loads(out.read_text())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--slots", type=int, default=8)
  parser.add_argument("--episodes", type=int, default=32)
  parser.add_argument("--new", type=int, default=64)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--role", choices=("one", "lead", "follow"), help=argparse.SUPPRESS)
  parser.add_argument("--address", help=argparse.SUPPRESS)
  parser.add_argument("--out", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.role:
    role(args)
    return
  with tempfile.TemporaryDirectory() as tmp:
    one = side(args, ["one"], pathlib.Path(tmp) / "one.json")
    two = side(args, ["lead", "follow"], pathlib.Path(tmp) / "two.json")
  rate = lambda r: r["tokens"] / r["seconds"]
  result = {
      "tokens_per_s_one_process": round(rate(one), 1),
      "tokens_per_s_two_processes": round(rate(two), 1),
      "two_over_one": round(rate(two) / rate(one), 3),
      "broadcast_ms_per_step": round(1e3 * two["broadcast_s"] / two["steps"], 3),
      "broadcast_share": round(two["broadcast_s"] / two["seconds"], 4),
      "steps": two["steps"], "tokens": two["tokens"], "devices": args.devices,
      "cpus": os.cpu_count()}
  print(f"one process x {args.devices} devices: {result['tokens_per_s_one_process']} tokens/s; "
        f"two processes x {args.devices // 2}: {result['tokens_per_s_two_processes']} tokens/s "
        f"(x{result['two_over_one']}); broadcast {result['broadcast_ms_per_step']} ms per step")
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
