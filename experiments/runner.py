"""Runs one claim: `sao-train` per (variant, seed) in subprocesses, resumable, then the report.

    python -m experiments.<claim> [--seeds N] [--quick] [--out DIR] [--set a.b=c ...]

Layout under `--out` (default runs/experiments, runs/experiments-quick with --quick):

    warm_start/<env>-<hash>-seed<k>/   tokenizer + SFT policy shared by every run of seed k
    runs/<setting>/<variant>-seed<k>/  a sao-train run directory, plus experiment.json
                                       (overrides, wall-clock per finished invocation,
                                       done flag) and train.log
    claims/<claim>.json                which runs make up the claim, seeds, budget

Runs go one at a time, or `--jobs N` at once (a run is a learner and a sampler
process that take turns, so on 2 cores two runs at once finish sooner than two
in turn; they share the CPU, so per-run wall-clock grows). A run whose experiment.json
says done is skipped; one that was killed resumes from its latest checkpoint
(`--resume`); one killed before its first checkpoint starts again. The same
variant name always means the same overrides: a run directory recorded with
other overrides (another `--set`, or --quick) is refused, not mixed in.

Every run of a seed starts from that seed's warm-start and uses seed k for the
model init, task stream and sampler; all variants train the same number of
trajectories (`learner.steps` x `learner.batch_trajectories`). For the style
setting the run is split at each `env.style_schedule` switch into resumed
invocations, each with the next style from step 0 (see claims.py).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

from sao_jax.config import AlgorithmConfig, Config
from sao_jax.jobs import startup

from experiments import claims as claims_lib
from experiments import runs, warm_start as warm_start_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS_DIR = ROOT / "configs" / "experiments"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# One lock per warm-start directory: runs of the same seed in parallel jobs wait
# for the first to make it instead of making it twice.
_WARM_START_LOCKS: collections.defaultdict[pathlib.Path, threading.Lock] = (
    collections.defaultdict(threading.Lock))


def setting_path(setting: str) -> pathlib.Path:
  return SETTINGS_DIR / f"{setting}.py"


def quick_overrides(setting: str) -> tuple[str, ...]:
  """The setting module's QUICK_OVERRIDES (a pipeline check in minutes)."""
  spec = importlib.util.spec_from_file_location(f"_setting_{setting}", setting_path(setting))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return tuple(module.QUICK_OVERRIDES)


def _literal(value: Any) -> str:
  return value if isinstance(value, str) else repr(value)


def variant_overrides(base: Config, variant: claims_lib.Variant) -> list[str]:
  """`--set` strings that turn `base`'s algorithm section into `variant`'s."""
  target = AlgorithmConfig.for_variant(variant.preset, **dict(variant.fields))
  return [f"algorithm.{f.name}={_literal(getattr(target, f.name))}"
          for f in dataclasses.fields(target)
          if getattr(target, f.name) != getattr(base.algorithm, f.name)]


def seed_overrides(seed: int) -> list[str]:
  return [f"seed={seed}", f"env.seed={seed}", f"sampler.seed={seed}"]


def _changed(section: Any, prefix: str = "") -> dict[str, Any]:
  """A config section's fields that differ from the defaults: new fields added to
  sao_jax's config later (with defaults) leave the key, and existing warm-starts, as they are.
  A nested section's fields count as `<field>_<name>` (env.tool.wall_time_s is
  `tool_wall_time_s`, as it was spelled before the tool limits became a section)."""
  default, changed = type(section)(), {}
  for field in dataclasses.fields(section):
    value = getattr(section, field.name)
    if dataclasses.is_dataclass(value):
      changed.update(_changed(value, f"{prefix}{field.name}_"))
    elif value != getattr(default, field.name):
      changed[prefix + field.name] = value
  return changed


