#!/usr/bin/env bash
# Fault trials of parameter-server training (docs/parameter-server.md, "Failures"): N times, start
# a job of 2 servers x 2 trainers (`keel launch --server_num=2 --worker_num=2 keel train
# --model=mlp --ps_mode=MODE`), wait for trainer 0 to reach a random step, kill -9 one process of
# KIND (a random server or trainer), and check that
#   - the job ends (the launcher exits, non-zero) within the comm timeout + 5 s of the kill,
#   - the launcher's report names the killed process ("server 1 rank 1 (local 1, pid P) was
#     killed by signal SIGKILL"),
#   - nothing of the job is left running (no process in the launcher's session).
# With --direct the four processes are started without keel launch (Paddle's environment set by
# hand), so nobody stops the survivors: they must find the death through the parameter-server
# transport. The job's end is then the last survivor's exit, and the name is checked in the
# survivors' errors ("server 1 (rank 1)", "trainer 0 (rank 2)"); rc= is then the number of
# servers that failed (did not log that every trainer stopped).
# One line per trial, then a summary line; exits non-zero when any trial fails a check.
#
#   tools/ps_kill_trials.sh [--trials=N] [--kind=server|trainer|both] [--mode=sync|async|geo]
#                           [--comm_timeout_s=T] [--max_step=K] [--direct] KEEL_BINARY
# Defaults: 20 trials, both kinds (N trials of each), sync, T = 10, K = 40, under keel launch.
set -euo pipefail

trials=20
kind=both
mode=sync
timeout_s=10
max_step=40
direct=0
keel=
for a in "$@"; do
  case $a in
    --trials=*) trials=${a#*=} ;;
    --kind=*) kind=${a#*=} ;;
    --mode=*) mode=${a#*=} ;;
    --comm_timeout_s=*) timeout_s=${a#*=} ;;
    --max_step=*) max_step=${a#*=} ;;
    --direct) direct=1 ;;
    -*) echo "ps_kill_trials: unknown option $a" >&2; exit 2 ;;
    *) keel=$a ;;
  esac
done
[ -x "$keel" ] || { echo "usage: ps_kill_trials.sh [options] KEEL_BINARY (not executable: '$keel')" >&2; exit 2; }
case $kind in server|trainer|both) ;; *) echo "ps_kill_trials: --kind=$kind is not server, trainer or both" >&2; exit 2 ;; esac
case $mode in sync|async|geo) ;; *) echo "ps_kill_trials: --mode=$mode is not sync, async or geo" >&2; exit 2 ;; esac

now() { date +%s.%N; }

# env_of PID NAME: NAME's value in PID's environment.
env_of() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=//p"; }

