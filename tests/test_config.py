"""Config dataclasses, validation errors, `--set` overrides and config files."""

import dataclasses
import functools
import math
import pathlib
import re

import pytest

from sao_jax import config as cfg
from sao_jax.config.checks import MAX_TIMEOUT_S
from sao_jax.jobs import startup
from sao_jax.learner import step

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("**/*.py")), ids=lambda p: p.name)
def test_every_config_file_loads_and_validates(path):
  config = startup.load(path)  # its sections, then its environment and variant's functions
  assert isinstance(config, cfg.Config)


def test_sections_are_frozen_and_keyword_only():
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.Config().seed = 3  # type: ignore[misc]
  with pytest.raises(TypeError):
    cfg.ModelConfig(512)  # type: ignore[misc]


@pytest.mark.parametrize("variant", cfg.VARIANTS)
def test_variant_presets_validate(variant):
  algorithm = cfg.AlgorithmConfig.for_variant(variant)
  algorithm.validate()
  assert algorithm.variant == variant


def test_variant_presets_follow_the_paper():
  assert cfg.AlgorithmConfig.for_variant("sao").value_updates_per_step == 2
  assert cfg.AlgorithmConfig.for_variant("sao").frozen_attention
  dis_only = cfg.AlgorithmConfig.for_variant("sao_dis_only")
  assert dis_only.value_updates_per_step == 1 and not dis_only.frozen_attention
  grpo = cfg.AlgorithmConfig.for_variant("grpo")
  assert (grpo.group_size, grpo.eps_low, grpo.eps_high, grpo.policy_loss) == (8, 0.2, 0.28,
                                                                              "ppo_clip")
  assert cfg.AlgorithmConfig.for_variant("grpo_dis").policy_loss == "dis"


@pytest.mark.parametrize("section,changes,message", [
    ("algorithm", {"variant": "reinforce"}, r"algorithm.variant='reinforce'.*'sao'"),
    ("algorithm", {"loss_agg": "sum"}, r"algorithm.loss_agg='sum'.*token_mean"),
    ("algorithm", {"eps_low": 1.5}, r"algorithm.eps_low=1.5.*0 < eps_low <= 1"),
    ("algorithm", {"gamma": 0.0}, r"algorithm.gamma=0.0"),
    ("algorithm", {"value_updates_per_step": 0}, r"algorithm.value_updates_per_step=0"),
    ("algorithm", {"group_size": 4}, r"algorithm.group_size=4.*single-rollout"),
    ("algorithm", {"value_clip": -1.0}, r"algorithm.value_clip=-1.0"),
    ("model", {"num_key_value_heads": 3}, r"model.num_key_value_heads=3.*divide"),
    ("model", {"hidden_size": 0}, r"model.hidden_size=0.*positive"),
    ("model", {"param_dtype": "float16"}, r"model.param_dtype='float16'.*bfloat16"),
    ("model", {"mlp_only_layers": (5,)}, r"model.mlp_only_layers=\(5,\)"),
    ("mesh", {"fsdp": -1, "tensor": -1}, r"mesh.tensor=-1.*only one axis"),
    ("mesh", {"data": 0}, r"mesh.data=0"),
    ("sampler", {"mesh": cfg.MeshConfig(fsdp=1, tensor=4)},
     r"sampler.mesh='data=1,fsdp=1,sequence=1,tensor=4,expert=1'.*set sampler.sharded=true"),
    ("sampler", {"sharded": True, "mesh": cfg.MeshConfig(tensor=0)}, r"sampler.mesh.tensor=0"),
    ("sampler", {"sharded": True, "mesh": cfg.MeshConfig(fsdp=-1, data=-1)},
     r"sampler.mesh.fsdp=-1.*only one axis"),
    ("sampler", {"sharded": True, "mesh": "tensor=4"}, r"sampler.mesh='tensor=4'.*MeshConfig"),
    ("run", {"sft_target_accuracy": 1.5}, r"run.sft_target_accuracy=1.5.*\[0, 1\]"),
    ("run", {"sft_target_accuracy": 0.5}, r"run.sft_target_accuracy=0.5.*run.sft_steps"),
    ("run", {"sft_steps": 10, "sft_check_every": 0}, r"run.sft_check_every=0.*positive"),
    ("run", {"sft_check_episodes": -1}, r"run.sft_check_episodes=-1.*>= 0"),
    ("run", {"sft_check_episodes": True}, r"run.sft_check_episodes=True.*integer"),
    ("run", {"eval_transcripts": -1}, r"run.eval_transcripts=-1.*>= 0"),
])
def test_bad_values_are_named(section, changes, message):
  base = cfg.Config()
  bad = dataclasses.replace(base, **{section: dataclasses.replace(getattr(base, section),
                                                                  **changes)})
  with pytest.raises(ValueError, match=message):
    bad.validate()


