"""`sao-eval`: benchmark scores of a checkpointed policy.

  sao-eval --config configs/demo_cpu.py [--set ...] [--step N] [--episodes N]
           [--samples N] [--pass-k 1,4] [--temperature T] [--output FILE]
  sao-eval --config configs/from_hf.py --policy /path/to/Qwen3-0.6B [...]
  sao-eval --config C --serve [--step N] [--policy DIR] [--episodes N]

Restores the policy of checkpoint `--step` (default: latest) from the run's
checkpoint directory, or with `--policy DIR` loads the policy in DIR (a Hugging
Face directory: the base model before RL or a merged export; or a sao-convert
params directory) sharded over the config's sampler mesh, and plays the benchmark tasks (every row of an
`env.dataset` file, or `run.eval_episodes` generated tasks; `--episodes` caps
them): greedy pass@1 and, with `--samples N`, mean@N and unbiased pass@k per
`--pass-k`, overall and per source (`sao_jax.jobs.evaluate.benchmark`), and each
kind of environment failure with its count and first message. Prints a table and
writes the JSON report to `--output` (refused when that file exists), by default
RUN_DIR/eval/step_<step>.json, or step_<step>.2.json, .3, ... when an earlier
report of the step is there (it is kept); the last line says where.

With `--serve` it scores nothing: it serves the policy on the agent endpoint alone,
for debugging an agent against it (`sao_jax.jobs.serve`; docs/reference/
agent-endpoint.md): it prints the base URL and the API key to give the agent, one
line per episode that ends, and stops after `--episodes` episodes (default: when
interrupted).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from sao_jax import storage
from sao_jax.cli import flags
from sao_jax.jobs import startup


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="sao-eval", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="the run's configs/<name>.py file")
  flags.add_set(parser, help="the run's overrides, as given to sao-train (repeatable)")
  parser.add_argument("--step", type=int, help="checkpoint step (default: latest)")
  parser.add_argument("--policy", metavar="DIR",
                      help="score the policy in DIR instead of a run checkpoint: a Hugging "
                      "Face directory (the base model before RL, or a sao-convert export with "
                      "LoRA merged) or a sao-convert params directory; its model section and "
                      "tokenizer come from DIR, the rest from the config")
  parser.add_argument("--episodes", type=int, help="at most this many tasks (default: every "
                      "dataset row, or run.eval_episodes generated tasks)")
  parser.add_argument("--samples", help="sampled episodes per task (run.eval_samples)")
  parser.add_argument("--pass-k", help="comma-separated k for pass@k (run.eval_pass_k)")
  parser.add_argument("--temperature", help="sampling temperature (run.eval_temperature)")
  parser.add_argument("--serve", action="store_true",
                      help="serve the policy on the agent endpoint (env.options' address and "
                      "limits) for agents to call, instead of scoring it; each new episode "
                      "name in a client's API key opens an episode; with --episodes N, stop "
                      "after N episodes ended")
  parser.add_argument("--output", help="JSON report path, a new file (default "
                      "RUN_DIR/eval/step_<step>.json, numbered .2, .3, ... when taken)")
  return parser


def main(argv: Sequence[str] | None = None) -> None:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.episodes is not None and args.episodes < 1:
    parser.error(f"--episodes {args.episodes}: expected at least 1 task")
  # Checked before the evaluation, which can take hours, not when its report is written.
  try:  # a bucket URL (sao_jax.storage) needs its filesystem's package
    output = storage.as_path(args.output) if args.output else None
  except ValueError as error:
    parser.error(f"--output: {error}")
  if output is not None and output.is_dir():
    parser.error(f"--output {args.output!r} is a directory; pass a file path, e.g. "
                 f"{output / 'report.json'}")
  if output is not None and output.exists():  # a report there is not overwritten unasked
    parser.error(f"--output {args.output!r} already exists; remove it first to replace it, "
                 "or name another file (without --output, reports are numbered, never "
                 "overwritten)")
  if args.serve and (args.output or args.samples or args.pass_k or args.temperature):
    parser.error("--serve scores nothing: --output, --samples, --pass-k and --temperature "
                 "are for scoring; the served policy samples with the run's sampler settings")
  overrides = list(args.overrides)
  for field, value in (("eval_samples", args.samples), ("eval_temperature", args.temperature),
                       ("eval_pass_k", args.pass_k)):
    if value is not None:
      overrides.append(f"run.{field}={value}")
  try:
    cfg = startup.load(args.config, overrides)
    from sao_jax.jobs import eval_scores, evaluate as evaluation

    if args.policy and args.step is not None:
      parser.error("--step picks a run checkpoint; --policy scores a directory instead")
    if args.serve:
      return _serve(cfg, args)
    if args.policy:
      report = evaluation.evaluate_policy(cfg, args.policy, limit=args.episodes)
    else:
      report = evaluation.evaluate_checkpoint(cfg, args.step, limit=args.episodes)
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  earlier = None
  if output is None:  # a report of the same checkpoint already there is kept
    earlier = (evaluation.policy_report_path(cfg, args.policy) if args.policy
               else evaluation.report_path(cfg, report["step"]))
    output = evaluation.unused_report_path(earlier)
  try:  # written whole or not at all: a full disk leaves no half report to be read
    storage.write_atomic(output, json.dumps(report, indent=2).encode())
  except OSError as error:
    parser.exit(1, f"error: cannot write the report to {str(output)!r} ({error}); the scores "
                f"follow, pass --output ANOTHER_FILE next time\n{json.dumps(report)}\n")
  scored = f"policy {args.policy}" if args.policy else f"checkpoint step {report['step']}"
  print(f"{report['tasks']}: {scored}"
        + (f", {report['samples']} samples per task at temperature {report['temperature']}"
           if report["samples"] else ", greedy"))
  print(eval_scores.format_table(report))
  print(f"report: {output}" + (f" ({earlier} holds an earlier report, kept)"
                                if earlier is not None and output != earlier else ""))


def _serve(cfg, args) -> None:
  """`--serve`: the policy of `--policy` or checkpoint `--step` behind the endpoint."""
  from sao_jax.jobs import evaluate as evaluation, serve

  if args.policy:
    cfg, mesh, chat, params = evaluation.directory_policy(cfg, args.policy)
    version, what = 0, f"policy {args.policy}"
  else:
    cfg, mesh, chat, params, meta = evaluation.checkpoint_policy(cfg, args.step)
    version, what = int(meta["policy_version"]), f"checkpoint step {meta['step']}"
  print(f"{what}, sampled with the run's sampler settings (temperature "
        f"{cfg.sampler.temperature:g})", flush=True)
  try:
    serve.serve(cfg, chat, params, version=version, mesh=mesh, episodes=args.episodes,
                log=lambda line: print(line, flush=True))
  except KeyboardInterrupt:
    print("stopped", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
