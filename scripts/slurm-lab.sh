#!/usr/bin/env bash
# A real single-machine Slurm 22.05 "cluster" for tests and benchmarks: no systemd, nothing in /etc.
#   munged + slurmctld + N slurmd (one per simulated node, all on 127.0.0.1, distinct ports)
#   + slurmrestd (local auth on a unix socket) + one declared node with no slurmd ("ghost").
#
#   scripts/slurm-lab.sh up           start (idempotent); prints `export ...` lines to eval
#   scripts/slurm-lab.sh env          print the `export ...` lines of a running lab
#   scripts/slurm-lab.sh status       one line per daemon; exit 0 only if all are alive
#   scripts/slurm-lab.sh ctld-stop    stop slurmctld only (SIGKILL: a crash, not a clean stop)
#   scripts/slurm-lab.sh ctld-start   start slurmctld again on the saved state
#   scripts/slurm-lab.sh down [--purge]   stop every daemon by the PID in its pid file
#
# Environment:
#   SLURM_LAB              lab directory (default /tmp/gpufleet-slurm-lab)
#   SLURM_LAB_PORT_BASE    ports: slurmctld BASE+17, slurmd n_i BASE+200+i,
#                          ghost BASE+299 (default 16800); pick another base for a parallel lab
#   SLURM_LAB_NODES        number of real slurmd nodes n1..nN (default 3)
#   SLURM_LAB_HC_INTERVAL  HealthCheckInterval in seconds (default 5)
#   SLURM_LAB_GHOST        1 (default): also declare "ghost", a node with no slurmd; 0: leave it out
#   SLURM_LAB_MAX_JOBS     MaxJobCount (default: Slurm's own, 10000); e.g. 120000 for a 100,000-job queue
#   SLURM_LAB_SCHED_PARAMS extra SchedulerParameters, comma-separated, after nohold_on_prolog_fail
#                          (default none), e.g. default_queue_depth=100,bf_max_job_test=100 for a long queue
#
# Hooks (the lab's slurm.conf points Prolog, Epilog and HealthCheckProgram at wrappers in etc/):
#   $SLURM_LAB/hooks/{prolog,epilog,healthcheck}[.<node>]  if executable, the wrapper runs it (the
#   node-specific one first) with SLURM_CONF exported; its exit status is the hook's exit status.
#   $SLURM_LAB/faults/<node>   the built-in health check drains <node> with the file's text.
# Needs root and: apt-get install -y slurm-wlm slurmctld slurmd slurmrestd slurm-client munge curl
set -euo pipefail
LAB="${SLURM_LAB:-/tmp/gpufleet-slurm-lab}"
N="${SLURM_LAB_NODES:-3}"
BASE="${SLURM_LAB_PORT_BASE:-16800}"
CTLD_PORT=$((BASE + 17)); NODE_PORT0=$((BASE + 200))
HC_INTERVAL="${SLURM_LAB_HC_INTERVAL:-5}"
GHOST="${SLURM_LAB_GHOST:-1}"
MAX_JOBS="${SLURM_LAB_MAX_JOBS:-}"
SCHED_PARAMS="${SLURM_LAB_SCHED_PARAMS:-}"
case "$MAX_JOBS" in ''|*[!0-9]*) [ -z "$MAX_JOBS" ] || { echo "slurm-lab: SLURM_LAB_MAX_JOBS=$MAX_JOBS: expected a number" >&2; exit 2; } ;; esac
case "$SCHED_PARAMS" in *[[:space:]]*) echo "slurm-lab: SLURM_LAB_SCHED_PARAMS must not contain spaces" >&2; exit 2 ;; esac
RUN="$LAB/run"
export SLURM_CONF="$LAB/etc/slurm.conf"

log() { echo "slurm-lab: $*" >&2; }

# A daemon that exited but is not yet reaped by PID 1 is a zombie: count it as gone
# (kill -0 still succeeds on a zombie; waiting for the reap costs ~2 s per daemon).
alive() {
  local st
  st="$(ps -o stat= -p "$1" 2>/dev/null || true)"
  [ -n "$st" ] && [ "${st#Z}" = "$st" ]
}
pid_of() { [ -f "$1" ] && cat "$1" 2>/dev/null || true; }
alive_file() { local p; p="$(pid_of "$1")"; [ -n "$p" ] && alive "$p"; }

