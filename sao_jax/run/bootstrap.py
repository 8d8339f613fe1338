"""What a run starts from: the initial policy, the chat format and the run tokenizer.

    chat   = prepare_chat(cfg)     # run.tokenizer (+ its chat template), the run's copy, or trained
    policy = initial_policy(cfg)   # random, a Hugging Face directory or sao-convert params

The learner (`sao_jax.jobs.train`), the samplers (`sao_jax.sampler.worker`, which
load the frozen base under LoRA) and evaluation (`sao_jax.jobs.evaluate`) all
start here, so they agree on the tokenizer and the weights; the SFT warm-start
(`sao_jax.jobs.warm_start`) plays `demonstrations` through the environment.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
from typing import Callable, Iterator

import jax

from sao_jax import storage
from sao_jax.chat import ChatFormat, chat_format, tool_calls
from sao_jax.config import Config, hf_json, init_model, params_json
from sao_jax.config.dataset import DATASET_SOURCES
from sao_jax.envs.base import play
from sao_jax.envs.registry import demonstration, make_env, make_tasks, resolve
from sao_jax.models import hf, params_io, tokenizer as tokenizer_lib
from sao_jax.models.tokenizer import TEMPLATE_FILE, TOKENIZER_CONFIG
from sao_jax.models.transformer import Params, init_params

TOKENIZER_DEMONSTRATIONS = 400  # transcripts a run's own tokenizer is trained on


@dataclasses.dataclass(frozen=True)
class Demonstration:
  """A played demonstration: its messages and the tools its template is given."""

  messages: list[dict]
  tools: tuple  # the environment's `tools` (OpenAI-format schemas); () without tools


def demonstrations(cfg: Config, chat: ChatFormat | None) -> Iterator[Demonstration]:
  """Played demonstration transcripts of the training task source, their tool calls
  written in the format episodes under `chat` are parsed in (`tool_calls.format_for`;
  `chat` None: ChatML, for training the run's own tokenizer), so the SFT warm-start
  teaches the format RL uses."""
  demo = demonstration(cfg.env)
  if demo is None:
    raise ValueError(f"run.sft_steps={cfg.run.sft_steps} but env.name={cfg.env.name!r} has no "
                     "demonstrations (its EnvironmentSpec.demonstration is None); set "
                     "run.sft_steps=0")
  source = resolve(cfg.env).task_source
  if source in DATASET_SOURCES:
    # sao-train refuses this before it starts (`startup.check_train_inputs`).
    # Every field that needs changing, so that one fix does not meet the next refusal.
    fields = ([f"run.sft_steps={cfg.run.sft_steps}: set run.sft_steps=0"] if cfg.run.sft_steps
              else []) + ([] if cfg.run.tokenizer else [
                  "run.tokenizer='': set run.tokenizer (a tokenizer.json, or the model's "
                  "directory; python -m sao_jax.cli.make_tokenizer builds one from the rows)"])
    raise ValueError(f"env.task_source={source!r}: dataset rows hold no demonstrations to "
                     f"warm-start on or to train a tokenizer from; {'; '.join(fields)}")
  template_format = "fenced" if chat is None else chat.tool_format
  for task in make_tasks(cfg.env):
    env = make_env(cfg.env)
    env.set_tool_format(tool_calls.format_for(env.tools, template_format))
    yield Demonstration(play(env, task, demo(task)).messages, tuple(env.tools))


def train_run_tokenizer(cfg: Config, transcripts: int = TOKENIZER_DEMONSTRATIONS):
  """A tokenizer of `model.vocab_size` tokens trained on the first `transcripts`
  demonstration transcripts."""
  texts = [m["content"] + " " + m["role"] for demo in
           itertools.islice(demonstrations(cfg, None), transcripts) for m in demo.messages]
  return tokenizer_lib.train_tokenizer(texts, cfg.model.vocab_size)


def prepare_chat(cfg: Config, log: Callable[[str], None] = print) -> ChatFormat:
  """The configured tokenizer (`run.tokenizer`), else the run's own copy, else one
  trained on the environment's texts, with its chat format (the template the
  tokenizer directory ships, else ChatML; `run.enable_thinking`). The run's copy
  (`run.tokenizer_file` and the template files beside it, what samplers and
  `sao-eval` load) is written if missing; a bucket run directory keeps none and
  they load `run.tokenizer` (`config.run`)."""
  copy = pathlib.Path(cfg.run.tokenizer_file)
  source = cfg.run.tokenizer or (copy if copy.is_file() else None)
  if source:
    tokenizer = tokenizer_lib.load_tokenizer(source)
  else:
    tokenizer = train_run_tokenizer(cfg)
  if tokenizer.get_vocab_size() > cfg.model.vocab_size:
    raise ValueError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens but "
                     f"model.vocab_size={cfg.model.vocab_size}; raise model.vocab_size")
  chat = chat_format(source, tokenizer, enable_thinking=cfg.run.enable_thinking)
  if cfg.run.tokenizer and chat.fallback:
    # A checkpoint's tokenizer without a template of its own: say which format the run
    # trains with, since a model tuned on another template would be served with that one.
    log(f"chat format: run.tokenizer={cfg.run.tokenizer!r} ships no chat template "
        f"({TEMPLATE_FILE}, or chat_template in {TOKENIZER_CONFIG}); training with ChatML, "
        f"which its tokenizer's tokens allow. To train with another template, put it in "
        f"{TEMPLATE_FILE} beside the tokenizer.json")
  if not storage.is_url(cfg.run.run_dir) and not copy.is_file():
    copy.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(copy))
    chat.save(copy.parent)
  return chat


def initial_policy(cfg: Config, mesh: jax.sharding.Mesh | None = None) -> Params:
  """The policy `run.init` names (random, a Hugging Face or a params directory); with
  `mesh`, each param is placed on its shards of it as it is read."""
  if cfg.run.init == "random":
    return init_params(cfg.model, jax.random.key(cfg.seed), mesh=mesh)
  path = pathlib.Path(cfg.run.init)
  if (path / hf_json.HF_CONFIG).is_file():
    model_cfg, params = hf.load_hf(path, mesh)
  elif (path / params_json.CONFIG_FILE).is_file():
    model_cfg, _, params = params_io.load_params(path, mesh)
  else:
    raise ValueError(f"run.init={cfg.run.init!r} is neither 'random', a Hugging Face directory "
                     "(config.json) nor a sao-convert params directory")
  if init_model.architecture(model_cfg) != init_model.architecture(cfg.model):
    raise ValueError(f"run.init={cfg.run.init!r} holds a model that differs from the `model` "
                     "section; copy its config.json values into the config file")
  return params


