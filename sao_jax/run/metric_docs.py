"""What every metric key a run logs means: the one table the metrics reference page
(`docs/reference/metrics.md`, `python -m sao_jax.cli.docsgen`) is generated from.

A key is a fixed name (`policy/loss`) or a pattern whose `<placeholder>` stands for
one path segment (`staleness/lag_<k>`, `weights/errors/<reason>`) or, as the last
segment of `dropped/<reason>` and the per-source keys (`REST_OF_KEY`), the rest of
the key. `describe(key)` finds a key's entry; tests check that every key the learner step, the host-side batch metrics, the
SFT warm-start and the evaluations write has one (tests/docs/test_reference.py, and
the end-to-end run in tests/cli/test_train_e2e.py).

Units: `fraction` is a share in [0, 1]; `count` a number of items; `tokens` a
number of tokens; `nats/token` a mean per action token; `reward` in the
environment's reward units (0/1 for the built-ins).
"""

from __future__ import annotations

import dataclasses
import re

from sao_jax.run import phases
from sao_jax.run.critic_window import WINDOW_STEPS

# When a key is written (the `when` column). Learner rows are one per training step.
STEP = "every learner step"
CRITIC = "every learner step, critic variants (sao, sao_dis_only, ppo)"
POLICY = "every learner step (0 / NaN-free defaults on value-only steps)"
DIS = "every learner step, DIS variants (sao, sao_dis_only, grpo_dis, running_mean)"
PPO = "every learner step, PPO-clip variants (grpo, ppo)"
HOST = "every learner step, from the host's data pipeline"
EVAL = "every held-out evaluation (run.eval_every; before and after SFT)"
SFT = "every SFT warm-start step (negative step numbers)"
ROUTING = ("every learner step, MoE policies whose sampler recorded routing (0 on value-only "
           "steps, shares NaN)")


# Patterns whose last placeholder takes the rest of the key: a drop reason
# (env_failure/<kind>) or a data source name may hold slashes.
REST_OF_KEY = ("dropped/", "reward/source/", "eval/source/")


@dataclasses.dataclass(frozen=True)
class MetricDoc:
  key: str  # the key, or a pattern with <placeholders>
  unit: str
  when: str
  meaning: str

  @property
  def pattern(self) -> re.Pattern:
    parts = re.split(r"(<[a-z_]+>)", self.key)
    regex = ""
    for index, part in enumerate(parts):
      if part.startswith("<"):
        last = index == len(parts) - 2 and not parts[-1]
        regex += ".+" if last and self.key.startswith(REST_OF_KEY) else "[^/]+"
      else:
        regex += re.escape(part)
    return re.compile(regex + r"\Z")