def test_grpo_needs_a_group():
  with pytest.raises(ValueError, match=r"group_size=1.*'grpo'"):
    cfg.AlgorithmConfig.for_variant("grpo", group_size=1).validate()


def test_samplers_elsewhere_need_a_directory_transport_a_secret_and_a_remote_weight_channel():
  base = cfg.Config(run=cfg.RunConfig(num_samplers=0))
  with pytest.raises(ValueError, match=r"data.transport='queue'.*run.num_samplers=0"):
    base.validate()
  directory = dataclasses.replace(base, data=cfg.DataConfig(transport="directory",
                                                            transport_dir="/shared/trajectories"))
  with pytest.raises(ValueError, match=r"sampler.weights='shared_memory'.*run.num_samplers=0"):
    directory.validate()
  for weights in ("network", "directory"):  # records in a shared directory must be sealed
    with pytest.raises(ValueError, match=r"sampler.weights_secret_file=''.*seal the trajectories"):
      dataclasses.replace(directory, sampler=cfg.SamplerConfig(
          weights=weights, weights_dir="/shared/weights")).validate()
  with pytest.raises(ValueError, match=r"sampler.weights_addresses=\(\).*host:port"):
    dataclasses.replace(directory, sampler=cfg.SamplerConfig(
        weights="network", weights_secret_file="weights.secret")).validate()
  dataclasses.replace(directory, sampler=cfg.SamplerConfig(
      weights="network", weights_addresses=("10.0.0.2:8477",),
      weights_secret_env="SAO_WEIGHTS_SECRET")).validate()
  with pytest.raises(ValueError, match=r"run.num_samplers=-1"):
    cfg.RunConfig(num_samplers=-1).validate()


def test_mesh_fills_the_free_axis():
  assert cfg.MeshConfig(data=2, fsdp=-1, tensor=2).shape(8) == {
      "data": 2, "fsdp": 2, "sequence": 1, "tensor": 2, "expert": 1}
  with pytest.raises(ValueError, match="cannot be split"):
    cfg.MeshConfig(data=3, fsdp=-1).shape(8)
  with pytest.raises(ValueError, match="use 4 devices but 8"):
    cfg.MeshConfig(data=2, fsdp=2).shape(8)


def test_overrides_parse_by_field_type():
  config = cfg.apply_overrides(cfg.Config(), [
      "algorithm.eps_low=0.2", "algorithm.eps_high=3", "model.tie_word_embeddings=False",
      "algorithm.value_clip=None", "model.mlp_only_layers=(0, 1)", "model.param_dtype=bfloat16",
      "seed=7", "name=my run", "model.scan_layers=true",
  ])
  assert config.algorithm.eps_low == 0.2
  assert config.algorithm.eps_high == 3.0 and isinstance(config.algorithm.eps_high, float)
  assert config.model.tie_word_embeddings is False
  assert config.algorithm.value_clip is None
  assert config.model.mlp_only_layers == (0, 1)
  assert config.model.param_dtype == "bfloat16"
  assert (config.seed, config.name) == (7, "my run")
  assert config.model.scan_layers is True  # shell-style lowercase booleans too


