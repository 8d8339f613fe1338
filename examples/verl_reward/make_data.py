"""Writes a small verl-style Parquet file (what verl's data_preprocess scripts write):
a chat-message `prompt`, `reward_model.ground_truth`, `data_source` and `extra_info`.

    .venv/bin/python examples/verl_reward/make_data.py runs/verl_reward/train.parquet
"""

import pathlib
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq

SYSTEM = "Answer with the number only, as \\boxed{number}."


def rows(count: int, seed: int = 0) -> dict:
  rng = random.Random(seed)
  out = {"data_source": [], "prompt": [], "ability": [], "reward_model": [], "extra_info": []}
  for index in range(count):
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    source, question, answer = (("arith/add", f"What is {a} + {b}?", a + b) if index % 2 == 0
                                else ("arith/mul", f"What is {a} * {b}?", a * b))
    out["data_source"].append(source)
    out["prompt"].append([{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": question}])
    out["ability"].append("math")
    out["reward_model"].append({"style": "rule", "ground_truth": str(answer)})
    out["extra_info"].append({"split": "train", "index": index})
  return out


def write(path: str | pathlib.Path, count: int = 256) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.table(rows(count)), path)
  return path


if __name__ == "__main__":
  print(write(sys.argv[1] if len(sys.argv) > 1 else "runs/verl_reward/train.parquet"))
