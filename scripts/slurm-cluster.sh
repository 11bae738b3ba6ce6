#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for the multi-host tests.
#
#   scripts/slurm-cluster.sh start DIR [PORT]   # prints "export SLURM_CONF=DIR/etc/slurm.conf"
#                                               # (its only line on stdout)
#   scripts/slurm-cluster.sh stop DIR
#
# One slurmctld and two `slurmd -N n1|n2` (NodeHostname=localhost, each on its own port),
# from Debian's slurm-wlm + munge (installed with apt-get when missing and running as root).
# Ports: PORT (or $SLURM_CLUSTER_PORT) is slurmctld's, PORT+1 slurmd's default, PORT+4 and
# PORT+5 the nodes'; without either, a free block is picked, so a second cluster (CI's,
# another test session's) never collides with this one. Everything lives under DIR
# (config, spool, logs, pid files); `stop` cancels every job of this cluster and ends the
# daemons whose pids its pid files hold. No gres: the tests simulate GPUs per node.
# $SLURM_CLUSTER_EXTRA_CONF (lines) is appended to slurm.conf (e.g. MaxStepCount=8 for a
# cluster whose jobs run out of steps).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
conf="$dir/etc/slurm.conf"

die() { echo "slurm-cluster: $*" >&2; exit 1; }

install_slurm() {
  command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    || die "slurmctld/munged missing and not root: install Debian's slurm-wlm and munge"
  local pkgs=(slurm-wlm munge)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null \
    || { apt-get update -qq \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; } \
    || die "apt-get install ${pkgs[*]} failed"
}

start_munge() {
  # One munged per host serves every cluster on it; start it only when none answers.
  if munge -n </dev/null >/dev/null 2>&1; then return 0; fi
  [ "$(id -u)" = 0 ] || die "munged is not running and only root can start it"
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null 2>&1; then
      mungekey -c -f -k /etc/munge/munge.key >&2
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  su -s /bin/sh munge -c munged >&2 || die "munged failed to start (see /var/log/munge/munged.log)"
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "munged started but does not answer (see /var/log/munge/munged.log)"
}

free_port_block() {
  # The first base in 20000..29990 (step 10) whose six ports are all free on localhost.
  python3 - <<'EOF'
import socket, random
bases = list(range(20000, 30000, 10))
random.shuffle(bases)
for base in bases:
    socks = []
    try:
        for p in range(base, base + 6):
            s = socket.socket(); socks.append(s)
            s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    break
else:
    raise SystemExit("no free block of 6 ports in 20000..29999")
EOF
}

write_conf() {
  local port=$1
  mkdir -p "$dir/etc" "$dir/spool/ctld" "$dir/spool/n1" "$dir/spool/n2" "$dir/log" "$dir/run"
  cat >"$conf" <<EOF
ClusterName=sgsup
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/spool/ctld
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName=n1 NodeHostname=localhost Port=$((port + 4)) CPUs=2 RealMemory=2000 State=UNKNOWN
NodeName=n2 NodeHostname=localhost Port=$((port + 5)) CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
${SLURM_CLUSTER_EXTRA_CONF:-}
EOF
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  if alive "$dir/run/slurmctld.pid"; then
    echo "export SLURM_CONF=$conf"
    return 0
  fi
  install_slurm
  start_munge
  local port=${3:-${SLURM_CLUSTER_PORT:-}}
  [ -n "$port" ] || port=$(free_port_block)
  write_conf "$port"
  export SLURM_CONF="$conf"
  slurmctld -i >&2 || die "slurmctld failed to start: $(tail -5 "$dir/log/slurmctld.log" 2>/dev/null)"
  slurmd -N n1 >&2 || die "slurmd -N n1 failed: $(tail -5 "$dir/log/slurmd-n1.log" 2>/dev/null)"
  slurmd -N n2 >&2 || die "slurmd -N n2 failed: $(tail -5 "$dir/log/slurmd-n2.log" 2>/dev/null)"
  # Ready when both nodes are idle (each slurmd registered with slurmctld).
  local states=""
  for _ in $(seq 200); do
    states=$(sinfo -h -N -o '%N=%t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
    case "$states" in *n1=idle*n2=idle*) echo "export SLURM_CONF=$conf"; return 0 ;; esac
    sleep 0.1
  done
  die "nodes not idle after 20 s (sinfo: ${states:-no answer}); logs in $dir/log"
}

stop() {
  [ -f "$conf" ] || return 0
  export SLURM_CONF="$conf"
  if alive "$dir/run/slurmctld.pid"; then
    # Every job of this cluster ends first, so no slurmstepd outlives its slurmd.
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      scancel -s KILL $jobs 2>/dev/null || true
      for _ in $(seq 100); do
        [ -z "$(squeue -h -o %i 2>/dev/null || true)" ] && break
        sleep 0.1
      done
    fi
  fi
  local pidfile pid
  for pidfile in "$dir/run/slurmd-n1.pid" "$dir/run/slurmd-n2.pid" "$dir/run/slurmctld.pid"; do
    alive "$pidfile" || continue
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  done
  return 0
}

case "$cmd" in
  start) start "$@" ;;
  stop) stop ;;
  *) usage ;;
esac