def test_sampler_mesh_defaults_to_the_top_level_mesh_and_overrides_as_text():
  base = cfg.Config(mesh=cfg.MeshConfig(fsdp=8))
  assert base.sampler.mesh is None and base.sampler_mesh() == base.mesh
  own = cfg.apply_overrides(base, ["sampler.sharded=true", "sampler.mesh=fsdp=1, tensor=4"])
  assert own.validate().sampler_mesh() == cfg.MeshConfig(data=1, fsdp=1, tensor=4, expert=1)
  assert own.mesh == cfg.MeshConfig(fsdp=8)  # the learner's mesh is untouched
  nested = cfg.apply_overrides(own, ["sampler.mesh.tensor=2", "mesh=data=2,fsdp=4"])
  assert nested.sampler_mesh() == cfg.MeshConfig(fsdp=1, tensor=2)
  assert nested.mesh == cfg.MeshConfig(data=2, fsdp=4)
  assert cfg.apply_overrides(own, ["sampler.mesh=None"]).sampler_mesh() == base.mesh
  assert cfg.MeshConfig.parse(own.sampler.mesh.text()) == own.sampler.mesh


@pytest.mark.parametrize("override,message", [
    ("sampler.mesh.tensor=4", r"sampler.mesh is None \(unset\); set the whole mesh, e.g. "
     r"--set sampler.mesh=fsdp=1,tensor=4"),
    ("sampler.mesh=tensor=4,model=2",
     r"sampler.mesh='tensor=4,model=2'.*'model=2' is not AXIS=SIZE"),
    ("sampler.mesh=tensor=2,tensor=4", r"names axis 'tensor' twice"),
    ("mesh=None", r"mesh='None'.*not AXIS=SIZE"),
    ("algorithm.eps_lo=0.2", r"AlgorithmConfig has no field 'eps_lo'"),
    ("algorithm", r"not of the form section.field=value"),
    ("model=3", r"names a whole section"),
    ("seed.x=1", r"'seed' is not a section"),
    ("model.hidden_size=big", r"model.hidden_size='big': cannot parse"),
    ("model.hidden_size=1.5", r"cannot parse"),
    ("model.scan_layers=yes", r"model.scan_layers='yes'.*expected true or false"),
])
def test_bad_overrides_are_named(override, message):
  with pytest.raises(ValueError, match=message):
    cfg.apply_overrides(cfg.Config(), [override])


@pytest.mark.parametrize("override, field", [
    ("learner.policy_lr=1e999", "learner.policy_lr"),  # parses as inf
    ("algorithm.eps_high=-1e999", "algorithm.eps_high"),
    ("env.judge_timeout_s=1e999", "env.judge_timeout_s"),
])
def test_non_finite_overrides_are_named(override, field):
  with pytest.raises(ValueError, match=rf"{field}=-?inf is invalid: expected a finite number"):
    cfg.load_config(ROOT / "configs" / "tiny_cpu.py", [override])


def test_nan_in_any_float_field_is_named():
  # NaN passes every range check (`nan <= 0` is False): only the generic check sees it.
  bad = dataclasses.replace(cfg.Config(), learner=cfg.LearnerConfig(value_lr=float("nan")))
  with pytest.raises(ValueError, match=r"learner.value_lr=nan is invalid: expected a finite"):
    bad.validate()


def test_load_config_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.py"):
    cfg.load_config(tmp_path / "nope.py")
  (tmp_path / "empty.py").write_text("x = 1\n")
  with pytest.raises(ValueError, match="must define get_config"):
    cfg.load_config(tmp_path / "empty.py")
  (tmp_path / "wrong.py").write_text("def get_config():\n  return {}\n")
  with pytest.raises(ValueError, match="returned dict"):
    cfg.load_config(tmp_path / "wrong.py")


@pytest.mark.parametrize("name, text, message", [
    ("syntax.py", "def get_config(:\n", r"syntax.py' line 1: SyntaxError: .*while importing it"),
    ("imports.py", "import no_such_module_xyz\n",
     r"imports.py' line 1: ModuleNotFoundError: .*no_such_module_xyz"),
    ("raises.py", "def get_config():\n  return {}['model']\n",
     r"raises.py' line 2: KeyError: 'model' \(raised while calling its get_config\(\)\)"),
])
def test_a_config_file_whose_code_fails_is_named_with_its_line(tmp_path, name, text, message):
  # Before: the SyntaxError / KeyError escaped load_config, and every CLI printed a
  # traceback into importlib instead of one line naming the user's file.
  (tmp_path / name).write_text(text)
  with pytest.raises(ValueError, match=message):
    cfg.load_config(tmp_path / name)


