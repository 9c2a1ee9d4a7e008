#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the tests (tests/test_slurm.py):
#   bash tests/slurm/local_cluster.sh start DIR   # munged, slurmctld and slurmd under DIR
#   bash tests/slurm/local_cluster.sh stop DIR    # stops them and removes DIR
# Then `SLURM_CONF=DIR/slurm.conf srun -n 3 ...` runs here. Needs root and Debian's
# slurm-wlm and munge packages (`.ci/run` installs them). The node claims 8 CPUs
# whatever the machine has, so 2-3 tasks of a test fit on a 2-core machine.
set -euo pipefail
action=${1:?usage: local_cluster.sh start|stop DIR}
dir=${2:?usage: local_cluster.sh start|stop DIR}
node=$(hostname -s)

stop() {
  if [ -f "$dir/slurm.conf" ]; then  # jobs first: their tasks outlive slurmd
    SLURM_CONF="$dir/slurm.conf" scancel --full --user "$(id -un)" 2>/dev/null || true
    sleep 1
  fi
  for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 0.5
  for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  done
  rm -rf "$dir"
}

start() {
  for tool in munged slurmctld slurmd srun; do
    command -v "$tool" >/dev/null || { echo "local_cluster.sh: $tool not found (apt-get install slurm-wlm munge)" >&2; exit 3; }
  done
  mkdir -p "$dir/state" "$dir/spool"
  chmod 755 "$dir"
  dd if=/dev/urandom of="$dir/munge.key" bs=1 count=1024 status=none
  chmod 600 "$dir/munge.key"
  munged --force --key-file "$dir/munge.key" --socket "$dir/munge.socket" \
    --pid-file "$dir/munged.pid" --log-file "$dir/munged.log" --seed-file "$dir/munge.seed"
  cat > "$dir/slurm.conf" <<CONF
ClusterName=tfdisttest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$((20000 + RANDOM % 5000))
SlurmdPort=$((25000 + RANDOM % 5000))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF" -i
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 100); do
    if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
      echo "$SLURM_CONF"
      return 0
    fi
    sleep 0.2
  done
  echo "local_cluster.sh: the node did not become idle in 20 s:" >&2
  sinfo >&2 || true
  tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  stop
  exit 1
}

case "$action" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: local_cluster.sh start|stop DIR" >&2; exit 2 ;;
esac
