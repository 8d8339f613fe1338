"""Pure arithmetic of a plan: memory against HBM, FLOPs, roofline step time, MFU, advice.

Memory (per device, from XLA's `memory_analysis()` of the compiled program):

    total = arguments + outputs - aliased (donated) + temporaries + generated code

FLOPs are counted analytically because XLA's cost analysis counts the body of
every loop (micro-batch scan, LM-head chunks, blocked attention) once. Per token,
one forward pass of a decoder layer costs (every family: q/k/v biases and norms
are not matmuls)

    2 * D * (N + 2K) * H + 2 * N * H * D     q/k/v/o projections
    + 2 * N * H * T                           causal attention (q k^T and p v, mean context T/2)
    + 2 * 3 * D * F                           SwiGLU MLP (MoE: 3 * D * F_moe * k + router D * E)

plus the head (2 * D * V for the LM head). A backward pass costs two forwards.
An SAO step runs, over all B * T tokens: one value forward (V_old), one policy
forward + backward, and K value forward + backward passes (`model_flops`).
`hardware_flops` adds what the program recomputes: the LM-head chunks
(checkpointed), the layer forward under `remat_policy` "full", the attention
matmuls under "dots_with_no_batch_dims_saveable", and q k^T again in blocked
attention's backward.

Roofline: step_seconds = hardware_flops / (devices * peak), a lower bound that
ignores communication and kernel efficiency; MFU = model_flops / (devices * peak
* step_seconds), an upper bound; tokens/s = B * T / step_seconds.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from sao_jax.config import Config, ModelConfig
from sao_jax.models.transformer import is_moe_layer
from sao_jax.planning.hardware import GiB


@dataclasses.dataclass(frozen=True)
class MemoryUse:
  """Per-device bytes of one compiled program (XLA memory analysis)."""

  arguments: int
  outputs: int
  aliased: int
  temporaries: int
  generated_code: int

  @property
  def total(self) -> int:
    return self.arguments + self.outputs - self.aliased + self.temporaries + self.generated_code

  @classmethod
  def from_stats(cls, stats: Any) -> "MemoryUse":
    """From `compiled.memory_analysis()` (a CompiledMemoryStats)."""
    return cls(arguments=stats.argument_size_in_bytes, outputs=stats.output_size_in_bytes,
               aliased=stats.alias_size_in_bytes, temporaries=stats.temp_size_in_bytes,
               generated_code=stats.generated_code_size_in_bytes)


def _layer_forward_flops(cfg: ModelConfig, seq_len: int, moe: bool) -> tuple[float, float]:
  """Per-token forward FLOPs of one layer: (total, attention score/value part)."""
  d, n, k, h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
  attention = 2.0 * n * h * seq_len
  projections = 2.0 * d * (n + 2 * k) * h + 2.0 * n * h * d
  if moe:
    mlp = (2.0 * 3 * d * cfg.moe_intermediate_size * cfg.num_experts_per_tok
           + 2.0 * d * cfg.num_experts)
  else:
    mlp = 2.0 * 3 * d * cfg.intermediate_size
  return projections + attention + mlp, attention


def forward_flops_per_token(cfg: ModelConfig, seq_len: int, head: str) -> dict[str, float]:
  """Per-token forward FLOPs: {"trunk", "attention" (inside trunk), "head"}."""
  trunk = attention = 0.0
  for index in range(cfg.num_hidden_layers):
    total, attn = _layer_forward_flops(cfg, seq_len, is_moe_layer(cfg, index))
    trunk += total
    attention += attn
  head_flops = 2.0 * cfg.hidden_size * (cfg.vocab_size if head == "lm" else 1)
  return {"trunk": trunk, "attention": attention, "head": head_flops}


# Attention recomputed in the backward pass, in units of the attention forward (q k^T
# and p v, half each). A dense backward takes dv, dout v^T, dq and dk; the blocked
# path recomputes q k^T once more (0.5); the splash kernel's dq kernel recomputes
# q k^T and its dkv kernel q k^T and dout v^T again (1.5).
ATTENTION_RECOMPUTE = {"dense": 0.0, "blocked": 0.5, "splash": 1.5}


def step_flops(cfg: Config, seq_len: int, attention: str | None = None) -> tuple[float, float]:
  """(model_flops, hardware_flops) of one SAO train step that updates the policy, over
  every token slot of its `[batch_rows, seq_len]` batch (packed segments attend
  within themselves, so attention FLOPs are an upper bound under packing).
  `attention`: the path the forwards take ("dense", "blocked" or "splash"; None:
  `model.attention_impl`, "auto" counted as blocked)."""
  attention = attention or {"auto": "blocked"}.get(cfg.model.attention_impl,
                                                   cfg.model.attention_impl)
  tokens = cfg.learner.batch_rows * seq_len
  model = hardware = 0.0
  recompute = {"none": 0.0, "dots_saveable": 0.0, "full": 1.0}
  for head, forwards, backwards in _passes(cfg):
    f = forward_flops_per_token(cfg.model, seq_len, head)
    forward = f["trunk"] + f["head"]
    model += (forwards + 3 * backwards) * forward * tokens
    extra = f["head"] if head == "lm" else 0.0  # LM-head chunks are checkpointed
    extra += recompute.get(cfg.model.remat_policy, 0.0) * f["trunk"]
    if cfg.model.remat_policy == "dots_with_no_batch_dims_saveable":
      extra += f["attention"]
    extra += ATTENTION_RECOMPUTE[attention] * f["attention"]
    hardware += backwards * extra * tokens
  return model, model + hardware


def _passes(cfg: Config) -> list[tuple[str, int, int]]:
  """(head, forward-only passes, forward+backward passes) of one step."""
  alg = cfg.algorithm
  passes = [("lm", 0, 1)]
  if alg.uses_critic:
    value_forwards = 2 if cfg.learner.advantage_values == "after_critic_update" else 1
    passes.append(("value", value_forwards, alg.value_updates_per_step))
  return passes


@dataclasses.dataclass(frozen=True)
class Roofline:
  step_seconds: float
  mfu: float
  tokens_per_s: float


def roofline(model_flops: float, hardware_flops: float, tokens: int, devices: int,
             peak_flops: float) -> Roofline:
  """Compute-bound step time and the MFU / throughput it implies (module docstring)."""
  if devices <= 0 or peak_flops <= 0 or hardware_flops <= 0:
    raise ValueError(f"roofline: devices={devices}, peak_flops={peak_flops}, "
                     f"hardware_flops={hardware_flops}; all must be positive")
  seconds = hardware_flops / (devices * peak_flops)
  return Roofline(step_seconds=seconds, mfu=model_flops / (devices * peak_flops * seconds),
                  tokens_per_s=tokens / seconds)


def _advice(cfg: Config, memory: MemoryUse, program: str, seq_len: int,
            batch_shards: int) -> list[str]:
  """Concrete changes, largest memory consumer first."""
  model, learner = cfg.model, cfg.learner
  state_fixes = [f"--set mesh.fsdp=... larger than {cfg.mesh.fsdp} (shards params and optimizer "
                 "state over more chips; set another axis smaller or use a larger --topology)"]
  sampler_mesh = cfg.sampler_mesh()
  if program in ("decode_step", "paged_decode"):  # the sampler's programs, on its own mesh
    state_fixes = [f"--set sampler.mesh=... (now {sampler_mesh.text()}) with params split "
                   "over more of the sampler's chips (fsdp x tensor), or a larger "
                   "--sampler-topology"]
  if program == "paged_decode":
    # The pool splits pages over data/fsdp and KV heads over tensor
    # (docs/explanation/paged-engine.md); the Pallas kernel holds its page tables in
    # SMEM (1 MiB on v5p); the reference path gathers every listed page.
    activation_fixes = [f"--set sampler.mesh=... with more chips over data x tensor (now "
                        f"data={sampler_mesh.data}, fsdp={sampler_mesh.fsdp}, tensor="
                        f"{sampler_mesh.tensor}; tensor a divisor of the KV heads; with "
                        "sampler.sharded): each chip holds pool / (data x fsdp x tensor)",
                        f"--set sampler.kv_page_size=... larger (now {cfg.sampler.kv_page_size}): "
                        "the Pallas kernel keeps slots x pages-per-episode page indices in SMEM",
                        "--set sampler.kv_layout=dense (off the kernel the paged decode gathers "
                        "every listed page: about twice its pool in temporaries)",
                        "a larger --mean-episode-tokens (fewer slots over the same pool)",
                        "a smaller --sampler-batch (a smaller pool: that many dense rows)"]
  elif program == "decode_step":
    activation_fixes = ["a smaller --sampler-batch", f"a shorter cache (--seq-len, now {seq_len})",
                        f"--set sampler.mesh=fsdp=1,tensor=... larger than "
                        f"{sampler_mesh.tensor} (shards KV heads; with sampler.sharded)"]
  else:
    activation_fixes = []
    per_micro = learner.batch_rows // learner.micro_batches
    if per_micro > batch_shards and per_micro % 2 == 0:
      activation_fixes.append(f"--set learner.micro_batches={2 * learner.micro_batches} "
                              f"(now {learner.micro_batches}: {per_micro} rows per pass)")
    if model.remat_policy != "full":
      activation_fixes.append(f"--set model.remat_policy=full (now {model.remat_policy!r})")
    if model.attention_impl == "dense":
      activation_fixes.append("--set model.attention_impl=blocked (now 'dense': [B, N, T, T] "
                              "float32 scores)")
    activation_fixes.append(f"a shorter sequence (--seq-len, now {seq_len})")
  fixed = memory.arguments + memory.outputs - memory.aliased
  return state_fixes + activation_fixes if fixed >= memory.temporaries else (
      activation_fixes + state_fixes)


def does_not_fit_message(cfg: Config, program: str, memory: MemoryUse, limit_bytes: float,
                         chip: str, seq_len: int, batch_shards: int) -> str:
  """Why `program` does not fit one device, and what to change."""
  fixes = "\n".join(f"  - {fix}" for fix in _advice(cfg, memory, program, seq_len, batch_shards))
  return (f"{program} does not fit: it needs {memory.total / GiB:.1f} GiB per {chip} device but "
          f"the limit is {limit_bytes / GiB:.1f} GiB (arguments {memory.arguments / GiB:.1f}, "
          f"outputs {memory.outputs / GiB:.1f}, aliased {memory.aliased / GiB:.1f}, temporaries "
          f"{memory.temporaries / GiB:.1f} GiB). To fit, try:\n{fixes}")


_COMPILER_OOM = re.compile(r"required for (?P<what>[\w ]+?) \((?P<need>[0-9.]+)G\) exceeds "
                           r"available HBM \((?P<have>[0-9.]+)G\)")


def compiler_oom_message(cfg: Config, program: str, error: str, chip: str, seq_len: int,
                         batch_shards: int) -> str:
  """Why the TPU compiler itself refused `program` (RESOURCE_EXHAUSTED), and what to change."""
  match = _COMPILER_OOM.search(error)
  if match:
    need = int(float(match["need"]) * GiB)
    is_temp = "temporar" in match["what"]
    memory = MemoryUse(arguments=0 if is_temp else need, outputs=0, aliased=0,
                       temporaries=need if is_temp else 0, generated_code=0)
    reason = (f"the TPU compiler needs {match['need']} GiB for {match['what']} but a {chip} "
              f"device has {match['have']} GiB available")
  else:
    memory = MemoryUse(arguments=0, outputs=0, aliased=0, temporaries=1, generated_code=0)
    reason = f"the TPU compiler ran out of memory: {error.splitlines()[0]}"
  fixes = "\n".join(f"  - {fix}" for fix in _advice(cfg, memory, program, seq_len, batch_shards))
  return f"{program} does not fit: {reason}. To fit, try:\n{fixes}"


@dataclasses.dataclass(frozen=True)
class PagedDecode:
  """The paged engine's decode at the dense cache's KV memory (`paged_decode`)."""

  episodes: int    # concurrent episodes that fit
  seconds: float   # decode step lower bound
  tokens_per_s: float
  shards: int = 1  # page shards the pool splits into (the sampler mesh's batch axes)
  pages_per_shard: int = 0


def paged_pool_pages(dense_slots: int, seq_len: int, page_size: int, shards: int = 1) -> int:
  """Pages in the dense cache's KV memory: dense_slots rows of ceil(seq_len / page),
  rounded down to a multiple of `shards` (each shard holds as many)."""
  return dense_slots * -(-seq_len // page_size) // shards * shards


def paged_episodes(dense_slots: int, seq_len: int, mean_tokens: int, page_size: int,
                   shards: int = 1) -> int:
  """Episodes of `mean_tokens` tokens the dense cache's memory holds as pages split into
  `shards` pools (`paged_decode`'s formula)."""
  if not 0 < mean_tokens <= seq_len:
    raise ValueError(f"mean episode tokens={mean_tokens} is invalid: expected 0 < mean <= "
                     f"seq_len={seq_len}")
  per_shard = paged_pool_pages(dense_slots, seq_len, page_size, shards) // shards
  return shards * (per_shard // -(-mean_tokens // page_size))


def paged_decode(dense_slots: int, seq_len: int, mean_tokens: int, page_size: int,
                 dense_flops: float, dense_bytes: float, peak_flops: float,
                 bytes_per_s: float, shards: int = 1) -> PagedDecode:
  """Episodes and decode bound of the paged engine in the dense cache's memory.

  The dense cache is dense_slots * ceil(seq_len / page) pages; split over D page
  shards (`sao_jax.models.paged_mesh`: the sampler mesh's batch axes) each shard
  holds P_D = floor(dense_slots * ceil(seq_len / page) / D) of them on its devices,
  as the dense rows split over those axes. An episode of `mean_tokens` tokens (the
  assumed mean final length: an episode holds at most that many while it decodes)
  needs ceil(mean_tokens / page) pages of its slot's shard, so

      episodes = D * floor(P_D / ceil(mean_tokens / page)).

  A full pool is read once per step like the dense cache, so the step moves the
  dense step's bytes, while its FLOPs grow with the batch:

      seconds >= max(dense_bytes / bandwidth, dense_flops * episodes / dense_slots / peak)

  (per device: the dense step's bytes and FLOPs are per device, and the split pool
  and its episodes divide over the same devices), and tokens/s <= episodes / seconds.
  """
  episodes = paged_episodes(dense_slots, seq_len, mean_tokens, page_size, shards)
  seconds = max(dense_bytes / bytes_per_s, dense_flops * episodes / dense_slots / peak_flops)
  return PagedDecode(episodes=episodes, seconds=seconds, tokens_per_s=episodes / seconds,
                     shards=shards,
                     pages_per_shard=paged_pool_pages(dense_slots, seq_len, page_size, shards)
                     // shards)
