"""AOT plans of the pod configs: memory per chip vs HBM, FLOPs, roofline MFU and tokens/s.

  .venv/bin/python benchmarks/aot_plan.py [--only qwen3_8b_v5p32]

Needs libtpu at the jax version (`pip install "jax[tpu]==<jax version>"`), no TPU:
each config's train step is compiled for its learner topology and the sampler decode
step for one sampler host
with `sao_jax.planning.aot.plan` (see `sao-plan`). Prints each plan's table and
one line per config:

  RESULT {"name": "aot_plan", "config": ..., "topology": ..., "hbm_fraction": ...,
          "estimated_mfu": ..., ...}

`sampler_concurrency_gain`: episodes that fit per sampler host, paged (pages of
sampler.kv_page_size, episodes of sampler.expected_episode_tokens on average, else
seq_len / 8) vs dense, at the dense cache's memory (`aot.paged_decode`);
`paged_decode_gib_per_chip` (configs on the paged engine): its decode call compiled
at that many slots over that memory. `kernel_blocks`: the Pallas kernel's block
sizes the plan compiled into that call (`Plan.kernel_blocks`); `plan_block_sizes_match_run`
is 1 when they are exactly the sizes the engine's decode call gets on a chip of the
sampler topology (`paged_blocks.kernel_blocks` for that chip's device kind and the
config's per-chip shapes: slots, pages per slot, heads over `tensor`). `hbm_fraction`
is the largest program's per-device total over HBM (> 0.95 does not fit);
`estimated_mfu` and `tokens_per_s` are compute-roofline bounds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp

from sao_jax.config import load_config
from sao_jax.models import paged_blocks
from sao_jax.models.paged_mesh import page_shards, pool_head_axis
from sao_jax.planning import aot, hardware

# config -> (learner topology, one sampler host: sao-sampler runs an engine per host)
CONFIGS = {"qwen3_8b_v5p32": ("v5p:2x2x4", "v5p:2x2x1"),
           "qwen3_30b_a3b_v5p128": ("v5p:4x4x4", "v5p:2x2x1")}
ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_kernel_blocks(cfg, sampler_topology: str) -> paged_blocks.KernelBlocks:
  """The sizes the engine's decode call uses on a chip of `sampler_topology`: one query
  per slot of the chip's page shard, the config's page table width, its heads split
  over the sampler mesh's `tensor` as the pool is."""
  model, sampler = cfg.model, cfg.sampler
  devices = hardware.topology_devices(sampler_topology)
  mesh_shape = cfg.sampler_mesh().shape(len(devices))
  head_axis = pool_head_axis(mesh_shape, model.num_key_value_heads)
  tensor = mesh_shape[head_axis] if head_axis else 1
  device = devices[0]
  dtype = jnp.dtype(model.compute_dtype)
  return paged_blocks.kernel_blocks(paged_blocks.generation_of(device.device_kind),
                                    paged_blocks.KernelShapes(
      page_size=sampler.kv_page_size, pages_per_seq=-(-sampler.max_seq_len // sampler.kv_page_size),
      num_q_tokens=sampler.slots // page_shards(mesh_shape),
      num_q_heads=model.num_attention_heads // tensor,
      num_kv_heads=model.num_key_value_heads // tensor, head_dim=model.head_dim,
      q_dtype=dtype, kv_dtype=dtype))


def plan_one(name: str, topology: str, sampler_topology: str) -> dict:
  cfg = load_config(ROOT / "configs" / f"{name}.py")
  start = time.perf_counter()
  result = aot.plan(cfg, topology, cfg.sampler.max_seq_len, sampler_topology=sampler_topology)
  seconds = time.perf_counter() - start
  print(aot.format_plan(result))
  try:
    aot.check_fits(result)
    print("fits")
  except aot.DoesNotFit as error:
    print(f"DOES NOT FIT: {error}")
  fraction = max(p.memory.total for p in result.programs()) / result.device.hbm_bytes
  run_blocks = run_kernel_blocks(cfg, sampler_topology)
  print(f"kernel blocks: plan {[b.describe() for b in result.kernel_blocks]}, "
        f"run {run_blocks.describe()}")
  return {"name": "aot_plan", "config": name, "topology": topology,
          "sampler_topology": sampler_topology,
          "hbm_fraction": round(fraction, 4), "estimated_mfu": round(result.roofline.mfu, 4),
          "tokens_per_s": round(result.roofline.tokens_per_s),
          "step_seconds": round(result.roofline.step_seconds, 3),
          "train_gib_per_chip": round(result.train.memory.total / 2**30, 2),
          "decode_gib_per_chip": round(result.decode.memory.total / 2**30, 2),
          "decode_ms": round(aot.decode_seconds(result) * 1e3, 3),
          "sampler_concurrency_gain": round(aot.paged_decode(result).episodes
                                            / result.sampler_batch, 3),
          "paged_decode_tokens_per_s": round(aot.paged_decode(result).tokens_per_s),
          "compile_s": round(seconds, 1),
          "kernel_blocks": [list(b) for b in result.kernel_blocks],
          "plan_block_sizes_match_run": int(set(result.kernel_blocks) == {run_blocks}),
          **({"paged_decode_gib_per_chip": round(result.paged_decode.memory.total / 2**30, 2)}
             if result.paged_decode else {})}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=sorted(CONFIGS), default=None)
  args = parser.parse_args()
  jax.config.update("jax_platforms", "cpu")
  for name, (topology, sampler_topology) in CONFIGS.items():
    if args.only in (None, name):
      print(f"RESULT {json.dumps(plan_one(name, topology, sampler_topology))}", flush=True)


if __name__ == "__main__":
  main()
