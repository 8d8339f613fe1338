"""`sao-eval --serve`: a policy behind the agent endpoint alone, to debug an agent against it.

    sao-eval --config C --serve [--step N] [--policy DIR] [--episodes N]

No program is started and nothing is trained: the endpoint (`env.options` of the
agent environment for its address and limits, or their defaults) serves the
policy with the run's sampler settings, as training samples it, and opens an
episode for each new name a client puts in its key (`server.Endpoint`,
`open_on_call`): `OPENAI_API_KEY=<run-token>.<name>`, printed at start. The
episode is then exactly a training episode (`envs.agent.env.ServedEnv`): its
calls must continue one conversation (or start a new segment, counted), it ends
when the client posts `/v1/episode/end` (with or without a reward) or after
`env.options.time_limit_s`, and one line per episode says how it went: its name,
turns, tokens (sampled), segments, reward or failure. Up to `sampler.slots`
episodes at once; `episodes` (`--episodes`) stops after that many ended, else it
serves until interrupted.
"""

from __future__ import annotations

import itertools
from typing import Callable

import jax

from sao_jax.chat import ChatFormat
from sao_jax.config import Config
from sao_jax.envs.agent import server, spec as agent_spec
from sao_jax.envs.agent.env import ServedEnv
from sao_jax.envs.base import Task
from sao_jax.envs.registry import resolve
from sao_jax.models.transformer import Params
from sao_jax.sampler.episodes import EpisodeRunner, make_engine
from sao_jax.types import Trajectory


def endpoint_options(cfg: Config) -> agent_spec.AgentOptions:
  """The agent environment's options of `cfg` (its endpoint's address and limits), or
  their defaults when the run's environment is another."""
  if cfg.env.name == agent_spec.SPEC.name:
    return resolve(cfg.env).options
  return agent_spec.AgentOptions(program="(served)")


def summary(name: str, traj: Trajectory) -> str:
  """One line of a served episode."""
  sampled = int(traj.action_mask.sum())
  end = (f"failed ({traj.info.get('failure_kind')}: {traj.env_failure})" if traj.env_failure
         else f"reward {traj.outcome:g}")
  return (f"episode {name}: {traj.info['turns']} turns, {traj.length} tokens ({sampled} "
          f"sampled), {traj.info.get('segments', 1)} segment(s), {end}")


def serve(cfg: Config, chat: ChatFormat, params: Params, *, version: int = 0,
          mesh: jax.sharding.Mesh | None = None, episodes: int | None = None,
          log: Callable[[str], object] = print,
          ready: Callable[[server.Endpoint], object] = lambda endpoint: None
          ) -> list[tuple[str, Trajectory]]:
  """Serves `params` (module docstring) until `episodes` ended (None: until
  interrupted); each ended episode as (its name, its trajectory). `ready` hears of the
  endpoint once it listens."""
  options = endpoint_options(cfg)
  engine = make_engine(cfg.sampler, cfg.model, params, chat, version=version, mesh=mesh)
  engine.warmup()
  endpoint = server.Endpoint(agent_spec.limits(options), open_on_call=True)
  names: dict[str, str] = {}
  slots = cfg.sampler.slots
  # Each episode holds at most one step thread (waiting for its client, or for its next
  # call): a thread per episode, so a waiting one never holds up another's turn.
  runner = EpisodeRunner(
      engine, chat, lambda: ServedEnv(endpoint, names, time_limit_s=options.time_limit_s,
                                      max_turns=cfg.env.max_turns,
                                      max_observation_chars=cfg.env.max_observation_chars),
      max_episodes=slots, env_threads=slots, log=log, close_grace_s=1.0)
  log(f"serving at {endpoint.base_url}: OPENAI_BASE_URL={endpoint.base_url} "
      f"OPENAI_API_KEY={endpoint.run_token}.<episode name> (each new name opens an episode; "
      "POST /v1/episode/end ends it)")
  ready(endpoint)
  done: list[tuple[str, Trajectory]] = []
  numbers = itertools.count()
  try:
    started = 0
    while episodes is None or len(done) < episodes:
      while runner.can_start() and (episodes is None or started < episodes):
        number = next(numbers)
        runner.start(Task(id=f"served-{number}", prompt="", answer=""), prompt_id=0,
                     seed=cfg.seed + number)
        started += 1
      for traj in runner.step():
        name = names.get(traj.info["task"], traj.info["task"])
        done.append((name, traj))
        log(summary(name, traj))
  finally:
    for _ in range(slots):  # the episodes still waiting for a client end
      endpoint.arrivals.put(None)
    runner.close()
    endpoint.stop()
  return done
