"""Scripted answers for the style environment, for its SFT warm-start.

`sao_jax.train` has demonstrations for math_tool and coding only; the style
experiment (claim 5) needs a policy that can already write an on-topic answer
in every style, so that RL has a preference to find and, after each switch, to
re-find. `demonstration(task)` answers a built-in style task (`sao_jax.envs.
style.builtin_task`) in the word range, with the keyword and two markers of one
style chosen by a hash of the task id: across tasks the styles are uniform, so
the warm-started policy favours none of them. The two markers open the answer,
side by side, so a small model can keep them consistent; the length aims at
15 words above the minimum (ranges are 60 or 100 words wide), leaving slack on
both sides.
"""

from __future__ import annotations

import random
import re

from sao_jax.envs.base import Task
from sao_jax.envs.style import STYLE_MARKERS, STYLES

# Neutral sentences: none contains a marker of any style (tests check it).
_FILLER = ("It is a simple idea once you see it.", "Many people notice it every day.",
           "People have studied it for a long time.", "The details are easy to follow.",
           "It explains a lot about the world around us.", "A small example makes it clear.")
_PROMPT = re.compile(r"^Explain (?P<topic>.+?) in \d+ to \d+ words\.")


def demonstration(task: Task) -> list[str]:
  """One assistant turn: two markers of one style, the keyword, `min_words + 15` words."""
  match = _PROMPT.match(task.prompt)
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
