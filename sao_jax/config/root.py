"""`Config`: the whole run, one field per concern."""

from __future__ import annotations

import dataclasses

from sao_jax.config.algorithm import AlgorithmConfig
from sao_jax.config.checks import check_finite, fail
from sao_jax.config.data import DataConfig
from sao_jax.config.env import EnvConfig
from sao_jax.config.learner import CheckpointConfig, LearnerConfig
from sao_jax.config.mesh import MeshConfig
from sao_jax.config.model import ModelConfig
from sao_jax.config.run import RunConfig
from sao_jax.config.sampler import SamplerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
  """The whole run: one field per concern."""

  name: str = "default"
  seed: int = 0
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
  learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
  run: RunConfig = dataclasses.field(default_factory=RunConfig)

  def validate(self) -> "Config":
    check_finite("", self)  # every float field of every section, before any range check
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if dataclasses.is_dataclass(value):
        value.validate()
    if not isinstance(self.seed, int) or isinstance(self.seed, bool):
      fail("config", "seed", self.seed, "expected an integer")
    if self.algorithm.loss_agg == "token_mean_kept" and self.learner.micro_batches > 1:
      fail("learner", "micro_batches", self.learner.micro_batches,
            "token_mean_kept normalises by the kept tokens of the whole batch, unknown "
            "until every micro-batch ran; use micro_batches=1 or another loss_agg")
    if self.algorithm.group_size > 1 and self.learner.batch_trajectories % self.algorithm.group_size:
      fail("learner", "batch_trajectories", self.learner.batch_trajectories,
            f"must be a multiple of algorithm.group_size={self.algorithm.group_size} so "
            "that whole groups fit a batch")
    if self.run.num_samplers == 0:
      if self.data.transport != "directory":
        fail("run", "num_samplers", 0,
             f"no local samplers means samplers elsewhere (sao-sampler) send trajectories "
             f"through a shared directory, but data.transport={self.data.transport!r}; set "
             "data.transport='directory' and data.transport_dir")
      if self.sampler.weights == "shared_memory":
        fail("run", "num_samplers", 0,
             "samplers elsewhere (sao-sampler) cannot read sampler.weights='shared_memory'; "
             "set sampler.weights='network' (or 'directory')")
    return self
