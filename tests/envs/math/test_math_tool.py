"""Math environment: answer checking, tool round trips, JSONL tasks, generator, demos."""

import dataclasses
import json
import threading
import time

import pytest

from sao_jax.envs import sandbox, tasks
from sao_jax.envs.base import Task, play
from sao_jax.envs.math import answers, checker
from sao_jax.envs.math import tasks as math_tasks
from sao_jax.envs.math import tool as math_tool

LIMITS = sandbox.SandboxLimits(wall_time_s=3.0, cpu_time_s=1, memory_mb=256)


def make_env(max_turns=4, sandbox_limits=LIMITS):
  return math_tool.MathToolEnv(max_turns=max_turns, max_observation_chars=2000,
                               sandbox_limits=sandbox_limits)


@pytest.mark.parametrize("predicted, gold, correct", [
    ("42", "42", True),
    ("41", "42", False),
    ("0.5", "1/2", True),
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac12", "1/2", True),
    ("1,000", "1000", True),
    ("3\\sqrt{2}", "\\sqrt{18}", True),
    ("x + 1", "1 + x", True),
    ("$-7$", "-7", True),
    ("paris", "Paris", True),
    ("sirap", "Paris", False),  # math parsers would accept the anagram p*a*r*i*s
    ("9^{9^{9}}", "5", False),  # refused before any symbolic work
    ("", "1", False),
    ("1/0", "\\text{ }", False),  # math-verify parses no gold: the fallback got Fraction(1, 0)
])
def test_verify_answer(predicted, gold, correct):
  assert answers.verify_answer(predicted, gold) is correct


@pytest.mark.parametrize("predicted, gold, correct", [
    ("7\\%", "7", True),
    ("7\\%", "0.07", False),  # was accepted for both golds
    ("7 percent", "0.07", False),
    ("700\\%", "7", False),  # and this for both 7 and 700 (dollars or cents)
    ("700\\%", "700", True),
    ("7\\text{\\%}", "7", True),
    ("\\%", "7", False),
    ("7\\%", "7\\%", True),  # a gold with a percent sign: math-verify's readings, as before
    ("0.07", "7\\%", True),
])
def test_a_percentage_is_one_number_not_a_hedge_over_a_factor_of_100(predicted, gold, correct):
  """math-verify reads `7\\%` as 7 against the gold 7 and as 0.07 against 0.07: a policy
  unsure of a factor of 100 answered with a percent sign and was right either way."""
  assert answers.verify_answer(predicted, gold) is correct


def test_extract_boxed_takes_the_last_balanced_box():
  assert answers.extract_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
  assert answers.extract_boxed("\\boxed{7} and an unclosed \\boxed{3") == "7"
  assert answers.extract_boxed("no answer") is None
  assert answers.extract_boxed("} \\boxed{a{b}c} \\boxed{x \\boxed{y}") == "y"
  assert answers.extract_boxed("\\boxed{\\boxed{2}}") == "2"  # the box that opens last


def test_extract_boxed_is_linear_in_unclosed_boxes():
  # Each unclosed \boxed{ was scanned to the end: 40 000 characters took ~25 s.
  start = time.monotonic()
  assert answers.extract_boxed("\\boxed{" * 6000) is None
  assert time.monotonic() - start < 1.0


def test_extract_code_takes_the_first_python_block():
  text = "think\n```python\nprint(1)\n```\nmore\n```python\nprint(2)\n```"
  assert math_tool.extract_code(text) == "print(1)\n"
  assert math_tool.extract_code("```\nprint(1)\n```") is None


TASK = Task(id="t", prompt="What is 6 * 7?", answer="42")


def test_correct_and_incorrect_answers():
  env = make_env()
  messages = env.reset(TASK)
  assert [m["role"] for m in messages] == ["system", "user"]
  assert messages[1]["content"] == TASK.prompt and "\\boxed" in messages[0]["content"]
  result = env.step("It is \\boxed{42}.")
  assert (result.done, result.reward, result.info["correct"]) == (True, 1.0, True)
  env.reset(TASK)
  result = env.step("\\boxed{41}")
  assert (result.done, result.reward, result.failure) == (True, 0.0, None)


