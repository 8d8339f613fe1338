#!/usr/bin/env bash
# Run one SPMD program on every worker of the slice, with per-worker logs and an
# optional relaunch after preemption.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
Usage: tpu_scripts/run.sh [--relaunch N] [-h|--help] -- PROGRAM [ARGS...]

Runs PROGRAM ARGS... on every worker at once (tpu-vm ssh --worker=all), from
$REPO_DIR with $VENV_DIR activated. JAX finds its peers on a TPU slice by
itself: no coordinator settings are needed. Each worker writes
$LOG_DIR/$RUN_NAME-worker<N>.log on its VM; worker 0 also streams to this
terminal, and a failing worker prints its last 20 lines. The program sees
RUN_NAME, RELAUNCH_ATTEMPT, BUCKET (if set) and every variable named in
FORWARD_ENV (values are put on the ssh command line: visible to `ps` on the VMs
and in DRY_RUN output).

  --relaunch N  if the run fails and the slice was preempted (queued resource
                SUSPENDING/SUSPENDED, or node PREEMPTED/TERMINATED), delete and
                re-create it, copy, setup, and run again; at most N times. A
                program that fails on a healthy slice is not relaunched. The
                program should resume from its checkpoints in $BUCKET: a
                sao-train program without --resume gets `--resume auto`
                (every attempt, the first too), so the identical command
                continues the run after a preemption, starts fresh when there
                is no checkpoint yet, and refuses checkpoints of another config.

Example: RUN_NAME=qwen3-sao-001 tpu_scripts/run.sh --relaunch 3 -- sao-train --config configs/x.py

Needs: PROJECT ZONE TPU_NAME; with --relaunch also ACCELERATOR_TYPE RUNTIME_VERSION JAX_VERSION
EOF_USAGE
}

relaunch=0
while (($#)); do
  case "$1" in
    -h | --help) usage; settings_help; exit 0 ;;
    --relaunch) [[ $# -ge 2 ]] || { echo "error: --relaunch needs a count" >&2; exit 2; }; relaunch=$2; shift ;;
    --relaunch=*) relaunch=${1#--relaunch=} ;;
    --) shift; break ;;
    *) echo "error: unknown argument '$1'; put the program after --" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if (($# == 0)); then
  echo "error: no program given; e.g. tpu_scripts/run.sh -- sao-train --config configs/x.py" >&2
  usage >&2
  exit 2
fi
[[ "$relaunch" =~ ^[0-9]+$ ]] || die "--relaunch $relaunch; give a whole number of relaunches, e.g. --relaunch 3"

: "${RUN_NAME:=run-$(date -u +%Y%m%d-%H%M%S)}"
export RUN_NAME
[[ "$RUN_NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || die "RUN_NAME=$RUN_NAME; use letters, digits, '.', '_' and '-' (it names the log files)"
if ((relaunch > 0)); then
  # Checked now, not hours later when the first preemption needs them.
  require_settings PROJECT ZONE TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION JAX_VERSION
else
  require_settings PROJECT ZONE TPU_NAME
fi
for var in $FORWARD_ENV; do
  [[ -n "${!var+set}" ]] || die "FORWARD_ENV names $var, but $var is not set here"
done

# Under --relaunch a training program resumes its own run (run.resume="auto").
if ((relaunch > 0)); then
  is_train=0 has_resume=0
  for arg in "$@"; do
    case "$arg" in
      sao-train | */sao-train | sao_jax.cli.train) is_train=1 ;;
      --resume | --resume=*) has_resume=1 ;;
    esac
  done
  if ((is_train && !has_resume)); then set -- "$@" --resume auto; fi
fi
program=$(shell_quote "$@")

# remote_script ATTEMPT : the bash that every worker runs.
remote_script() {
  local exports=(RUN_NAME="$RUN_NAME" RELAUNCH_ATTEMPT="$1") var
  if [[ -n "$BUCKET" ]]; then exports+=(BUCKET="$BUCKET"); fi
  for var in $FORWARD_ENV; do exports+=("$var=${!var}"); done
  local log_dir venv repo
  log_dir=$(shell_quote "$LOG_DIR")
  venv=$(shell_quote "$VENV_DIR")
  repo=$(shell_quote "$REPO_DIR")
  local steps=(
    'set -euo pipefail'
    "cd \"\$HOME\""
    # The metadata server knows which worker this VM is; TPU_WORKER_ID if the image sets it.
    "worker=\${TPU_WORKER_ID:-}"
    "if [ -z \"\$worker\" ]; then worker=\$(curl -sf --max-time 10 -H Metadata-Flavor:Google http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number) || worker=\$(hostname); fi"
    "mkdir -p $log_dir"
    "log=\"\$(cd $log_dir && pwd)/$RUN_NAME-worker\$worker.log\""
    "export $(shell_quote "${exports[@]}")"
    "if [ ! -f $venv/bin/activate ]; then echo \"error: \$(hostname): no venv $venv; run tpu_scripts/setup.sh first\" >&2; exit 1; fi"
    ". $venv/bin/activate"
    "cd $repo"
    "echo \"\$(hostname) worker \$worker: running $RUN_NAME (attempt \$RELAUNCH_ATTEMPT), log \$log\" >&2"
    "if [ \"\$worker\" = 0 ]; then $program 2>&1 | tee \"\$log\"; else $program >\"\$log\" 2>&1 || { rc=\$?; echo \"\$(hostname) worker \$worker: exit \$rc; last lines of \$log:\" >&2; tail -n 20 \"\$log\" >&2; exit \"\$rc\"; }; fi"
  )
  local script
  script=$(printf '%s; ' "${steps[@]}")
  printf '%s\n' "${script%; }"
}

attempt=0
while true; do
  info "run $RUN_NAME on $TPU_NAME (all workers), attempt $attempt: $program"
  rc=0
  ssh_workers all "$(remote_script "$attempt")" || rc=$?
  if ((rc == 0)); then
    info "run $RUN_NAME finished on all workers"
    exit 0
  fi
  if ((relaunch == 0)); then
    die "run $RUN_NAME failed (exit $rc); logs: tpu_scripts/logs.sh --worker=all"
  fi
  if ! tpu_preempted; then
    die "run $RUN_NAME failed (exit $rc) on a healthy slice: not relaunching; logs: RUN_NAME=$RUN_NAME tpu_scripts/logs.sh --worker=all"
  fi
  if ((attempt >= relaunch)); then
    die "run $RUN_NAME was preempted and the $relaunch relaunch(es) of --relaunch are used up"
  fi
  attempt=$((attempt + 1))
  info "slice preempted: re-creating it for relaunch $attempt of $relaunch"
  "$TPU_SCRIPTS_DIR/delete.sh" --yes
  "$TPU_SCRIPTS_DIR/create.sh"
  "$TPU_SCRIPTS_DIR/copy.sh"
  "$TPU_SCRIPTS_DIR/setup.sh"
done
