"""A sampler worker outlives a weight channel that drops it after the first weights
(a learner restarting, a publisher at its subscriber cap): it samples on with the
weights it has and polls again after a doubling wait. Before, the ConnectionError
escaped `run_sampler`, the worker died and its episodes in flight were lost."""

import jax

from sao_jax import config as C
from sao_jax.channel import weights
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.models.transformer import init_params
from sao_jax.sampler import worker


class Subscriber:
  """The first poll gives weights; the next `failures` raise as a dropped channel does."""

  def __init__(self, params, failures: int):
    self.params, self.failures, self.polls = params, failures, 0

  def poll(self):
    self.polls += 1
    if self.polls == 1:
      return self.params, 1
    if self.polls <= 1 + self.failures:
      raise ConnectionError("weight channel: learner host 10.0.0.2:5617 dropped the connection")
    return None

  def close(self):
    pass


class Transport:
  def __init__(self):
    self.trajectories = []

  def put(self, traj, timeout=None):
    self.trajectories.append(traj)


def test_a_dropped_weight_channel_does_not_end_the_worker(tmp_path, monkeypatch, capsys):
  tokenizer = tmp_path / "tokenizer.json"
  train_tokenizer(["Solve 12 + 30 = 42. \\boxed{42}"] * 4, vocab_size=300).save(str(tokenizer))
  model = C.ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, head_dim=8,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        logits_chunk=512, max_position_embeddings=1024)
  # The math_tool prompt is ~470 tokens of this tiny tokenizer.
  sampler = C.SamplerConfig(slots=2, max_seq_len=600, prefill_buckets=(512,),
                            max_new_tokens=8, stop_tokens=(), stop_patterns=())
  cfg = C.Config(model=model, sampler=sampler, mesh=C.MeshConfig(fsdp=1),
                 env=C.EnvConfig(name="math_tool", max_turns=1))
  subscriber = Subscriber(init_params(model, jax.random.key(0)), failures=2)
  monkeypatch.setattr(weights, "subscribe", lambda spec: subscriber)
  monkeypatch.setattr(worker, "_RECONNECT_FIRST_S", 0.01, raising=False)
  transport = Transport()
  spec = worker.WorkerSpec(cfg=cfg, tokenizer_path=str(tokenizer), weights=None,
                           transport=transport, worker_id=3)
  # Until it has handed over 3 episodes and polled again after both failures.
  worker.run_sampler(spec, alive=lambda: len(transport.trajectories) < 3 or subscriber.polls < 4)
  assert len(transport.trajectories) >= 3
  assert not any(t.env_failure for t in transport.trajectories)
  logged = capsys.readouterr().err
  assert logged.count("sampler 3: weight channel unavailable") == 2, logged
  assert "polling again in 0 s" in logged  # 0.01 s, then 0.02 s
  # The paged engine's attention and why, said once at start (on TPU: maybe the reference).
  assert logged.count("sampler 3: paged attention: reference (sampler.paged_attention='auto' "
                      "on cpu: the kernel is TPU-only)") == 1, logged


def test_the_wait_doubles_per_failure_up_to_its_cap_and_a_clean_poll_resets_it():
  now = [0.0]
  lines = []
  reconnect = worker._Reconnect(lines.append, clock=lambda: now[0])
  failing = Subscriber(None, failures=10)
  failing.polls = 1  # past its first weights: every poll now fails
  waits = []
  for _ in range(7):
    assert reconnect.poll(failing) is None
    waits.append(reconnect._retry_at - now[0])
    polls = failing.polls
    now[0] = reconnect._retry_at - 1e-3
    assert reconnect.poll(failing) is None and failing.polls == polls  # still waiting
    now[0] = reconnect._retry_at
  assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
  assert len(lines) == 3 and reconnect.waits == {"connection": 7}  # logged at 1, 2, 4 in a row
  failing.failures = 0  # the channel is back
  assert reconnect.poll(failing) is None and reconnect._wait == 0.0