# trial KIND INDEX: one trial; prints its line, returns 1 when a check fails.
trial() {
  local what=$1 n=$2
  local dir
  dir=$(mktemp -d)
  local step=$((RANDOM % max_step + 1))
  local geo=""
  [ "$mode" = geo ] && geo="--geo_k=4"
  local args=(train --model=mlp --mlp_hidden=64 --batch_size=16 --steps=100000 --progress=lines
    --seed=1 --ps_mode="$mode" $geo)
  if [ "$direct" = 1 ]; then
    # Paddle's variables as keel launch sets them, on free loopback ports; one session for all.
    local p
    p=($(python3 -c 'import socket
s=[socket.socket() for _ in range(4)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))'))
    mkdir -p "$dir/log"
    KEEL_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d " \n") \
      FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=$timeout_s KEEL="$keel" DIR="$dir" \
      PADDLE_PSERVERS_IP_PORT_LIST="127.0.0.1:${p[0]},127.0.0.1:${p[1]}" PADDLE_TRAINERS_NUM=2 \
      PADDLE_TRAINER_ENDPOINTS="127.0.0.1:${p[2]},127.0.0.1:${p[3]}" POD_IP=127.0.0.1 \
      P0=${p[0]} P1=${p[1]} setsid bash -c '
        TRAINING_ROLE=PSERVER PADDLE_PORT=$P0 "$KEEL" "$@" >"$DIR/log/serverlog.0" 2>&1 & echo $! >"$DIR/pid.server0"
        TRAINING_ROLE=PSERVER PADDLE_PORT=$P1 "$KEEL" "$@" >"$DIR/log/serverlog.1" 2>&1 & echo $! >"$DIR/pid.server1"
        TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=0 "$KEEL" "$@" >"$DIR/log/workerlog.0" 2>&1 & echo $! >"$DIR/pid.trainer0"
        TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=1 "$KEEL" "$@" >"$DIR/log/workerlog.1" 2>&1 & echo $! >"$DIR/pid.trainer1"
        wait' bash "${args[@]}" >"$dir/out" 2>&1 &
  else
    FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=$timeout_s setsid "$keel" launch --server_num=2 \
      --worker_num=2 --log_dir="$dir/log" "$keel" "${args[@]}" >"$dir/out" 2>&1 &
  fi
  local launcher=$!
  current=$launcher
  # Trainer 0 at the chosen step (its lines are flushed as they are printed).
  local deadline=$(($(date +%s) + 120))
  until grep -q "^step $step " "$dir/log/workerlog.0" 2>/dev/null; do
    if ! kill -0 "$launcher" 2>/dev/null || [ "$(date +%s)" -gt "$deadline" ]; then
      echo "trial $n ($what): the job did not reach step $step: $(tail -n 3 "$dir/out" | tr '\n' ' ')"
      kill -9 -- "-$launcher" 2>/dev/null || true
      rm -rf "$dir"
      return 1
    fi
    sleep 0.02
  done
  # The victim among the launcher's children: a random server (by its port's place in the
  # server list) or trainer (by its id).
  local want=$((RANDOM % 2)) victim="" name=""
  local servers pid
  if [ "$direct" = 1 ]; then
    victim=$(cat "$dir/pid.$what$want")
    [ "$what" = server ] && name="server $want (rank $want)" || name="trainer $want (rank $((2 + want)))"
  fi
  for pid in $([ "$direct" = 1 ] || pgrep -P "$launcher"); do
    local role
    role=$(env_of "$pid" TRAINING_ROLE)
    if [ "$what" = server ] && [ "$role" = PSERVER ]; then
      servers=$(env_of "$pid" PADDLE_PSERVERS_IP_PORT_LIST)
      local port i=0 ep
      port=$(env_of "$pid" PADDLE_PORT)
      for ep in ${servers//,/ }; do
        [ "${ep##*:}" = "$port" ] && break
        i=$((i + 1))
      done
      [ "$i" = "$want" ] && { victim=$pid; name="server $i rank $i"; }
    elif [ "$what" = trainer ] && [ "$role" = TRAINER ] &&
      [ "$(env_of "$pid" PADDLE_TRAINER_ID)" = "$want" ]; then
      victim=$pid
      name="trainer $want rank $((2 + want))"
    fi
  done
  if [ -z "$victim" ]; then
    echo "trial $n ($what): found no $what $want among the launcher's children"
    kill -9 -- "-$launcher" 2>/dev/null || true
    rm -rf "$dir"
    return 1
  fi
  local t0 t1 rc=0
  kill -9 "$victim"
  t0=$(now)
  local limit=$((timeout_s + 5))
  # Wait for the launcher (a little past the limit, to measure a late end rather than hang).
  local waited=0
  while kill -0 "$launcher" 2>/dev/null && [ "$waited" -lt $((limit * 50 + 500)) ]; do
    sleep 0.02
    waited=$((waited + 1))
    # Who is still running 2 s after the kill (shown for a slow or failed trial).
    [ "$waited" = 100 ] && ps -o pid=,args= -s "$launcher" >"$dir/lingering" 2>/dev/null || true
  done
  t1=$(now)
  if kill -0 "$launcher" 2>/dev/null; then
    kill -9 -- "-$launcher" 2>/dev/null || true
    rc=hung
  else
    wait "$launcher" || rc=$?
  fi
  local secs
  secs=$(echo "$t1 - $t0" | bc)
  sleep 0.2
  local left
  left=$(pgrep -s "$launcher" | wc -l || true)
  local named=no
  if [ "$direct" = 1 ]; then
    # A survivor's error names the dead process.
    grep -q "$name" $(ls "$dir"/log/* | grep -v "$([ "$what" = server ] && echo serverlog || echo workerlog).$want") && named=yes
    rc=$(grep -L "every trainer stopped" "$dir"/log/serverlog.* | wc -l)  # servers that failed
  else
    grep -q "$name (local [0-9]*, pid $victim) was killed by signal SIGKILL" "$dir/out" && named=yes
  fi
  local ok=1
  [ "$rc" != 0 ] && [ "$rc" != hung ] || ok=0
  [ "$(echo "$secs <= $limit" | bc)" = 1 ] || ok=0
  [ "$named" = yes ] || ok=0
  [ "$left" = 0 ] || ok=0
  printf "trial %d: kill -9 %s (pid %s) at step %d: job ended in %.2f s (limit %d), rc=%s, named=%s, left running=%s%s\n" \
    "$n" "$name" "$victim" "$step" "$secs" "$limit" "$rc" "$named" "$left" "$([ $ok = 1 ] && echo '' || echo '  FAILED')"
  if [ $ok = 0 ] || { [ -n "${PS_KILL_TRIALS_SHOW_SLOW:-}" ] && [ "$(echo "$secs > 1" | bc)" = 1 ]; }; then
    for f in "$dir/out" "$dir"/log/*; do
      grep -v "^[IW]2\|^step " "$f" | tail -n 3 | sed "s|^|    ${f##*/}: |"
    done
    [ -s "$dir/lingering" ] && sed 's/^/    running 2 s after the kill: /' "$dir/lingering"
    pkill -9 -s "$launcher" 2>/dev/null || true
  fi
  echo "$secs" >>"$times.$what"
  rm -rf "$dir"
  [ $ok = 1 ]
}

times=$(mktemp)
current=""  # the session of the running trial's job: stopped when this script is
trap 'rm -f "$times" "$times".*; [ -z "$current" ] || pkill -9 -s "$current" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
failed=0
kinds=$kind
[ "$kind" = both ] && kinds="server trainer"
for k in $kinds; do
  : >"$times.$k"
  for n in $(seq "$trials"); do
    trial "$k" "$n" || failed=$((failed + 1))
  done
done
for k in $kinds; do
  sort -n "$times.$k" | awk -v k="$k" -v m="$mode" -v t="$timeout_s" '
    { v[NR] = $1 } END { if (NR) printf "summary %s kills (%s, comm timeout %d s): %d trials, end after kill: median %.2f s, max %.2f s\n", k, m, t, NR, v[int((NR + 1) / 2)], v[NR] }'
done
echo "failed checks: $failed"
[ "$failed" = 0 ]
