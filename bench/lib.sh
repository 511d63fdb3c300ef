# lib.sh - what the benchmark scripts share; sourced, not run.
#
#   idle_pct          the CPUs' idle share over 2 s, in percent
#   wait_quiet        waits (at most $max_wait seconds) for the CPUs to be at least 85% idle and
#                     appends the idle share it saw to $tmp/idle; waiting for a quiet machine
#                     keeps other jobs' bursts out of the measured steps
#   knob SPEC NAME D  the value of NAME in "dp=2,tp=2,sp=1", or D
#   parse_opts ME ARGS  sets each --some-name VALUE of ARGS into the variable some_name, which
#                     the script defined with its default first; anything else is refused
#                     naming ME

idle_pct() {
  local u n s i w x y z t1 i1 t2 i2
  read -r _ u n s i w x y z _ </proc/stat; t1=$((u + n + s + i + w + x + y + z)); i1=$((i + w))
  sleep 2
  read -r _ u n s i w x y z _ </proc/stat; t2=$((u + n + s + i + w + x + y + z)); i2=$((i + w))
  echo $((100 * (i2 - i1) / (t2 - t1)))
}

wait_quiet() {
  local p waited=0
  while p=$(idle_pct); [ "$p" -lt 85 ] && [ $waited -lt "$max_wait" ]; do waited=$((waited + 2)); done
  echo "$p" >>"$tmp/idle"
}

knob() {
  local v
  v=$(tr ',' '\n' <<<"$1" | sed -n "s/^$2=//p")
  echo "${v:-$3}"
}

parse_opts() {
  local me=$1 v
  shift
  while [ $# -gt 0 ]; do
    v=${1#--}
    v=${v//-/_}
    if [[ $1 != --* ]] || [ -z "${!v+x}" ] || [ $# -lt 2 ]; then
      echo "$me: unknown option $1" >&2
      exit 2
    fi
    printf -v "$v" '%s' "$2"
    shift 2
  done
}
