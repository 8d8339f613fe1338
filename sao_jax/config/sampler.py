"""The rollout sampler: slots, static shapes, sampling and stop conditions."""

from __future__ import annotations

import dataclasses
import os
import re

from sao_jax.config.checks import check_choice, check_positive, check_timeout, fail
from sao_jax.config.mesh import MeshConfig

WEIGHT_CHANNELS = ("shared_memory", "directory", "network")
KV_LAYOUTS = ("dense", "paged")
# How to make the run secret that `sampler.weights_secret_file` names (said in errors).
SECRET_CREATE_HINT = "head -c 32 /dev/urandom > weights.secret"
PAGED_ATTENTIONS = ("auto", "reference", "pallas")
# The order finished trajectories leave the sampler (sao_jax.sampler.episodes): as they
# finish, or in the order their episodes started (deterministic, head-of-line blocking).
RELEASE_ORDERS = ("finish", "start")

# Ends a turn at the fence that closes a ```python tool-call block (sao_jax.envs.math.tool),
# not at the opening fence.
PYTHON_TOOL_CALL = r"```(?:python|py)[ \t]*\n.*?```"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerConfig:
  """Generation engine settings (semantics: `sao_jax.sampler.engine`).

  The engine decodes `slots` sequences at once; each slot holds one episode's KV
  cache of `max_seq_len` tokens (prompt, every turn and every observation). New
  tokens are prefilled in chunks padded to the smallest of `prefill_buckets`
  that fits (longer inputs are split into chunks of the largest bucket), so the
  engine compiles once per bucket plus once for the decode step. Each engine
  call decodes `steps_per_call` tokens per slot before the host checks stop
  patterns and refills slots.

  Sampling: softmax(logits / temperature), restricted to the `top_k` most likely
  tokens (0 = no limit) and to the smallest set whose probability reaches `top_p`
  (1.0 = no limit). A training run refuses truncation (`check_untruncated`):
  `behavior_logp` is the full tempered distribution's, which DIS needs to be the
  one the token was drawn from (docs/algorithm.md §2). The token for trajectory position t of an episode with seed
  s is drawn with the key fold_in(key(s), t); an episode's seed is
  `seed` + its index, chosen by the caller. A turn ends on one of
  `stop_tokens` (sampled and kept as the turn's last action token), when its
  text matches one of `stop_patterns` (Python regular expressions, searched
  with re.DOTALL; the turn ends at the token that completes the match), after
  `max_new_tokens`, or when the episode reaches `max_seq_len`.

  Environments: a turn that ends hands its `env.step` to a pool of at most
  `env_threads` step threads (0: one per CPU core of the host,
  `num_env_threads`) while the engine decodes the other episodes; its slot stays
  parked until the observation comes back (`sao_jax.sampler.episodes`, the
  episode lifecycle in docs/explanation/episode-lifecycle.md). Tokens and
  behavior_logp do not depend on when a step returns; the order finished
  trajectories leave the sampler does: `release_order` "finish" (as they
  finish) or "start" (in the order their episodes started, the same in every
  run; a slow episode then holds back every later one, and held trajectories
  count against the episodes in flight). CPU-bound steps (sandboxed tool runs)
  want no more threads than cores: more would stretch each run's wall time,
  which could then hit its `env.tool.wall_time_s` (2x its CPU limit by default)
  where it would not alone; steps that mostly wait (a judge's HTTP call) can
  have many more. Steps that hold their thread without using it get one thread
  per episode in flight whatever `env_threads` says (the runner sizes the pool):
  simulated latency (`env.latency`) and agent programs (`env.name="agent"`,
  whose episodes wait for the program's next call).

  Weights reach samplers through `weights` (`sao_jax.channel.weights`):
  "shared_memory" (samplers on the learner's host), "directory" (orbax versions
  in `weights_dir`, a directory or bucket all hosts share) or "network" (every
  learner host serves its shards over TCP on `weights_port`; samplers on other
  hosts connect to `weights_addresses`, the "host:port" of every learner host in
  process order; empty: only this host, for same-host samplers). Its peers
  prove a shared secret (`sao_jax.channel.weights_wire`): the bytes of
  `weights_secret_file`, or of the environment variable `weights_secret_env`
  (at most one of the two); required with `weights_addresses` or
  `run.num_samplers=0` (samplers on other hosts), a fresh random one otherwise.
  The same secret seals the directory transport's records (`data.sealed`). Each learner host listens on its own
  entry of `weights_addresses` (loopback without them) and serves at most
  `weights_max_connections` authenticated subscribers at once, beside at most as
  many connections still in their handshake (`sao_jax.channel.weights_net`).

  KV cache (`kv_layout`): "paged" (the default, `sao_jax.sampler.paged_engine`)
  keeps one pool of `kv_pages`
  pages of `kv_page_size` tokens (0: the pages `slots` dense rows would take);
  episodes are admitted while slots and pages last, an episode that needs a page
  when none is free preempts the most recently admitted one (its pages are
  freed, it is re-prefilled later; counted in `stats["preemptions"]`), and the
  prefills of several slots run in one call of up to the smallest of
  `prefill_row_buckets` rows that fits. With `kv_prefix_sharing`, episodes whose
  prompts start alike (a GRPO group) share those pages instead of prefilling them.
  "dense" gives every slot its own `max_seq_len`-token row (`sao_jax.sampler.
  engine`): the paged engine's reference in its exactness tests, and no page
  bookkeeping when every episode runs to max_seq_len.

  Paged attention, prefill and decode (`paged_attention`): "reference" is the
  pure-JAX gather (`sao_jax.models.paged_attention`), "pallas" jax's Pallas TPU
  kernel (`sao_jax.models.paged_kernel`; off a TPU only under its interpret
  mode), "auto" the kernel where the sampler runs on TPU and the model's
  attention shapes suit it, else the reference (`sao_jax.sampler.paged_steps.
  attention_path`).

  Placement: with `sharded`, a sampler process lays params and KV cache out
  over all its local devices with `mesh` (None: the top-level `mesh`, the
  learner's; `Config.sampler_mesh`), its -1 axis filled for the local device
  count, MoE layers expert parallel over `expert`; otherwise it runs on one
  device. A model plus cache too large for one chip needs it. The paged pool
  splits its pages over the mesh's data and fsdp axes (D = data x fsdp page
  shards, each with its own allocator and slots / D slots: `slots` and
  `kv_pages` must be multiples of D) and its KV heads over `tensor`, so each chip
  holds pool / (D x tensor); at pod scale a sampler host runs e.g.
  `MeshConfig(fsdp=1, tensor=4)` (configs/qwen3_8b_v5p32.py).
  """

  slots: int = 8  # sequences decoded at once (the decode batch width)
  max_seq_len: int = 2048  # tokens of one episode: prompt, turns and observations
  # Padded prefill chunk lengths (one compiled prefill each).
  prefill_buckets: tuple[int, ...] = (32, 128, 512)
  steps_per_call: int = 8  # tokens decoded per slot per engine call before the host checks stops
  max_new_tokens: int = 512  # tokens one turn may generate
  temperature: float = 1.0  # sampling temperature (behavior_logp is the tempered distribution's)
  top_p: float = 1.0  # nucleus sampling mass (1.0: off; refused in training)
  top_k: int = 0  # sample from the k most likely tokens (0: off; refused in training)
  seed: int = 0  # base seed of the episodes (episode i uses seed + i)
  # Token strings that end a turn (kept as its last action token).
  stop_tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
  # Regexes whose match ends a turn (default: a complete python tool call).
  stop_patterns: tuple[str, ...] = (PYTHON_TOOL_CALL,)
  # Threads stepping environments at once (0: one per CPU core); with env.latency or an
  # agent program, at least one per episode in flight (the runner sizes it).
  env_threads: int = 0
  # Order finished trajectories leave the sampler: "finish" (as they end) or "start"
  # (in start order, identical whatever the tool latencies; a finished episode may wait).
  release_order: str = "finish"
  weights: str = "shared_memory"  # weight channel: shared_memory, directory or network
  # Weights=directory: the directory or bucket of weight versions all hosts share.
  weights_dir: str = ""
  weights_port: int = 0  # 0: any free port (same-host samplers learn it from the learner)
  # Weights=network: host:port of every learner host, in process order.
  weights_addresses: tuple[str, ...] = ()
  weights_secret_file: str = ""  # file holding the run's shared secret (weights and sealed records)
  weights_secret_env: str = ""  # environment variable holding the run's shared secret instead
  # Weights=network: authenticated subscribers a learner host serves.
  weights_max_connections: int = 64
  sharded: bool = False  # lay params and KV cache out over all the sampler process's devices (mesh)
  # Paged (one page pool, the default) or dense (a max_seq_len row per slot).
  kv_layout: str = "paged"
  kv_page_size: int = 16  # tokens per KV page
  kv_pages: int = 0  # 0: slots * ceil(max_seq_len / kv_page_size), the dense cache's memory
  prefill_row_buckets: tuple[int, ...] = (1, 4)  # rows per batched prefill call (paged engine)
  # Share the KV pages of identical prompt prefixes (a GRPO group's prompt).
  kv_prefix_sharing: bool = True
  # Paged attention path: auto, reference (pure JAX) or pallas (TPU kernel).
  paged_attention: str = "auto"
  # The mean episode length (tokens) the run expects; `sao-plan` sizes the paged
  # engine's figures with it (episodes that fit, decode bound). 0: max_seq_len // 8.
  expected_episode_tokens: int = 0
  mesh: MeshConfig | None = None  # None: the top-level mesh (Config.sampler_mesh)
  # One engine over several hosts (sao-sampler --coordinator): seconds a process of the
  # group may be silent, or an engine call may run, before the whole group ends.
  group_timeout_s: float = 60.0

  def num_env_threads(self) -> int:
    """Threads stepping environments at once: `env_threads`, or (0) this host's cores."""
    return self.env_threads or os.cpu_count() or 1

  def num_kv_pages(self) -> int:
    """Pages in the paged pool: `kv_pages`, or (0) those of `slots` dense rows."""
    return self.kv_pages or self.slots * -(-self.max_seq_len // self.kv_page_size)

  def validate(self) -> None:
    check_positive("sampler", self, "slots", "max_seq_len", "steps_per_call", "max_new_tokens")
    threads = self.env_threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
      fail("sampler", "env_threads", threads,
           "expected 0 (one per CPU core) or a positive number of threads (1: one at a time)")
    check_choice("sampler", self, "release_order", RELEASE_ORDERS)
    check_choice("sampler", self, "weights", WEIGHT_CHANNELS)
    if self.weights == "directory" and not self.weights_dir:
      fail("sampler", "weights_dir", self.weights_dir,
           "weights='directory' needs a directory (or gs:// bucket path) all hosts share")
    port = self.weights_port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
      fail("sampler", "weights_port", port, "expected a TCP port in [0, 65535] (0: any free port)")
    for address in self.weights_addresses:
      host, _, number = str(address).rpartition(":")
      if not host or not number.isdigit() or not 0 < int(number) < 65536:
        fail("sampler", "weights_addresses", self.weights_addresses,
             f"{address!r} is not host:port (one entry per learner host, e.g. '10.0.0.2:5617')")
    check_positive("sampler", self, "weights_max_connections")
    check_timeout("sampler", self, "group_timeout_s")
    if self.weights_secret_file and self.weights_secret_env:
      fail("sampler", "weights_secret_env", self.weights_secret_env,
           "set one of sampler.weights_secret_file and sampler.weights_secret_env, not both")
    if self.weights == "network" and self.weights_addresses and not (
        self.weights_secret_file or self.weights_secret_env):
      fail("sampler", "weights_secret_file", self.weights_secret_file,
           "weights_addresses (samplers on other hosts) needs a shared secret: create one with "
           f"`{SECRET_CREATE_HINT}`, copy it to every learner and sampler "
           "host and set sampler.weights_secret_file=weights.secret (or "
           "sampler.weights_secret_env to a variable holding it)")
    buckets = self.prefill_buckets
    if (not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in buckets)
        or list(buckets) != sorted(set(buckets))):
      fail("sampler", "prefill_buckets", buckets,
           "expected positive integers in strictly increasing order, e.g. (32, 128, 512)")
    if buckets[-1] > self.max_seq_len:
      fitting = [b for b in buckets if b <= self.max_seq_len] or [self.max_seq_len]
      fail("sampler", "prefill_buckets", buckets,
           f"the largest bucket must be <= max_seq_len={self.max_seq_len}; with that "
           f"max_seq_len, e.g. --set sampler.prefill_buckets={','.join(map(str, fitting))}")
    check_choice("sampler", self, "kv_layout", KV_LAYOUTS)
    check_choice("sampler", self, "paged_attention", PAGED_ATTENTIONS)
    expected = self.expected_episode_tokens
    if (isinstance(expected, bool) or not isinstance(expected, int)
        or not 0 <= expected <= self.max_seq_len):
      fail("sampler", "expected_episode_tokens", expected,
           f"expected 0 (max_seq_len // 8) or a mean episode length in tokens up to "
           f"max_seq_len={self.max_seq_len}")
    check_positive("sampler", self, "kv_page_size")
    pages = self.kv_pages
    per_episode = -(-self.max_seq_len // self.kv_page_size) if self.kv_page_size > 0 else 0
    if isinstance(pages, bool) or not isinstance(pages, int) or (pages != 0 and pages < per_episode):
      fail("sampler", "kv_pages", pages,
           f"expected 0 (as much as the dense cache) or at least the {per_episode} pages one "
           f"episode of max_seq_len={self.max_seq_len} tokens needs at kv_page_size="
           f"{self.kv_page_size}")
    if not isinstance(self.kv_prefix_sharing, bool):
      fail("sampler", "kv_prefix_sharing", self.kv_prefix_sharing, "expected true or false")
    rows = self.prefill_row_buckets
    if (not rows or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in rows)
        or list(rows) != sorted(set(rows))):
      fail("sampler", "prefill_row_buckets", rows,
           "expected positive integers in strictly increasing order, e.g. (1, 4)")
    if self.mesh is not None:
      if not isinstance(self.mesh, MeshConfig):
        fail("sampler", "mesh", self.mesh,
             "expected a MeshConfig (e.g. --set sampler.mesh=fsdp=1,tensor=4) or None (the "
             "top-level mesh)")
      if not self.sharded:
        fail("sampler", "mesh", self.mesh.text(),
             "a sampler mesh lays out a sharded engine, but sampler.sharded=False runs it on "
             "one device; set sampler.sharded=true or sampler.mesh=None")
      try:
        self.mesh.validate()
      except ValueError as error:
        raise ValueError(f"sampler.{error}") from None
    if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or (
        not self.temperature > 0):
      fail("sampler", "temperature", self.temperature,
           "expected a number > 0 (for greedy decoding use top_k=1)")
    if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or (
        not 0 < self.top_p <= 1):
      fail("sampler", "top_p", self.top_p, "expected a number in (0, 1]; 1.0 disables top-p")
    if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
      fail("sampler", "top_k", self.top_k, "expected an integer >= 0; 0 disables top-k")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
      fail("sampler", "seed", self.seed, "expected an integer in [0, 2**32)")
    if not all(isinstance(t, str) and t for t in self.stop_tokens):
      fail("sampler", "stop_tokens", self.stop_tokens, "expected non-empty token strings")
    for pattern in self.stop_patterns:
      try:
        re.compile(pattern)
      except (re.error, TypeError) as err:
        fail("sampler", "stop_patterns", self.stop_patterns,
             f"{pattern!r} is not a regular expression ({err})")


def check_untruncated(sampler: SamplerConfig) -> None:
  """Refuses top-k / top-p truncation in a training run's sampler (docs/algorithm.md §2).

  The sampler records `behavior_logp` under the full tempered distribution p and
  the learner's DIS ratio compares against p; a truncated draw comes from q != p,
  a difference no ratio corrects. Evaluation may truncate (it takes no ratio).
  """
  if sampler.top_k != 0:
    fail("sampler", "top_k", sampler.top_k,
         "training samples the full tempered distribution that behavior_logp and the DIS "
         "ratio assume (docs/algorithm.md §2); set top_k=0 (evaluation decodes greedily on its own)")
  if sampler.top_p < 1.0:
    fail("sampler", "top_p", sampler.top_p,
         "training samples the full tempered distribution that behavior_logp and the DIS "
         "ratio assume (docs/algorithm.md §2); set top_p=1.0")
