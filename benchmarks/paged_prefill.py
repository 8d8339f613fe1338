"""Per-chip memory of the paged engine's batched prefill compiled for a TPU host: the
pure-JAX gathered attention vs jax's Pallas ragged paged attention kernel.

  .venv/bin/python benchmarks/paged_prefill.py [--config configs/qwen3_8b_v5p32.py] \
      [--topology v5p:2x2x1] [--tensor 4] [--page 256] [--rows 4] [--chunks 512 8192]

Needs libtpu at the jax version (`pip install "jax[tpu]==<jax version>"`), no TPU.
Compiles `paged_steps.compile_steps(...).prefill` for the config's model on one
sampler host (the config's sampler mesh, `Config.sampler_mesh`, or with `--tensor`
fsdp x tensor over its chips), `--rows` rows (default: the largest
prefill_row_buckets) of each chunk length (default: every prefill bucket) over a
pool of the dense cache's memory (sampler.slots x max_seq_len tokens in pages of
`--page`, default sampler.kv_page_size), once with
sampler.paged_attention="reference" and once with "pallas", and prints both
programs' per-chip bytes, the kernel's block sizes (the ones a TPU of the topology's
generation runs, `sao_jax.models.paged_blocks`; the program is traced on the
topology's devices) (XLA's memory analysis; where the TPU compiler refuses a
program for HBM, the temporaries it says it needs, `*_fits` false) and, per chunk:

  RESULT {"name": "paged_prefill_memory", "config": ..., "chunks": [...],
          "reference_temp_gib": [...], "kernel_temp_gib": [...], "temp_ratio": [...],
          "reference_fits": [...], "kernel_fits": [...], "hbm_gib": ..., ...}

The gathered path scores each row's chunk against its whole page table,
[rows, heads, chunk, max_seq_len] float32 per layer; the kernel holds a block of
pages and queries at a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from sao_jax.config import MeshConfig, load_config
from sao_jax.models import paged
from sao_jax.models.paged_kernel import record_blocks
from sao_jax.models.transformer import abstract_params, param_shardings
from sao_jax.planning import aot, estimate, hardware
from sao_jax.sampler import paged_steps
from sao_jax.sharding.mesh import make_mesh

ROOT = pathlib.Path(__file__).resolve().parents[1]


def compile_prefill(cfg, mesh, attention: str, page: int, rows: int, chunk: int):
  """The prefill program, compiled; sampler.paged_attention = `attention`."""
  sampler = dataclasses.replace(cfg.sampler, kv_layout="paged", kv_page_size=page, kv_pages=0,
                                paged_attention=attention)
  if paged_steps.attention_path(sampler, cfg.model, mesh) != attention:
    raise SystemExit(f"paged_attention={attention!r} does not apply to this model on this mesh")
  columns = -(-sampler.max_seq_len // page)
  params = aot._abstract(abstract_params(cfg.model, "lm"), param_shardings(cfg.model, mesh, "lm"))
  cache = jax.eval_shape(lambda: paged.init_paged_cache(cfg.model, sampler.num_kv_pages(), page,
                                                        sampler.slots))
  cache = aot._abstract(cache, paged_steps.cache_shardings(cache, mesh))
  host = NamedSharding(mesh, PartitionSpec())  # the engine's numpy arguments: replicated
  arg = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype, sharding=host)
  prefill = paged_steps.compile_steps(cfg.model, sampler, (), mesh).prefill
  return prefill.lower(params, cache, arg(sampler.slots, columns), arg(rows), arg(rows, chunk),
                       arg(rows, chunk), arg(rows), arg(rows, dtype=jnp.uint32)).compile()


def prefill_memory(cfg, mesh, attention: str, page: int, rows: int, chunk: int) -> dict:
  """Per-chip GiB of the compiled prefill; where the TPU compiler refuses it for HBM, the
  temporaries it says it needs (fits False)."""
  blocks: list = []
  try:
    with record_blocks() as blocks:
      compiled = compile_prefill(cfg, mesh, attention, page, rows, chunk)
  except jax.errors.JaxRuntimeError as error:
    match = estimate._COMPILER_OOM.search(str(error))
    if match is None:
      raise
    return dict(fits=False, temp_gib=float(match["need"]), total_gib=None, kernel=None,
                blocks=sorted({b.describe() for b in blocks}))
  memory = estimate.MemoryUse.from_stats(compiled.memory_analysis())
  return dict(fits=True, temp_gib=round(memory.temporaries / 2**30, 3),
              total_gib=round(memory.total / 2**30, 3),
              kernel="ragged_paged_attention_kernel" in compiled.as_text(),
              blocks=sorted({b.describe() for b in blocks}))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=str(ROOT / "configs" / "qwen3_8b_v5p32.py"))
  parser.add_argument("--topology", default="v5p:2x2x1", help="one sampler host")
  parser.add_argument("--tensor", type=int, default=0,
                      help="tensor axis, fsdp takes the rest (0: the config's sampler mesh)")
  parser.add_argument("--page", type=int, default=0,
                      help="tokens per page (0: the config's sampler.kv_page_size)")
  parser.add_argument("--rows", type=int, default=0, help="0: the largest prefill_row_buckets")
  parser.add_argument("--chunks", type=int, nargs="*", help="default: the config's prefill_buckets")
  args = parser.parse_args()
  cfg = load_config(args.config)
  rows = args.rows or cfg.sampler.prefill_row_buckets[-1]
  chunks = args.chunks or list(cfg.sampler.prefill_buckets)
  args.page = args.page or cfg.sampler.kv_page_size
  devices = hardware.topology_devices(args.topology)
  mesh = make_mesh(MeshConfig(fsdp=-1, tensor=args.tensor) if args.tensor
                   else cfg.sampler_mesh(), devices)
  generation, _ = hardware.parse_topology(args.topology)
  hbm = hardware.chip_spec(generation).per_device(hardware.num_chips(args.topology),
                                                  len(devices)).hbm_bytes
  print(f"{pathlib.Path(args.config).stem} on {args.topology} {dict(mesh.shape)}, {rows} rows, "
        f"pages of {args.page}, {cfg.sampler.slots} x {cfg.sampler.max_seq_len} tokens of pool; "
        f"per chip, {hbm / 2**30:.1f} GiB HBM:")
  result = {name: [] for name in ("reference_temp_gib", "kernel_temp_gib", "reference_fits",
                                  "kernel_fits", "reference_total_gib", "kernel_total_gib",
                                  "kernel_blocks")}
  for chunk in chunks:
    for attention, key in (("reference", "reference"), ("pallas", "kernel")):
      memory = prefill_memory(cfg, mesh, attention, args.page, rows, chunk)
      print(f"  chunk {chunk:6d} {attention:9s}: temporaries {memory['temp_gib']} GiB, "
            f"total {memory['total_gib']} GiB, fits {memory['fits']}, "
            f"kernel in program {memory['kernel']}, kernel blocks {memory['blocks']}")
      result[f"{key}_temp_gib"].append(memory["temp_gib"])
      result[f"{key}_total_gib"].append(memory["total_gib"])
      result[f"{key}_fits"].append(memory["fits"])
      if key == "kernel":
        result["kernel_blocks"].append(memory["blocks"])
  ratios = [round(r / max(k, 1e-9), 1) for r, k in zip(result["reference_temp_gib"],
                                                        result["kernel_temp_gib"])]
  print("RESULT " + json.dumps({
      "name": "paged_prefill_memory", "config": pathlib.Path(args.config).stem,
      "topology": args.topology, "mesh": dict(mesh.shape), "page": args.page, "rows": rows,
      "chunks": chunks, "max_seq_len": cfg.sampler.max_seq_len, **result,
      "temp_ratio": ratios, "hbm_gib": round(hbm / 2**30, 2)}))


if __name__ == "__main__":
  main()