stop_pidfile() { # stop_pidfile FILE [SIGNAL]: signal that PID, wait up to 10 s, then SIGKILL it
  local f="$1" sig="${2:-TERM}" pid
  [ -f "$f" ] || return 0
  pid="$(pid_of "$f")"
  if [ -n "$pid" ] && alive "$pid"; then
    kill "-$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

lab_job_pids() { # PIDs of this lab's slurmstepd and job processes (SLURM_CONF=<lab conf> in their environment)
  local d pid env
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    [ "$pid" = "$$" ] && continue
    env="$( { tr '\0' '\n' < "$d/environ"; } 2>/dev/null)" || continue
    printf '%s\n' "$env" | grep -qxF "SLURM_CONF=$SLURM_CONF" || continue
    if [ "$(cat "$d/comm" 2>/dev/null)" = slurmstepd ] || printf '%s\n' "$env" | grep -q '^SLURM_JOB_ID='; then
      alive "$pid" && echo "$pid"
    fi
  done
}

print_env() {
  cat <<ENV
export SLURM_LAB=$LAB
export SLURM_CONF=$SLURM_CONF
export SLURMRESTD_SOCKET=$RUN/slurmrestd.sock
export SLURM_LAB_NODES=$N
ENV
}

write_hook_wrapper() { # write_hook_wrapper NAME: etc/NAME.sh runs hooks/NAME.<node> or hooks/NAME
  local name="$1"
  cat > "$LAB/etc/$name.sh" <<HOOK
#!/bin/sh
# $name wrapper written by scripts/slurm-lab.sh: runs the lab's hook for this node, if any.
export SLURM_CONF="$SLURM_CONF"
n="\${SLURMD_NODENAME:-unknown}"
echo "\$(date +%s.%N) node=\$n job=\${SLURM_JOB_ID:-}" >> "$LAB/log/$name.log"
for h in "$LAB/hooks/$name.\$n" "$LAB/hooks/$name"; do
  if [ -x "\$h" ]; then exec "\$h"; fi
done
HOOK
  if [ "$name" = healthcheck ]; then
    cat >> "$LAB/etc/$name.sh" <<HC
if [ -f "$LAB/faults/\$n" ]; then
  scontrol update nodename="\$n" state=drain reason="healthcheck: \$(head -c 100 "$LAB/faults/\$n")"
fi
HC
  fi
  echo "exit 0" >> "$LAB/etc/$name.sh"
  chmod 755 "$LAB/etc/$name.sh"
}

write_conf() {
  local GHOST_NODE=""
  [ "$GHOST" = 1 ] && GHOST_NODE=",ghost"
  cat > "$SLURM_CONF" <<CONF
# Written by scripts/slurm-lab.sh ($(date -u +%FT%TZ)). One host, several slurmd (-N nX), all root.
ClusterName=gpufleetlab
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$NODE_PORT0
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$RUN/munge.socket
CredType=cred/munge
StateSaveLocation=$LAB/state
SlurmdSpoolDir=$LAB/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.%n.pid
SlurmctldLogFile=$LAB/log/slurmctld.log
SlurmdLogFile=$LAB/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=nohold_on_prolog_fail${SCHED_PARAMS:+,$SCHED_PARAMS}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LAB/log/jobcomp.log
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
MessageTimeout=5
InactiveLimit=0
MinJobAge=300
KillWait=2
Prolog=$LAB/etc/prolog.sh
Epilog=$LAB/etc/epilog.sh
HealthCheckProgram=$LAB/etc/healthcheck.sh
HealthCheckInterval=$HC_INTERVAL
HealthCheckNodeState=ANY
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
TopologyPlugin=topology/tree
NodeName=n[1-$N] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + 1))-$((NODE_PORT0 + N)) CPUs=2 RealMemory=1000 Feature=gpu,h100 Weight=10 State=UNKNOWN
PartitionName=low  Nodes=n[1-$N]$GHOST_NODE Default=YES MaxTime=INFINITE State=UP PriorityTier=1  PreemptMode=REQUEUE
PartitionName=high Nodes=n[1-$N]$GHOST_NODE Default=NO  MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
CONF
  [ -n "$MAX_JOBS" ] && echo "MaxJobCount=$MAX_JOBS" >> "$SLURM_CONF"
  if [ "$GHOST" = 1 ]; then
    echo "NodeName=ghost NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + 99)) CPUs=2 RealMemory=1000 State=UNKNOWN" >> "$SLURM_CONF"
  fi
  # topology/tree with one switch over every node: placement as without a topology, until a test
  # writes its own (gpufleet slurm topology-conf) and runs scontrol reconfigure.
  echo "SwitchName=lab Nodes=n[1-$N]$GHOST_NODE" > "$LAB/etc/topology.conf.default"
  cp "$LAB/etc/topology.conf.default" "$LAB/etc/topology.conf"
}

start_ctld() {
  alive_file "$RUN/slurmctld.pid" && return 0
  slurmctld -f "$SLURM_CONF"
  for _ in $(seq 1 80); do scontrol ping >/dev/null 2>&1 && return 0; sleep 0.25; done
  log "slurmctld did not answer scontrol ping; see $LAB/log/slurmctld.log"; return 1
}