METRICS: tuple[MetricDoc, ...] = (
    # Rewards and tokens of the batch.
    MetricDoc("reward/mean", "reward", STEP,
              "mean outcome (summed reward) of the batch's trajectories, sampled at the "
              "sampler's temperature"),
    MetricDoc("reward/single_turn", "reward", STEP,
              "mean outcome of trajectories with one assistant turn (answered at once); NaN "
              "when the batch has none"),
    MetricDoc("reward/multi_turn", "reward", STEP,
              "mean outcome of trajectories with several assistant turns (a tool call "
              "first); NaN when the batch has none"),
    MetricDoc("tokens/action", "tokens", STEP, "action tokens in the batch"),
    MetricDoc("tokens/total", "tokens", STEP,
              "non-padding tokens in the batch (prompt, actions and observations); the "
              "progress line's tok/s"),
    MetricDoc("response/action_tokens_p50", "tokens", STEP,
              "median number of action tokens per trajectory"),
    MetricDoc("response/action_tokens_p90", "tokens", STEP,
              "90th percentile of action tokens per trajectory"),
    MetricDoc("response/action_tokens_max", "tokens", STEP,
              "largest number of action tokens of a trajectory in the batch"),
    MetricDoc("episodes/single_turn_frac", "fraction", STEP,
              "share of the batch's trajectories with a single assistant turn"),
    # Advantages.
    MetricDoc("advantage/mean", "advantage", STEP,
              "mean advantage over the batch's action tokens (0 with "
              "algorithm.advantage_centering=batch_mean; a critic's bias shows here)"),
    MetricDoc("advantage/std", "advantage", STEP, "standard deviation of the advantages over "
              "action tokens"),
    MetricDoc("advantage/neg_frac", "fraction", STEP,
              "share of action tokens with a negative advantage"),
    MetricDoc("advantage/zero_traj_frac", "fraction", STEP,
              "share of trajectories whose every action token has advantage 0: for group "
              "variants, the members of groups whose rewards are all equal (no gradient)"),
    MetricDoc("advantage/opening_single_turn", "advantage", STEP,
              "mean advantage on the first action token of single-turn trajectories; NaN "
              "when there are none"),
    MetricDoc("advantage/opening_multi_turn", "advantage", STEP,
              "mean advantage on the first action token of multi-turn trajectories; the gap "
              "to opening_single_turn beyond the rewards' gap is the critic choosing the path"),
    # Policy update.
    MetricDoc("policy/loss", "loss", POLICY, "the policy loss (DIS or PPO clip) of the step"),
    MetricDoc("policy/grad_norm", "L2 norm", POLICY, "global norm of the policy gradient, "
              "before clipping"),
    MetricDoc("policy/update_norm", "L2 norm", POLICY,
              "global norm of the change the step made to the policy's parameters"),
    MetricDoc("policy/updated", "0 or 1", STEP,
              "1 if the step updated the policy (0 on value-only steps, skipped non-finite "
              "updates and batches without reward contrast)"),
    MetricDoc("policy/entropy", "nats/token", POLICY,
              "mean entropy of the policy's next-token distribution over action tokens"),
    MetricDoc("policy/ratio_mean", "ratio", POLICY,
              "mean importance ratio exp(logp - behavior_logp) over action tokens"),
    MetricDoc("policy/ratio_max", "ratio", POLICY, "largest importance ratio over action tokens"),
    MetricDoc("policy/kl_k1", "nats/token", POLICY,
              "KL from the behaviour policy, k1 estimator E[log b - log p] on behaviour samples"),
    MetricDoc("policy/kl_k3", "nats/token", POLICY,
              "KL from the behaviour policy, k3 estimator E[r - 1 - log r] (non-negative)"),
    MetricDoc("policy/kept_frac", "fraction", DIS,
              "share of action tokens whose ratio lies inside the DIS band"),
    MetricDoc("policy/mask_low_frac", "fraction", DIS,
              "share of action tokens masked because the ratio is at or below 1 - eps_low"),
    MetricDoc("policy/mask_high_frac", "fraction", DIS,
              "share of action tokens masked because the ratio is at or above 1 + eps_high"),
    MetricDoc("policy/clip_frac", "fraction", PPO,
              "share of action tokens whose gradient the PPO clip stopped"),
    MetricDoc("policy/no_contrast_skip", "0 or 1", "every learner step, with "
              "algorithm.require_reward_contrast",
              "1 if the policy update was skipped because every trajectory of the batch "
              "earned the same reward"),
    MetricDoc("policy/router_aux_loss", "loss", "every learner step, MoE policies",
              "the router's load-balancing loss added to the policy loss"),
    MetricDoc("policy/router_balance", "ratio", "every learner step, MoE policies",
              "mean over MoE layers of E * sum_e f_e * P_e (f_e: share of routed slots, P_e: "
              "mean router probability of expert e); 1.0 when perfectly balanced"),
    MetricDoc("routing/recorded_tokens", "tokens", ROUTING,
              "action tokens whose experts the sampler recorded in every MoE layer (all but "
              "each turn's last sampled token, docs/explanation/moe-routing.md)"),
    MetricDoc("routing/changed_frac", "fraction", ROUTING,
              "share of recorded action tokens whose top-k expert set, in any MoE layer, "
              "differs between the learner's router (before the update) and the sampler's; "
              "NaN without recorded tokens"),
    MetricDoc("routing/changed_frac/layer_<l>", "fraction", ROUTING,
              "routing/changed_frac for the l-th MoE layer alone (l counts MoE layers from 0)"),
    MetricDoc("routing/changed_scored_tokens", "tokens", ROUTING,
              "action tokens whose log-prob the learner computed at a position (the token "
              "before, same trajectory) whose routing changed"),
    MetricDoc("routing/unchanged_scored_tokens", "tokens", ROUTING,
              "action tokens whose log-prob the learner computed at a recorded position whose "
              "routing did not change"),
    MetricDoc("routing/dis_masked_frac_changed", "fraction", ROUTING,
              "share of routing/changed_scored_tokens whose ratio lies outside the DIS band "
              "(1 - eps_low, 1 + eps_high); NaN without such tokens"),
    MetricDoc("routing/dis_masked_frac_unchanged", "fraction", ROUTING,
              "share of routing/unchanged_scored_tokens outside the DIS band; the gap to "
              "routing/dis_masked_frac_changed is what routing flips cost"),
    MetricDoc("mismatch/lag0_abs_logp", "nats/token", STEP,
              "mean |learner log-prob - sampler behavior_logp| over lag-0 action tokens: the "
              "training-inference mismatch, ~0 unless numerics differ; NaN without lag-0 "
              "tokens or without a policy update"),
    MetricDoc("mismatch/lag0_tokens", "tokens", STEP,
              "action tokens sampled entirely by the weights the step started from"),
    # Critic.
    MetricDoc("value/loss", "loss", CRITIC, "clipped value loss, mean over the step's K value updates"),
    MetricDoc("value/grad_norm", "L2 norm", CRITIC, "global norm of the value gradient, mean over the K updates"),
    MetricDoc("value/clip_frac", "fraction", CRITIC,
              "share of tokens whose value the value clip (algorithm.value_clip) held back"),
    MetricDoc("value/explained_variance", "ratio", CRITIC,
              "1 - Var(G - V) / Var(G) over action tokens: 1 perfect, 0 no better than a "
              "constant; NaN when the returns do not vary"),
    MetricDoc("value/mean", "reward", CRITIC, "mean critic value V_old over action tokens"),
    MetricDoc("value/bias", "reward", CRITIC, "mean of V_old - G over action tokens: the "
              "critic's bias against the value targets"),
    MetricDoc("value/return_mean", "reward", CRITIC, "mean value target G over action tokens"),
    MetricDoc("value/return_var", "reward^2", CRITIC,
              "variance of G over action tokens (population: divided by the token count)"),
    MetricDoc("value/residual_var", "reward^2", CRITIC,
              "variance of G - V_old over action tokens; with value/return_var, "
              "value/bias and tokens/action, what the window figures pool exactly"),
    MetricDoc("value/explained_variance_window", "ratio", CRITIC,
              f"1 - Var(G - V) / Var(G) over every action token of the last {WINDOW_STEPS} "
              "learner steps (sao_jax.run.critic_window) pooled as one batch, not the "
              "mean of the steps' figures; the progress line's critic EV; NaN when the "
              "window's returns do not vary; restarts with a resumed process"),
    MetricDoc("value/bias_window", "reward", CRITIC,
              f"mean of V_old - G over every action token of the last {WINDOW_STEPS} learner steps "
              "(token-weighted); the progress line's critic bias"),
    # Learner state.
    MetricDoc("nonfinite_skips", "count", STEP,
              "updates skipped so far because their loss or gradient was not finite"),
    MetricDoc("policy_version", "version", STEP,
              "policy updates made so far (the version samplers see)"),
    # Host-side batch metrics (sao_jax.run.metrics.batch_metrics, sao_jax.jobs.train).
    MetricDoc("staleness/mean", "policy updates", HOST,
              "mean lag of the batch's trajectories: policy updates between their first token "
              "and this step"),
    MetricDoc("staleness/max", "policy updates", HOST, "largest lag in the batch"),
    MetricDoc("staleness/lag_<k>", "count", HOST,
              "trajectories of the batch with lag k, for k = 0 .. 15 (a histogram)"),
    MetricDoc("staleness/lag_16_plus", "count", HOST, "trajectories of the batch with lag >= 16"),
    MetricDoc("staleness/multi_version_frac", "fraction", HOST,
              "share of trajectories sampled by more than one policy version"),
    MetricDoc("batch/padding_rows", "count", HOST, "rows of the batch that hold no trajectory"),
    MetricDoc("batch/mean_length", "tokens", HOST, "mean trajectory length in the batch"),
    MetricDoc("batch/trajectories", "count", HOST, "trajectories in the batch"),
    MetricDoc("groups/release_delay_s", "seconds", "every learner step, group mode (grpo)",
              "mean over the batch's prompt groups of the time from a group's first member "
              "reaching the learner to its last: what GRPO waits for a group's slowest "
              "episode (sao_jax.data.pipeline.GroupDataset)"),
    MetricDoc("groups/release_delay_max_s", "seconds", "every learner step, group mode (grpo)",
              "largest release delay of a prompt group in the batch"),
    # The learner's wall clock (sao_jax.run.timing), every row of a sao-train run.
    MetricDoc("time/elapsed_s", "seconds", HOST,
              "wall-clock seconds the run has trained for when this step's batch arrived, "
              "counted from the first batch asked for, resumes included (what run.max_wall_s "
              "bounds; the x axis of reward against time in curves.png)"),
    MetricDoc("data/trajectories_total", "count", HOST,
              "trajectories the learner has consumed (trained on) so far, resumes included"),
    MetricDoc("learner/wait_s", "seconds", HOST,
              "how long the learner waited for this step's batch (trajectories not there yet)"),
    MetricDoc("learner/idle_frac", "fraction", HOST,
              "learner/wait_s over the time since the previous batch arrived: near 1 when "
              "rollouts bound the run, near 0 when the learner does"),
    MetricDoc("learner/idle_frac_total", "fraction", HOST,
              "all time waited for batches over the elapsed time of this launch"),
    # Where the time goes (sao_jax.run.phases): the learner's step, the samplers' loops.
    MetricDoc(phases.STEP_KEY, "seconds", STEP,
              "the learner's wall time for this step: from the end of the previous step's "
              "after-step work (publish, evaluation) to the end of this one's; the "
              f"time/learner/<phase>_s sum to it within {phases.TOLERANCE_S} s + "
              f"{phases.TOLERANCE_FRAC:.0%} (the loop's untimed bookkeeping)"),
    *(MetricDoc(phases.learner_key(phase), "seconds", STEP, f"part of {phases.STEP_KEY} in: {what}")
      for phase, what in phases.LEARNER_PHASES.items()),
    MetricDoc(phases.SAMPLER_WALL_KEY, "seconds", HOST,
              "sampler seconds spent making this batch's trajectories (the sampler "
              "processes' loop time since each one's previous trajectory, summed over the "
              "batch: two samplers make two seconds a second); the time/sampler/<phase>_s "
              "sum to it"),
    *(MetricDoc(phases.sampler_key(phase), "seconds", HOST,
                f"part of {phases.SAMPLER_WALL_KEY} in: {what}")
      for phase, what in phases.SAMPLER_PHASES.items()),
    MetricDoc("batch/padding_frac", "fraction", HOST,
              "share of the batch's token slots that are padding (what packing saves)"),
    MetricDoc("episodes/max_turns_frac", "fraction", HOST,
              "share of the batch's episodes ended by the turn budget (env.max_turns)"),
    MetricDoc("episodes/length_cut_frac", "fraction", HOST,
              "share of episodes ended by a length limit: out of context, or a last turn cut "
              "at max_new_tokens / max_seq_len"),
    MetricDoc("episodes/tool_call_frac", "fraction", HOST,
              "share of episodes in which the environment ran a tool"),
    MetricDoc("reward/source/<source>", "reward", HOST,
              "mean final reward of the batch's episodes whose task names this data source "
              "(a dataset's data_source column; at most 32 sources)"),
    MetricDoc("episodes/metric/<name>", "as reported", HOST,
              "mean of a number the environment or env.reward_fn reported beside the reward "
              "(StepResult.info, or the reward function's mapping), over the episodes that "
              "report it"),
    MetricDoc("weights/sampler_waits", "count", HOST,
              "weight-channel network faults (timeouts, resets) the samplers waited out, as "
              "reported with this batch's trajectories"),
    MetricDoc("weights/sampler_errors", "count", HOST,
              "weight-channel peer errors and refused (forged, replayed, stale) versions the "
              "samplers counted, as reported with this batch's trajectories"),
    MetricDoc("dropped/<reason>", "count", HOST,
              "trajectories dropped so far, by reason (cumulative; dropped/stale is written "
              "from the first step, 0 until there are any): stale, future_version, "
              "too_long, prompt_id_out_of_range, writer_died, unscheduled (data.fixed_lag: a "
              "trajectory of a batch already trained, too far ahead or sent twice), "
              "env_failure (all environment "
              "failures) and env_failure/<kind>, each kind the sampler names on its own (an "
              "exception type, or the environment's name for a bad value; first 32 kinds, then "
              "env_failure/other), quarantined_<reason> for record files; each kind's first "
              "message is logged once, and summary.json keeps them (dropped_first_message)"),
    MetricDoc("episodes/failed_frac", "fraction", HOST,
              "share of the last run.failure_window trajectories the learner judged (admitted, "
              "or dropped as failed, malformed or too long; stale ones left out) that were "
              "dropped; the run stops once it reaches run.max_failure_fraction"),
    MetricDoc("weights/errors/<reason>", "count", "every learner step, network weight channel",
              "weight-channel peer errors so far, by the code's reason (e.g. a failed "
              "handshake, handshake_evicted)"),
    # Evaluation.
    MetricDoc("eval/accuracy", "fraction", EVAL,
              "held-out accuracy: mean final reward of greedy episodes that did not fail"),
    MetricDoc("eval/source/<source>", "fraction", EVAL,
              "held-out accuracy over the tasks of one data source"),
    MetricDoc("eval/failures", "count", EVAL,
              "held-out episodes the environment could not judge"),
    MetricDoc("eval/mean_turns", "turns", EVAL, "mean assistant turns per held-out episode"),
    MetricDoc("eval/tool_call_rate", "fraction", EVAL,
              "share of held-out episodes in which a tool ran"),
    MetricDoc("eval/sampled_accuracy", "fraction", EVAL,
              "with run.eval_samples = n > 0: mean final reward of n episodes per held-out "
              "task sampled at run.eval_temperature (what the policy earns as training "
              "samples it; greedy accuracy can flip on one near-tied token)"),
    MetricDoc("eval/sampled_accuracy_after_sft", "fraction", "summary.json, at the end of a run",
              "sampled held-out accuracy at step 0 (with run.eval_samples > 0)"),
    MetricDoc("eval/sampled_accuracy_after_rl", "fraction", "summary.json, at the end of a run",
              "sampled held-out accuracy at the last evaluation (with run.eval_samples > 0)"),
    MetricDoc("eval/sampled_rl_gain", "fraction", "summary.json, at the end of a run",
              "sampled accuracy after RL minus after SFT: RL's honest gain"),
    MetricDoc("eval/accuracy_after_sft", "fraction", "summary.json, at the end of a run",
              "held-out accuracy at step 0 (after the SFT warm-start)"),
    MetricDoc("eval/accuracy_after_rl", "fraction", "summary.json, at the end of a run",
              "held-out accuracy at the last evaluation"),
    MetricDoc("eval/rl_gain", "fraction", "summary.json, at the end of a run",
              "accuracy after RL minus after SFT"),
    # SFT warm-start.
    MetricDoc("sft/loss", "nats/token", SFT, "cross-entropy of the demonstrations' action tokens"),
    MetricDoc("sft/entropy", "nats/token", SFT, "mean entropy over the demonstrations' action "
              "tokens"),
    MetricDoc("sft/grad_norm", "L2 norm", SFT, "global norm of the SFT gradient"),
    MetricDoc("sft/validation_accuracy", "fraction", "every run.sft_check_every SFT steps, with "
              "run.sft_target_accuracy > 0",
              "greedy accuracy on the SFT validation tasks (stops SFT at the target)"),
)


