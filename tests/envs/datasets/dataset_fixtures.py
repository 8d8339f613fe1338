"""Small dataset files in the shape of GSM8K, MATH-500 and AIME, written by the tests.

Parquet through `pyarrow.parquet`. The `save_to_disk` directory is written with
pyarrow directly, in the layout `datasets.Dataset.save_to_disk` produces
(`data-00000-of-00001.arrow` as an Arrow IPC stream, `dataset_info.json`,
`state.json` listing the data files): `datasets` itself is not a dependency.
"""

import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

GSM8K = {  # openai/gsm8k "main": question, answer (worked solution ending in "#### n")
    "question": ["Natalia sold clips to 48 of her friends in April, and then she sold half as "
                 "many clips in May. How many clips did Natalia sell altogether?",
                 "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes "
                 "of babysitting. How much did she earn?",
                 "A shop sold 1,200 pens on Monday and 34 on Tuesday. How many pens in all?",
                 "Tom has 3 apples and buys 4 more. How many apples does he have?",
                 "A box holds 6 eggs. How many eggs are in 7 boxes?"],
    "answer": ["Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
               "<<48+24=72>>72 clips altogether in April and May.\n#### 72",
               "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she "
               "earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
               "1200 + 34 = 1234\n#### 1,234",
               "3 + 4 = 7\n#### 7",
               "6 * 7 = 42\n#### 42"],
}
GSM8K_ANSWERS = ["72", "10", "1234", "7", "42"]

MATH500 = {  # HuggingFaceH4/MATH-500: problem, solution, answer, subject, level, unique_id
    "problem": ["Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
                "What is $\\frac{14}{3}$ written as a fraction?",
                "Simplify $\\sqrt{18}$."],
    "solution": ["We have $r = 3$ and $\\theta = \\frac{\\pi}{2}$, so the answer is "
                 "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
                 "It is $\\boxed{\\frac{14}{3}}$.",
                 "$\\sqrt{18} = \\boxed{3\\sqrt{2}}$."],
    "answer": ["\\left( 3, \\frac{\\pi}{2} \\right)", "\\frac{14}{3}", "3\\sqrt{2}"],
    "subject": ["Precalculus", "Prealgebra", "Algebra"],
    "level": [2, 1, 2],
    "unique_id": ["test/precalculus/807.json", "test/prealgebra/1.json", "test/algebra/2.json"],
}

AIME = {  # Maxwell-Jia/AIME_2024: ID, Problem, Solution, Answer (an integer)
    "ID": ["2024-I-1", "2024-I-2", "2024-II-4"],
    "Problem": ["Every morning Aya goes for a 9-kilometer-long walk ... Find the number of "
                "minutes the walk takes her.",
                "There exist real numbers x and y ... Find xy.",
                "Let x, y and z be positive real numbers ... find m+n."],
    "Solution": ["... so the answer is $\\boxed{204}$.", "... $\\boxed{025}$",
                 "... $\\boxed{033}$"],
    "Answer": pa.array([204, 25, 33], pa.int64()),
}


def write_parquet(path: pathlib.Path, columns: dict, *, row_group_size: int | None = None):
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
  return path


def write_saved_dataset(directory: pathlib.Path, columns: dict, *, batch_rows: int = 2,
                        shards: int = 1):
  """`columns` as `datasets.Dataset.from_dict(columns).save_to_disk(directory,
  num_shards=shards)` lays it out."""
  directory.mkdir(parents=True, exist_ok=True)
  table = pa.table(columns)
  names = [f"data-{i:05d}-of-{shards:05d}.arrow" for i in range(shards)]
  per_shard = -(-table.num_rows // shards)
  for i, name in enumerate(names):
    with pa.OSFile(str(directory / name), "wb") as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.slice(i * per_shard, per_shard).to_batches(max_chunksize=batch_rows):
          writer.write_batch(batch)
  (directory / "dataset_info.json").write_text(json.dumps(
      {"citation": "", "description": "", "features": {
          c: {"dtype": str(table.schema.field(c).type), "_type": "Value"}
          for c in table.column_names}, "homepage": "", "license": ""}))
  (directory / "state.json").write_text(json.dumps(
      {"_data_files": [{"filename": name} for name in names], "_fingerprint": "0123456789abcdef",
       "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
       "_output_all_columns": False, "_split": "test"}))
  return directory
