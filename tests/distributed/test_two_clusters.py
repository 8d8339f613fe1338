"""A learner cluster (2 processes) and a sampler cluster (1 process) on CPU.

The learner trains the tiny model on a mesh spanning both of its processes
(gloo collectives), checkpoints to a shared directory and publishes every
policy version over the network weight channel. A sampler adopts versions and
must hold exactly the published params; SIGKILLing it must not disturb the
learner, and a new sampler must start from the newest version.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROLES = HERE / "cluster_roles.py"
STEPS = 8


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def read_lines(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Cluster:
  """The test's processes; each writes its output to a log file in the work dir."""

  def __init__(self, work: pathlib.Path):
    self.work, self.processes = work, {}

  def start(self, name: str, *args: str, **env: str) -> subprocess.Popen:
    log = (self.work / f"{name}.log").open("w")
    process = subprocess.Popen([sys.executable, str(ROLES), *args], stdout=log,
                               stderr=subprocess.STDOUT,
                               env={**os.environ, "JAX_PLATFORMS": "cpu", **env})
    self.processes[name] = process
    return process

  def logs(self) -> str:
    return "\n".join(f"--- {name} (exit {p.poll()}):\n"
                     + (self.work / f"{name}.log").read_text()[-3000:]
                     for name, p in self.processes.items())

  def wait_for(self, what: str, condition, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
      crashed = [n for n, p in self.processes.items() if p.poll() not in (None, 0, -9)]
      if crashed or time.monotonic() > deadline:
        pytest.fail(f"waiting for {what}: {'crashed: ' + str(crashed) if crashed else 'timeout'}"
                    f"\n{self.logs()}")
      time.sleep(0.05)

  def gate(self, steps: int) -> None:
    (self.work / "gate.tmp").write_text(str(steps))
    (self.work / "gate.tmp").rename(self.work / "gate")

  def versions(self, name: str) -> list[int]:
    return [r["version"] for r in read_lines(self.work / f"adopted-{name}.jsonl")]

  def published(self) -> dict[int, str]:
    return {r["version"]: r["digest"] for r in read_lines(self.work / "published.jsonl")}

  def kill_all(self) -> None:
    for process in self.processes.values():
      if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.slow  # ~60 s on 2 cores: three JAX processes, a train step compiled per learner host
def test_learner_and_sampler_clusters_exchange_weights(tmp_path):
  cluster = Cluster(tmp_path)
  cluster.gate(0)
  coordinator = {"SAO_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}", "SAO_NUM_PROCESSES": "2"}
  try:
    for i in range(2):
      cluster.start(f"learner{i}", "learner", str(tmp_path), **coordinator, SAO_PROCESS_ID=str(i))
    cluster.wait_for("the initial weights", lambda: 0 in cluster.published()
                     and all((tmp_path / f"address-{i}").exists() for i in range(2)))
    first = cluster.start("sampler_a", "sampler", str(tmp_path), "a")
    cluster.wait_for("sampler a to adopt version 0", lambda: 0 in cluster.versions("a"))
    cluster.gate(3)
    cluster.wait_for("sampler a to adopt version 3", lambda: 3 in cluster.versions("a"))

    os.kill(first.pid, signal.SIGKILL)  # the sampler cluster dies mid-run
    assert first.wait(timeout=30) == -signal.SIGKILL
    cluster.gate(6)  # the learner goes on without samplers
    cluster.wait_for("the learner to publish version 6", lambda: 6 in cluster.published())
    cluster.start("sampler_b", "sampler", str(tmp_path), "b")
    cluster.wait_for("sampler b to adopt version 6", lambda: 6 in cluster.versions("b"))
    cluster.gate(STEPS)
    cluster.wait_for("the learner to finish and sampler b to adopt its last version",
                     lambda: all((tmp_path / f"done-{i}.json").exists() for i in range(2))
                     and STEPS in cluster.versions("b"))
    (tmp_path / "stop").touch()
    for name, process in cluster.processes.items():
      if name != "sampler_a":
        assert process.wait(timeout=60) == 0, cluster.logs()
  finally:
    cluster.kill_all()

  published = cluster.published()
  assert sorted(published) == list(range(STEPS + 1)), "one policy update per step"
  for name in ("a", "b"):
    adopted = read_lines(tmp_path / f"adopted-{name}.jsonl")
    versions = [r["version"] for r in adopted]
    assert versions == sorted(set(versions)), f"sampler {name} went back or repeated: {versions}"
    for record in adopted:  # bit-exact: the digest covers every byte of every leaf
      assert record["digest"] == published[record["version"]], (name, record)
  assert cluster.versions("a")[0] == 0
  assert cluster.versions("b")[0] == 6, "a new sampler starts from the newest version"
  for i in range(2):
    done = json.loads((tmp_path / f"done-{i}.json").read_text())
    assert done["steps_done"] == STEPS and done["stopped_by"] == "steps"
    assert done["rows"] == [4 * i, 4 * i + 4] and done["batch_equal"], done
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                if p.name.isdigit()) == [4, 8]
