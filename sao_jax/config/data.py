"""The learner's data pipeline: transport, staleness, padding buckets."""

from __future__ import annotations

import dataclasses

from sao_jax import storage
from sao_jax.config.checks import check_choice, check_positive, fail

TRANSPORTS = ("queue", "directory")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """How finished trajectories reach the learner (docs/algorithm.md §1).

  A trajectory whose `lag = current policy version - first policy version`
  (policy updates since its first token was sampled) exceeds `max_lag` is
  dropped and counted. Batches are right-padded to the smallest
  of `length_buckets` that fits their longest trajectory (one compiled step per
  bucket); a trajectory longer than the largest bucket is dropped and counted.
  With `learner.batch_tokens` set, batches are packed rows of `learner.row_length`
  tokens instead: the buckets are not used, and the row length is the limit.
  """

  # Queue (samplers on this host) or directory (record files in transport_dir).
  transport: str = "queue"
  transport_dir: str = ""  # for transport="directory": a directory all hosts share
  transport_capacity: int = 256  # unread trajectories before a sampler blocks (per sampler
  # with the queue transport, each sampler writing its own queue; in all with a directory)
  max_lag: int = 4
  # Padded batch lengths (one compiled step each); longer trajectories are dropped.
  length_buckets: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
  pad_id: int = 0  # token id of padding
  # Reproducible rollouts (`sao_jax.data.fixed_lag`): None samples with the newest weights
  # and batches in arrival order (asynchronous, fastest); an integer L >= 0 samples batch t
  # entirely by the policy after t - L learner steps and assembles it by task position, so
  # one seed gives the same tokens, rewards and parameters on a quiet or a loaded machine
  # (0: synchronous on-policy; 1: batch t + 1 is sampled while the learner trains on t).
  fixed_lag: int | None = None

  def validate(self) -> None:
    check_choice("data", self, "transport", TRANSPORTS)
    if self.transport == "directory" and not self.transport_dir:
      fail("data", "transport_dir", self.transport_dir,
           "transport='directory' needs a directory shared by learner and samplers")
    if storage.is_url(self.transport_dir):  # pathlib would make it a local gs:/ directory
      fail("data", "transport_dir", self.transport_dir, "the directory transport claims records "
           "by renaming files, which a bucket cannot do atomically; use a filesystem every "
           "learner and sampler host mounts (NFS, Filestore)")
    check_positive("data", self, "transport_capacity")
    if isinstance(self.max_lag, bool) or not isinstance(self.max_lag, int) or self.max_lag < 0:
      fail("data", "max_lag", self.max_lag, "expected an integer >= 0")
    buckets = self.length_buckets
    if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 2 for b in buckets) \
        or list(buckets) != sorted(set(buckets)):
      fail("data", "length_buckets", buckets, "expected strictly increasing integers >= 2")
    if self.fixed_lag is not None and (isinstance(self.fixed_lag, bool) or not isinstance(
        self.fixed_lag, int) or self.fixed_lag < 0):
      fail("data", "fixed_lag", self.fixed_lag, "expected None (asynchronous, the default) or "
           "an integer >= 0 (0: synchronous on-policy, 1: sample one batch ahead)")
    if self.fixed_lag is not None and self.fixed_lag > self.max_lag:
      fail("data", "fixed_lag", self.fixed_lag, f"batches sampled {self.fixed_lag} policy "
           f"updates behind would all be dropped as staler than data.max_lag={self.max_lag}; "
           f"set data.max_lag >= {self.fixed_lag} or a smaller fixed_lag")
    if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int) or self.pad_id < 0:
      fail("data", "pad_id", self.pad_id, "expected a token id >= 0")
