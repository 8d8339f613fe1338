"""Environments that change during training see the sampler's policy version."""

from sao_jax import config as C
from sao_jax.chat import chat_format
from sao_jax.envs.registry import make_tasks
from sao_jax.envs.style import env as style
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.sampler.episodes import EpisodeRunner


class RecordingEngine:
  """The part of `Engine` that `EpisodeRunner.start` uses."""

  def __init__(self):
    self.version, self.submitted = 0, []

  def submit(self, episode_id, tokens, *, seed):
    self.submitted.append(episode_id)


def test_each_new_episode_gets_the_style_of_the_current_policy_version():
  tasks = make_tasks(C.EnvConfig(name="style"))
  task = next(tasks)
  chat = chat_format(None, train_tokenizer([task.prompt, style.SYSTEM_PROMPT], vocab_size=300))
  schedule = style.StyleSchedule(((0, "academic"), (3, "cute")))
  envs = []

  def make_env():
    envs.append(style.StyleEnv(schedule=schedule))
    return envs[-1]

  engine = RecordingEngine()
  runner = EpisodeRunner(engine, chat, make_env, max_episodes=4)
  for version in (0, 2, 3, 7):
    engine.version = version
    runner.start(task, prompt_id=0, seed=version)
  assert [env.style for env in envs] == ["academic", "academic", "cute", "cute"]
  assert engine.submitted == [0, 1, 2, 3]