def test_tool_call_round_trip():
  env = make_env()
  env.reset(TASK)
  result = env.step("Let me compute.\n```python\nprint(6 * 7)\n```")
  assert not result.done and result.observation == "42"
  assert env.observation_role == "tool"
  result = env.step("```python\nimport sys\nprint('partial')\nsys.exit(3)\n```")
  assert result.observation == "partial\n[exit status 3]"
  result = env.step("```python\n1/0\n```")
  assert "ZeroDivisionError" in result.observation and "[exit status 1]" in result.observation
  result = env.step("So \\boxed{42}")
  assert result.reward == 1.0 and result.info["tool_calls"] == 3 and env.tool_calls == 3
  env.reset(TASK)
  assert env.tool_calls == 0


def test_tool_limits_show_up_in_the_observation():
  # Wall time well above the CPU limit: on a loaded machine the 1 s of CPU can
  # take longer than 3 s of wall time, and then the wall limit would hit first.
  env = make_env(sandbox_limits=dataclasses.replace(LIMITS, wall_time_s=15.0))
  env.reset(TASK)
  result = env.step("```python\nwhile True:\n  pass\n```")
  assert "CPU time limit" in result.observation


def test_turn_without_code_or_answer_gets_a_reminder():
  env = make_env(max_turns=2)
  env.reset(TASK)
  assert env.step("hmm").observation == math_tool.NO_ACTION
  result = env.step("still thinking")
  assert (result.done, result.reward, result.reason) == (True, 0.0, "max_turns")
  assert env.tool_calls == 0  # two turns, no tool run


def test_sandbox_harness_failure_is_an_environment_failure(monkeypatch):
  def broken(code, limits, **kwargs):
    raise sandbox.SandboxError("interpreter missing")
  monkeypatch.setattr(sandbox, "run_python", broken)
  env = make_env()
  env.reset(TASK)
  result = env.step("```python\nprint(1)\n```")
  assert result.done and "interpreter missing" in result.failure and result.reward == 0.0


def write_lines(tmp_path, lines):
  path = tmp_path / "tasks.jsonl"
  path.write_text("".join(line + "\n" for line in lines))
  return path


def test_jsonl_tasks_load(tmp_path):
  path = write_lines(tmp_path, [
      json.dumps({"prompt": "1+1?", "answer": 2}),
      json.dumps({"prompt": "Half?", "answer": "1/2", "id": "half", "program": "print(1/2)",
                  "source": "x"}),
  ])
  first, second = tasks.load_jsonl(path)
  assert (first.id, first.answer) == ("tasks.jsonl:1", "2")
  assert (second.id, second.metadata["source"], second.metadata["program"]) == (
      "half", "x", "print(1/2)")


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"answer": "2"}), "'prompt' must be a non-empty string"),
    (json.dumps({"prompt": "q", "answer": None}), "'answer' must be"),
    (json.dumps({"prompt": "q", "answer": True}), "'answer' must be"),
    (json.dumps({"prompt": "q", "answer": "1", "id": 5}), "'id' must be"),
    (json.dumps({"prompt": "q", "answer": "1", "program": 3}), "'program' must be"),
    ("", "blank line"),
    ('{"prompt": "q", "answer": NaN}', "NaN is not a number JSON allows"),
    ('{"prompt": "q", "answer": -Infinity}', "-Infinity is not a number JSON allows"),
    ('{"prompt": "q", "answer": 1e999}', "1e999 overflows to infinity"),
    ('{"prompt": "q", "answer": "1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "nested more than 64 levels"),  # a RecursionError in the parser
    ('{"prompt": "q", "answer": "1", "x": ' + "[" * 65 + "]" * 65 + "}",
     "nested more than 64 levels"),  # parses, but deeper than any task row needs
])
def test_jsonl_errors_name_file_and_line(tmp_path, bad_line, message):
  good = json.dumps({"prompt": "1+1?", "answer": "2"})
  path = write_lines(tmp_path, [good, bad_line, good])
  with pytest.raises(ValueError, match=message) as error:
    tasks.load_jsonl(path)
  assert f"{path}:2:" in str(error.value)


