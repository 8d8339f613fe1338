#!/usr/bin/env bash
# Install jax[tpu] and this package into a venv on every worker. Safe to re-run.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
Usage: tpu_scripts/setup.sh [-h|--help]

On every worker (tpu-vm ssh --worker=all): creates the venv $VENV_DIR with
$REMOTE_PYTHON if it is missing, installs bubblewrap (the kernel sandbox of
tool calls; sudo apt-get) if bwrap is missing, then pip-installs
"jax[tpu]==$JAX_VERSION" and the checkout copy.sh left in $REPO_DIR
with its gcs extra (pip install -e "$REPO_DIR[gcs]": gcsfs, which gs://
checkpoint directories need). Idempotent: re-running keeps the venv and only installs what
changed. Run copy.sh first.

Needs: PROJECT ZONE TPU_NAME JAX_VERSION
EOF_USAGE
}

for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; settings_help; exit 0 ;;
    *) echo "error: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

require_settings PROJECT ZONE TPU_NAME JAX_VERSION
[[ "$JAX_VERSION" =~ ^[0-9]+(\.[0-9]+)*([a-z0-9.]*)$ ]] ||
  die "JAX_VERSION=$JAX_VERSION is not a version; use e.g. JAX_VERSION=$(setting_example JAX_VERSION)"

py=$(shell_quote "$REMOTE_PYTHON")
venv=$(shell_quote "$VENV_DIR")
vpy=$(shell_quote "$VENV_DIR/bin/python")
need_py="sao_jax needs Python >= 3.11: install it on the VMs (Ubuntu 22.04 images ship 3.10; e.g. python3.11-venv from the deadsnakes PPA) and set REMOTE_PYTHON=python3.11"

steps=(
  'set -euo pipefail'
  "cd \"\$HOME\""
  "if [ ! -f $(shell_quote "$REPO_DIR/pyproject.toml") ]; then echo \"error: \$(hostname): no $(shell_quote "$REPO_DIR")/pyproject.toml; run tpu_scripts/copy.sh first\" >&2; exit 1; fi"
  "if [ ! -x $vpy ]; then $py -c \"import sys; sys.exit(sys.version_info < (3, 11))\" || { echo \"error: \$(hostname): $py is \$($py -V 2>&1); $need_py\" >&2; exit 1; }; $py -m venv $venv; fi"
  "if ! command -v bwrap >/dev/null 2>&1; then sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap >/dev/null; fi"
  "$vpy -m pip install --quiet \"jax[tpu]==$JAX_VERSION\""
  "$vpy -m pip install --quiet -e $(shell_quote "${REPO_DIR}[gcs]")"
  "echo \"\$(hostname): ready, jax \$($vpy -c \"import jax; print(jax.__version__)\")\""
)
script=$(printf '%s; ' "${steps[@]}")

info "setting up $TPU_NAME (all workers): venv $VENV_DIR, jax[tpu]==$JAX_VERSION, pip install -e ${REPO_DIR}[gcs]"
ssh_workers all "${script%; }"
