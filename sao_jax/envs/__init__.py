"""Text-level RL environments: chat messages in, observations or rewards out.

No model or tokenizer in here; the sampler renders messages with the chat
template. See `base` for the protocol (the public interface for environments
of your own: docs/tutorials/your-own-environment.md), `registry` to build from
an `EnvConfig`.
"""

from sao_jax.config import EnvConfig
from sao_jax.envs.base import (Environment, EnvironmentSpec, Message, NoOptions, StepResult, Task,
                               Transcript, play)
from sao_jax.envs.registry import make_env, make_tasks

__all__ = [
    "EnvConfig",
    "Environment",
    "EnvironmentSpec",
    "Message",
    "NoOptions",
    "StepResult",
    "Task",
    "Transcript",
    "make_env",
    "make_tasks",
    "play",
]