def test_jsonl_invalid_utf8_names_its_line(tmp_path):
  path = tmp_path / "tasks.jsonl"
  path.write_bytes(b'{"prompt": "1+1?", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
  with pytest.raises(ValueError, match=r"tasks.jsonl:2: not valid UTF-8 \(byte 16 of the line "
                                       r"is b'\\xe9'\); save the file as UTF-8"):
    tasks.load_jsonl(path)


def test_jsonl_duplicate_ids_and_empty_files_are_errors(tmp_path):
  row = json.dumps({"prompt": "q", "answer": "1", "id": "a"})
  with pytest.raises(ValueError, match=r"tasks.jsonl:2: id 'a' already used on line 1"):
    tasks.load_jsonl(write_lines(tmp_path, [row, row]))
  with pytest.raises(ValueError, match="no tasks"):
    tasks.load_jsonl(write_lines(tmp_path, []))


def test_shuffled_iteration_covers_every_task_each_epoch():
  pool = [Task(id=str(i), prompt="p", answer="1") for i in range(5)]
  stream = tasks.iterate_shuffled(pool, seed=3)
  epochs = [[next(stream).id for _ in range(5)] for _ in range(2)]
  assert all(sorted(epoch) == sorted(t.id for t in pool) for epoch in epochs)
  again = tasks.iterate_shuffled(pool, seed=3)
  assert [next(again).id for _ in range(5)] == epochs[0]


def test_generator_is_deterministic_and_seeded():
  first = [math_tasks.generate_task(i, seed=7, difficulty=3) for i in range(20)]
  assert first == [math_tasks.generate_task(i, seed=7, difficulty=3) for i in range(20)]
  stream = math_tasks.iterate_generated(seed=7, difficulty=3)
  assert [next(stream) for _ in range(20)] == first
  other = [math_tasks.generate_task(i, seed=8, difficulty=3) for i in range(20)]
  assert [t.prompt for t in other] != [t.prompt for t in first]
  assert {t.metadata["kind"] for t in first} == {"arithmetic", "word"}
  # Pinned: a change here changes every generated training set.
  assert math_tasks.generate_task(0, seed=0, difficulty=2, kind="arithmetic").prompt == (
      GOLDEN_PROMPT)


GOLDEN_PROMPT = "Compute 47 * (9 * 3)."


@pytest.mark.parametrize("kind", ["arithmetic", "word"])
def test_difficulty_controls_size(kind):
  def size(task):
    if kind == "arithmetic":
      return sum(token.strip("()").isdigit() for token in task.prompt.rstrip(".").split())
    return task.prompt.count("Then ")
  for difficulty in range(1, 6):
    sizes = {size(math_tasks.generate_task(i, difficulty=difficulty, kind=kind))
             for i in range(10)}
    expected = difficulty + 1 if kind == "arithmetic" else difficulty
    assert sizes == {expected}, (difficulty, sizes)


@pytest.mark.parametrize("bad", [{"difficulty": 0}, {"difficulty": 6}, {"kind": "poetry"}])
def test_generator_arguments_are_validated(bad):
  with pytest.raises(ValueError, match=next(iter(bad))):
    math_tasks.generate_task(0, **bad)


@pytest.mark.parametrize("difficulty", [1, 3, 5])
def test_demonstrations_solve_their_tasks(difficulty):
  env = make_env()
  for kind in ("arithmetic", "word"):
    task = math_tasks.generate_task(difficulty, seed=11, difficulty=difficulty, kind=kind)
    turns = math_tasks.demonstration(task)
    transcript = play(env, task, turns)
    assert transcript.result.reward == 1.0, (task, transcript.messages)
    assert transcript.messages[3] == {"role": "tool", "content": task.answer}


def test_demonstration_needs_a_program(tmp_path):
  path = write_lines(tmp_path, [json.dumps({"prompt": "q", "answer": "3"}),
                                json.dumps({"prompt": "q", "answer": "3", "program": "print(3)"})])
  plain, scripted = tasks.load_jsonl(path)
  with pytest.raises(ValueError, match="no 'program'"):
    math_tasks.demonstration(plain)
  assert play(make_env(), scripted, math_tasks.demonstration(scripted)).result.reward == 1.0


def test_verify_answer_works_off_the_main_thread():
  # math-verify's signal-based timeout raises ValueError outside the main thread.
  results = []
  worker = threading.Thread(target=lambda: results.append(answers.verify_answer("0.5", "1/2")))
  worker.start()
  worker.join()
  assert results == [True]


@pytest.mark.parametrize("predicted", ["2^{+99999999999}", "(99999999)!"])
def test_explosive_answers_past_the_pattern_guard_are_incorrect_in_bounded_time(
    monkeypatch, predicted):
  # Both slip past step 3's patterns; off the main thread math-verify had no timeout
  # and sympy computed 2**99999999999 (99999999!) forever, stalling the sampler.
  monkeypatch.setattr(answers, "_TIMEOUT_S", 1)
  results = []
  worker = threading.Thread(target=lambda: results.append(answers.verify_answer(predicted, "42")),
                            daemon=True)
  worker.start()
  worker.join(timeout=60)
  assert not worker.is_alive() and results == [False]


def test_a_checker_past_its_deadline_is_killed_and_replaced():
  # math-verify's alarm cannot cut one long C-level operation; the deadline can.
  assert checker.verify("2^{+99999999999}", "42", timeout_s=60, deadline_s=0.5) is False
  assert checker.verify("0.5", "1/2", timeout_s=5, deadline_s=60) is True


@pytest.mark.slow
def test_a_stalling_answer_holds_one_checker_not_every_check(monkeypatch):
  """The checker was one process under a lock: an explosive answer held every
  episode's check for its whole deadline. With a pool, another check is answered
  while it stalls."""
  monkeypatch.setattr(checker, "_free", checker._new_pool(2))
  stalled = threading.Thread(daemon=True, target=lambda: checker.verify(
      "2^{+99999999999}", "42", timeout_s=60, deadline_s=20))
  stalled.start()
  time.sleep(0.5)  # it holds a child first
  assert checker.verify("0.5", "1/2", timeout_s=5, deadline_s=60) is True
  assert stalled.is_alive()  # answered while the other check still stalls
  stalled.join(60)


def test_a_checker_that_cannot_start_is_named_when_the_environment_is_built(monkeypatch):
  monkeypatch.setattr(checker, "_free", checker._new_pool())
  monkeypatch.setattr(checker, "_CHILD", "raise SystemExit(3)")  # as when math-verify is missing
  with pytest.raises(RuntimeError, match="math answer checker .* did not start: the checker exited"):
    make_env()


def test_demo_guess_rate_mixes_wrong_guesses_in_a_fixed_share():
  """env.demo_guess_rate: that share of demonstrations answers at once with the
  question's first number (reward 0 on difficulty-1 arithmetic); the choice is
  fixed per task and independent of demo_tool_rate's."""
  env = make_env()
  generated = [math_tasks.generate_task(i, seed=3, difficulty=1, kind="arithmetic")
               for i in range(200)]
  demos = [math_tasks.demonstration(t, guess_rate=0.5) for t in generated]
  guessed = [t for t, d in zip(generated, demos) if len(d) == 1]
  assert 70 <= len(guessed) <= 130  # Binomial(200, 0.5): 7 standard deviations either side
  assert demos[:20] == [math_tasks.demonstration(t, guess_rate=0.5) for t in generated[:20]]
  first = guessed[0].prompt.split()[1]  # "Compute 7 - 3." -> "7"
  assert math_tasks.demonstration(guessed[0], guess_rate=0.5) == [
      f"The answer is \\boxed{{{first}}}."]
  assert all(play(env, t, math_tasks.demonstration(t, guess_rate=1.0)).result.reward == 0.0
             for t in guessed[:5])
  tool = [t for t, d in zip(generated, demos) if len(d) == 2]
  assert play(env, tool[0], math_tasks.demonstration(tool[0], guess_rate=0.5)).result.reward == 1.0
  assert all(len(math_tasks.demonstration(t, guess_rate=0.0)) == 2 for t in generated[:20])


def test_demo_tool_rate_mixes_direct_answers_in_a_fixed_share():
  """env.demo_tool_rate: that share of demonstrations calls the tool; the rest answer
  at once (one turn, full reward, no tool message); the choice is fixed per task."""
  env = make_env()
  generated = [math_tasks.generate_task(i, seed=3, difficulty=1, kind="arithmetic")
               for i in range(200)]
  direct = [t for t in generated if len(math_tasks.demonstration(t, tool_rate=0.5)) == 1]
  assert 70 <= len(direct) <= 130  # Binomial(200, 0.5): 7 standard deviations either side
  assert all(math_tasks.demonstration(t, tool_rate=0.5) ==
             math_tasks.demonstration(t, tool_rate=0.5) for t in generated[:20])
  transcript = play(env, direct[0], math_tasks.demonstration(direct[0], tool_rate=0.5))
  assert transcript.result.reward == 1.0
  assert "tool" not in [m["role"] for m in transcript.messages]
  assert all(len(math_tasks.demonstration(t, tool_rate=1.0)) == 2 for t in generated[:20])
  assert all(len(math_tasks.demonstration(t, tool_rate=0.0)) == 1 for t in generated[:20])


def test_a_difficulty_mix_makes_the_configured_share_of_tasks_hard():
  """env.options.hard_share: ~that share of the stream is generated at hard_difficulty
  (more operands, larger numbers), each task labelled by its difficulty as its source;
  the other tasks are exactly those of the unmixed stream."""
  import itertools  # pylint: disable=import-outside-toplevel

  from sao_jax import config as C  # pylint: disable=import-outside-toplevel
  from sao_jax.envs.registry import make_tasks  # pylint: disable=import-outside-toplevel

  cfg = C.EnvConfig(name="math_tool", seed=3, options={
      "difficulty": 1, "problem_kind": "arithmetic", "hard_share": 0.3, "hard_difficulty": 4})
  mixed = list(itertools.islice(make_tasks(cfg), 3000))
  hard = [t for t in mixed if t.metadata["difficulty"] == 4]
  assert len(hard) / len(mixed) == pytest.approx(0.3, abs=0.025)
  assert {t.metadata["source"] for t in mixed} == {"difficulty_1", "difficulty_4"}
  assert all(t.metadata["difficulty"] in (1, 4) for t in mixed)
  operands = lambda t: len(t.metadata["program"].split()) // 2 + 1  # "print(a + b ...)"
  assert min(map(operands, hard)) == 5 and max(operands(t) for t in mixed if t not in hard) == 2
  plain = math_tasks.generate_task
  for index, task in enumerate(mixed[:200]):
    if task.metadata["difficulty"] == 1:
      assert task.prompt == plain(index, seed=3, difficulty=1, kind="arithmetic").prompt
  unmixed = plain(0, seed=3, difficulty=1, kind="arithmetic")
  assert "source" not in unmixed.metadata  # no mix: the tasks are as before


@pytest.mark.parametrize("options,message", [
    ({"hard_share": 1.5}, "env.options.hard_share=1.5 is invalid: expected a number in [0, 1]"),
    ({"hard_share": 0.2, "difficulty": 3, "hard_difficulty": 3},
     "hard tasks must be harder than env.options.difficulty=3"),
    ({"hard_difficulty": 9}, "env.options.hard_difficulty=9 is invalid: expected an integer"),
])
def test_a_bad_difficulty_mix_is_refused_by_name(options, message):
  from sao_jax import config as C  # pylint: disable=import-outside-toplevel
  from sao_jax.envs import registry  # pylint: disable=import-outside-toplevel

  with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(".", r"\.")):
    registry.check(C.EnvConfig(name="math_tool", options=options))
