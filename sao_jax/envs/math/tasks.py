r"""Generated math tasks and scripted demonstrations.

(JSONL task files are read by `sao_jax.envs.tasks.load_jsonl`; a row's optional
`"program"` field feeds `demonstration` the same way.)

- `generate_task(index, seed=, difficulty=, kind=)`: a deterministic arithmetic
  or word problem. The same arguments give the same task on any machine and
  Python version (string-seeded `random.Random`), independently of other
  indices. `difficulty` 1..5 sets the size: arithmetic has `difficulty + 1`
  operands up to `10**difficulty` (`*` and parentheses from difficulty 2);
  word problems have `difficulty` steps on a count starting below
  `10 * 10**(difficulty-1)`. Answers are integers.
  A difficulty mix (`hard_share` > 0): each task is *hard* with probability
  `hard_share` (a fixed draw per seed and index, independent of the task's
  content), generated at `hard_difficulty` instead (more operands or steps,
  larger numbers); its `metadata["source"]` says which ("difficulty_<d>"), so the
  learner reports the reward of each (`reward/source/difficulty_<d>`). Without a
  mix the tasks are those of `difficulty` alone, as before.
- `demonstration(task)`: the ideal assistant turns (a tool call that prints the
  answer, then the boxed answer) for SFT warm-starts; `tool_rate` and
  `guess_rate` mix in direct answers and careless guesses.
"""

from __future__ import annotations

import itertools
import random
import re
import types
from typing import Iterator

from sao_jax.config.env import ENV_PROBLEM_KINDS
from sao_jax.envs import tasks
from sao_jax.envs.base import Task, ToolCall, Turn

KINDS = ENV_PROBLEM_KINDS
MAX_DIFFICULTY = 5

