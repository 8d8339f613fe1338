"""Keeps an experiment's runs across machines: what the report reads, and what resumes.

    python -m experiments.archive save    --out runs/claim6 --to docs/research/results/claim6_runs
    python -m experiments.archive restore --out runs/claim6 --from docs/research/results/claim6_runs

A long claim (claim 6: 16 runs of ~1 hour on 2 cores) outlives the machine it
started on, and a session may end in the middle of a run. `save` copies into a
small directory that can be committed:

- for every run whose `experiment.json` says done: `experiment.json`,
  `config.json` and `metrics.jsonl` (gzipped), ~0.3 MB;
- for a run started but not done: the same (its `experiment.json` only once an
  invocation has ended) plus its newest complete checkpoint, whole (~11 MB for
  the experiments' model), so that the claim resumes it from there instead of
  training it again from step 0; older checkpoints stay behind, and the
  checkpoint leaves the archive at the first `save` after the run is done;
- the claim manifests (listing only the finished runs, which the report reads);
- every warm-start's `DONE.json` record, and the warm-start itself, whole
  (policy, tokenizer: ~1.5 MB), while some variant of its seed is not done.

`restore` writes them back under another `--out` (the paths the runs recorded are
moved to it), after which the claim's script, run with the same arguments and that
`--out`, skips the finished runs, resumes the part-done ones and trains the rest;
it never overwrites a run that is already there. `save` refuses to leave files that
git would ignore (a `runs/` pattern once hid every run this way: the archive was
committed without them and they were lost with the machine).

Every variant of a seed must start from the same warm-start, and one made again
later need not be the same: on one machine and one commit it is bit-identical,
but the code between sessions changes (seed 0 of `stability` started at
held-out accuracy 0.39 in one session's rerun and 0.22 in the next's), and XLA
may compile other kernels on another CPU. Hence the warm-start travels whole
until its seed is finished.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import shutil
import subprocess
from typing import Sequence

from sao_jax.run.metrics import METRICS_FILE

from experiments import runs
from experiments.warm_start import DONE_FILE

INDEX = "ARCHIVE.json"  # {"out": the --out the runs were made under}
RUN_FILES = (runs.STATE_FILE, "config.json")  # JSON text: recorded paths are moved on restore
CONFIG_FILE = "config.json"  # every started run has it (sao-train writes it first)
WARM_RECORD = "warm_start.json"  # a warm-start's DONE.json, renamed: restoring it as DONE.json
# would claim a warm-start whose policy is not there
WARM_FILES = ("policy", "tokenizer.json", DONE_FILE)  # a warm-start archived whole


def _remove(path: pathlib.Path) -> None:
  if path.is_dir():
    shutil.rmtree(path)
  elif path.exists():
    path.unlink()


def _copy(source: pathlib.Path, target: pathlib.Path) -> None:
  if source.is_dir():
    shutil.copytree(source, target)
  else:
    shutil.copyfile(source, target)


def _warm_name(run_dir: pathlib.Path) -> str:
  """The warm-start directory a run started from (`run.init` = <warm-start>/policy)."""
  return pathlib.Path(json.loads((run_dir / "config.json").read_text())["run"]["init"]).parent.name


def _done(run_dir: pathlib.Path) -> bool:
  state = run_dir / runs.STATE_FILE
  return state.is_file() and json.loads(state.read_text())["done"]


def _unfinished_warm_starts(out: pathlib.Path) -> set[str]:
  """Warm-starts some variant of whose seed is not done (that run, when it trains or
  resumes, needs the very same warm-start)."""
  unfinished = set()
  for path in out.glob("claims/*.json"):
    manifest = json.loads(path.read_text())
    for seed in manifest["seeds"]:
      runs = [out / "runs" / manifest["setting"] / f"{v}-seed{seed}"
              for v in manifest["variants"]]
      if all(_done(d) for d in runs):
        continue
      # The warm-start a run started from, else the seed's (the runner's key for it).
      started = {_warm_name(d) for d in runs if (d / CONFIG_FILE).is_file()}
      unfinished |= started or {p.name for p in out.glob(f"warm_start/*-seed{seed}")}
  # A started run that is not done needs its warm-start whether or not a manifest lists
  # it: the runner writes the manifest only once some run has finished.
  for config_path in out.glob(f"runs/*/*/{CONFIG_FILE}"):
    if not _done(config_path.parent):
      unfinished.add(_warm_name(config_path.parent))
  return unfinished


def _git_ignored(paths: list[pathlib.Path]) -> list[str]:
  """Those of `paths` that the git work tree holding them would ignore (none outside git)."""
  if not paths:
    return []
  cwd = next(p for p in paths[0].resolve().parents if p.is_dir())
  try:
    result = subprocess.run(["git", "check-ignore", "--stdin", "-z"], cwd=cwd,
                            input="\0".join(str(p.resolve()) for p in paths), text=True,
                            capture_output=True, check=False)
  except FileNotFoundError:  # no git on this machine: nothing to commit the archive with
    return []
  return [p for p in result.stdout.split("\0") if p] if result.returncode == 0 else []


def _save_run(run_dir: pathlib.Path, target: pathlib.Path) -> None:
  """A run's files, and while it is not done its newest checkpoint (replacing an older one)."""
  target.mkdir(parents=True, exist_ok=True)
  for name in RUN_FILES:
    if (run_dir / name).is_file():
      shutil.copyfile(run_dir / name, target / name)
  with open(run_dir / METRICS_FILE, "rb") as source, \
      gzip.GzipFile(target / f"{METRICS_FILE}.gz", "wb", mtime=0) as sink:
    shutil.copyfileobj(source, sink)
  _remove(target / "checkpoints")
  step = runs.latest_checkpoint(run_dir)
  if not _done(run_dir) and step is not None:
    _copy(run_dir / "checkpoints" / str(step), target / "checkpoints" / str(step))


