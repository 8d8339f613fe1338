"""Native tool calling: math_tool's python tool offered through the chat template.

    .venv/bin/python examples/native_tools/make_tokenizer.py runs/native_tools/tokenizer
    .venv/bin/sao-train --config examples/native_tools/config.py

With a tokenizer whose chat template has a tool-call format (here Qwen3's), the
template is given the environment's tools (`tools=`), the policy calls python as
`<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>` and the
results come back as `tool` messages (`<tool_response>` in Qwen3's user turn).
Everything else is `configs/demo_cpu.py`'s, without the warm-start (with
`run.sft_steps` > 0 its demonstrations are written in the template's format too,
`<tool_call>` blocks here). For a real run set `run.tokenizer`
and `run.init` to a Qwen3 / Qwen2.5 / Llama 3.1 checkpoint and `model` to its config.
"""

import dataclasses
import pathlib

from sao_jax.config import load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


def get_config():
  base = load_config(ROOT / "configs" / "demo_cpu.py")
  return dataclasses.replace(
      base, name="native_tools",
      # The tool schemas in the system turn make the prompt longer than the demo's.
      model=dataclasses.replace(base.model, max_position_embeddings=1024),
      data=dataclasses.replace(base.data, length_buckets=(768, 1024)),
      # The turn ends at <|im_end|> after a <tool_call> block: no fenced stop pattern.
      sampler=dataclasses.replace(base.sampler, stop_patterns=(), max_new_tokens=64,
                                  max_seq_len=1024, prefill_buckets=(256, 512)),
      run=dataclasses.replace(base.run, run_dir="runs/native_tools", sft_steps=0,
                              tokenizer="runs/native_tools/tokenizer"))