def warm_start_dir(out: pathlib.Path, cfg: Config) -> pathlib.Path:
  """Keyed by everything the warm-start depends on, so settings share it only when equal."""
  # The style schedule and the simulated step latency change RL, not the SFT that
  # makes a warm-start (its demonstrations never run through the sampler's runner).
  env = {k: v for k, v in _changed(cfg.env).items()
         if k != "style_schedule" and not k.startswith("latency_")}
  sft = [cfg.run.sft_steps, cfg.run.sft_lr, cfg.run.sft_batch]
  if cfg.run.sft_target_accuracy:  # appended only when set: older keys stay valid
    sft += [cfg.run.sft_target_accuracy, cfg.run.sft_check_every,
            cfg.run.sft_validation_episodes, cfg.run.eval_seed]
  key = json.dumps({"model": _changed(cfg.model), "env": env, "data": _changed(cfg.data),
                    "seed": cfg.seed, "sft": sft}, sort_keys=True, default=str)
  digest = hashlib.sha1(key.encode()).hexdigest()[:8]
  return out / "warm_start" / f"{cfg.env.name}-{digest}-seed{cfg.seed}"


def phases(cfg: Config, style_switches: bool) -> list[tuple[int, tuple[str, ...]]]:
  """(end step, extra overrides) per invocation: one, or one per style phase."""
  if not style_switches:
    return [(cfg.learner.steps, ())]
  schedule = cfg.env.style_schedule
  ends = [step for step, _ in schedule[1:]] + [cfg.learner.steps]
  return [(end, (f"env.style_schedule=((0, {style!r}),)", f"learner.steps={end}"))
          for (_, style), end in zip(schedule, ends)]


def _read_state(run_dir: pathlib.Path) -> dict | None:
  path = run_dir / runs.STATE_FILE
  return json.loads(path.read_text()) if path.is_file() else None


def _write_state(run_dir: pathlib.Path, state: dict) -> None:
  (run_dir / runs.STATE_FILE).write_text(json.dumps(state, indent=2))


def _stop_with_runner(runner_pid: int) -> None:
  """In the child, before it runs: the kernel sends it SIGTERM when the runner's thread
  that started it ends, so killing the claim script stops its `sao-train` too (which
  saves a checkpoint on SIGTERM). Before, the child trained on alone, and the script
  started again on the same --out ran a second learner beside it."""
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
  if os.getppid() != runner_pid:  # the runner died before prctl: it would never be sent
    os._exit(1)


def _call(command: list[str], log_path: pathlib.Path) -> tuple[int, float]:
  """Runs `command`, appending its output to `log_path`; returns (exit code, seconds)."""
  start = time.monotonic()
  with open(log_path, "a", encoding="utf-8") as log:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                           preexec_fn=functools.partial(_stop_with_runner, os.getpid()))
  return code, time.monotonic() - start


def ensure_warm_start(cfg_path: pathlib.Path, overrides: list[str], cfg: Config,
                      out: pathlib.Path) -> pathlib.Path:
  """The seed's warm-start directory, made by `experiments.warm_start` unless already done."""
  directory = warm_start_dir(out, cfg)
  with _WARM_START_LOCKS[directory]:
    return _make_warm_start(cfg_path, overrides, cfg, directory)


def _make_warm_start(cfg_path: pathlib.Path, overrides: list[str], cfg: Config,
                     directory: pathlib.Path) -> pathlib.Path:
  if not (directory / warm_start_lib.DONE_FILE).is_file():
    directory.mkdir(parents=True, exist_ok=True)
    target = (f" (fewer once validation accuracy >= {cfg.run.sft_target_accuracy})"
              if cfg.run.sft_target_accuracy else "")
    print(f"  warm-start seed {cfg.seed}: {cfg.run.sft_steps} SFT steps{target} -> {directory}",
          flush=True)
    command = [sys.executable, "-m", "experiments.warm_start", "--config", str(cfg_path),
               "--seed", str(cfg.seed), "--out", str(directory)]
    command += [a for o in overrides for a in ("--set", o)]
    code, wall = _call(command, directory / "warm_start.log")
    if code != 0:
      raise RuntimeError(f"warm-start failed (exit {code}); see {directory / 'warm_start.log'}")
    print(f"  warm-start seed {cfg.seed} done in {wall:.0f} s", flush=True)
  return directory