def save(out: pathlib.Path, to: pathlib.Path) -> list[str]:
  """Archives `out`'s finished runs, and the part-done ones with their newest checkpoint,
  into `to` (added to what it holds); returns their paths relative to `out`, a part-done
  run's followed by ` (at step N)`."""
  out, saved = out.resolve(), []
  for path in (to, *to.parents):
    if path.exists() and not path.is_dir():
      raise ValueError(f"--to {str(to)!r}: {str(path)!r} is a file; pass an archive directory")
  index = to / INDEX
  if index.is_file() and json.loads(index.read_text())["out"] != str(out):
    raise ValueError(f"{to} archives runs made under {json.loads(index.read_text())['out']}, "
                     f"not {out}: restore it there first, or archive to another directory")
  if not (out / "claims").is_dir():  # a typo'd --out would archive nothing and claim `to`
    raise ValueError(f"--out {str(out)!r} holds no experiment runs (no claims/ directory); "
                     "pass the --out directory a claim script wrote")
  for config_path in sorted(out.glob(f"runs/*/*/{CONFIG_FILE}")):
    run_dir = config_path.parent
    step = runs.latest_checkpoint(run_dir)
    if not _done(run_dir) and step is None:
      continue  # nothing to resume from: the runner trains it again from step 0
    rel = run_dir.relative_to(out)
    _save_run(run_dir, to / rel)
    saved.append(str(rel) if _done(run_dir) else f"{rel} (at step {step})")
  archived = {str(p.parent.relative_to(to)) for p in to.glob(f"runs/*/*/{runs.STATE_FILE}")
              if _done(p.parent)}
  for path in sorted(out.glob("claims/*.json")):  # listing only the runs archived done
    manifest = json.loads(path.read_text())
    manifest["runs"] = {name: {seed: rel for seed, rel in by_seed.items() if rel in archived}
                        for name, by_seed in manifest["runs"].items()}
    (to / "claims").mkdir(parents=True, exist_ok=True)
    (to / "claims" / path.name).write_text(json.dumps(manifest, indent=2))
  unfinished = _unfinished_warm_starts(out)
  for path in sorted(out.glob(f"warm_start/*/{DONE_FILE}")):
    target = to / path.relative_to(out).parent
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target / WARM_RECORD)
    for name in WARM_FILES:  # whole while its seed is part-done, else the record alone
      _remove(target / name)
      if path.parent.name in unfinished:
        _copy(path.parent / name, target / name)
  to.mkdir(parents=True, exist_ok=True)
  index.write_text(json.dumps({"out": str(out)}, indent=2))
  ignored = _git_ignored([p for p in sorted(to.rglob("*")) if p.is_file()])
  if ignored:
    raise RuntimeError(f"git ignores {len(ignored)} archived file(s), e.g. {ignored[0]}: a "
                       "commit would leave them out (`git check-ignore -v PATH` names the "
                       "pattern); narrow that pattern or archive elsewhere")
  return saved


