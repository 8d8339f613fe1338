"""Trains the CPU demo model on the unit-conversion environment, named by its entry point.

    pip install -e examples/unit_conversion
    .venv/bin/sao-train --config examples/unit_conversion/config.py

Everything but the environment is `configs/demo_cpu.py`'s.
"""

import dataclasses
import pathlib

from sao_jax.config import EnvConfig, load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


def get_config():
  base = load_config(ROOT / "configs" / "demo_cpu.py")
  return dataclasses.replace(
      base, name="unit_conversion",
      env=EnvConfig(name="unit_conversion", max_turns=3, options={"max_value": 20}),
      run=dataclasses.replace(base.run, run_dir="runs/unit_conversion"))
