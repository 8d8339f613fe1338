"""Online learning with a drifting preference (docs/algorithm.md §6): reward = quality x style.

One turn per episode: the model answers a writing request, the judge returns
two 0/1 verdicts, and the reward is their product. The *preferred style* is not
in the prompt; it follows a schedule over training progress, e.g.
`((0, "academic"), (200, "cute"), (400, "chuunibyou"))`, so the policy has to
re-discover it after every switch. The sampler calls `env.set_step(version)`
before each episode with the policy version it samples with: the number of
policy updates, which equals the learner step once critic warm-up is over.

Default judge, `rule_judge` (deterministic):
- quality = the task's keyword (`Task.answer`) appears as a whole word, case
  insensitive, and the word count is within the task's `min_words..max_words`.
- style = at least two distinct markers of the preferred style appear
  (`STYLE_MARKERS`; alphabetic markers match whole words, case insensitive,
  symbols match as substrings) and more distinct markers of it than of any
  other style.
Optional judge: `judge.HttpJudge`, an OpenAI-compatible endpoint. A judge that
cannot answer is an environment failure (dropped, unscored), never reward 0;
but the policy must not be able to choose a drop, since a dropped episode is a
free exit from one it was losing. So:
- a judge that answers without a verdict (`judge.JudgeNoVerdict`: the response
  may have talked it out of its format) scores 0, reason "no_verdict";
- a judge that fails on the response (an HTTP 4xx for a response it will not
  take, a timeout on one that is slow to read, a crash) scores 0, reason
  "judge_failed_on_response", provided the judge is known to work without
  this response: it answered something (any response's verdict, or
  `CONTROL_RESPONSE`) within the last `JUDGE_HEALTH_S` seconds. When it has
  not (the first episode, a quiet spell, or right after any response failed
  it), `CONTROL_RESPONSE` is graded first, on its own call with its own
  deadline, before the response is sent; only when that control fails is the
  episode an environment failure, and then the response is not sent at all.
  The control is never queued behind its own episode's response: on a judge
  serving one request at a time, a long response kept it busy past the
  response's deadline and then past the deadline of the control asked after
  it, which made the episode a drop the response chose. A drop is now decided
  before the response reaches the judge, so it cannot depend on the response.
  (It can still depend on another episode's response that keeps a serial judge
  busy: that drops episodes regardless of their outcome, not the ones a
  policy was losing. A judge that starts failing scores the episodes already
  past their check 0, then every new one asks the control, and the outage is
  environment failures.)

Built-in tasks (`builtin_task`) ask to explain a topic in a word range and to
mention a keyword; JSONL tasks (`tasks.load_jsonl`) work too: `answer` is the
keyword, optional `min_words` / `max_words` keys (defaults 20 and 200).

Demonstrations (`demonstration`, the SFT warm-start's scripted answers) write
every style equally often, so a warm-started policy favours none of them and RL
has a preference to find, and after each switch to find again.
"""

from __future__ import annotations

import bisect
import itertools
import random
import re
import threading
import time
import types
from typing import Callable, Iterator, Sequence

from sao_jax.config.env import ENV_STYLES
from sao_jax.envs.base import Environment, Message, StepResult, Task
from sao_jax.envs.style import judge as judge_lib

STYLE_MARKERS = types.MappingProxyType({
    "academic": ("furthermore", "moreover", "consequently", "therefore", "thus", "in conclusion",
                 "in summary", "notably", "empirical", "hypothesis", "evidence suggests"),
    "cute": ("nya", "uwu", "owo", "hehe", "teehee", "kawaii", "~", "♡", "✨", ":3", "(◕‿◕)"),
    "chuunibyou": ("dark flame", "my right arm", "sealed", "the abyss", "forbidden", "awaken",
                   "mortal", "kukuku", "destiny", "ancient power", "bow before"),
    "classical": ("thee", "thou", "thy", "hath", "doth", "verily", "'tis", "whence", "henceforth",
                  "forsooth", "wherefore"),
})
STYLES = ENV_STYLES
DEFAULT_MIN_WORDS, DEFAULT_MAX_WORDS = 20, 200
SYSTEM_PROMPT = "You are a helpful writer. Answer the request directly."
# What the judge grades instead of a response it failed on, to tell a broken judge
# from a response that breaks it (module docstring).
CONTROL_RESPONSE = "I do not know."
# How long a judge's last answer stands in for the control (module docstring): long
# enough that a judge in steady use is never asked one, short enough that a judge that
# breaks quietly is found by the next episode's control.
JUDGE_HEALTH_S = 60.0

