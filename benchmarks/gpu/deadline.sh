# Sourced by the GPU scripts: steps that share one call's deadline.
# DEADLINE=S: the call's own limit in seconds from when this is sourced, or DEADLINE_AT=epoch
# seconds, shared by several scripts in one call (a run call is killed at its limit, and a step
# cut short leaves nothing). Each step's timeout is its cap or what is left before the
# deadline, whichever is less; a step with under MIN_STEP seconds left (default 40) is
# skipped, so the steps before it come back.
[ -n "${DEADLINE:-}" ] && export DEADLINE_AT=${DEADLINE_AT:-$(( $(date +%s) + DEADLINE ))}
t_for() {  # $1: the step's cap in seconds -> its timeout, or 0 to skip it
    local left=$(( ${DEADLINE_AT:-$(( $(date +%s) + 100000 ))} - $(date +%s) - 5 ))
    if [ $left -lt ${MIN_STEP:-40} ]; then echo 0; elif [ $left -lt $1 ]; then echo $left; else echo $1; fi
}
run_for() {  # $1: cap, then the command: runs it under t_for's timeout, or says it was skipped
    local t; t=$(t_for $1); shift
    if [ $t = 0 ]; then echo "skipped (deadline): $*" | cut -c1-160; return 124; fi
    timeout $t "$@"
}
