#!/usr/bin/env bash
# Request a TPU slice as a queued resource and wait until it is ACTIVE.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
Usage: tpu_scripts/create.sh [--wait-only] [-h|--help]

Creates queued resource $QR_ID (node $TPU_NAME, $ACCELERATOR_TYPE, $RUNTIME_VERSION;
--spot with SPOT=1, --reserved with RESERVED=1), then polls its state every
$POLL_INTERVAL s until ACTIVE. Fails with the reason on FAILED or SUSPENDED, and
after $POLL_TIMEOUT s.

  --wait-only   don't create; only wait for an existing queued resource

Needs: PROJECT ZONE TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION
EOF_USAGE
}

wait_only=0
while (($#)); do
  case "$1" in
    -h | --help) usage; settings_help; exit 0 ;;
    --wait-only) wait_only=1 ;;
    *) echo "error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

require_settings PROJECT ZONE TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION
location_flags

if ((!wait_only)); then
  tier=()
  if [[ "$SPOT" == 1 ]]; then tier=(--spot); fi
  if [[ "$RESERVED" == 1 ]]; then tier=(--reserved); fi
  info "requesting $ACCELERATOR_TYPE as queued resource $QR_ID (node $TPU_NAME) in $PROJECT/$ZONE"
  gcloud_cmd compute tpus queued-resources create "$QR_ID" \
    --node-id="$TPU_NAME" \
    --accelerator-type="$ACCELERATOR_TYPE" \
    --runtime-version="$RUNTIME_VERSION" \
    "${LOCATION_FLAGS[@]}" \
    ${tier[@]+"${tier[@]}"}
fi

SECONDS=0
last_state=""
while true; do
  read_qr_state
  case "$QR_STATE" in
    ACTIVE)
      info "queued resource $QR_ID is ACTIVE after ${SECONDS}s; next: tpu_scripts/copy.sh"
      exit 0
      ;;
    FAILED | SUSPENDED | SUSPENDING)
      # The state block holds failedData.error.message / stateInitiator: the why.
      details=$(gcloud compute tpus queued-resources describe "$QR_ID" "${LOCATION_FLAGS[@]}" \
        --format='yaml(state)' 2>&1) || true
      echo "error: queued resource $QR_ID is $QR_STATE; describe says:" >&2
      echo "    ${details//$'\n'/$'\n    '}" >&2
      echo "delete it with tpu_scripts/delete.sh --yes before creating it again" >&2
      exit 1
      ;;
  esac
  if [[ "$QR_STATE" != "$last_state" ]]; then
    info "queued resource $QR_ID: ${QR_STATE:-<describe failed, retrying>} (${SECONDS}s)"
    last_state=$QR_STATE
  fi
  if ((POLL_TIMEOUT > 0 && SECONDS >= POLL_TIMEOUT)); then
    die "queued resource $QR_ID still ${QR_STATE:-unknown} after ${POLL_TIMEOUT}s (POLL_TIMEOUT); it stays queued: wait again with tpu_scripts/create.sh --wait-only or remove it with tpu_scripts/delete.sh"
  fi
  sleep "$POLL_INTERVAL"
done
