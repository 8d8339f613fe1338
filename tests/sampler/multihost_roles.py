"""The processes of tests/sampler/test_multihost_engine.py: one engine over two processes.

  python multihost_roles.py ADDRESS PROCESS_ID OUT LAYOUT[,LAYOUT...]   # the equality run
  python multihost_roles.py ADDRESS PROCESS_ID OUT busy                  # runs until killed

Each process joins a 2-process group at ADDRESS with DEVICES (4) CPU devices, builds
one engine of each LAYOUT over the 8 devices of both (`MESH`), and process 0 leads
`scenario` through a `LeaderEngine` while process 1 replays it (`multihost.follow`).
The leader writes OUT/<layout>.json (the scenario's episodes); "busy" keeps the
engine decoding (writing OUT/ready-<id> once it decodes) until a process dies, then
each process writes OUT/ended-<id>.json with what ended it. The test runs `scenario`
on one process holding 8 devices for the reference.
"""

import json
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DEVICES, PROCESSES, TIMEOUT_S = 4, 2, 30.0
EPISODES = 6
OBSERVATION = [7, 8, 9]


def sampler(layout: str):
  from engine_fixtures import with_sampler

  if layout == "paged":
    return with_sampler(kv_layout="paged", slots=8, kv_page_size=8, kv_pages=64)  # 4 shards
  return with_sampler(slots=8)


def mesh():
  import jax

  from sao_jax.config import MeshConfig
  from sao_jax.sharding.mesh import make_mesh

  return make_mesh(MeshConfig(fsdp=4, tensor=2), jax.devices())


def build(layout: str, version_params, mesh):
  from engine_fixtures import MODEL, STOP
  from sao_jax.sampler.kv_layout import kv_layout

  cfg = sampler(layout)
  return kv_layout(cfg).engine(cfg, MODEL, version_params, version=0, stop_token_ids=(STOP,),
                               mesh=mesh)


def weights(version: int):
  from engine_fixtures import params

  return params(version)


def scenario(engine) -> dict:
  """Episodes 0..5 (0 and 3 get a second turn after an observation; an even one,
  once finished, starts episode 100 + i), a weight update to version 1 after the
  third engine step, all through dispatch/complete; {id: tokens, logp, versions}."""
  from engine_fixtures import prompts

  engine.warmup()
  for i, prompt in enumerate(prompts(EPISODES, seed=3)):
    engine.submit(i, prompt, seed=11 + i, max_new_tokens=3 + (5 * i) % 9)
  out, continued, steps = {}, set(), 0
  while engine.busy:
    for turn in engine.complete(engine.dispatch()):
      i = turn.episode_id
      if i < 100 and i % 3 == 0 and i not in continued:
        continued.add(i)
        engine.submit(i, OBSERVATION)
        continue
      generation = engine.finish(i)
      out[i] = {"tokens": generation.tokens.tolist(),
                "behavior_logp": generation.behavior_logp.tolist(),
                "versions": list(generation.policy_versions)}
      if i < 100 and i % 2 == 0:
        engine.submit(100 + i, [1, 2], seed=i)
    steps += 1
    if steps == 3:
      engine.set_params(weights(1), 1)
  return out


def main(address: str, process_id: int, out: pathlib.Path, job: str) -> None:
  import jax

  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", DEVICES)
  from sao_jax.sampler import multihost
  from sao_jax.sharding import distributed

  # The runtime's heartbeat outlasts the group's own timeouts, which report what ended it.
  distributed.join(address, PROCESSES, process_id, heartbeat_s=int(2 * TIMEOUT_S))
  group = multihost.Group(timeout_s=TIMEOUT_S)
  ended = lambda what: (out / f"ended-{process_id}.json").write_text(json.dumps(what))
  watchdog = multihost.Watchdog(TIMEOUT_S, lambda what: (ended({"stall": what}), os._exit(3)))
  group.announce(0)
  group.announce(1)  # every process holds both versions from the start (params_for)
  layouts = ["dense"] if job == "busy" else job.split(",")
  for layout in layouts:
    engine = build(layout, weights(0), mesh())
    if not group.leader:
      try:
        multihost.follow(engine, group, params_for=weights, watchdog=watchdog)
      except multihost.GroupFailed as error:
        ended({"failed": str(error)})
        os._exit(2)  # not jax's exit-time barrier with a peer that is gone
      continue
    engine = multihost.LeaderEngine(engine, group, watchdog=watchdog)
    if job == "busy":
      busy(engine, out, ended)
      return
    result = scenario(engine)
    engine.close()
    (out / f"{layout}.json").write_text(json.dumps(result))


def busy(engine, out: pathlib.Path, ended) -> None:
  """Keeps the engine decoding (two turns queued at every step) until the group fails."""
  from engine_fixtures import prompts
  from sao_jax.sampler import multihost

  engine.warmup()
  episode = 0
  try:
    while True:
      while engine.queued < 2:
        engine.submit(episode, prompts(1, seed=episode)[0], seed=episode, max_new_tokens=4)
        episode += 1
      for turn in engine.step():
        engine.finish(turn.episode_id)
      (out / "ready-0").touch()
  except multihost.GroupFailed as error:
    ended({"failed": str(error)})
    os._exit(2)  # not jax's exit-time barrier with a peer that is gone


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3]), sys.argv[4])
