#!/usr/bin/env bash
# Ship the local working tree to every worker, replacing the previous copy.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
Usage: tpu_scripts/copy.sh [-h|--help]

Packs $SRC_DIR (default: this repository) into a tarball locally, leaving out
.git, .venv, __pycache__, *.egg-info, .pytest_cache and .hypothesis, copies it to
every worker (tpu-vm scp --worker=all) and unpacks it there as $REPO_DIR,
replacing the previous copy (files deleted locally disappear on the VMs too).
Uncommitted changes are shipped: what you see locally is what runs.

Needs: PROJECT ZONE TPU_NAME
EOF_USAGE
}

for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; settings_help; exit 0 ;;
    *) echo "error: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

require_settings PROJECT ZONE TPU_NAME
[[ -d "$SRC_DIR" ]] || die "SRC_DIR=$SRC_DIR is not a directory"
repo_dir=${REPO_DIR%/}
# The old copy is removed with rm -rf on the VMs: only accept a plain path.
if [[ ! "$repo_dir" =~ ^/?[A-Za-z0-9_][A-Za-z0-9_./-]*$ || "$repo_dir" =~ (^|/)\.\.?(/|$) ]]; then
  die "REPO_DIR=$REPO_DIR; use a plain directory path such as sao_jax (relative to the remote home)"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tarball="$tmp/sao_jax_src.tar.gz"
tar -czf "$tarball" \
  --exclude=.git --exclude=.venv --exclude=__pycache__ --exclude='*.egg-info' \
  --exclude=.pytest_cache --exclude=.hypothesis \
  -C "$SRC_DIR" .
info "packed $SRC_DIR ($(du -h "$tarball" | cut -f1)) -> $TPU_NAME:$repo_dir on all workers"

remote_tar=sao_jax_src.tar.gz
location_flags
gcloud_cmd compute tpus tpu-vm scp "$tarball" "$TPU_NAME:$remote_tar" \
  "${LOCATION_FLAGS[@]}" --worker=all

repo=$(shell_quote "$repo_dir")
incoming=$(shell_quote "$repo_dir.incoming")
steps=(
  'set -euo pipefail'
  "cd \"\$HOME\""
  "rm -rf $incoming"
  "mkdir -p $incoming"
  "tar -xzf $remote_tar -C $incoming"
  "rm -f $remote_tar"
  "if [ -e $repo ] && [ ! -f $repo/pyproject.toml ]; then echo \"error: \$(hostname): $repo exists but is not a sao_jax checkout; not replacing it (set REPO_DIR)\" >&2; exit 1; fi"
  "rm -rf $repo"
  "mv $incoming $repo"
  "echo \"\$(hostname): unpacked into $repo\""
)
script=$(printf '%s; ' "${steps[@]}")
ssh_workers all "${script%; }"
