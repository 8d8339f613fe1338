"""Fixtures of the chat-format tests (helpers in chat_fixtures)."""

import pytest

from chat_fixtures import FAMILIES, build_tokenizer_dir


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory):
  """family -> a tiny tokenizer directory shipping that family's official template."""
  root = tmp_path_factory.mktemp("chat_tokenizers")
  return {family: build_tokenizer_dir(root, family) for family in FAMILIES}
