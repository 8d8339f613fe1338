# shellcheck shell=bash
# Settings and helpers shared by every tpu_scripts/*.sh. Source it, don't run it.
#
# Every setting is an environment variable, so one `export` block configures
# create, copy, setup, run, logs and delete alike. Scripts call
# `require_settings NAME...` for what they need; a missing one fails with the
# variable's name and an example value.

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  echo "common.sh is sourced by the other tpu_scripts, not run; see tpu_scripts/create.sh --help" >&2
  exit 2
fi

set -euo pipefail

TPU_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$TPU_SCRIPTS_DIR/.." && pwd)

# Defaults. Paths on the VM that are relative are relative to the remote home.
: "${DRY_RUN:=0}"
: "${SPOT:=0}"
: "${RESERVED:=0}"
: "${QR_ID:=${TPU_NAME:+${TPU_NAME}-qr}}"
: "${REPO_DIR:=sao_jax}"
: "${VENV_DIR:=sao_jax_venv}"
: "${REMOTE_PYTHON:=python3}"
: "${LOG_DIR:=logs}"
: "${SRC_DIR:=$REPO_ROOT}"
: "${POLL_INTERVAL:=30}"
: "${POLL_TIMEOUT:=3600}"
: "${FORWARD_ENV:=}"
: "${BUCKET:=}"
# Exported so that run.sh's relaunch sees exactly these values in create/copy/setup.
export DRY_RUN SPOT RESERVED QR_ID REPO_DIR VENV_DIR REMOTE_PYTHON LOG_DIR SRC_DIR \
  POLL_INTERVAL POLL_TIMEOUT FORWARD_ENV BUCKET
export PROJECT="${PROJECT:-}" ZONE="${ZONE:-}" TPU_NAME="${TPU_NAME:-}" \
  ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-}" RUNTIME_VERSION="${RUNTIME_VERSION:-}" \
  JAX_VERSION="${JAX_VERSION:-}"

# The settings table every --help ends with.
settings_help() {
  cat <<'EOF'
Settings (environment variables):
  PROJECT           GCP project                       e.g. my-gcp-project
  ZONE              TPU zone                          e.g. us-east5-a
  TPU_NAME          TPU node name                     e.g. sao-v5p-32
  QR_ID             queued-resource id                default: $TPU_NAME-qr
  ACCELERATOR_TYPE  slice type (create)               e.g. v5p-32, v5litepod-16, v6e-8
  RUNTIME_VERSION   TPU software version (create)     e.g. v2-alpha-tpuv5 (v5p),
                                                      v2-alpha-tpuv5-lite (v5e), v2-alpha-tpuv6e
  SPOT=1            request Spot capacity (create)    default 0
  RESERVED=1        use reserved capacity (create)    default 0; not together with SPOT
  JAX_VERSION       installs "jax[tpu]==$JAX_VERSION" (setup), e.g. 0.10.2
  REPO_DIR          checkout on the VM                default: sao_jax (under the remote home)
  VENV_DIR          virtualenv on the VM              default: sao_jax_venv (under the remote home)
  REMOTE_PYTHON     python (>= 3.11) that makes the venv on the VM, default: python3
  LOG_DIR           per-worker logs on the VM         default: logs (under the remote home)
  BUCKET            checkpoint bucket, passed to the program as $BUCKET, e.g. gs://my-bucket/sao
  RUN_NAME          run name, passed to the program and naming the logs (run, logs)
  FORWARD_ENV       names of more local variables to pass to the program, e.g. "WANDB_API_KEY XLA_FLAGS"
  SRC_DIR           local tree that copy.sh ships     default: this repository
  POLL_INTERVAL     seconds between state polls       default: 30
  POLL_TIMEOUT      seconds to wait for ACTIVE, 0 = forever, default: 3600
  DRY_RUN=1         print every gcloud command instead of running it
EOF
}

info() {
  if is_dry_run; then echo "[tpu_scripts, dry run] $*" >&2; else echo "[tpu_scripts] $*" >&2; fi
}
die() {
  echo "error: $*" >&2
  exit 1
}

setting_example() {
  case "$1" in
    PROJECT) echo "my-gcp-project" ;;
    ZONE) echo "us-east5-a" ;;
    TPU_NAME) echo "sao-v5p-32" ;;
    QR_ID) echo "sao-v5p-32-qr" ;;
    ACCELERATOR_TYPE) echo "v5p-32" ;;
    RUNTIME_VERSION) echo "v2-alpha-tpuv5" ;;
    JAX_VERSION) echo "0.10.2" ;;
    RUN_NAME) echo "qwen3-sao-001" ;;
    *) echo "..." ;;
  esac
}

# require_settings NAME... : every NAME must be non-empty, else name each missing
# one with an example, print the calling script's usage() and exit 2.
# Each script defines usage(); --help adds settings_help.
require_settings() {
  local name missing=0
  for name in "$@"; do
    if [[ -z "${!name:-}" ]]; then
      echo "error: $name is not set; for example: export $name=$(setting_example "$name")" >&2
      missing=1
    fi
  done
  if ((missing)); then
    echo >&2
    usage >&2
    echo "All settings: $(basename "$0") --help" >&2
    exit 2
  fi
  validate_settings
}

