"""Configuration: frozen keyword-only dataclasses, one module per concern.

A runnable setup is a file `configs/<name>.py` exposing `get_config() -> Config`;
command-line overrides are `--set section.field=value` strings applied on top
(`loading`). Every section has `validate()`, which raises `ValueError` naming
the field, the offending value and what is allowed; `Config.validate()` runs
them all plus the cross-section checks. What a config names in code above this
package (the environment, the variant's estimator and loss) is checked against
that code when a job starts (`sao_jax.jobs.startup`). `python -m sao_jax.config FILE` prints
a resolved config.
"""

from sao_jax.config.algorithm import (FROZEN_ATTENTION_PATTERNS, GAE_METHODS, LOSS_AGGS, VARIANTS,
                                      AlgorithmConfig)
from sao_jax.config.data import TRANSPORTS, DataConfig
from sao_jax.config.env import ENV_JUDGES, ENV_PROBLEM_KINDS, ENV_STYLES, EnvConfig
from sao_jax.config.learner import (ADVANTAGE_VALUES, LR_SCHEDULES, CheckpointConfig,
                                    LearnerConfig)
from sao_jax.config.loading import apply_overrides, load_config, main
from sao_jax.config.lora import BASE_QUANTIZATIONS, LORA_TARGETS, LoraConfig
from sao_jax.config.mesh import MESH_AXES, MeshConfig
from sao_jax.config.model import DTYPES, ModelConfig
from sao_jax.config.root import Config
from sao_jax.config.run import RunConfig
from sao_jax.config.sampler import SamplerConfig

__all__ = [
    "ADVANTAGE_VALUES", "BASE_QUANTIZATIONS", "DTYPES", "ENV_JUDGES", "ENV_PROBLEM_KINDS", "ENV_STYLES",
    "FROZEN_ATTENTION_PATTERNS", "GAE_METHODS", "LOSS_AGGS",
    "LORA_TARGETS", "LR_SCHEDULES", "MESH_AXES", "TRANSPORTS", "VARIANTS", "AlgorithmConfig", "CheckpointConfig",
    "Config", "DataConfig",
    "EnvConfig", "LearnerConfig", "LoraConfig", "MeshConfig", "ModelConfig", "RunConfig", "SamplerConfig", "apply_overrides", "load_config",
    "main",
]
