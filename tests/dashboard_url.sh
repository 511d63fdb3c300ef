# dashboard_url.sh - sourced by the shell tests that start a dashboard.

# dashboard_url FILE PID TRIES: the URL on the first "dashboard: URL" line of FILE, which the
# process PID writes; polls every 0.1 s, TRIES times at most, and stops once PID has ended.
# Prints nothing when the line never came.
dashboard_url() {
  local url= _
  for _ in $(seq "$3"); do
    url=$(sed -n 's/^dashboard: //p' "$1" | head -1)
    [ -n "$url" ] && break
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  printf '%s' "$url"
}
