"""Keeps an experiment's finished runs across machines: what the report reads, no checkpoints.

    python -m experiments.archive save    --out runs/claim6 --to docs/results/claim6_runs
    python -m experiments.archive restore --out runs/claim6 --from docs/results/claim6_runs

A long claim (claim 6: 16 runs of ~1 hour on 2 cores) outlives the machine it
started on. `save` copies, for every run whose `experiment.json` says done, its
`experiment.json`, `config.json` and `metrics.jsonl` (gzipped), plus the claim
manifests (listing the archived runs) and the warm-starts' `DONE.json` records, into a small directory that
can be committed (~0.3 MB a run). `restore` writes them back under another `--out`
(the paths the runs recorded are moved to it), after which the claim's script,
run with the same arguments and that `--out`, skips the finished runs and trains
the others, and the report is written from all of them. Unfinished runs and
checkpoints are never archived, and `restore` never overwrites a run that is
already there.

Every variant of a seed must start from the same warm-start, and one made again
later need not be the same: on one machine and one commit it is bit-identical,
but the code between sessions changes (seed 0 of `stability` started at
held-out accuracy 0.39 in one session's rerun and 0.22 in the next's), and XLA
may compile other kernels on another CPU. So a warm-start that some but not all of its seed's
variants have finished from is archived whole (policy, tokenizer: ~1.5 MB
for the experiments' model) and restored as made; once every variant of the
seed is archived, the next `save` keeps only its record.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import shutil
from typing import Sequence

from sao_jax.metrics import METRICS_FILE

from experiments import runner
from experiments.warm_start import DONE_FILE

INDEX = "ARCHIVE.json"  # {"out": the --out the runs were made under}
RUN_FILES = (runner.STATE_FILE, "config.json")
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


def _partial_warm_starts(out: pathlib.Path) -> set[str]:
  """Warm-starts from which some, but not all, of a claim's variants of their seed
  have finished (those runs need the very same warm-start)."""
  finished: dict[str, set[str]] = {}
  wanted: dict[str, set[str]] = {}
  for path in out.glob("claims/*.json"):
    manifest = json.loads(path.read_text())
    for seed in manifest["seeds"]:
      runs = {v: out / "runs" / manifest["setting"] / f"{v}-seed{seed}"
              for v in manifest["variants"]}
      done = {v for v, d in runs.items() if (d / runner.STATE_FILE).is_file()
              and json.loads((d / runner.STATE_FILE).read_text())["done"]}
      for variant in done:
        name = _warm_name(runs[variant])
        finished.setdefault(name, set()).add(variant)
        wanted.setdefault(name, set()).update(manifest["variants"])
  return {name for name in finished if finished[name] != wanted[name]}


def save(out: pathlib.Path, to: pathlib.Path) -> list[str]:
  """Archives `out`'s finished runs into `to` (added to what it holds); returns their
  paths relative to `out`."""
  out, saved = out.resolve(), []
  index = to / INDEX
  if index.is_file() and json.loads(index.read_text())["out"] != str(out):
    raise ValueError(f"{to} archives runs made under {json.loads(index.read_text())['out']}, "
                     f"not {out}: restore it there first, or archive to another directory")
  for state_path in sorted(out.glob(f"runs/*/*/{runner.STATE_FILE}")):
    run_dir = state_path.parent
    if not json.loads(state_path.read_text())["done"]:
      continue
    rel = run_dir.relative_to(out)
    target = to / rel
    target.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
      shutil.copyfile(run_dir / name, target / name)
    with open(run_dir / METRICS_FILE, "rb") as source, \
        gzip.GzipFile(target / f"{METRICS_FILE}.gz", "wb", mtime=0) as sink:
      shutil.copyfileobj(source, sink)
    saved.append(str(rel))
  archived = {str(p.parent.relative_to(to)) for p in to.glob(f"runs/*/*/{runner.STATE_FILE}")}
  for path in sorted(out.glob("claims/*.json")):  # listing only the runs archived
    manifest = json.loads(path.read_text())
    manifest["runs"] = {name: {seed: rel for seed, rel in by_seed.items() if rel in archived}
                        for name, by_seed in manifest["runs"].items()}
    (to / "claims").mkdir(parents=True, exist_ok=True)
    (to / "claims" / path.name).write_text(json.dumps(manifest, indent=2))
  partial = _partial_warm_starts(out)
  for path in sorted(out.glob(f"warm_start/*/{DONE_FILE}")):
    target = to / path.relative_to(out).parent
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target / WARM_RECORD)
    for name in WARM_FILES:  # whole while its seed is part-done, else the record alone
      _remove(target / name)
      if path.parent.name in partial:
        _copy(path.parent / name, target / name)
  to.mkdir(parents=True, exist_ok=True)
  index.write_text(json.dumps({"out": str(out)}, indent=2))
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
  for state_path in sorted(source.glob(f"runs/*/*/{runner.STATE_FILE}")):
    rel = state_path.parent.relative_to(source)
    target = out / rel
    if (target / runner.STATE_FILE).is_file():
      continue
    target.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:  # JSON text: the old prefix appears only in recorded paths
      text = (state_path.parent / name).read_text()
      (target / name).write_text(text.replace(json.dumps(old)[1:-1], json.dumps(str(out))[1:-1]))
    with gzip.open(state_path.parent / f"{METRICS_FILE}.gz", "rb") as metrics, \
        open(target / METRICS_FILE, "wb") as sink:
      shutil.copyfileobj(metrics, sink)
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
    runs = save(out, pathlib.Path(args.to))
    print(f"archived {len(runs)} finished run(s) of {out} in {args.to}")
  else:
    if not args.source:
      parser.error("restore needs --from DIR")
    try:
      runs = restore(pathlib.Path(args.source), out)
    except FileNotFoundError as error:
      parser.exit(2, f"error: {error}\n")
    print(f"restored {len(runs)} run(s) under {out}")
  for rel in runs:
    print(f"  {rel}")


if __name__ == "__main__":
  main()