cmd_up() {
  command -v slurmctld >/dev/null || { log "slurmctld not installed (apt-get install slurm-wlm slurmctld slurmd slurmrestd slurm-client munge curl)"; exit 1; }
  mkdir -p "$LAB"/{etc,state,spool,log,run,munge,faults,jobs,hooks}
  chmod 755 "$LAB" "$RUN"; chmod 700 "$LAB/munge"
  if alive_file "$RUN/slurmctld.pid"; then log "already up at $LAB"; print_env; return 0; fi

  # munge with its own key and socket (the socket dir must be world-searchable, the key dir not)
  [ -f "$LAB/munge/munge.key" ] || mungekey -c -k "$LAB/munge/munge.key" -b 1024 >/dev/null
  alive_file "$RUN/munged.pid" || munged --socket="$RUN/munge.socket" --key-file="$LAB/munge/munge.key" \
    --pid-file="$RUN/munged.pid" --log-file="$LAB/log/munged.log" --seed-file="$LAB/munge/munged.seed"
  for h in prolog epilog healthcheck; do write_hook_wrapper "$h"; done
  write_conf
  start_ctld
  for i in $(seq 1 "$N"); do
    alive_file "$RUN/slurmd.n$i.pid" || slurmd -f "$SLURM_CONF" -N "n$i"
  done
  # slurmrestd with local auth on a unix socket (no JWT plugin needed): as root it must be told
  # SLURMRESTD_SECURITY=disable_user_check, and it loads only the openapi plugin (the dbv0.0.x
  # plugins are fatal without slurmdbd).
  if ! alive_file "$RUN/slurmrestd.pid"; then
    rm -f "$RUN/slurmrestd.sock"
    SLURMRESTD_SECURITY=disable_user_check nohup slurmrestd -f "$SLURM_CONF" -a rest_auth/local \
      -s openapi/v0.0.38 "unix:$RUN/slurmrestd.sock" > "$LAB/log/slurmrestd.log" 2>&1 < /dev/null &
    echo $! > "$RUN/slurmrestd.pid"
  fi
  local ok=0
  for _ in $(seq 1 160); do
    if [ "$(sinfo -h -N -n "n[1-$N]" -t idle -o %N 2>/dev/null | sort -u | wc -l)" -eq "$N" ]; then ok=1; break; fi
    sleep 0.25
  done
  [ "$ok" = 1 ] || { log "nodes did not become idle: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"; exit 1; }
  for _ in $(seq 1 40); do [ -S "$RUN/slurmrestd.sock" ] && break; sleep 0.25; done
  log "up at $LAB: $(sinfo -h -N -o '%N:%T' | sort -u | tr '\n' ' ')"
  print_env
}

cmd_status() {
  local rc=0 f name
  [ -d "$RUN" ] || { echo "no lab at $LAB"; return 1; }
  for f in "$RUN"/munged.pid "$RUN"/slurmctld.pid "$RUN"/slurmd.*.pid "$RUN"/slurmrestd.pid; do
    name="$(basename "$f" .pid)"
    if [ -f "$f" ] && alive_file "$f"; then echo "$name up pid=$(pid_of "$f")"; else echo "$name down"; rc=1; fi
  done
  return "$rc"
}

cmd_down() {
  [ -d "$RUN" ] || { log "no lab at $LAB"; [ "${1:-}" = "--purge" ] && rm -rf "$LAB"; return 0; }
  # Cancel jobs through Slurm so job processes (which have no pid files) exit cleanly.
  if alive_file "$RUN/slurmctld.pid"; then
    local ids
    ids="$(timeout 5 squeue -h -o %i 2>/dev/null || true)"
    # shellcheck disable=SC2086
    [ -n "$ids" ] && timeout 10 scancel --quiet $ids 2>/dev/null || true
    for _ in $(seq 1 20); do
      [ -z "$(timeout 5 squeue -h -t R,CG 2>/dev/null || true)" ] && break; sleep 0.5
    done
  fi
  local f pid
  for f in "$RUN"/slurmrestd*.pid; do stop_pidfile "$f"; done
  for f in "$RUN"/slurmd.*.pid; do stop_pidfile "$f"; done
  # Job steps whose controller forgot them (e.g. after a slurmctld crash) outlive scancel and slurmd:
  # end this lab's slurmstepd and job processes, found by their SLURM_CONF, by PID.
  for pid in $(lab_job_pids); do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 30); do [ -z "$(lab_job_pids)" ] && break; sleep 0.1; done
  for pid in $(lab_job_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  stop_pidfile "$RUN/slurmctld.pid"
  stop_pidfile "$RUN/munged.pid"
  [ "${1:-}" = "--purge" ] && rm -rf "$LAB"
  log "stopped ($LAB)"
}

case "${1:-}" in
  up) cmd_up ;;
  env) print_env ;;
  status) cmd_status ;;
  ctld-stop) stop_pidfile "$RUN/slurmctld.pid" KILL; log "slurmctld killed" ;;
  ctld-start) start_ctld; log "slurmctld started" ;;
  down) shift; cmd_down "${1:-}" ;;
  *) echo "usage: $0 up|env|status|ctld-stop|ctld-start|down [--purge]" >&2; exit 2 ;;
esac