def run_overrides(cfg: Config, shared: Sequence[str], variant: claims_lib.Variant,
                  warm: pathlib.Path, run_dir: pathlib.Path) -> list[str]:
  """`--set` strings of one run: `shared` (quick, extra, seed), the variant, and a start
  from the seed's warm-start instead of SFT (its accuracy target off with it)."""
  return [*shared, *variant_overrides(cfg, variant), *variant.overrides,
          f"run.init={warm / 'policy'}",
          f"run.tokenizer={warm / 'tokenizer.json'}", "run.sft_steps=0",
          *(["run.sft_target_accuracy=0.0"] if cfg.run.sft_target_accuracy else []),
          f"run.run_dir={run_dir}"]


def run_one(claim: claims_lib.Claim, variant: claims_lib.Variant, seed: int, *, quick: bool,
            extra: Sequence[str], out: pathlib.Path, tag: str = "",
            warm_start_seed: int | None = None) -> pathlib.Path:
  """Runs (or resumes, or skips) one (variant, seed) run; returns its directory,
  `<variant><tag>-seed<k>` (a tag tells apart runs of one variant under other `extra`
  overrides, e.g. a pilot's learning rates). The run starts from seed `warm_start_seed`'s
  warm-start when given (one warm-start shared by every seed), else from its own seed's."""
  cfg_path = setting_path(claim.setting)
  base = [*(quick_overrides(claim.setting) if quick else ()), *extra]
  shared = [*base, *seed_overrides(seed)]
  cfg = startup.load(cfg_path, shared)
  warm_shared, warm_cfg = shared, cfg
  if warm_start_seed is not None:
    warm_shared = [*base, *seed_overrides(warm_start_seed)]
    warm_cfg = startup.load(cfg_path, warm_shared)
  run_dir = out / "runs" / claim.setting / f"{variant.name}{tag}-seed{seed}"
  overrides = run_overrides(cfg, shared, variant, warm_start_dir(out, warm_cfg), run_dir)
  state = _read_state(run_dir)
  if state is not None and state["overrides"] != overrides:
    raise RuntimeError(f"{run_dir} was run with other overrides ({state['overrides']}); "
                       "use another --out or delete it")
  if state is not None and state["done"]:  # its warm-start is not needed (an archived run)
    print(f"  {variant.name} seed {seed}: done, skipped", flush=True)
    return run_dir
  ensure_warm_start(cfg_path, warm_shared, warm_cfg, out)
  if runs.latest_checkpoint(run_dir) is None and run_dir.exists():
    shutil.rmtree(run_dir)  # killed before its first checkpoint: metrics would repeat steps
  run_dir.mkdir(parents=True, exist_ok=True)
  state = state if state is not None and runs.latest_checkpoint(run_dir) is not None else {
      "variant": variant.name, "seed": seed, "overrides": overrides, "invocations": [],
      "done": False}
  resolved = startup.load(cfg_path, overrides)
  for end, phase in phases(resolved, claim.kind == "realignment"):
    if (runs.latest_checkpoint(run_dir) or 0) >= end:
      continue
    command = [sys.executable, "-m", "sao_jax.cli.train", "--config", str(cfg_path)]
    command += [a for o in [*overrides, *phase] for a in ("--set", o)]
    if runs.latest_checkpoint(run_dir) is not None:
      command.append("--resume")
    print(f"  {variant.name} seed {seed}: training to step {end} ...", flush=True)
    # The machine's load beside the run: a wall-clock comparison reads it next to the
    # result (the 1-minute load average at the invocation's start and end).
    load_start = os.getloadavg()[0]
    code, wall = _call(command, run_dir / "train.log")
    state["invocations"].append({"end_step": end, "exit_code": code, "wall_s": wall,
                                 "load_start": load_start, "load_end": os.getloadavg()[0]})
    _write_state(run_dir, state)
    if code != 0:
      raise RuntimeError(f"sao-train exited with {code}; see {run_dir / 'train.log'}")
  state["done"] = True
  _write_state(run_dir, state)
  total = sum(i["wall_s"] for i in state["invocations"])
  print(f"  {variant.name} seed {seed}: done ({total:.0f} s)", flush=True)
  return run_dir


