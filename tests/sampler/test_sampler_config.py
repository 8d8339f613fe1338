"""SamplerConfig.validate names the field, the value and what is allowed."""

import dataclasses
import os
import re

import pytest

from sao_jax.config.sampler import PYTHON_TOOL_CALL, SamplerConfig


def test_defaults_are_valid_and_the_tool_call_pattern_ends_at_the_closing_fence():
  SamplerConfig().validate()
  text = "Let me compute.\n```python\nprint(1)\n```\nmore"
  match = re.search(PYTHON_TOOL_CALL, text, re.DOTALL)
  assert match and match.end() == text.index("```\nmore") + 3
  assert not re.search(PYTHON_TOOL_CALL, "```python\nprint(1)\n", re.DOTALL)


@pytest.mark.parametrize("changes, message", [
    (dict(slots=0), "sampler.slots=0 is invalid: expected a positive integer"),
    (dict(max_seq_len=64, prefill_buckets=(32, 128)),
     r"sampler.prefill_buckets=\(32, 128\) is invalid: the largest bucket must be <= max_seq_len=64; "
     r"with that max_seq_len, e.g. --set sampler.prefill_buckets=32\.$"),
    (dict(max_seq_len=16, prefill_buckets=(32, 128)), r"e.g. --set sampler.prefill_buckets=16\.$"),
    (dict(prefill_buckets=(64, 32)), "strictly increasing"),
    (dict(prefill_buckets=()), "sampler.prefill_buckets=()"),
    (dict(temperature=0.0), "sampler.temperature=0.0 is invalid: expected a number > 0"),
    (dict(top_p=0.0), r"sampler.top_p=0.0 is invalid: expected a number in \(0, 1\]"),
    (dict(top_k=-1), "sampler.top_k=-1 is invalid"),
    (dict(seed=-3), r"sampler.seed=-3 is invalid: expected an integer in \[0, 2\*\*32\)"),
    (dict(stop_tokens=("",)), "sampler.stop_tokens"),
    (dict(stop_patterns=("(",)), r"sampler.stop_patterns=\('\(',\) is invalid: '\(' is not a regular"),
    (dict(steps_per_call=True), "sampler.steps_per_call=True is invalid"),
    (dict(env_threads=-1), "sampler.env_threads=-1 is invalid: expected 0 \\(one per CPU core\\)"),
    (dict(kv_layout="ragged"), "sampler.kv_layout='ragged' is invalid: allowed values are 'dense', 'paged'"),
    (dict(kv_page_size=0), "sampler.kv_page_size=0 is invalid"),
    (dict(paged_attention="flash"), "sampler.paged_attention='flash' is invalid: allowed values "
     "are 'auto', 'reference', 'pallas'"),
    (dict(max_seq_len=2048, kv_page_size=16, kv_pages=100),
     "sampler.kv_pages=100 is invalid: .* at least the 128 pages one episode"),
    (dict(prefill_row_buckets=(4, 1)), "sampler.prefill_row_buckets=.* strictly increasing"),
    (dict(max_seq_len=2048, expected_episode_tokens=4096),
     "sampler.expected_episode_tokens=4096 is invalid: .* up to max_seq_len=2048"),
    (dict(expected_episode_tokens=-1), "sampler.expected_episode_tokens=-1 is invalid"),
])
def test_invalid_values_are_named(changes, message):
  with pytest.raises(ValueError, match=message):
    dataclasses.replace(SamplerConfig(), **changes).validate()


def test_env_threads_default_to_one_per_core():
  assert SamplerConfig().num_env_threads() == os.cpu_count()
  assert SamplerConfig(env_threads=3).num_env_threads() == 3
