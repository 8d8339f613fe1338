"""`sao-eval`: held-out accuracy of a checkpointed policy.

  sao-eval --config configs/demo_cpu.py [--set ...] [--step N] [--episodes N]

Restores the policy of checkpoint `--step` (default: latest) from the run's
checkpoint directory and runs the same greedy held-out evaluation as training.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from typing import Sequence

from sao_jax.config import load_config


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="sao-eval", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="the run's configs/<name>.py file")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE")
  parser.add_argument("--step", type=int, help="checkpoint step (default: latest)")
  parser.add_argument("--episodes", type=int, help="held-out episodes (default: run.eval_episodes)")
  args = parser.parse_args(argv)
  try:
    cfg = load_config(args.config, args.overrides)
    if args.episodes is not None:
      cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, eval_episodes=args.episodes))
    if cfg.checkpoint.directory is None:
      cfg = dataclasses.replace(cfg, checkpoint=dataclasses.replace(
          cfg.checkpoint, directory=str(pathlib.Path(cfg.run.run_dir) / "checkpoints")))
    cfg.validate()
    import jax

    from sao_jax.checkpoint import Checkpointer
    from sao_jax.evaluation import Evaluator
    from sao_jax.learner.state import abstract_state
    from sao_jax.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.run.tokenizer or pathlib.Path(cfg.run.run_dir))
    checkpointer = Checkpointer(cfg)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                            abstract_state(cfg))
    state, _, meta = checkpointer.restore(abstract, args.step)
    checkpointer.close()
    version = int(state.policy_version)
    result = Evaluator(cfg, tokenizer, state.policy_params, version=version).evaluate(
        state.policy_params, version)
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  print(json.dumps({"step": meta["step"], "policy_version": version, **result}, indent=2))


if __name__ == "__main__":
  main(sys.argv[1:])
