#!/usr/bin/env bash
# Show or fetch the per-worker logs that run.sh writes on the VMs.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
Usage: tpu_scripts/logs.sh [--worker=N|all] [--lines=N] [--follow] [--fetch=DIR] [-h|--help]

Tails $LOG_DIR/$RUN_NAME-worker<N>.log on the chosen workers (default: all),
each line prefixed with [wN]; without RUN_NAME, each worker's newest log.

  --worker=N|all  which worker(s) (default: all)
  --lines=N       how many lines to show (default: 50)
  --follow        keep following (tail -F) until Ctrl-C
  --fetch=DIR     copy the log files into local DIR instead (tpu-vm scp);
                  without RUN_NAME, every log in $LOG_DIR

Needs: PROJECT ZONE TPU_NAME
EOF_USAGE
}

worker=all
lines=50
follow=0
fetch=""
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; settings_help; exit 0 ;;
    --worker=*) worker=${arg#--worker=} ;;
    --lines=*) lines=${arg#--lines=} ;;
    --follow | -f) follow=1 ;;
    --fetch=*) fetch=${arg#--fetch=} ;;
    *) echo "error: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

require_settings PROJECT ZONE TPU_NAME
[[ "$worker" == all || "$worker" =~ ^[0-9]+$ ]] || die "--worker=$worker; use a worker number (0, 1, ...) or all"
[[ "$lines" =~ ^[0-9]+$ ]] || die "--lines=$lines; use a number of lines, e.g. --lines=200"
if [[ -n "${RUN_NAME:-}" && ! "$RUN_NAME" =~ ^[A-Za-z0-9_.-]+$ ]]; then
  die "RUN_NAME=$RUN_NAME; use letters, digits, '.', '_' and '-'"
fi
[[ -z "$fetch" || "$follow" == 0 ]] || die "--fetch copies files once; drop --follow"

if [[ -n "$fetch" ]]; then
  pattern="${RUN_NAME:+$RUN_NAME-worker}*.log"
  info "fetching $LOG_DIR/$pattern from worker(s) $worker of $TPU_NAME into $fetch"
  if ! is_dry_run; then mkdir -p "$fetch"; fi
  location_flags
  gcloud_cmd compute tpus tpu-vm scp "$TPU_NAME:${LOG_DIR%/}/$pattern" "$fetch" \
    "${LOCATION_FLAGS[@]}" --worker="$worker"
  exit 0
fi

if [[ -n "${RUN_NAME:-}" ]]; then
  pick="f=\$(ls -1 -- $RUN_NAME-worker*.log 2>/dev/null | head -n 1) || true"
else
  pick="f=\$(ls -t -- *-worker*.log 2>/dev/null | head -n 1) || true"
fi
tail_flags="-n $lines"
if ((follow)); then tail_flags+=" -F"; fi
log_dir=$(shell_quote "$LOG_DIR")
steps=(
  'set -euo pipefail'
  "cd \"\$HOME\""
  "cd $log_dir 2>/dev/null || { echo \"\$(hostname): no $log_dir directory yet\" >&2; exit 1; }"
  "$pick"
  "if [ -z \"\$f\" ]; then echo \"\$(hostname): no ${RUN_NAME:+$RUN_NAME }log in $log_dir\" >&2; exit 1; fi"
  "w=\${f##*-worker}; w=\${w%.log}"
  "tail $tail_flags -- \"\$f\" | sed -u \"s/^/[w\$w] /\""
)
script=$(printf '%s; ' "${steps[@]}")
ssh_workers "$worker" "${script%; }"
