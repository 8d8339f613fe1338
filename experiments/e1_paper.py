"""E1-paper (issue #50): E1 rerun with the paper's SAO and the paper's critic schedule.

    nice -n 19 .venv/bin/python -m experiments.e1_paper --seeds 10 --jobs 1 \\
        --out /work/exp_runs/e1_paper --report docs/research/e1_paper.md
    .venv/bin/python -m experiments.e1_paper --out DIR --report-only

E1 (`experiments/e1_single_vs_group.py`) found no advantage for SAO over GRPO where
GRPO's groups mostly fail, but its SAO arm was `sao_centered_gated` (centred
advantages, and a gate that skipped a third of its policy steps, most on the weak
seeds) with a critic at 1x the policy's lr, no value pretraining and 3 warm-up steps;
its critic explained little of the returns (median 0.09). E1-paper asks whether E1's
negative came from those choices: the same setting, test and checks, with the paper's
SAO and the paper's critic schedule in place of E1's SAO arm.

PRE-REGISTRATION (committed before any of its runs; the report names the commit that
added this file):

- Arms: `sao_paper_critic` (the paper's `sao`: no centring, no contrast gate; with the
  paper's critic schedule: value lr 5x the policy's (5e-4), 5 value-pretraining steps,
  10 critic warm-up steps, no lr warm-up) against `grpo` exactly as E1 ran it (groups
  of 8, PPO clip 0.2/0.28, the setting's 5-step lr warm-up), both rerun on today's code.
  Policy lr 1e-4 for both (E1's; no pilot: only the SAO arm's algorithm and critic
  schedule change). SAO's 15 value-only steps are part of its 100 steps: the paper's
  schedule pays them.
- Setting, seeds, primary metric, primary test, manipulation checks and secondary
  measures: E1's, unchanged (`experiments/e1_single_vs_group.py`: the weak warm-start,
  100 learner steps x 16 trajectories, seeds 0..9; the mean sampled training reward
  over all steps; one-sided exact Wilcoxon signed-rank on the per-seed paired
  differences, H1 SAO > GRPO, alpha 0.05; checks (a) warm-start reward over the first 5
  steps in [0.03, 0.25] and (b) GRPO's all-equal-group share over its first 10 steps >=
  0.5; "incomplete (n of 10 seeds)" with fewer than 10 finished pairs).
- Added to E1's rules, the critic check (`experiments/critic.py`): the explained variance
  of SAO's critic after its value-only steps, pooled over action tokens, median over
  seeds, must reach `CRITIC_EV_AT_LEAST` = 0.3; where it does not and SAO did not win, the
  verdict reads "the critic did not learn", not "SAO lost".
- Runs one at a time (`--jobs 1`) at niceness 19 beside other work: compared per learner
  step, so the machine's load changes only the policy lag (shown per seed).
"""

from __future__ import annotations

import pathlib

from experiments import claims as claims_lib
from experiments import e1_single_vs_group as e1

SUBJECT = "sao_paper_critic"
CRITIC_EV_AT_LEAST = 0.3
ROOT = pathlib.Path(__file__).resolve().parents[1]

EXPERIMENT = claims_lib.Claim(
    "e1_paper", 0, "the paper's SAO learns more than GRPO where groups fail",
    "single rollouts with a critic learn where GRPO's all-fail groups carry no gradient",
    "weak_start", "ordering", (SUBJECT, e1.BASELINE), seeds=e1.SEEDS)

DESIGN = e1.Design(EXPERIMENT, SUBJECT, pathlib.Path(__file__),
                   ROOT / "docs" / "research" / "e1_paper.md",
                   "E1-paper: the paper's SAO where groups fail (issue #50)",
                   "(the paper's `sao`: no centring, no contrast gate)",
                   critic_threshold=CRITIC_EV_AT_LEAST)


def main(argv=None) -> None:
  e1.main(argv, DESIGN, __doc__, default_out="e1_paper")


if __name__ == "__main__":
  main()
