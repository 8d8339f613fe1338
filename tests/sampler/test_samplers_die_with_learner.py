"""Samplers die with their learner, even blocked on a full transport of realistic
trajectories, and a dead learner's shared-memory weight block is reclaimed.

The learner here is a spawned process that builds what `sao-train` builds for
same-host samplers (a shared-memory weight channel, a queue transport, a
`SamplerSupervisor`), then is SIGKILLed. Its block outlives it because its
resource tracker is this test's process (as when a process-group kill takes the
learner's tracker too): only the next publisher can reclaim it. The blocks here
carry this test process's own prefix (`BLOCKS`), so a publisher of a test running
beside this one (another pytest worker) cannot reclaim them first.
"""

import multiprocessing
import os
import pathlib
import signal
import time

import jax.numpy as jnp
import numpy as np
import psutil
import pytest

from sao_jax import config as C
from sao_jax.channel import weights
from sao_jax.channel.transport import QueueTransport
from sao_jax.sampler.worker import SamplerSupervisor, WorkerSpec, hand_over, run_sampler
from sao_jax.types import Trajectory

CAPACITY, LENGTH, SAMPLERS = 8, 4000, 2  # 8 x ~52 KB: far more than a 64 KiB pipe holds
BLOCKS = f"sao_t{os.getpid()}p"  # + learner pid + "_" + random hex


def realistic(seed: int, length: int = LENGTH) -> Trajectory:
  """A multi-turn-sized trajectory: `length` tokens, the last quarter sampled."""
  action = np.zeros(length, np.int8)
  action[-length // 4:] = 1
  rewards = np.zeros(length, np.float32)
  rewards[-1] = 1.0
  return Trajectory(tokens=np.arange(length, dtype=np.int32) % 500, action_mask=action,
                    behavior_logp=-0.5 * action.astype(np.float32), rewards=rewards,
                    prompt_id=seed, policy_versions=(0, 0))


class CountingTransport(QueueTransport):
  """The real queue transport, recording in `progress_dir` how many trajectories
  each writer process has put (the test's only view of a full queue)."""

  def __init__(self, capacity: int, progress_dir: str):
    super().__init__(capacity)
    self.progress_dir = progress_dir

  def put(self, traj, timeout=None):
    super().put(traj, timeout)
    path = pathlib.Path(self.progress_dir) / str(os.getpid())
    path.write_text(str(int(path.read_text()) + 1 if path.exists() else 1))


def flood(spec: WorkerSpec, alive) -> None:
  """A scripted sampler run: attaches to the weights like a sampler, then hands
  over realistic trajectories as fast as the transport takes them."""
  subscriber = weights.subscribe(spec.weights)
  count = 0
  while hand_over(spec.transport, realistic(count), alive, poll_s=0.1):
    count += 1
  subscriber.close()


def handed(progress_dir) -> int:
  return sum(int(p.read_text() or 0) for p in pathlib.Path(progress_dir).iterdir())


def params():
  return {"embed": jnp.ones((64, 32), jnp.float32), "head": jnp.ones((32,), jnp.bfloat16)}


def _learner(report, progress_dir, blocks, cfg=None, tokenizer_path=""):
  """A learner-like process: weight block, transport, supervised samplers; then waits."""
  if cfg is None:
    publisher = weights.SharedMemoryWeights(params(), block_prefix=blocks)
    publisher.publish(params(), version=1)
    run = flood
  else:
    from sao_jax.models.transformer import init_params
    import jax

    policy = init_params(cfg.model, jax.random.key(0))
    publisher = weights.SharedMemoryWeights(policy, block_prefix=blocks)
    publisher.publish(policy, version=1)
    run = run_sampler
  transport = CountingTransport(CAPACITY, progress_dir)
  specs = [WorkerSpec(cfg=cfg or C.Config(), tokenizer_path=tokenizer_path,
                      weights=publisher.spec, transport=transport, worker_id=i)
           for i in range(SAMPLERS)]
  supervisor = SamplerSupervisor(specs, run=run)
  supervisor.start()
  report.put((supervisor.pids(), publisher.spec.name))
  time.sleep(600)


def _survivors(pids, timeout):
  """The pids still running (a zombie, dead but not reaped, is not) after `timeout` s."""
  deadline = time.monotonic() + timeout
  while True:
    running = []
    for pid in pids:
      try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
          running.append(pid)
      except psutil.NoSuchProcess:
        pass
    if not running or time.monotonic() > deadline:
      return running
    time.sleep(0.1)


def _kill_learner_with_full_queue(progress_dir, **learner_kwargs):
  """Starts the learner, waits until its transport is full (the samplers are
  blocked handing over), SIGKILLs it; returns (sampler pids, weight block name)."""
  context = multiprocessing.get_context("spawn")
  report = context.Queue()
  learner = context.Process(target=_learner, args=(report, str(progress_dir), BLOCKS),
                            kwargs=learner_kwargs)
  learner.start()
  pids, block = report.get(timeout=120)
  try:
    deadline = time.monotonic() + 300
    while handed(progress_dir) < CAPACITY and time.monotonic() < deadline:
      time.sleep(0.2)
    assert handed(progress_dir) >= CAPACITY, "the samplers never filled the transport"
    time.sleep(1.0)  # every sampler is now waiting to hand over, its feeder thread blocked
    assert all(psutil.Process(pid).is_running() for pid in pids)
    assert (pathlib.Path(weights.SHM_DIR) / block).exists()
  finally:
    os.kill(learner.pid, signal.SIGKILL)
    learner.join()
  return pids, block


def _assert_gone_and_reclaimed(pids, block):
  survivors = _survivors(pids, 10.0)
  for pid in survivors:  # do not leave them behind for the rest of the suite
    os.kill(pid, signal.SIGKILL)
  assert not survivors, f"samplers {survivors} outlived their SIGKILLed learner by 10 s"
  assert (pathlib.Path(weights.SHM_DIR) / block).exists()  # nobody cleaned it up...
  publisher = weights.SharedMemoryWeights(params(), block_prefix=BLOCKS)  # ... until the next start
  try:
    assert block in publisher.reclaimed
    assert not (pathlib.Path(weights.SHM_DIR) / block).exists()
  finally:
    publisher.close()


@pytest.mark.skipif(not os.path.isdir(weights.SHM_DIR), reason="needs Linux /dev/shm")
def test_a_sigkilled_learner_leaves_no_sampler_and_no_weight_block(tmp_path):
  pids, block = _kill_learner_with_full_queue(tmp_path)
  _assert_gone_and_reclaimed(pids, block)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(weights.SHM_DIR), reason="needs Linux /dev/shm")
