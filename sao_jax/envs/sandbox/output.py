"""What a tool run looks like to the model: one observation text per `SandboxResult`."""

from __future__ import annotations

from sao_jax.config.env import SandboxLimits
from sao_jax.envs.sandbox.process import SandboxResult


def format_tool_output(result: SandboxResult, limits: SandboxLimits) -> str:
  """stdout, then stderr, then notes on truncation, limits and the exit status."""
  parts = [text.rstrip("\n") for text in (result.stdout, result.stderr) if text]
  if result.stdout_truncated:
    parts.append(f"[stdout truncated to {limits.max_output_bytes} bytes]")
  if result.stderr_truncated:
    parts.append(f"[stderr truncated to {limits.max_output_bytes} bytes]")
  if result.killed_reason == "wall_time":
    parts.append(f"[killed: exceeded the {limits.wall_time_s:g} s time limit]")
  elif result.killed_reason == "cpu_time":
    parts.append(f"[killed: exceeded the {limits.cpu_time_s} s CPU time limit]")
  elif result.killed_reason is not None:
    parts.append(f"[killed: {result.killed_reason}]")
  elif result.exit_code != 0:
    parts.append(f"[exit status {result.exit_code}]")
  return "\n".join(parts) if parts else "[no output]"
