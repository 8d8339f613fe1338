"""benchmarks/sampler.py's `plan_block_sizes_match_run`: 1 only when the kernel block
sizes sao-plan compiles for a TPU topology are those a run on that generation uses,
null (not 1) where libtpu is missing."""

import importlib.util
import pathlib
import sys

import jax.numpy as jnp
import pytest

from sao_jax.models import paged_kernel
from sao_jax.models.paged_blocks import KernelShapes, kernel_blocks

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
  """benchmarks/sampler.py as `python benchmarks/sampler.py` imports it: its folder
  first on sys.path (it imports aot_plan from there)."""
  sys.path.insert(0, str(ROOT / "benchmarks"))
  try:
    spec = importlib.util.spec_from_file_location("sampler_bench",
                                                  ROOT / "benchmarks" / "sampler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(str(ROOT / "benchmarks"))
  return module


def test_the_run_side_is_the_kernel_sizes_at_one_chips_decode_shapes(bench):
  pytest.importorskip("libtpu", reason="a v5e topology's devices need libtpu")
  # 8 slots over fsdp=2 page shards: 4 one-token rows per chip; 4 query and 2 KV
  # heads over tensor=2; 64-token episodes in pages of 16.
  per_chip = KernelShapes(page_size=16, pages_per_seq=4, num_q_tokens=4, num_q_heads=2,
                          num_kv_heads=1, head_dim=128, q_dtype=jnp.bfloat16,
                          kv_dtype=jnp.bfloat16)
  run = bench.run_kernel_blocks(bench.plan_config(), bench.PLAN_TOPOLOGY)
  assert run == kernel_blocks("v5e", per_chip) != kernel_blocks(None, per_chip)


def test_without_libtpu_the_key_is_null_and_says_why(bench, monkeypatch):
  def no_libtpu(name):
    raise ImportError("planning for a TPU topology needs libtpu at the jax version")

  monkeypatch.setattr(bench.hardware, "topology_devices", no_libtpu)
  monkeypatch.setattr(bench.aot, "plan", lambda *a, **k: pytest.fail("planned without libtpu"))
  assert bench.plan_block_sizes_match_run(bench.plan_config()) == (
      None, "not checked: planning for a TPU topology needs libtpu at the jax version")


@pytest.mark.slow  # two plans of a small config on v5e:2x2 (train and decode steps each)
@pytest.mark.tpu_compile
def test_the_key_is_1_for_the_plan_and_0_when_the_plan_traces_other_sizes(bench, monkeypatch):
  pytest.importorskip("libtpu", reason="AOT planning for TPU needs libtpu: "
                      "pip install 'jax[tpu]==<jax version>'")
  cfg = bench.plan_config()
  match, compared = bench.plan_block_sizes_match_run(cfg)
  assert match == 1, compared
  # A plan that traces the kernel with the off-TPU sizes (what a CPU-hosted plan did
  # before the generation came from the traced devices) is caught.
  monkeypatch.setattr(paged_kernel, "trace_generation", lambda: None)
  match, compared = bench.plan_block_sizes_match_run(cfg)
  assert match == 0, compared
  assert "v5e:2x2 plan: 4 KV pages x 4 queries per block, no VMEM limit" in compared