def test_real_samplers_of_a_sigkilled_learner_exit(tmp_path):
  """The same with the real sampler loop: a tiny model generating episodes of
  thousands of tokens (math environment, random weights) into a full queue."""
  from sao_jax.models.tokenizer import train_tokenizer

  tokenizer_path = str(tmp_path / "tokenizer.json")
  train_tokenizer(["Solve 12 + 30 = 42. \\boxed{42}"] * 4, vocab_size=300).save(tokenizer_path)
  model = C.ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, head_dim=8,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        logits_chunk=512, max_position_embeddings=4096)
  sampler = C.SamplerConfig(slots=4, max_seq_len=2048, prefill_buckets=(128,),
                            steps_per_call=64, max_new_tokens=2048, stop_tokens=(),
                            stop_patterns=())
  cfg = C.Config(model=model, sampler=sampler, mesh=C.MeshConfig(fsdp=1),
                 env=C.EnvConfig(name="math_tool", max_turns=1))
  progress = tmp_path / "progress"
  progress.mkdir()
  pids, block = _kill_learner_with_full_queue(progress, cfg=cfg, tokenizer_path=tokenizer_path)
  _assert_gone_and_reclaimed(pids, block)


def test_reclaim_keeps_live_owners_blocks_and_removes_dead_ones(tmp_path):
  dead = psutil.Popen(["true"])
  dead.wait()
  live_block = tmp_path / f"sao_w{os.getpid()}_0123abcd"
  dead_block = tmp_path / f"sao_w{dead.pid}_0123abcd"
  other = tmp_path / f"psm_{dead.pid}"  # not a weight block: never touched
  dead_test_block = tmp_path / f"sao_t1p{dead.pid}_0123abcd"  # another prefix's
  for path in (live_block, dead_block, other, dead_test_block):
    path.write_bytes(b"x")
  assert weights.reclaim_stale_blocks(str(tmp_path)) == [dead_block.name]
  assert live_block.exists() and other.exists() and not dead_block.exists()
  assert dead_test_block.exists()
  assert weights.reclaim_stale_blocks(str(tmp_path), "sao_t1p") == [dead_test_block.name]
  assert weights.reclaim_stale_blocks(str(tmp_path / "missing")) == []


def test_stop_returns_without_waiting_for_unread_trajectories(tmp_path):
  """The learner stops while its queue is full of realistic trajectories it will
  never read: workers exit at once instead of flushing (and being killed after
  the stop timeout)."""
  transport = CountingTransport(CAPACITY, str(tmp_path))
  publisher = weights.SharedMemoryWeights(params())
  specs = [WorkerSpec(cfg=C.Config(), tokenizer_path="", weights=publisher.spec,
                      transport=transport, worker_id=i) for i in range(SAMPLERS)]
  supervisor = SamplerSupervisor(specs, run=flood)
  try:
    supervisor.start()
    deadline = time.monotonic() + 120
    while handed(tmp_path) < CAPACITY and time.monotonic() < deadline:
      time.sleep(0.2)
    time.sleep(1.0)
    transport.close()
    start = time.monotonic()
    supervisor.stop(timeout=10.0)
    assert time.monotonic() - start < 5.0 and not supervisor.pids()
  finally:
    supervisor.stop()
    publisher.close()


def test_a_crash_report_quotes_the_failure_escaped(monkeypatch, capsys):
  # The crash's traceback went to stderr and to the learner, which logs it: its message
  # (a peer's file name, a reply) reached the operator's terminal raw.
  from sao_jax.sampler import worker

  monkeypatch.setattr(worker, "die_with_parent", lambda pid: None)
  monkeypatch.setattr(worker, "exit_without_flushing", lambda code: None)
  reports = []
  errors = type("Errors", (), {"put": lambda self, item: reports.append(item),
                               "close": lambda self: None, "join_thread": lambda self: None})()

  def crash(spec, alive):
    raise OSError("cannot read \x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\r\nstep 1000/1000 | done")

  worker.process_main(crash, WorkerSpec(cfg=None, tokenizer_path="", weights=None,
                                        transport=None, worker_id=3), None, errors, 0)
  [(worker_id, report)] = reports
  for text in (report, capsys.readouterr().err):
    assert "\x1b" not in text and "\\x1b]52;c;" in text and "\\nstep 1000/1000" in text, text
    assert "Traceback" in text and "OSError: cannot read" in text
