"""Trajectory validation and the record encoding."""

import io
import zipfile

import numpy as np
import pytest

from sao_jax.channel import records
from traj_factory import make_traj


def test_valid_trajectory_has_no_problems():
  assert records.problems(make_traj(), vocab_size=50) == []


@pytest.mark.parametrize("change,reason", [
    (lambda t: t.behavior_logp.__setitem__(-1, np.nan), "nan_logp"),
    (lambda t: t.behavior_logp.__setitem__(0, -1.0), "bad_logp"),
    (lambda t: t.rewards.__setitem__(0, 1.0), "reward_off_action"),
    (lambda t: t.rewards.__setitem__(-1, np.inf), "nan_reward"),
    (lambda t: t.action_mask.__setitem__(slice(None), 0), "no_action_tokens"),
    (lambda t: t.tokens.__setitem__(0, 99), "token_out_of_range"),
])
def test_malformed_trajectories_are_named(change, reason):
  traj = make_traj()
  change(traj)
  assert reason in records.problems(traj, vocab_size=50)


def test_shape_mismatch_and_empty():
  traj = make_traj()
  traj.rewards = traj.rewards[:-1]
  assert records.problems(traj) == ["bad_shape"]
  empty = make_traj(length=0)
  assert records.problems(empty) == ["empty"]
  assert "bad_versions" in records.problems(make_traj(versions=(3, 2)))


@pytest.mark.parametrize("changes,reason", [
    (dict(prompt_id=2**31), "bad_prompt_id"),
    (dict(prompt_id=-1), "bad_prompt_id"),
    (dict(versions=(2**31, 2**31)), "bad_versions"),
    (dict(versions=(-3, 2)), "bad_versions"),
])
def test_ids_the_int32_batch_cannot_hold_are_problems(changes, reason):
  # A peer's record (DirectoryTransport) carries any JSON integers; the batch is int32.
  traj = records.from_bytes(records.to_bytes(make_traj(**changes)), max_tokens=64)
  assert reason in records.problems(traj, vocab_size=50)


def test_bytes_round_trip():
  traj = make_traj(prompt_id=7, versions=(2, 5), env_failure=None, info={"task": "t-1", "turns": 3})
  back = records.from_bytes(records.to_bytes(traj))
  for name in records.ARRAYS:
    np.testing.assert_array_equal(getattr(back, name), getattr(traj, name))
    assert getattr(back, name).dtype == getattr(traj, name).dtype
  assert (back.prompt_id, back.policy_versions, back.info) == (7, (2, 5), traj.info)
  assert back.outcome == traj.outcome == 1.0


def test_round_trip_within_the_token_bound_and_bound_is_enforced():
  data = records.to_bytes(make_traj(length=10))
  assert records.from_bytes(data, max_tokens=10).length == 10
  with pytest.raises(records.RecordError, match="tokens: 10 elements, more than 9") as error:
    records.from_bytes(data, max_tokens=9)
  assert error.value.reason == "oversized"
  assert len(data) <= records.max_record_bytes(10)


@pytest.mark.parametrize("data, reason", [
    (b"", "unreadable"),
    (b"PK\x03\x04" + b"\x00" * 100, "unreadable"),
    (records.to_bytes(make_traj())[:-30], "unreadable"),
])
def test_unreadable_bytes_raise_a_record_error(data, reason):
  with pytest.raises(records.RecordError) as error:
    records.from_bytes(data, max_tokens=64)
  assert error.value.reason == reason


def test_metadata_of_the_wrong_types_is_malformed():
  import io
  import json
  meta = {"prompt_id": "7", "policy_versions": [1, 2], "env_failure": None, "info": {}}
  buffer = io.BytesIO()
  traj = make_traj()
  np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
           **{name: getattr(traj, name) for name in records.ARRAYS})
  with pytest.raises(records.RecordError, match="wrong types") as error:
    records.from_bytes(buffer.getvalue(), max_tokens=64)
  assert error.value.reason == "malformed"


