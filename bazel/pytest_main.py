"""Entry point of every Bazel `pytest_test`: runs pytest on the files given as args."""

import sys

import pytest

if __name__ == "__main__":
  sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
