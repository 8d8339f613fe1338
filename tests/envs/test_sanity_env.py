"""The sanity environment: exact-word reward, one turn, format-only demonstrations."""

import collections

from sao_jax.config import EnvConfig
from sao_jax.envs import base, registry, sanity


def test_reward_is_one_exactly_for_the_named_word():
  env = registry.make_env(EnvConfig(name="sanity"))
  task = next(registry.make_tasks(EnvConfig(name="sanity", seed=3)))
  assert task == sanity.generate_task(0, seed=3) and task.prompt.endswith(f" {task.answer}.")
  other = next(w for w in sanity.WORDS if w != task.answer)
  assert task.answer == sanity.TARGET
  for action, reward in ((task.answer, 1.0), (f" {task.answer}\n", 1.0), (other, 0.0),
                         (f"{task.answer} {task.answer}", 0.0), ("", 0.0)):
    messages = env.reset(task)
    assert [m["role"] for m in messages] == ["system", "user"]
    result = env.step(action)
    assert result.done and result.reward == reward and result.reason == "answer", action


def test_demonstrations_teach_the_format_not_the_answer():
  """A demonstration answers with a listed word drawn independently of the named one,
  so SFT on them leaves the policy at chance (1 / len(WORDS))."""
  tasks = [sanity.generate_task(i) for i in range(2000)]
  played = [base.play(sanity.SanityEnv(max_observation_chars=100), t, sanity.demonstration(t))
            for t in tasks]
  hits = sum(p.result.reward for p in played) / len(played)
  assert abs(hits - 1 / len(sanity.WORDS)) < 0.04, hits
  assert {t.answer for t in tasks} == {sanity.TARGET}
  demos = collections.Counter(sanity.demonstration(t)[0] for t in tasks)
  assert set(demos) == set(sanity.WORDS) and min(demos.values()) > 0.2 * len(tasks)