_TOPICS = (("why the sky is blue", "scattering"), ("how vaccines work", "immune"),
           ("what a black hole is", "gravity"), ("how bread rises", "yeast"),
           ("why leaves change color", "chlorophyll"), ("how a compass works", "magnetic"),
           ("what causes tides", "moon"), ("how bees make honey", "nectar"),
           ("how volcanoes erupt", "magma"), ("how a rainbow forms", "refraction"),
           ("what photosynthesis is", "sunlight"), ("how a bicycle stays upright", "balance"))

# Neutral sentences for demonstrations: none contains a marker of any style (tests check it).
_FILLER = ("It is a simple idea once you see it.", "Many people notice it every day.",
           "People have studied it for a long time.", "The details are easy to follow.",
           "It explains a lot about the world around us.", "A small example makes it clear.")
_BUILTIN_PROMPT = re.compile(r"^Explain (?P<topic>.+?) in \d+ to \d+ words\.")

Judge = Callable[[Task, str, str], tuple[bool, bool]]


class JudgeHealth:
  """When each judge last answered (time.monotonic), shared by a process's environments:
  each episode makes its own `HttpJudge`, so a judge is known by its `endpoint` (URL and
  model), any other callable by itself."""

  def __init__(self):
    self._lock = threading.Lock()
    self._answered: dict = {}

  @staticmethod
  def key(judge: Judge):
    return getattr(judge, "endpoint", judge)

  def recent(self, judge: Judge) -> bool:
    with self._lock:
      answered = self._answered.get(self.key(judge))
    return answered is not None and time.monotonic() - answered < JUDGE_HEALTH_S

  def answered(self, judge: Judge) -> None:
    with self._lock:
      self._answered[self.key(judge)] = time.monotonic()

  def failed(self, judge: Judge) -> None:
    """A response failed the judge: the next episode asks the control first."""
    with self._lock:
      self._answered.pop(self.key(judge), None)

  def clear(self) -> None:
    with self._lock:
      self._answered.clear()


JUDGE_HEALTH = JudgeHealth()


def _marker_pattern(marker: str) -> re.Pattern:
  escaped = re.escape(marker)
  return re.compile(rf"\b{escaped}\b" if marker[0].isalnum() else escaped, re.IGNORECASE)


_PATTERNS = {style: tuple(map(_marker_pattern, markers)) for style, markers in STYLE_MARKERS.items()}


def style_marker_counts(text: str) -> dict[str, int]:
  """Distinct markers of each style present in `text`."""
  return {style: sum(bool(p.search(text)) for p in patterns) for style, patterns in _PATTERNS.items()}


def rule_judge(task: Task, response: str, style: str) -> tuple[bool, bool]:
  """(quality, style) by the deterministic rules in the module docstring."""
  words = len(response.split())
  low = task.metadata.get("min_words", DEFAULT_MIN_WORDS)
  high = task.metadata.get("max_words", DEFAULT_MAX_WORDS)
  keyword = re.search(rf"\b{re.escape(task.answer)}\b", response, re.IGNORECASE)
  quality = bool(keyword) and low <= words <= high
  counts = style_marker_counts(response)
  target = counts[style]
  styled = target >= 2 and all(target > n for other, n in counts.items() if other != style)
  return quality, styled


class StyleSchedule:
  """Preferred style by learner step: `[(first_step, style), ...]`, first step 0."""

  def __init__(self, phases: Sequence[tuple[int, str]]):
    phases = [tuple(p) for p in phases]
    if not phases or phases[0][0] != 0:
      raise ValueError(f"style schedule {phases!r} is invalid: expected [(0, style), "
                       "(step, style), ...] starting at step 0.")
    steps = [step for step, _ in phases]
    if any(not isinstance(s, int) or isinstance(s, bool) for s in steps) or steps != sorted(
        set(steps)):
      raise ValueError(f"style schedule {phases!r} is invalid: steps must be integers in "
                       "strictly increasing order.")
    unknown = [style for _, style in phases if style not in STYLES]
    if unknown:
      raise ValueError(f"style schedule {phases!r}: unknown style(s) {unknown}; allowed "
                       f"styles are {', '.join(map(repr, STYLES))}.")
    self.phases = tuple(phases)
    self._steps = steps

  def style_at(self, step: int) -> str:
    if step < 0:
      raise ValueError(f"step={step!r} is invalid: learner steps start at 0.")
    return self.phases[bisect.bisect_right(self._steps, step) - 1][1]


