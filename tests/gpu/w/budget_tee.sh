# Sourced by window scripts that log each line both to stdout and to their LOGFILE (trainloop, devapi), as
# budget.sh is by those that append everything to it. Set first: WINDOW_LOG (default log name), WINDOW_SECS (the
# script's default budget), WINDOW_TMP (its scratch folder). Gives: LOG = $1 or WINDOW_LOG (emptied), BUDGET = $2 or
# WINDOW_SECS, the repo root as the working folder, T0 and left() (seconds of the budget left), log() (a line to
# stdout and LOG), EVTC (window.sh's, else build/evtc) and B = WINDOW_TMP (created).
LOG=${1:-$WINDOW_LOG}
BUDGET=${2:-$WINDOW_SECS}
cd "$(dirname "$0")/../../.."
: >"$LOG"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "$@" | tee -a "$LOG"; }
EVTC=${EVTC:-$PWD/build/evtc}
B=$WINDOW_TMP
mkdir -p "$B"