# The scores of a `sao-eval` report (RUN_DIR/eval/step_<step>.json), under "overall" and
# per source under "sources" (`sao_jax.jobs.eval_scores.group_scores`).
REPORT = "every sao-eval report, overall and per source"
EVAL_REPORT: tuple[MetricDoc, ...] = (
    MetricDoc("tasks", "count", REPORT, "tasks evaluated"),
    MetricDoc("greedy_pass@1", "fraction", REPORT, "share of tasks the greedy episode solved"),
    MetricDoc("failures", "count", REPORT,
              "episodes (greedy and sampled) the environment could not judge; counted as "
              "unsolved"),
    MetricDoc("mean@<n>", "fraction", "with --samples n (run.eval_samples)",
              "mean over tasks of c / n, the share of a task's n sampled episodes that solve it"),
    MetricDoc("pass@<k>", "fraction", "with --samples n, for each k <= n of --pass-k",
              "mean over tasks of the unbiased 1 - C(n - c, k) / C(n, k): the chance that one "
              "of k samples solves the task (Chen et al. 2021)"),
)


def describe(key: str, table: tuple[MetricDoc, ...] = METRICS) -> MetricDoc | None:
  """The entry of `table` documenting `key` (an exact key before a pattern), or None."""
  for doc in table:
    if doc.key == key:
      return doc
  for doc in table:
    if "<" in doc.key and doc.pattern.match(key):
      return doc
  return None
