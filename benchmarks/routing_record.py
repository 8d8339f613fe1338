"""What MoE routing records cost: bytes per token of a trajectory record
(`sao_jax.channel.records.to_bytes`) with and without `routed_experts`, for a model
config (default: configs/qwen3_30b_a3b_v5p128.py), and what that means for the
sampler's host memory and the channel.

    python benchmarks/routing_record.py [--config configs/NAME.py] [--tokens 4096]

Measured on real record bytes: a trajectory of `--tokens` tokens (half prompt, half
action, as the sampler writes it: -1 rows where nothing was recorded) is encoded
with and without its routing; the difference over the tokens is the overhead.
Ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from sao_jax.channel import records
from sao_jax.config import load_config
from sao_jax.models import moe
from sao_jax.models.transformer import moe_layers
from sao_jax.types import Trajectory

ROOT = pathlib.Path(__file__).resolve().parents[1]


def record_bytes(tokens: int, routing: tuple[int, int, np.dtype] | None, seed: int = 0) -> int:
  """Bytes of the record of a `tokens`-token trajectory (half prompt, half action)."""
  rng = np.random.default_rng(seed)
  action = (np.arange(tokens) >= tokens // 2).astype(np.int8)
  routed = None
  if routing is not None:
    layers, k, dtype = routing
    routed = rng.integers(0, 100, (tokens, layers, k)).astype(dtype)
    routed[action == 0] = -1
  traj = Trajectory(tokens=rng.integers(0, 150_000, tokens).astype(np.int32), action_mask=action,
                    behavior_logp=np.where(action, -1.0, 0.0).astype(np.float32),
                    rewards=np.zeros(tokens, np.float32), prompt_id=0, policy_versions=(0, 0),
                    info={"task": "t"}, routed_experts=routed)
  return len(records.to_bytes(traj))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default=str(ROOT / "configs" / "qwen3_30b_a3b_v5p128.py"))
  parser.add_argument("--tokens", type=int, default=4096)
  args = parser.parse_args()
  cfg = load_config(args.config)
  model, sampler = cfg.model, cfg.sampler
  if not model.num_experts:
    raise SystemExit(f"{args.config}: a dense model (model.num_experts=0) records no routing")
  routing = (moe_layers(model), model.num_experts_per_tok, moe.expert_index_dtype(model.num_experts))
  plain = record_bytes(args.tokens, None)
  routed = record_bytes(args.tokens, routing)
  per_token = (routed - plain) / args.tokens
  base_per_token = plain / args.tokens
  # The sampler holds each in-flight episode's routing on the host (one [L, k] row per
  # decoded token) until it finishes; worst case every slot at max_seq_len.
  worst_host = sampler.slots * sampler.max_seq_len * per_token
  # One learner batch carries [rows, T, L, k] beside its [rows, T] arrays.
  batch = cfg.learner.batch_rows * sampler.max_seq_len * per_token
  result = {"name": "routing_record", "config": pathlib.Path(args.config).stem,
            "moe_layers": routing[0], "top_k": routing[1], "dtype": str(np.dtype(routing[2])),
            "tokens": args.tokens, "record_bytes_plain": plain, "record_bytes_routed": routed,
            "routing_bytes_per_token": round(per_token, 2),
            "plain_bytes_per_token": round(base_per_token, 2),
            "routing_share_of_record": round((routed - plain) / routed, 4),
            "sampler_host_worst_GiB": round(worst_host / 2**30, 2),
            "learner_batch_routing_GiB": round(batch / 2**30, 2)}
  print(f"{result['config']}: {routing[0]} MoE layers x top-{routing[1]} as {result['dtype']}: "
        f"{per_token:.1f} B/token of routing beside {base_per_token:.1f} B/token of the rest "
        f"({result['routing_share_of_record']:.1%} of the record)")
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