def run_claim(claim: claims_lib.Claim, *, seeds: int, quick: bool, extra: Sequence[str],
              out: pathlib.Path, jobs: int = 1) -> list[str]:
  """Every (variant, seed) run of `claim`, `jobs` at a time; returns the failures (also
  printed). Parallel jobs start runs variant by variant across seeds, so they first
  make different seeds' warm-starts rather than wait on one; one job runs seed by seed,
  so a run stopped part-way leaves every variant with the same finished seeds."""
  cfg = startup.load(setting_path(claim.setting),
                    [*(quick_overrides(claim.setting) if quick else ()), *extra])
  manifest = {"claim": claim.name, "setting": claim.setting, "quick": quick,
              "extra_overrides": list(extra), "seeds": list(range(seeds)),
              "variants": list(claim.variants), "steps": cfg.learner.steps,
              "batch_trajectories": cfg.learner.batch_trajectories,
              "switches": [step for step, _ in cfg.env.style_schedule[1:]]
                          if claim.kind == "realignment" else [],
              "runs": {name: {} for name in claim.variants}}
  path = out / "claims" / f"{claim.name}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  failures = []
  print(f"{claim.name}: {len(claim.variants)} variants x {seeds} seeds, "
        f"{cfg.learner.steps} steps x {cfg.learner.batch_trajectories} trajectories each"
        + (f", {jobs} at a time" if jobs > 1 else ""), flush=True)
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    order = ([(name, seed) for name in claim.variants for seed in range(seeds)] if jobs > 1
             else [(name, seed) for seed in range(seeds) for name in claim.variants])
    pending = {pool.submit(run_one, claim, claims_lib.VARIANTS[name], seed, quick=quick,
                           extra=extra, out=out): (name, seed) for name, seed in order}
    try:
      for future in concurrent.futures.as_completed(pending):
        name, seed = pending[future]
        try:
          manifest["runs"][name][str(seed)] = str(future.result().relative_to(out))
        except RuntimeError as error:  # this run failed; the others go on
          failures.append(f"{name} seed {seed}: {error}")
          print(f"  FAILED {failures[-1]}", flush=True)
        manifest["runs"][name] = dict(sorted(manifest["runs"][name].items(),
                                             key=lambda kv: int(kv[0])))
        path.write_text(json.dumps(manifest, indent=2))
    except BaseException:  # a bad config (every run would fail alike) or Ctrl-C: start no more
      pool.shutdown(cancel_futures=True)
      raise
  return failures


def main(claim: claims_lib.Claim, argv: Sequence[str] | None = None) -> None:
  """The command line of every claim script."""
  from experiments import report  # matplotlib: only once arguments are fine

  parser = argparse.ArgumentParser(prog=f"experiments.{claim.name}",
                                   description=f"Claim {claim.number}: {claim.title}. "
                                               f"Paper: {claim.paper}.")
  parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
  parser.add_argument("--quick", action="store_true",
                      help="tiny budget (the setting's QUICK_OVERRIDES): checks the pipeline")
  parser.add_argument("--jobs", type=int, default=1,
                      help="runs at once (default 1; 2 suits a 2-core machine)")
  parser.add_argument("--out", help="runs directory (default runs/experiments[-quick])")
  parser.add_argument("--set", dest="extra", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE",
                      help="override for every run of every variant, e.g. learner.steps=60")
  parser.add_argument("--report", default=None,
                      help="report to (re)write (default docs/research/results.md, every claim); another "
                           "path gets this claim alone; plots go to <report dir>/results/")
  args = parser.parse_args(argv)
  if args.seeds < 1:
    parser.error(f"--seeds {args.seeds}: expected at least 1")
  if args.jobs < 1:
    parser.error(f"--jobs {args.jobs}: expected at least 1")
  out = pathlib.Path(args.out or ROOT / "runs" / ("experiments-quick" if args.quick
                                                  else "experiments")).resolve()
  target = pathlib.Path(args.report or report.DEFAULT_REPORT).resolve()
  try:
    if out.exists() and not out.is_dir():
      raise ValueError(f"--out {str(out)!r} is a file; pass a runs directory (created if missing)")
    report.check_report_path(target)
    failures = run_claim(claim, seeds=args.seeds, quick=args.quick, extra=args.extra, out=out,
                         jobs=args.jobs)
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  written = report.write_report(out, target, skip_missing=target != report.DEFAULT_REPORT)
  print(f"report: {written}")
  if failures:
    parser.exit(1, "failed runs:\n" + "\n".join(failures) + "\n")
