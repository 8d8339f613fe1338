"""The processes of tests/distributed/test_two_clusters.py.

  python cluster_roles.py learner WORKDIR        # one host of the learner cluster; the
                                                 # cluster comes from SAO_COORDINATOR_ADDRESS,
                                                 # SAO_NUM_PROCESSES, SAO_PROCESS_ID
  python cluster_roles.py sampler WORKDIR NAME   # a one-process sampler cluster

They talk to the test through files in WORKDIR:
  gate               the test writes N: learner steps < N may run (paces the run)
  address-<i>        learner host i's weight server, host:port
  published.jsonl    learner host 0: {"version", "digest"} of every published version,
                     the digest over the full (all-gathered) policy params
  adopted-<NAME>.jsonl  sampler: {"version", "digest"} of every version it adopted,
                     the digest over its params after placing them on its own mesh
  done-<i>.json      learner host i finished: steps, stop reason, batch-assembly check
  stop               the test is done: every process exits
Each learner host serves its weights until `stop` appears, so a late sampler can
still fetch the final version.
"""

import hashlib
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "learner"))  # learner_fixtures: the tiny model and batches

STEPS, DEVICES_PER_HOST, WAIT_SECONDS = 8, 2, 300
SECRET = b"the two clusters' shared secret."  # the weight channel's (weights_wire)


def digest(params) -> str:
  """blake2b over every leaf's path, dtype, shape and bytes (host arrays)."""
  import jax
  import numpy as np
  hasher = hashlib.blake2b(digest_size=16)
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    leaf = np.ascontiguousarray(leaf)
    hasher.update(f"{jax.tree_util.keystr(path)} {leaf.dtype.name} {leaf.shape}".encode())
    hasher.update(leaf.tobytes())
  return hasher.hexdigest()


def append_line(path: pathlib.Path, record: dict) -> None:
  with path.open("a") as f:
    f.write(json.dumps(record) + "\n")


def write_atomic(path: pathlib.Path, text: str) -> None:
  tmp = path.with_suffix(".tmp")
  tmp.write_text(text)
  tmp.rename(path)


def configure_jax():
  import jax
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", DEVICES_PER_HOST)
  return jax


def learner(work: pathlib.Path) -> None:
  jax = configure_jax()
  from sao_jax.sharding import distributed

  if not distributed.initialize():
    raise SystemExit("learner role: SAO_COORDINATOR_ADDRESS is not set")
  import dataclasses

  import numpy as np
  from jax.experimental import multihost_utils
  from learner_fixtures import BATCH, LENGTH, make_batch, make_config

  from sao_jax import config as C
  from sao_jax.channel import weights_net
  from sao_jax.learner import compile as compile_lib
  from sao_jax.learner.loop import run_learner
  from sao_jax.models.transformer import abstract_params
  from sao_jax.sharding.mesh import make_mesh

  process = jax.process_index()
  cfg = dataclasses.replace(make_config(steps=STEPS), checkpoint=C.CheckpointConfig(
      directory=str(work / "checkpoints"), save_every_steps=4, keep=2, async_save=False))
  publisher = weights_net.NetworkWeights(abstract_params(cfg.model, "lm"), port=0, secret=SECRET)
  write_atomic(work / f"address-{process}", publisher.address)
  published = {"version": -1}

  def publish(state):
    version = int(jax.device_get(state.policy_version))
    if version == published["version"]:
      return
    publisher.publish(state.policy_params, version)
    published["version"] = version
    full = multihost_utils.process_allgather(state.policy_params, tiled=True)  # every host calls
    if process == 0:
      append_line(work / "published.jsonl", {"version": version, "digest": digest(full)})

  # Each host yields only its rows of every batch; run_learner assembles the global one.
  layout = compile_lib.batch_shardings(cfg, make_mesh(cfg.mesh), LENGTH)
  mine = distributed.local_rows(layout.tokens, (BATCH, LENGTH))

  def batches():
    for step in range(STEPS):
      deadline = time.monotonic() + WAIT_SECONDS
      while int((work / "gate").read_text() or 0) <= step:
        if time.monotonic() > deadline:
          raise TimeoutError(f"learner {process}: gate never passed step {step}")
        time.sleep(0.02)
      yield jax.tree.map(lambda x: x[mine], make_batch(seed=step))

  result = run_learner(cfg, batches(), on_start=lambda state, resumed: publish(state),
                       after_step=lambda steps_done, state: publish(state))

  # Per-host loading: this host's rows only, assembled into the global batch, must
  # equal the whole batch placed from one host.
  shardings = compile_lib.batch_shardings(cfg, result.state.step.sharding.mesh, LENGTH)
  whole = make_batch(seed=99)
  rows = distributed.local_rows(shardings.tokens, whole.tokens.shape)
  assembled = distributed.global_batch(jax.tree.map(lambda x: x[rows], whole), shardings, BATCH)
  reference = compile_lib.put_batch(whole, shardings)
  same = all(np.array_equal(a.data, b.data) and a.index == b.index
             for x, y in zip(jax.tree.leaves(assembled), jax.tree.leaves(reference))
             for a, b in zip(x.addressable_shards, y.addressable_shards))
  write_atomic(work / f"done-{process}.json", json.dumps({
      "steps_done": result.steps_done, "stopped_by": result.stopped_by,
      "rows": [rows.start, rows.stop], "batch_equal": same}))
  deadline = time.monotonic() + WAIT_SECONDS
  while not (work / "stop").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
  publisher.close()
  jax.distributed.shutdown()


def sampler(work: pathlib.Path, name: str) -> None:
  jax = configure_jax()
  from learner_fixtures import make_config

  from sao_jax import config as C
  from sao_jax.channel import weights, weights_fetch
  from sao_jax.models.transformer import abstract_params, param_shardings
  from sao_jax.sharding.mesh import make_mesh

  cfg = make_config()
  addresses = tuple((work / f"address-{i}").read_text() for i in range(2))
  subscriber = weights.subscribe(weights_fetch.NetworkSpec(
      addresses, abstract_params(cfg.model, "lm"), timeout=30.0, secret=SECRET))
  shardings = param_shardings(cfg.model, make_mesh(C.MeshConfig()), "lm")  # its own 2 devices
  deadline = time.monotonic() + WAIT_SECONDS
  while not (work / "stop").exists() and time.monotonic() < deadline:
    try:
      got = subscriber.poll()
    except ConnectionError:
      if (work / "stop").exists():  # the learner shut down first
        break
      raise
    if got is not None:
      params, version = got
      placed = jax.device_put(params, shardings)
      append_line(work / f"adopted-{name}.jsonl",
                  {"version": version, "digest": digest(jax.device_get(placed))})
    time.sleep(0.02)
  subscriber.close()


if __name__ == "__main__":
  role, workdir = sys.argv[1], pathlib.Path(sys.argv[2])
  if role == "learner":
    learner(workdir)
  else:
    sampler(workdir, sys.argv[3])
