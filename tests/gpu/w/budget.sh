# Sourced by window scripts that start alike (set WINDOW_SECS, the script's default budget, first):
# LOG = the script's $1, SECS = its $2 or WINDOW_SECS, left() = seconds of that budget still left, and
# everything the script prints from here on is appended to LOG.
LOG=${1:?LOGFILE}
SECS=${2:-$WINDOW_SECS}
start=$(date +%s)
left() { echo $(( SECS - ($(date +%s) - start) )); }
exec >>"$LOG" 2>&1