_NAMES = ("Ava", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Julia")
_ITEMS = ("apples", "marbles", "stickers", "books", "coins", "shells", "stamps", "cards")
_MULTIPLIERS = {2: "doubles", 3: "triples", 4: "quadruples"}


def _check_generator_args(difficulty: int, kind: str) -> None:
  tasks.check_generator_args(difficulty, kind, max_difficulty=MAX_DIFFICULTY, kinds=KINDS)


def is_hard(index: int, *, seed: int, hard_share: float) -> bool:
  """Whether task `index` of `seed` is hard under a mix with `hard_share` hard tasks."""
  return hard_share > 0 and random.Random(f"sao-math-hard/{seed}/{index}").random() < hard_share


def generate_task(index: int, *, seed: int = 0, difficulty: int = 2, kind: str = "mixed",
                  hard_share: float = 0.0, hard_difficulty: int = MAX_DIFFICULTY) -> Task:
  """The `index`-th generated task for (`seed`, `difficulty`, `kind`), at
  `hard_difficulty` when the mix makes it hard (module docstring)."""
  _check_generator_args(difficulty, kind)
  mixed = hard_share > 0
  if mixed:
    _check_generator_args(hard_difficulty, kind)
    if is_hard(index, seed=seed, hard_share=hard_share):
      difficulty = hard_difficulty
  rng = random.Random(f"sao-math/{seed}/{difficulty}/{kind}/{index}")
  chosen = rng.choice(("arithmetic", "word")) if kind == "mixed" else kind
  make = _arithmetic if chosen == "arithmetic" else _word_problem
  prompt, program, answer = make(rng, difficulty)
  metadata = {"program": program, "kind": chosen, "difficulty": difficulty}
  if mixed:
    metadata["source"] = f"difficulty_{difficulty}"
  return Task(id=f"gen-{kind}-d{difficulty}-s{seed}-{index}", prompt=prompt, answer=str(answer),
              metadata=types.MappingProxyType(metadata))


def iterate_generated(*, seed: int = 0, difficulty: int = 2, kind: str = "mixed",
                      hard_share: float = 0.0,
                      hard_difficulty: int = MAX_DIFFICULTY) -> Iterator[Task]:
  """Generated tasks 0, 1, 2, ... without end."""
  _check_generator_args(difficulty, kind)
  for index in itertools.count():
    yield generate_task(index, seed=seed, difficulty=difficulty, kind=kind,
                        hard_share=hard_share, hard_difficulty=hard_difficulty)


def _arithmetic(rng: random.Random, difficulty: int) -> tuple[str, str, int]:
  """`difficulty + 1` integers joined by random operators, one parenthesised group."""
  ops = [rng.choice("+-" if difficulty == 1 else "+-*") for _ in range(difficulty)]
  # The right operand of `*` is a short factor so that answers stay readable.
  numbers = [rng.randint(1, 10**difficulty)] + [
      rng.randint(2, 12) if op == "*" else rng.randint(1, 10**difficulty) for op in ops]
  tokens = [str(n) for n in numbers]
  if difficulty >= 2:
    first = rng.randrange(len(numbers) - 1)
    last = rng.randrange(first + 1, len(numbers))
    if (first, last) != (0, len(numbers) - 1):
      tokens[first], tokens[last] = f"({tokens[first]}", f"{tokens[last]})"
  expression = tokens[0] + "".join(f" {op} {token}" for op, token in zip(ops, tokens[1:]))
  answer = eval(expression, {"__builtins__": {}})  # Our own digits and operators only.
  return f"Compute {expression}.", f"print({expression})", answer


def _word_problem(rng: random.Random, difficulty: int) -> tuple[str, str, int]:
  """A count changed by `difficulty` steps (buy, give away, multiply, share)."""
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  count = rng.randint(2, 10 * 10**(difficulty - 1))
  sentences = [f"{name} has {count} {item}."]
  program = [f"count = {count}"]
  for _ in range(difficulty):
    step = rng.choice(("buy", "give", "multiply", "share"))
    divisors = [k for k in range(2, 10) if count % k == 0]
    if step == "give" and count > 1:
      k = rng.randint(1, count - 1)
      count -= k
      sentences.append(f"Then {name} gives {k} {item} to a friend.")
      program.append(f"count -= {k}")
    elif step == "multiply":
      k = rng.choice(sorted(_MULTIPLIERS))
      count *= k
      sentences.append(f"Then {name} {_MULTIPLIERS[k]} the number of {item}.")
      program.append(f"count *= {k}")
    elif step == "share" and divisors:
      k = rng.choice(divisors)
      count //= k
      sentences.append(f"Then {name} splits the {item} equally into {k} boxes and keeps one box.")
      program.append(f"count //= {k}")
    else:
      k = rng.randint(1, 10**difficulty)
      count += k
      sentences.append(f"Then {name} buys {k} more {item}.")
      program.append(f"count += {k}")
  sentences.append(f"How many {item} does {name} have now?")
  program.append("print(count)")
  return " ".join(sentences), "\n".join(program), count


def demonstration(task: Task, tool_rate: float = 1.0,
                  guess_rate: float = 0.0) -> list[str | Turn]:
  r"""Assistant turns to imitate: run `task.metadata["program"]` (a `Turn` calling
  the python tool, written in the run's format by `MathToolEnv.write_turn`), then
  `\boxed{answer}`.

  With `guess_rate` > 0 that share of tasks (a fixed per-task draw,
  `env.demo_guess_rate`) is demonstrated by a careless expert who answers at
  once, without the tool, with the first number of the question: wrong on
  every difficulty-1 arithmetic task (a + b != a and a - b != a for b >= 1). SFT
  imitates the habit as faithfully as the skill (at the first token the policy
  guesses with probability ~`guess_rate`), and more SFT cannot remove it; only
  RL, paid for right answers, can. With `tool_rate` < 1 that share of the
  remaining tasks is demonstrated with the tool and the rest are answered at
  once, rightly, without it (`env.demo_tool_rate`): an expert who computes in
  their head, which a small policy imitates in form but not in accuracy.
  """
  if guess_rate > 0 and random.Random(f"demo-guess:{task.id}").random() < guess_rate:
    first = re.search(r"\d+", task.prompt)
    if first is None:
      raise ValueError(f"task {task.id!r} has no number in its prompt to guess; set "
                       "env.demo_guess_rate=0 for this task source")
    return [f"The answer is \\boxed{{{first.group()}}}."]
  if tool_rate < 1 and random.Random(f"demo-tool:{task.id}").random() >= tool_rate:
    return [f"The answer is \\boxed{{{task.answer}}}."]
  program = task.metadata.get("program")
  if not program:
    raise ValueError(f"task {task.id!r} has no 'program' in its metadata; demonstrations need "
                     "Python that prints the answer (generated tasks have one; add a 'program' "
                     "field to the JSONL row).")
  return [Turn("Let me compute this with Python.", ToolCall("python", {"code": program.rstrip()})),
          f"The program prints {task.answer}, so the answer is \\boxed{{{task.answer}}}."]