validate_settings() {
  local flag
  for flag in DRY_RUN SPOT RESERVED; do
    [[ "${!flag}" == 0 || "${!flag}" == 1 ]] || die "$flag=${!flag}; use $flag=1 or $flag=0"
  done
  if ! is_dry_run && ! command -v gcloud >/dev/null; then
    die "gcloud is not on PATH; install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), or preview with DRY_RUN=1"
  fi
  if [[ "$SPOT" == 1 && "$RESERVED" == 1 ]]; then
    die "SPOT=1 and RESERVED=1 are both set; a queued resource is either Spot or reserved, unset one"
  fi
  if [[ -n "$ACCELERATOR_TYPE" && ! "$ACCELERATOR_TYPE" =~ ^v[0-9]+[a-z]*-[0-9]+$ ]]; then
    die "ACCELERATOR_TYPE=$ACCELERATOR_TYPE is not a TPU type; use e.g. v5p-32, v5litepod-16, v6e-8"
  fi
  [[ "$POLL_INTERVAL" =~ ^[0-9]+([.][0-9]+)?$ ]] ||
    die "POLL_INTERVAL=$POLL_INTERVAL; use a number of seconds, e.g. 30"
  [[ "$POLL_TIMEOUT" =~ ^[0-9]+$ ]] ||
    die "POLL_TIMEOUT=$POLL_TIMEOUT; use whole seconds, e.g. 3600 (0 waits forever)"
  if [[ -n "$BUCKET" && "$BUCKET" != gs://* ]]; then
    die "BUCKET=$BUCKET; use a gs:// path, e.g. gs://my-bucket/sao"
  fi
  local var
  for var in $FORWARD_ENV; do
    [[ "$var" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
      die "FORWARD_ENV lists '$var', which is not a variable name"
  done
}

is_dry_run() { [[ "$DRY_RUN" == 1 ]]; }

# shell_quote ARG... : one line that a POSIX shell splits back into ARG...
# Plain words stay bare; anything else is single-quoted.
shell_quote() {
  local arg quoted out=() sq="'\\''"
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+=("$arg")
    elif [[ -z "$arg" ]]; then
      out+=("''")
    else
      quoted="'${arg//\'/"$sq"}'"
      quoted=${quoted#"''"} # drop the empty '' a leading or trailing quote leaves
      out+=("${quoted%"''"}")
    fi
  done
  local IFS=' '
  printf '%s\n' "${out[*]}"
}

# gcloud_cmd ARG... : run `gcloud ARG...`, or with DRY_RUN=1 print it as one
# shell-quoted line on stdout ("DRY_RUN: gcloud ...") and succeed.
gcloud_cmd() {
  if is_dry_run; then
    echo "DRY_RUN: $(shell_quote gcloud "$@")"
  else
    gcloud "$@"
  fi
}

# Flags every TPU command takes; explicit so a stale `gcloud config` never picks the zone.
location_flags() { LOCATION_FLAGS=(--project="$PROJECT" --zone="$ZONE"); }

# ssh_workers WORKER SCRIPT : run the bash SCRIPT on WORKER (N or all).
# `bash -c` so the VM user's login shell only has to parse one quoted word.
ssh_workers() {
  local worker=$1 script=$2
  location_flags
  gcloud_cmd compute tpus tpu-vm ssh "$TPU_NAME" "${LOCATION_FLAGS[@]}" \
    --worker="$worker" --command="$(shell_quote bash -c "$script")"
}

# Sets QR_STATE from `queued-resources describe`. Dry run: prints the command
# once and reports ACTIVE so that polling loops end.
read_qr_state() {
  location_flags
  if is_dry_run; then
    gcloud_cmd compute tpus queued-resources describe "$QR_ID" "${LOCATION_FLAGS[@]}" \
      --format='value(state.state)'
    QR_STATE=ACTIVE
    return 0
  fi
  QR_STATE=$(gcloud compute tpus queued-resources describe "$QR_ID" "${LOCATION_FLAGS[@]}" \
    --format='value(state.state)') || QR_STATE=""
}

# Sets NODE_STATE from `tpu-vm describe` (READY, PREEMPTED, TERMINATED, ...);
# empty when the node is gone or the call failed.
read_node_state() {
  location_flags
  if is_dry_run; then
    gcloud_cmd compute tpus tpu-vm describe "$TPU_NAME" "${LOCATION_FLAGS[@]}" --format='value(state)'
    NODE_STATE=READY
    return 0
  fi
  NODE_STATE=$(gcloud compute tpus tpu-vm describe "$TPU_NAME" "${LOCATION_FLAGS[@]}" \
    --format='value(state)' 2>/dev/null) || NODE_STATE=""
}

# tpu_preempted : true when the slice was taken away under the program — the
# queued resource is SUSPENDING/SUSPENDED (Spot reclaimed, maintenance) or the
# node reports PREEMPTED/TERMINATED. Anything else means the program itself failed.
tpu_preempted() {
  read_qr_state
  case "$QR_STATE" in
    SUSPENDING | SUSPENDED | PREEMPTED)
      info "queued resource $QR_ID is $QR_STATE"
      return 0
      ;;
  esac
  read_node_state
  case "$NODE_STATE" in
    PREEMPTED | TERMINATED)
      info "TPU node $TPU_NAME is $NODE_STATE (queued resource: ${QR_STATE:-unknown})"
      return 0
      ;;
  esac
  info "queued resource $QR_ID is ${QR_STATE:-unknown}, node $TPU_NAME is ${NODE_STATE:-unknown}: not a preemption"
  return 1
}
