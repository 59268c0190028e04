#!/usr/bin/env bash
# A real Slurm on this one machine, for running tests/slurm/run.sh against it instead of the stand-ins
# (CORAG_SLURM=real): munged, one slurmctld and one `slurmd -N nodeI` per fake node (node1, node2), each
# node of 2 CPUs, 10000 MB and 2 fake GPUs (gres.conf: File=/dev/tty*), every daemon on loopback, as
# root, all state under DIR (default /tmp/corag-slurm). Needs Debian's slurmctld, slurmd, slurm-client
# and munge (Slurm 22.05); see DESIGN.md, "A real Slurm on one machine".
#
#   eval "$(bash tests/slurm/real_slurm.sh [start] [DIR])"   # prints: export SLURM_CONF=DIR/slurm.conf
#   CORAG_SLURM=real bash tests/slurm/run.sh
#   bash tests/slurm/real_slurm.sh stop [DIR]
#
# A second start reuses the daemons already running under DIR. Start waits until sinfo shows both nodes
# idle (CORAG_SLURM_WAIT seconds, default 90) and otherwise fails in one line naming what did not come
# up and its log. Stop cancels the cluster's jobs and ends the daemons it started (munged only if this
# script started it), by their pid files.
set -euo pipefail
action=start
case "${1:-}" in start | stop) action=$1; shift ;; esac
dir=${1:-/tmp/corag-slurm}
dir=$(mkdir -p "$dir" && cd "$dir" && pwd)
conf=$dir/slurm.conf
nodes=(node1 node2)
wait_s=${CORAG_SLURM_WAIT:-90}
export SLURM_CONF=$conf
say() { echo "real_slurm.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2> /dev/null; }  # a pid file whose process runs
munge_ok() { munge -n 2> /dev/null | unmunge > /dev/null 2>&1; }

stop_pid() {  # the process of a pid file: TERM, then KILL after 10 s
  local file=$1 pid
  alive "$file" || return 0
  pid=$(cat "$file")
  kill "$pid" 2> /dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || return 0; sleep 0.2; done
  kill -9 "$pid" 2> /dev/null || true
}

if [[ "$action" == stop ]]; then
  if alive "$dir/slurmctld.pid"; then
    mapfile -t jobs < <(squeue -h -o %A 2> /dev/null || true)
    [[ ${#jobs[@]} -eq 0 ]] || scancel "${jobs[@]}" 2> /dev/null || true
  fi
  for node in "${nodes[@]}"; do stop_pid "$dir/slurmd-$node.pid"; done
  stop_pid "$dir/slurmctld.pid"
  if [[ -f "$dir/munged.started" ]]; then stop_pid /run/munge/munged.pid; rm -f "$dir/munged.started"; fi
  say "stopped the Slurm under $dir"
  exit 0
fi

for tool in munged slurmctld slurmd sbatch sinfo; do
  command -v "$tool" > /dev/null || die "no $tool here (apt-get install -y slurmctld slurmd slurm-client munge)"
done
[[ $(id -u) == 0 ]] || die "run as root (slurmd starts the jobs as their users)"
host=$(hostname -s)
mkdir -p "$dir/state" "$dir/log" "$dir/spool"

# munge: the key the package wrote; one daemon for the whole machine
if ! munge_ok; then
  mkdir -p /run/munge && chown munge:munge /run/munge
  munged --force 2> "$dir/log/munged.err" || die "munged did not start: $(head -n 1 "$dir/log/munged.err")"
  touch "$dir/munged.started"
  for _ in $(seq 50); do munge_ok && break; sleep 0.2; done
  munge_ok || die "munged does not answer (munge -n | unmunge; see /var/log/munge/munged.log)"
fi

running=0
alive "$dir/slurmctld.pid" && running=1
if (( ! running )); then  # a fresh configuration (the running daemons keep the one they read)
  cat > "$conf" << EOF
# A one-machine Slurm for tests/slurm/run.sh (written by tests/slurm/real_slurm.sh)
ClusterName=corag
SlurmctldHost=$host
SlurmctldPort=16817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits for the credential lifetime before it may start again (default 120 s), and a job
# whose begin time passed waits for the next scheduling pass (default 60 s): both shortened for tests
AuthInfo=cred_expire=30
SchedulerParameters=sched_interval=5,bf_interval=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
# each step bound to the job's CPUs: the node runner logs what it may use (os.sched_getaffinity)
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
KillWait=10
NodeName=node1 NodeHostname=$host NodeAddr=127.0.0.1 Port=17001 CPUs=2 RealMemory=10000 Gres=gpu:2 State=UNKNOWN
NodeName=node2 NodeHostname=$host NodeAddr=127.0.0.1 Port=17002 CPUs=2 RealMemory=10000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
# a partition of 1 h jobs: a longer --time would wait for good (PartitionTimeLimit); corag submit refuses it
PartitionName=short Nodes=node[1-2] MaxTime=01:00:00 State=UP OverSubscribe=FORCE:4
EOF
  # Fake GPUs: without File= the nodes register as INVAL (gres/gpu count reported lower than configured)
  echo "NodeName=node[1-2] Name=gpu File=/dev/tty[0-1]" > "$dir/gres.conf"
  slurmctld -f "$conf" 2> "$dir/log/slurmctld.err" || die "slurmctld did not start: $(head -n 1 "$dir/log/slurmctld.err") (log $dir/log/slurmctld.log)"
fi
for _ in $(seq 50); do scontrol ping 2> /dev/null | grep -q UP && break; sleep 0.2; done
scontrol ping 2> /dev/null | grep -q UP || die "slurmctld does not answer (scontrol ping; log $dir/log/slurmctld.log)"
for node in "${nodes[@]}"; do
  alive "$dir/slurmd-$node.pid" && continue
  slurmd -N "$node" -f "$conf" 2> "$dir/log/slurmd-$node.err" \
    || die "slurmd of $node did not start: $(head -n 1 "$dir/log/slurmd-$node.err") (log $dir/log/slurmd-$node.log)"
done
# Up: both nodes idle (or running jobs, when an earlier start's cluster is reused)
deadline=$(( SECONDS + wait_s ))
while :; do
  down=()
  for node in "${nodes[@]}"; do
    state=$(sinfo -h -n "$node" -o %T 2> /dev/null | head -n 1)
    [[ "$state" =~ ^(idle|mixed|allocated)$ ]] || down+=("$node (${state:-unknown})")
  done
  [[ ${#down[@]} -eq 0 ]] && break
  (( SECONDS < deadline )) || die "not up after ${wait_s} s: ${down[*]} (logs $dir/log/slurmd-<node>.log, $dir/log/slurmctld.log)"
  sleep 1
done
(( running )) && say "reusing the Slurm running under $dir" || say "started a Slurm under $dir"
say "$(sinfo -h -N -o '%N %T %c CPUs %m MB %G' | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
echo "export SLURM_CONF=$conf"
