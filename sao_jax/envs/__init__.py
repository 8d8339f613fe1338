"""Text-level RL environments: chat messages in, observations or rewards out.

No model or tokenizer in here; the sampler renders messages with the chat
template. See `base` for the protocol, `registry` to build from an `EnvConfig`.
"""

from sao_jax.config import EnvConfig
from sao_jax.envs.base import Environment, Message, StepResult, Task, Transcript, play
from sao_jax.envs.registry import make_env, make_tasks

__all__ = [
    "EnvConfig",
    "Environment",
    "Message",
    "StepResult",
    "Task",
    "Transcript",
    "make_env",
    "make_tasks",
    "play",
]
