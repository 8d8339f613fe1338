"""One engine over two processes (`sao_jax.sampler.multihost`): 2 processes x 4 CPU
devices sample what 1 process x 8 devices samples, and the group fails as one unit.

The processes are tests/sampler/multihost_roles.py: they join one jax.distributed
group (gloo collectives), lay one engine over the 8 devices of both, and process 0
leads the scenario while process 1 replays its calls."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import multihost_roles as roles

# Each process compiles its engine's programs (about a minute on 2 loaded cores).
pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROLES = pathlib.Path(roles.__file__)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_group(out: pathlib.Path, job: str) -> list[subprocess.Popen]:
  address = f"127.0.0.1:{free_port()}"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  return [subprocess.Popen([sys.executable, str(ROLES), address, str(i), str(out), job],
                           stdout=(out / f"log-{i}").open("w"), stderr=subprocess.STDOUT,
                           env={**env, "JAX_PLATFORMS": "cpu"}) for i in range(roles.PROCESSES)]


def logs(out: pathlib.Path) -> str:
  return "\n".join(f"--- process {i}:\n" + (out / f"log-{i}").read_text()[-3000:]
                   for i in range(roles.PROCESSES))


def wait_all(processes, out, timeout_s: float) -> list[int]:
  deadline = time.monotonic() + timeout_s
  for p in processes:
    try:
      p.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      for q in processes:
        q.kill()
      pytest.fail(f"the group did not end within {timeout_s} s\n{logs(out)}")
  return [p.returncode for p in processes]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
  """Both layouts' scenario, led over 2 processes x 4 devices."""
  out = tmp_path_factory.mktemp("multihost")
  codes = wait_all(start_group(out, "dense,paged"), out, 900)
  assert codes == [0, 0], logs(out)
  return {layout: json.loads((out / f"{layout}.json").read_text()) for layout in ("dense", "paged")}


@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_two_processes_sample_what_one_process_does(two_processes, layout):
  want = roles.scenario(roles.build(layout, roles.weights(0), roles.mesh()))
  got = two_processes[layout]
  assert sorted(got, key=int) == sorted(map(str, want), key=int)
  assert {tuple(e["versions"]) for e in want.values()} >= {(0, 0), (1, 1)}  # through an update
  for episode, ref in want.items():
    mine = got[str(episode)]
    assert mine["tokens"] == ref["tokens"], f"episode {episode}"
    assert mine["versions"] == ref["versions"], f"episode {episode}"
    np.testing.assert_allclose(mine["behavior_logp"], ref["behavior_logp"], atol=1e-6,
                               err_msg=f"episode {episode}")


@pytest.mark.parametrize("killed", [1, 0], ids=["follower", "leader"])
def test_a_dead_process_ends_the_group(tmp_path, killed):
  processes = start_group(tmp_path, "busy")
  deadline = time.monotonic() + 600
  while not (tmp_path / "ready-0").exists():
    if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
      for p in processes:
        p.kill()
      pytest.fail(f"the group never decoded\n{logs(tmp_path)}")
    time.sleep(0.2)
  processes[killed].send_signal(signal.SIGKILL)
  survivor = 1 - killed
  codes = wait_all(processes, tmp_path, 4 * roles.TIMEOUT_S + 30)
  assert codes[killed] == -signal.SIGKILL
  assert codes[survivor] != 0, logs(tmp_path)
  # Ended by the group's own checks (what ended it written down), or by the runtime,
  # which terminates every process of a cluster whose peer is gone.
  ended = tmp_path / f"ended-{survivor}.json"
  by_runtime = "JAX distributed service detected fatal errors" in (
      tmp_path / f"log-{survivor}").read_text()
  assert ended.exists() or by_runtime, logs(tmp_path)
  if ended.exists():
    what = json.loads(ended.read_text())
    assert "stall" in what or "failed" in what, what
