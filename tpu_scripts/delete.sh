#!/usr/bin/env bash
# Delete the queued resource and its TPU slice.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
Usage: tpu_scripts/delete.sh [--yes] [-h|--help]

Deletes queued resource $QR_ID and its node $TPU_NAME
(queued-resources delete --force --quiet): the VMs and everything on them,
logs included, are gone; fetch logs first (logs.sh --fetch=DIR). Asks for
confirmation on a terminal; without one (scripts, CI) --yes is required.

  --yes   don't ask

Needs: PROJECT ZONE TPU_NAME (or QR_ID)
EOF_USAGE
}

yes=0
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; settings_help; exit 0 ;;
    --yes | -y) yes=1 ;;
    *) echo "error: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

# QR_ID defaults from TPU_NAME; ask for TPU_NAME, the name users know.
if [[ -n "$QR_ID" ]]; then require_settings PROJECT ZONE QR_ID; else require_settings PROJECT ZONE TPU_NAME; fi

# A dry run deletes nothing, so it doesn't ask.
if ((!yes)) && ! is_dry_run; then
  if [[ ! -t 0 ]]; then
    die "not deleting $QR_ID without confirmation: stdin is not a terminal; pass --yes"
  fi
  read -r -p "Delete queued resource $QR_ID (node ${TPU_NAME:-?}) in $PROJECT/$ZONE and everything on its VMs? [y/N] " answer
  case "$answer" in
    y | Y | yes | YES) ;;
    *) die "not deleted (answer '$answer')" ;;
  esac
fi

info "deleting queued resource $QR_ID in $PROJECT/$ZONE"
location_flags
gcloud_cmd compute tpus queued-resources delete "$QR_ID" "${LOCATION_FLAGS[@]}" --force --quiet
info "deleted $QR_ID"