def test_utf16_metadata_nested_past_the_cap_is_malformed_not_a_crash():
  # Read as UTF-16 it hid its nesting from the depth cap; json.loads then raised
  # RecursionError, which no reader catches: one record killed the learner.
  traj = make_traj()
  meta = ('["\u2200", ' + "[" * 100_000 + "]" * 100_000 + ', "\u2200"]').encode("utf-16-le")
  buffer = io.BytesIO()
  np.savez(buffer, meta=np.frombuffer(meta, np.uint8),
           **{name: getattr(traj, name) for name in records.ARRAYS})
  with pytest.raises(records.RecordError, match="malformed"):
    records.from_bytes(buffer.getvalue(), max_tokens=64)


def _routed(length=10, layers=3, k=2, num_experts=100, seed=0):
  """Recorded experts of an MoE sampler: k distinct per token and layer, -1 on the prompt."""
  rng = np.random.default_rng(seed)
  experts = np.argsort(rng.random((length, layers, num_experts)), axis=-1)[..., :k]
  experts = experts.astype(np.int8 if num_experts <= 127 else np.int16)
  experts[:length // 2] = -1
  return experts


@pytest.mark.parametrize("num_experts,dtype", [(100, np.int8), (130, np.int16)])
def test_routing_survives_bytes_sealing_and_pipeline_state(num_experts, dtype):
  """MoE routing records cross the channel unchanged, values, shape and dtype: the
  record bytes, the sealed file and the pipeline's checkpointed state (resume)."""
  from sao_jax.channel import sealed
  from sao_jax.data import pipeline
  routed = _routed(num_experts=num_experts)
  traj = make_traj(routed_experts=routed)
  assert records.problems(traj, vocab_size=50) == []
  secret, nonce = b"k" * 32, b"n" * 16
  data = sealed.seal(secret, nonce, "w-0.p0.traj", records.to_bytes(traj))
  back = records.from_bytes(sealed.unseal(secret, nonce, "w-0.p0.traj", data), max_tokens=64)
  resumed = pipeline._decode(pipeline._encode([back]))[0]
  for got in (back, resumed):
    assert got.routed_experts.dtype == dtype
    np.testing.assert_array_equal(got.routed_experts, routed)
  dense = records.from_bytes(records.to_bytes(make_traj()), max_tokens=64)
  assert dense.routed_experts is None


@pytest.mark.parametrize("routed", [
    _routed(length=9),  # not one row per token
    _routed()[:, :, 0],  # not [T, L, k]
    _routed(num_experts=300).astype(np.int32),  # wider than int16
    np.full((10, 2, 2), -2, np.int8),  # below the -1 of "not recorded"
    np.zeros((10, 33, 32), np.int8),  # more than MAX_ROUTED_PER_TOKEN per token
])
def test_malformed_routing_is_a_problem(routed):
  assert records.problems(make_traj(routed_experts=routed)) == ["bad_routing"]


@pytest.mark.parametrize("routed,reason", [
    (np.zeros((10, 2), np.int8), "malformed"),
    (np.zeros((10, 2, 2), np.float32), "malformed"),
    (np.zeros((10, 2, 2), np.int32), "malformed"),
    (np.zeros((65, 2, 2), np.int8), "oversized"),
    (np.zeros((10, 33, 32), np.int8), "oversized"),
])
def test_a_record_s_routing_member_is_checked_before_use(routed, reason):
  """A peer's routing member is read only as a [T, L, k] int8/int16 array within the
  bounds; anything else is a RecordError with its drop reason."""
  good = records.to_bytes(make_traj())
  out = io.BytesIO()
  with zipfile.ZipFile(io.BytesIO(good)) as src, zipfile.ZipFile(out, "w") as dst:
    for info in src.infolist():
      dst.writestr(info, src.read(info))
    member = io.BytesIO()
    np.save(member, routed)
    dst.writestr(f"{records.ROUTING}.npy", member.getvalue())
  with pytest.raises(records.RecordError) as error:
    records.from_bytes(out.getvalue(), max_tokens=64)
  assert error.value.reason == reason