def restore(source: pathlib.Path, out: pathlib.Path) -> list[str]:
  """Writes the runs archived in `source` under `out`, with the paths they recorded
  moved from the archived `--out` to `out`; returns the runs restored (a run already
  under `out` is left as it is)."""
  index = source / INDEX
  if not index.is_file():
    raise FileNotFoundError(f"{source} holds no {INDEX}: not an experiment archive "
                            "(`python -m experiments.archive save` writes one)")
  old, out, restored = json.loads(index.read_text())["out"], out.resolve(), []
  for config_path in sorted(source.glob(f"runs/*/*/{CONFIG_FILE}")):
    archived = config_path.parent
    rel = archived.relative_to(source)
    target = out / rel
    if (target / CONFIG_FILE).is_file():
      continue
    target.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:  # JSON text: the old prefix appears only in recorded paths
      if (archived / name).is_file():
        text = (archived / name).read_text()
        (target / name).write_text(
            text.replace(json.dumps(old)[1:-1], json.dumps(str(out))[1:-1]))
    with gzip.open(archived / f"{METRICS_FILE}.gz", "rb") as metrics, \
        open(target / METRICS_FILE, "wb") as sink:
      shutil.copyfileobj(metrics, sink)
    if (archived / "checkpoints").is_dir():
      shutil.copytree(archived / "checkpoints", target / "checkpoints")
    restored.append(str(rel))
  for path in sorted(source.glob("claims/*.json")):
    target = out / path.relative_to(source)
    if not target.is_file():
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(path, target)
  for path in sorted(source.glob(f"warm_start/*/{WARM_RECORD}")):
    target = out / path.relative_to(source)
    if target.parent.is_dir():
      continue  # made or restored here already
    shutil.copytree(path.parent, target.parent)  # the record, and the warm-start if whole
  return restored


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="experiments.archive", description=__doc__.split("\n")[0])
  parser.add_argument("action", choices=("save", "restore"))
  parser.add_argument("--out", required=True, help="the claim script's runs directory")
  parser.add_argument("--to", help="save: the archive directory")
  parser.add_argument("--from", dest="source", help="restore: the archive directory")
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out)
  if args.action == "save":
    if not args.to:
      parser.error("save needs --to DIR")
    try:
      runs = save(out, pathlib.Path(args.to))
    except (ValueError, RuntimeError) as error:
      parser.exit(2, f"error: {error}\n")
    print(f"archived {len(runs)} run(s) of {out} in {args.to}")
  else:
    if not args.source:
      parser.error("restore needs --from DIR")
    try:
      if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out!r} is a file; pass the runs directory to restore into")
      runs = restore(pathlib.Path(args.source), out)
    except (ValueError, FileNotFoundError) as error:
      parser.exit(2, f"error: {error}\n")
    print(f"restored {len(runs)} run(s) under {out}")
  for rel in runs:
    print(f"  {rel}")


if __name__ == "__main__":
  main()