def test_a_config_path_that_is_no_python_file_is_named(tmp_path):
  with pytest.raises(ValueError, match="is a directory; pass a file in it"):
    cfg.load_config(tmp_path)
  (tmp_path / "config.yaml").write_text("seed: 1\n")
  # Before: an AssertionError (importlib finds no loader for a non-.py file).
  with pytest.raises(ValueError, match=r"config.yaml' is not a .py file"):
    cfg.load_config(tmp_path / "config.yaml")


@pytest.mark.parametrize("override, message", [
    # Before: accepted as (1.5,), and a run started with a pass@k nobody can compute.
    ("run.eval_pass_k=(1.5,)", r"run.eval_pass_k='\(1.5,\)': cannot parse as tuple\[int, \.\.\.\]"),
    ("run.loggers=(1,)", r"run.loggers='\(1,\)': cannot parse as tuple\[str, \.\.\.\]"),
    ("data.length_buckets=(256, True)", r"data.length_buckets=.*cannot parse"),
    ("run.eval_pass_k=four", r"expected comma-separated items of that type"),
    ("run.eval_pass_k=1,x", r"run.eval_pass_k='1,x': cannot parse as tuple\[int, \.\.\.\]"),
    # A literal that does not parse is not split into items ('(a' and 'b)').
    ("run.loggers=(a, b)", r"cannot parse as tuple\[str, \.\.\.\]"),
    # Comma items only for tuples of scalars: pairs need a literal.
    ("env.style_schedule=1,a", r"cannot parse"),
])
def test_tuple_overrides_check_their_items(override, message):
  with pytest.raises(ValueError, match=message):
    cfg.apply_overrides(cfg.Config(), [override])


# `sao_jax.config.conform` at one of its two call sites (the other, an environment's
# options: tests/envs/test_options.py): unions, non-finite numbers, nested sections and
# wrong types.
@pytest.mark.parametrize("override, section, field, value", [
    ("algorithm.lam_policy=0.5", "algorithm", "lam_policy", 0.5),  # float | None
    ("algorithm.lam_policy=None", "algorithm", "lam_policy", None),
    ("algorithm.value_clip=1", "algorithm", "value_clip", 1.0),  # an int taken as the float
    ("learner.batch_tokens=64", "learner", "batch_tokens", 64),  # int | None
    ("env.tool.memory_mb=2048", "env", "tool", cfg.env.SandboxLimits(memory_mb=2048)),
])
def test_overrides_take_the_first_union_member_that_fits(override, section, field, value):
  got = getattr(getattr(cfg.apply_overrides(cfg.Config(), [override]), section), field)
  assert got == value and type(got) is type(value)


@pytest.mark.parametrize("override, message", [
    ("algorithm.lam_policy=1e999", r"algorithm.lam_policy=inf is invalid: expected a finite "
                                   r"number"),
    ("algorithm.eps_low=-1e999", r"algorithm.eps_low=-inf is invalid: expected a finite number"),
    ("learner.batch_tokens=1.5", r"learner.batch_tokens='1.5': cannot parse as int \| None"),
    ("learner.steps=1e999", r"learner.steps='1e999': cannot parse as int"),
    ("algorithm.lam_policy=high", r"algorithm.lam_policy='high': cannot parse as float \| None"),
    ("env.tool=3", r"override 'env.tool' names a whole section; set one of its fields"),
    ("env.tool.memory_mb=lots", r"env.tool.memory_mb='lots': cannot parse as int"),
])
def test_overrides_refuse_non_finite_numbers_wrong_types_and_whole_sections(override, message):
  """Refused while the override is parsed, before any validate() runs."""
  with pytest.raises(ValueError, match=message):
    cfg.apply_overrides(cfg.Config(), [override])


@pytest.mark.parametrize("override, message", [
    # Before: "fields are adam_b1, adam_b2, ..." (every field of the section), no nearest name.
    ("learner.stpes=5", "LearnerConfig has no field 'stpes'; did you mean learner.steps?"),
    ("lerner.steps=5", "Config has no field 'lerner'; did you mean learner.steps?"),
    ("learner.critic_warmup=3", "did you mean learner.critic_warmup_steps?"),
])
def test_a_misspelt_override_names_the_nearest_fields(override, message):
  with pytest.raises(ValueError) as error:
    cfg.apply_overrides(cfg.Config(), [override])
  assert str(error.value).endswith(message) and "fields are" not in str(error.value)


