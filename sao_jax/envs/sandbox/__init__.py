"""Run untrusted, model-written Python in a separate, limited process
(`process`: what is enforced and by what) and turn the result into an
observation (`output`)."""

from sao_jax.config.env import DEFAULT_SANDBOX, SandboxLimits
from sao_jax.envs.sandbox.files import remove_tree
from sao_jax.envs.sandbox.output import format_tool_output
from sao_jax.envs.sandbox.process import (IsolationUnavailable, SandboxError, SandboxResult,
                                          require_isolation, run_python)
from sao_jax.envs.sandbox.scratch import make as make_scratch, reclaim as reclaim_scratch

__all__ = ["DEFAULT_SANDBOX", "IsolationUnavailable", "SandboxError", "SandboxLimits", "SandboxResult",
           "format_tool_output", "make_scratch", "reclaim_scratch", "remove_tree",
           "require_isolation", "run_python"]
