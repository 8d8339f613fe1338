"""`python -m sao_jax.envs.sandbox.prepare`: the interpreter reachable for the sandbox's user."""

import stat

from sao_jax.envs.sandbox import prepare


def test_directories_others_cannot_traverse_are_found_and_opened_for_traversal_only(tmp_path):
  home = tmp_path / "home"
  interpreter = home / "pyenv" / "3.11"
  interpreter.mkdir(parents=True)
  home.chmod(0o700)  # like /root: the sandbox's nobody cannot reach the interpreter below it
  assert home in prepare.untraversable([str(interpreter)])
  assert interpreter not in prepare.untraversable([str(interpreter)])
  prepare.make_traversable([home])
  assert stat.S_IMODE(home.stat().st_mode) == 0o701  # traverse, not list
  assert home not in prepare.untraversable([str(interpreter)])


def test_prepare_reports_that_isolation_works_here(capsys):
  assert prepare.main() == 0
  assert "kernel isolation (bwrap) works here" in capsys.readouterr().out