def test_an_override_near_no_field_lists_the_sections_fields():
  with pytest.raises(ValueError, match=r"has no field 'zzz'; fields are adam_b1, adam_b2, .*steps"):
    cfg.apply_overrides(cfg.Config(), ["learner.zzz=1"])


@pytest.mark.parametrize("override, message", [
    # Before: "cannot parse as int" and nothing more.
    ("learner.steps=five", "override learner.steps='five': cannot parse as int; learner.steps "
     "is of type int, e.g. --set learner.steps=1000 (its value now)"),
    ("model.scan_layers=yes", "(expected true or false); model.scan_layers is of type bool, "
     "e.g. --set model.scan_layers=false (its value now)"),
    ("run.eval_pass_k=x", "run.eval_pass_k is of type tuple[int, ...], e.g. --set "
     "run.eval_pass_k=1 (its value now)"),
    # A field that is None now: an example of its type.
    ("learner.batch_tokens=many", "learner.batch_tokens is of type int | None, e.g. --set "
     "learner.batch_tokens=8"),
])
def test_an_unparsable_override_names_its_type_and_an_example(override, message):
  with pytest.raises(ValueError) as error:
    cfg.apply_overrides(cfg.Config(), [override])
  assert str(error.value).endswith(message)


def test_tuple_overrides_convert_their_items():
  config = cfg.apply_overrides(cfg.Config(), ["run.eval_pass_k=[1, 4]", "run.loggers=()"])
  assert config.run.eval_pass_k == (1, 4) and config.run.loggers == ()


@pytest.mark.parametrize("override, field, value", [
    # Issue #37: a person writes the value, not a Python literal of it.
    ("run.loggers=tensorboard,wandb", "loggers", ("tensorboard", "wandb")),
    ("run.loggers= tensorboard , wandb ", "loggers", ("tensorboard", "wandb")),
    ("run.loggers=tensorboard", "loggers", ("tensorboard",)),
    ("run.loggers=", "loggers", ()),
    ("run.eval_pass_k=1,4,16", "eval_pass_k", (1, 4, 16)),
    ("run.eval_pass_k=4", "eval_pass_k", (4,)),
    ("run.run_dir=runs/x", "run_dir", "runs/x"),
    # Python literals are still accepted.
    ("run.loggers=('tensorboard', 'wandb')", "loggers", ("tensorboard", "wandb")),
    ("run.eval_pass_k=(1, 4)", "eval_pass_k", (1, 4)),
])
def test_overrides_parse_by_the_fields_type(override, field, value):
  config = cfg.apply_overrides(cfg.Config(), [override])
  assert getattr(config.run, field) == value


def test_load_config_applies_overrides_then_validates():
  path = ROOT / "configs" / "tiny_cpu.py"
  assert cfg.load_config(path, ["algorithm.eps_low=0.5"]).algorithm.eps_low == 0.5
  with pytest.raises(ValueError, match="algorithm.eps_low=2.0"):
    cfg.load_config(path, ["algorithm.eps_low=2.0"])


def test_cli_prints_resolved_config(capsys):
  cfg.main([str(ROOT / "configs" / "tiny_cpu.py"), "--set", "seed=3"])
  assert '"seed": 3' in capsys.readouterr().out
  with pytest.raises(SystemExit) as exit_info:
    cfg.main([str(ROOT / "configs" / "tiny_cpu.py"), "--set", "seed=x"])
  assert exit_info.value.code == 2


def test_every_variant_row_names_an_implemented_estimator_and_loss():
  for name, row in cfg.VARIANTS.items():
    algorithm = cfg.AlgorithmConfig.for_variant(name)
    step.check_variant(algorithm)  # both names are in the registries of their functions
    assert (algorithm.uses_critic, algorithm.policy_loss) == (row.advantage == "gae",
                                                             row.policy_loss)