class StyleEnv(Environment):
  """Single-turn writing task; reward = quality x style under the current phase."""

  def __init__(self, *, schedule: StyleSchedule, judge: Judge = rule_judge,
               max_observation_chars: int = 4096):
    super().__init__(max_turns=1, max_observation_chars=max_observation_chars)
    self.schedule, self.judge = schedule, judge
    self.step_count = 0

  @property
  def style(self) -> str:
    """The style rewarded now."""
    return self.schedule.style_at(self.step_count)

  def set_step(self, step: int) -> None:
    """Tells the environment the learner's current step (selects the style)."""
    self.schedule.style_at(step)  # Validates.
    self.step_count = step

  def _reset(self, task: Task) -> list[Message]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.prompt}]

  def _step(self, action: str) -> StepResult:
    style = self.style
    if not JUDGE_HEALTH.recent(self.judge):
      control = self._control(style)
      if control is not None:
        return StepResult.fail(f"the judge failed the control response, so the response was "
                               f"not graded: {control}", style=style)
    try:
      quality, styled = self.judge(self.task, action, style)
    except judge_lib.JudgeNoVerdict as e:
      JUDGE_HEALTH.answered(self.judge)
      return StepResult.finish(0.0, "no_verdict", quality=False, style_ok=False, style=style,
                               judge_error=str(e)[:300])
    except judge_lib.JudgeError as e:
      JUDGE_HEALTH.failed(self.judge)
      return StepResult.finish(0.0, "judge_failed_on_response", quality=False, style_ok=False,
                               style=style, judge_error=str(e)[:300])
    JUDGE_HEALTH.answered(self.judge)
    return StepResult.finish(float(quality and styled), "judged", quality=quality,
                             style_ok=styled, style=style)

  def _control(self, style: str) -> str | None:
    """None if the judge answers `CONTROL_RESPONSE` (a verdict or not), else its error."""
    try:
      self.judge(self.task, CONTROL_RESPONSE, style)
    except judge_lib.JudgeNoVerdict:
      pass
    except judge_lib.JudgeError as e:
      return str(e)
    JUDGE_HEALTH.answered(self.judge)
    return None


def builtin_task(index: int, *, seed: int = 0) -> Task:
  """A deterministic 'explain X in N..M words, mention K' request."""
  rng = random.Random(f"sao-style/{seed}/{index}")
  topic, keyword = rng.choice(_TOPICS)
  low = rng.choice((20, 30, 40))
  high = low + rng.choice((60, 100))
  prompt = (f"Explain {topic} in {low} to {high} words. "
            f"Your answer must use the word \"{keyword}\".")
  return Task(id=f"style-s{seed}-{index}", prompt=prompt, answer=keyword,
              metadata=types.MappingProxyType({"min_words": low, "max_words": high}))


def iterate_builtin(*, seed: int = 0) -> Iterator[Task]:
  """Built-in style tasks 0, 1, 2, ... without end."""
  for index in itertools.count():
    yield builtin_task(index, seed=seed)


def demonstration(task: Task) -> list[str]:
  """One scripted assistant turn for a built-in task that passes the judge in one style.

  The style is chosen by a hash of the task id, so across tasks every style is
  equally likely. Two of its markers open the answer side by side (a small model
  keeps them consistent more easily), then the keyword, then neutral filler up
  to `min_words + 15` words: ranges are 60 or 100 words wide, so the length has
  slack on both sides.
  """
  match = _BUILTIN_PROMPT.match(task.prompt)
  if match is None:
    raise ValueError(f"task {task.id!r}: style demonstrations need a built-in style task "
                     f"('Explain <topic> in N to M words. ...'), got {task.prompt!r}")
  rng = random.Random(f"sao-style-demo/{task.id}")
  style = rng.choice(STYLES)
  first, second = rng.sample(STYLE_MARKERS[style], 2)
  words = [first, second, f"{match['topic']} comes down to {task.answer}."]
  filler = list(_FILLER)
  rng.shuffle(filler)
  while len(" ".join(words).split()) < task.metadata["min_words"] + 15:
    words.append(filler[len(words) % len(filler)])
  return [" ".join(words)]
