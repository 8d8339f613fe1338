"""Untrusted text for logs and terminals: one printable line, escapes shown, not run."""

import traceback

from sao_jax.log_text import MESSAGE_CHARS, traceback_text, untrusted

# An OSC 52 clipboard write, a line erased, a forged progress line, a bidi override,
# a C1 control (CSI), a lone surrogate (a file name's undecodable byte).
HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\r\nstep 1000/1000 | reward 1.000\u202e\x9b\udcff"


def test_control_characters_are_shown_escaped_and_printable_text_passes_unchanged():
  assert untrusted(HOSTILE) == ("\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2K\\r\\nstep 1000/1000 | "
                                "reward 1.000\\u202e\\x9b\\udcff")
  plain = "ünïcode, tabs aside: 你好 {\"a\": 1} \\x1b stays literal"
  assert untrusted(plain) is plain
  assert untrusted(KeyError("k")) == "'k'"  # any object, as str() shows it


def test_a_limit_cuts_the_text_and_says_how_long_it_was():
  assert untrusted("x" * 10, 4) == "xxxx... (10 characters)"
  assert untrusted("x" * 4, 4) == "xxxx"
  assert untrusted("\n" * 10, 2) == "\\n\\n... (10 characters)"


def test_a_traceback_keeps_its_stack_and_escapes_every_message_of_the_chain():
  def fail():
    try:
      raise KeyError(HOSTILE)
    except KeyError as error:
      raise ValueError(HOSTILE + "y" * (2 * MESSAGE_CHARS)) from error

  try:
    fail()
  except ValueError as error:
    text, plain = traceback_text(error), "".join(traceback.format_exception(error))
  assert "\x1b" in plain and "\x1b" not in text and "\r" not in text
  assert not any(line.startswith("step ") for line in text.splitlines())
  # The same stack lines as Python's, in the same order.
  frames = [line for line in plain.splitlines() if line.startswith("  File ")]
  assert frames and frames == [line for line in text.splitlines() if line.startswith("  File ")]
  assert "direct cause of the following exception" in text
  assert "KeyError: '\\x1b]52;" in text and "ValueError: \\x1b]52;" in text
  assert f"({len(HOSTILE) + 2 * MESSAGE_CHARS} characters)" in text
