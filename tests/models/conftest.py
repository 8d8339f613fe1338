"""Session fixtures: tiny random HF checkpoints saved to disk."""

import pytest

from tiny import build_hf


@pytest.fixture(scope="session", params=["dense", "moe", "moe_unnormed"])
def hf_checkpoint(request, tmp_path_factory):
  """(kind, HF model, directory it was saved to)."""
  model = build_hf(request.param)
  path = tmp_path_factory.mktemp(request.param)
  model.save_pretrained(path)
  return request.param, model, path
