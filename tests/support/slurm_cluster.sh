#!/usr/bin/env bash
# tests/support/slurm_cluster.sh start|stop|kill-slurmd|start-slurmd DIR: a throwaway single-node
# Slurm for the Slurm executor's tests (ctest's slurm fixture; ../shared/design/ops-notes.md). munged,
# slurmctld and slurmd run in the foreground, in the background of this script, with their state,
# logs, PIDs and sockets (munge's, slurmd's steps') all in a short private directory that `start`
# makes under /tmp (mktemp), never under DIR: a socket's path must fit in sun_path (108 bytes, its
# NUL included), which a build tree in a clone at a long path does not. DIR (in the build tree) is a
# link to that directory, so DIR/slurm.conf is what SLURM_CONF must name; `stop` removes both. The
# node is `localhost` (127.0.0.1, 2 CPUs) in one default partition `kevo`. The ports come from DIR,
# so that two build trees' clusters do not collide. kill-slurmd and start-slurmd let a test fail the
# node. Missing binaries are an error, never a skip: CI must not pass without Slurm.
set -euo pipefail
usage="usage: slurm_cluster.sh start|stop|kill-slurmd|start-slurmd DIR"
action=${1:?$usage}
dir=${2:?$usage}

# The private directory DIR links to (DIR itself where an older run made it a directory); empty: none.
private_dir() {
  if [ -L "$dir" ]; then readlink "$dir"; elif [ -d "$dir" ]; then printf %s "$dir"; fi
}

for program in munged slurmctld slurmd srun scontrol sinfo; do
  if ! PATH=$PATH:/usr/sbin command -v "$program" >/dev/null; then
    echo "slurm_cluster.sh: $program is missing: install the slurm-wlm and munge packages (scripts/install-deps)" >&2
    exit 1
  fi
done
export PATH=$PATH:/usr/sbin
link=$dir
dir=$(private_dir)  # where everything below lives; empty before `start`
export SLURM_CONF=$dir/slurm.conf

# Signals the processes whose PIDs the files DIR/NAME.pid hold (SIGNAL, default TERM), all at once,
# and waits up to 5 s for them to go before SIGKILL.
stop_these() {
  local signal=$1 pids=() file pid
  shift
  for file in "$@"; do
    [ -f "$dir/$file.pid" ] || continue
    pid=$(cat "$dir/$file.pid")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "-$signal" "$pid" 2>/dev/null || true; pids+=("$pid"); fi
    rm -f "$dir/$file.pid"
  done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

# Started with -D (no daemonizing: nothing here would reap them), stdio to files so ctest's pipes close.
start_slurmd() {
  setsid slurmd -D -N localhost -f "$SLURM_CONF" </dev/null >>"$dir/slurmd.out" 2>&1 &
  echo $! >"$dir/slurmd.pid"
}

wait_for_idle_node() {
  for _ in $(seq 100); do
    case $(sinfo -h -n localhost -o %T 2>/dev/null) in idle|mixed|allocated) return 0 ;; esac
    sleep 0.1
  done
  echo "slurm_cluster.sh: the node never became idle: $(sinfo -h -N -o '%N %T %E' 2>&1)" >&2
  tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  return 1
}

case $action in
  start)
    if [ -n "$dir" ]; then "$0" stop "$link" || true; fi  # a cluster left by a run that was killed
    rm -rf "$link"
    dir=$(mktemp -d /tmp/kevo-slurm.XXXXXX)
    export SLURM_CONF=$dir/slurm.conf
    # The sockets: munge's, and slurmd's for each step (spool/localhost_JOB.STEP, 40 bytes allowed for
    # the name). Refused here, named, where they cannot fit.
    for socket in "$dir/munge/munge.socket" "$dir/spool/$(printf '%040d' 0)"; do
      if [ ${#socket} -gt 107 ]; then
        echo "slurm_cluster.sh: the Unix socket $socket is ${#socket} bytes, over the 107 that a socket path holds (sun_path, 108 bytes with its NUL)" >&2
        rm -rf "$dir"
        exit 1
      fi
    done
    mkdir -p "$(dirname "$link")"
    ln -s "$dir" "$link"
    chmod 0755 "$dir"  # munged, as the munge user, reaches its directory through it
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    if [ "$(id -u)" = 0 ]; then chown munge: "$dir/munge"; fi
    chmod 0700 "$dir/munge"
    port=$((20000 + $(printf %s "$link" | cksum | cut -d' ' -f1) % 20000))
    cat >"$SLURM_CONF" <<EOF
ClusterName=kevotest
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=2
InactiveLimit=0
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.daemon.pid
SlurmdPidFile=$dir/slurmd.daemon.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=kevo Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    munge_user=()
    if [ "$(id -u)" = 0 ]; then munge_user=(runuser -u munge --); fi
    setsid "${munge_user[@]}" munged -F -f --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
      --seed-file="$dir/munge/munged.seed" --log-file="$dir/munge/munged.log" </dev/null >>"$dir/munged.out" 2>&1 &
    echo $! >"$dir/munged.pid"
    for _ in $(seq 50); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
    [ -S "$dir/munge/munge.socket" ] || { echo "slurm_cluster.sh: munged did not start" >&2; cat "$dir/munged.out" "$dir/munge/munged.log" >&2 || true; exit 1; }
    setsid slurmctld -D -i -f "$SLURM_CONF" </dev/null >>"$dir/slurmctld.out" 2>&1 &
    echo $! >"$dir/slurmctld.pid"
    start_slurmd
    wait_for_idle_node
    timeout 20 srun -t 1 true || { echo "slurm_cluster.sh: a first srun failed" >&2; tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2; exit 1; }
    echo "Slurm on localhost (SLURM_CONF=$SLURM_CONF, ports $port and $((port + 1)); $link links to $dir)"
    ;;
  stop)
    if [ -n "$dir" ]; then
      if [ -f "$SLURM_CONF" ]; then timeout 5 scancel --full --user="$(id -un)" 2>/dev/null || true; fi
      stop_these TERM slurmd slurmctld
      stop_these KILL munge/munged munged  # it keeps nothing worth a graceful stop (seconds) here
      case $dir in /tmp/kevo-slurm.*) rm -rf "$dir" ;; esac
    fi
    rm -rf "$link"
    ;;
  kill-slurmd)
    [ -n "$dir" ] || { echo "slurm_cluster.sh: no cluster at $link (start one first)" >&2; exit 1; }
    stop_these KILL slurmd
    ;;
  start-slurmd)
    [ -n "$dir" ] || { echo "slurm_cluster.sh: no cluster at $link (start one first)" >&2; exit 1; }
    stop_these TERM slurmd
    start_slurmd
    wait_for_idle_node
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