@pytest.mark.parametrize("row, error", [
    (cfg.algorithm.Variant(advantage="vtrace", policy_loss="dis"),
     r"algorithm.variant='new' is invalid: its advantage estimator 'vtrace' is not "
     r"implemented; allowed values are 'gae', 'group', 'running_mean' "
     r"\(sao_jax.learner.step.ADVANTAGE_ESTIMATORS\)"),
    (cfg.algorithm.Variant(advantage="gae", policy_loss="reinforce"),
     r"algorithm.variant='new' is invalid: its policy loss 'reinforce' is not implemented; "
     r"allowed values are 'dis', 'ppo_clip' \(sao_jax.losses.POLICY_LOSSES\)"),
])
def test_a_variant_row_naming_an_unknown_function_is_refused_at_startup(monkeypatch, row, error):
  """The config cannot know which functions exist (they live above it): the row
  passes `Config.validate()`, and the job's start-up check refuses it, naming the
  value and the registered names."""
  monkeypatch.setattr(cfg.algorithm, "VARIANTS", {**cfg.VARIANTS, "new": row})
  config = cfg.Config(algorithm=cfg.AlgorithmConfig(
      variant="new", value_updates_per_step=2 if row.uses_critic else 0))
  config.validate()
  with pytest.raises(ValueError, match=error):
    startup.check(config)


def test_a_variant_row_grouped_without_group_advantages_is_refused():
  with pytest.raises(ValueError, match=r"Variant.grouped"):
    cfg.algorithm.Variant(advantage="gae", policy_loss="dis", grouped=True)


def _timeout_fields(section, prefix=""):
  """The paths of every `*_timeout_s` field under `section`, nested sections included."""
  for field in dataclasses.fields(section):
    value = getattr(section, field.name)
    if dataclasses.is_dataclass(value):
      yield from _timeout_fields(value, f"{prefix}{field.name}.")
    elif field.name.endswith("_timeout_s"):
      yield f"{prefix}{field.name}"


# Every *_timeout_s field, and the sandbox's wall-clock limit (a timeout by another name).
TIMEOUTS = sorted(_timeout_fields(cfg.Config())) + ["env.tool.wall_time_s"]
MAX_S = MAX_TIMEOUT_S


def test_the_timeouts_are_found():
  assert {"env.step_timeout_s", "env.reward_timeout_s"} <= set(TIMEOUTS)


@pytest.mark.parametrize("value", [1e300, MAX_S + 1.0, -1.0])
@pytest.mark.parametrize("path", TIMEOUTS)
def test_a_timeout_the_runtime_cannot_wait_on_is_refused(path, value):
  # 1e300 passed validation, then every step raised OverflowError ("timestamp out of
  # range") in the runner, again after every restart.
  config = cfg.apply_overrides(cfg.Config(), [f"{path}={value!r}"])
  with pytest.raises(ValueError, match=rf"^{re.escape(f'{path}={value!r}')} is invalid: expected "
                     rf"a finite number of seconds .* {MAX_S} \(one week, MAX_TIMEOUT_S\)\.$"):
    config.validate()


@pytest.mark.parametrize("value", [math.inf, math.nan])
@pytest.mark.parametrize("path", TIMEOUTS)
def test_a_timeout_section_refuses_inf_and_nan_itself(path, value):
  # EnvConfig.validate (what registry.check runs) let env.step_timeout_s=inf through;
  # env.reward_timeout_s=inf then made every grade() raise, dropping every episode.
  *sections, name = path.split(".")
  section = functools.reduce(getattr, sections, cfg.Config())
  bad = dataclasses.replace(section, **{name: value})
  with pytest.raises(ValueError, match=rf"{name}={value!r} is invalid: expected a finite"):
    bad.validate()


def test_timeouts_at_their_bounds_are_allowed():
  ok = cfg.apply_overrides(cfg.Config(), [f"{path}={MAX_S}" for path in TIMEOUTS])
  ok.validate()
  cfg.apply_overrides(cfg.Config(), ["env.step_timeout_s=0"]).validate()  # 0: no timeout
  with pytest.raises(ValueError, match=r"env.reward_timeout_s=0.0 is invalid: .* above 0"):
    cfg.apply_overrides(cfg.Config(), ["env.reward_timeout_s=0"]).validate()


def test_the_style_judges_timeout_option_has_the_same_bound():
  from sao_jax.envs.style.spec import StyleOptions
  with pytest.raises(ValueError, match=r"env.options.judge_timeout_s=1e\+300 is invalid: "
                     rf"expected a finite number of seconds above 0, at most {MAX_S}"):
    StyleOptions(judge_timeout_s=1e300).validate()
