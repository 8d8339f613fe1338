"""`Config`: the whole run, one field per concern."""

from __future__ import annotations

import dataclasses

from sao_jax.config.algorithm import AlgorithmConfig
from sao_jax.config.checks import check_finite, fail
from sao_jax.config.data import DataConfig
from sao_jax.config.env import EnvConfig
from sao_jax.config.learner import CheckpointConfig, LearnerConfig
from sao_jax.config.lora import LoraConfig
from sao_jax.config.mesh import MeshConfig, split_length_multiple
from sao_jax.config.model import ModelConfig
from sao_jax.config.run import RunConfig
from sao_jax.config.sampler import SECRET_CREATE_HINT
from sao_jax.config.sampler import SamplerConfig, check_untruncated


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
  """The whole run: one field per concern."""

  name: str = "default"  # the run's name (W&B run name, logs)
  seed: int = 0  # seed of parameter initialisation and the learner's randomness
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
  learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
  run: RunConfig = dataclasses.field(default_factory=RunConfig)
  lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)

  def validate(self) -> "Config":
    check_finite("", self)  # every float field of every section, before any range check
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if dataclasses.is_dataclass(value):
        value.validate()
    if not isinstance(self.seed, int) or isinstance(self.seed, bool):
      fail("config", "seed", self.seed, "expected an integer")
    check_untruncated(self.sampler)  # a run's sampler is a training sampler
    if self.algorithm.loss_agg == "token_mean_kept" and self.learner.micro_batches > 1:
      fail("learner", "micro_batches", self.learner.micro_batches,
            "token_mean_kept normalises by the kept tokens of the whole batch, unknown "
            "until every micro-batch ran; use micro_batches=1 or another loss_agg")
    if self.algorithm.group_size > 1 and self.learner.batch_trajectories % self.algorithm.group_size:
      fail("learner", "batch_trajectories", self.learner.batch_trajectories,
            f"must be a multiple of algorithm.group_size={self.algorithm.group_size} so "
            "that whole groups fit a batch")
    if self.sampler.sharded and self.sampler_mesh().sequence != 1:
      # The sampler decodes whole sequences; the axis splits the learner's only.
      if self.sampler.mesh is not None:
        fail("sampler", "mesh", self.sampler.mesh.text(), "a sampler mesh cannot split "
             "sequences; set its sequence axis to 1")
      fail("mesh", "sequence", self.mesh.sequence, "the sharded sampler lays out on the "
           "top-level mesh while sampler.mesh is unset, and a sampler cannot split "
           "sequences; set sampler.mesh (e.g. --set sampler.mesh=fsdp=-1) or "
           "sampler.sharded=false")
    if self.mesh.sequence > 1:
      self._check_split_lengths()
    if self.data.fixed_lag is not None:
      self._check_fixed_lag()
    if self.run.num_samplers == 0:
      self.check_remote_samplers()
    if self.lora.enabled:
      self._check_lora()
    if self.learner.router_replay and not self.model.num_experts:
      fail("learner", "router_replay", True,
           "router replay needs an MoE policy (model.num_experts > 0); set it False for a "
           "dense model")
    return self

  def sampler_mesh(self) -> MeshConfig:
    """The mesh a sharded sampler engine lays out over its process's devices:
    `sampler.mesh`, or (None) the top-level `mesh`. Every place that builds or
    plans the sampler's mesh asks here."""
    return self.sampler.mesh if self.sampler.mesh is not None else self.mesh

  def sampler_mesh_shape(self, devices: int, *, processes: int = 1) -> dict[str, int]:
    """The axis sizes of `sampler_mesh()` over a sampler's `devices` devices (those of
    its process, or of its `processes` processes' engine group: `sao-sampler
    --coordinator`); ValueError naming the field and the fix when it does not lay out
    over them. sao-train's own samplers (run.num_samplers >= 1) each lay their engine
    over their own process's devices: one spanning hosts is not built there."""
    mesh = self.sampler_mesh()
    try:
      return mesh.shape(devices)
    except ValueError as error:
      field = "sampler.mesh" if self.sampler.mesh is not None else "mesh (sampler.mesh unset)"
      fixed = {axis: size for axis, size in dataclasses.asdict(mesh).items() if size != -1}
      if processes > 1:
        raise ValueError(
            f"{field}={fixed}: one engine over {processes} processes lays it over their "
            f"{devices} devices ({error}); give it fixed axis sizes whose product is "
            "that device count, or one -1 axis taking the rest.") from None
      raise ValueError(
          f"{field}={fixed}: a sampler process lays its engine over its own devices, "
          f"{devices} here ({error}). A sampler spanning hosts is not built for sao-train's "
          "own samplers: run it as one engine over those hosts (run.num_samplers=0 and "
          "`sao-sampler --coordinator HOST:PORT --num-processes N --process-id I` on each), "
          "or give each host its own sampler process, on a mesh of that host's devices: "
          "fixed axis sizes whose product is its device count, or divides it with one -1 "
          "axis taking the rest.") from None

  def _check_lora(self) -> None:
    """LoRA runs reload their frozen base from `run.init` (checkpoints hold only the
    adapters), and adapters sit on dense projections only."""
    if self.run.sft_steps:
      fail("run", "sft_steps", self.run.sft_steps,
           "with lora.enabled the frozen base is reloaded from run.init on resume, so it "
           "cannot be an in-run SFT result; warm-start first (python -m "
           "experiments.warm_start), point run.init at its output and set run.sft_steps=0")
    mlp = [t for t in self.lora.targets if t in ("gate_proj", "up_proj", "down_proj")]
    if self.model.num_experts and mlp:
      fail("lora", "targets", self.lora.targets,
           f"model.num_experts={self.model.num_experts}: adapters on MoE experts are not "
           f"supported; drop {mlp} (attention projections only)")

  def _check_split_lengths(self) -> None:
    """Every padded batch length the learner compiles splits over mesh.sequence."""
    multiple = split_length_multiple(self.mesh.sequence)
    if self.learner.batch_tokens is not None:
      if self.learner.row_length % multiple:
        fail("learner", "row_length", self.learner.row_length,
             f"mesh.sequence={self.mesh.sequence} splits each row into {multiple} equal "
             f"chunks; use a multiple of {multiple}")
    elif any(length % multiple for length in self.data.length_buckets):
      fail("data", "length_buckets", self.data.length_buckets,
           f"mesh.sequence={self.mesh.sequence} splits each sequence into {multiple} equal "
           f"chunks; use multiples of {multiple}")

  def _check_fixed_lag(self) -> None:
    """What a fixed-lag schedule (`sao_jax.data.fixed_lag`) needs of the other sections."""
    lag = self.data.fixed_lag
    if self.learner.batch_tokens is not None:
      fail("data", "fixed_lag", lag, f"packed batches (learner.batch_tokens="
           f"{self.learner.batch_tokens}) close when a trajectory does not fit, which a "
           "schedule of whole batches cannot; set learner.batch_tokens=None or "
           "data.fixed_lag=None")
    if self.run.num_samplers == 0:
      fail("data", "fixed_lag", lag, "samplers elsewhere (sao-sampler, run.num_samplers=0) "
           "are not scheduled; run the samplers in the learner's job (run.num_samplers >= 1) "
           "or set data.fixed_lag=None")
    tasks = self.learner.batch_trajectories // self.algorithm.group_size
    if self.run.num_samplers > tasks:
      fail("run", "num_samplers", self.run.num_samplers, f"data.fixed_lag shares each batch's "
           f"{tasks} tasks between the samplers, so at most {tasks} of them have work; set "
           f"run.num_samplers <= {tasks}")

  def check_remote_samplers(self) -> None:
    """ValueError unless samplers on other hosts (`sao-sampler`) can reach the
    learner: trajectories through a shared directory, sealed with a shared secret;
    weights over the network or a shared directory."""
    if self.data.transport != "directory":
      fail("data", "transport", self.data.transport,
           "samplers elsewhere (sao-sampler, run.num_samplers=0) send trajectories through "
           "a shared directory; set data.transport='directory' and data.transport_dir (the "
           "same on both sides)")
    if self.sampler.weights == "shared_memory":
      fail("sampler", "weights", self.sampler.weights,
           "samplers elsewhere (sao-sampler, run.num_samplers=0) cannot read the learner's "
           "shared memory; set sampler.weights='network' (with weights_addresses) or "
           "'directory'")
    if not (self.sampler.weights_secret_file or self.sampler.weights_secret_env):
      fail("sampler", "weights_secret_file", self.sampler.weights_secret_file,
           "samplers elsewhere (sao-sampler, run.num_samplers=0) seal the trajectories they "
           "write to the shared directory with the run's secret: create one with "
           f"`{SECRET_CREATE_HINT}`, copy it to every learner and sampler host and set "
           "sampler.weights_secret_file (or sampler.weights_secret_env)")
    if self.sampler.weights == "network" and not self.sampler.weights_addresses:
      fail("sampler", "weights_addresses", self.sampler.weights_addresses,
           "samplers elsewhere (sao-sampler, run.num_samplers=0) connect to the learner "
           "hosts; list the host:port of every learner host, in process order")

  def with_run_paths(self) -> "Config":
    """This config with the paths derived from `run.run_dir` filled in (today
    `checkpoint.directory`, default `run.default_checkpoint_dir`); every job
    resolves paths through here."""
    if self.checkpoint.directory is not None:
      return self
    return dataclasses.replace(self, checkpoint=dataclasses.replace(
        self.checkpoint, directory=self.run.default_checkpoint_dir))
