#!/usr/bin/env bash
# A real single-node SLURM cluster on 127.0.0.1 for the integration tests (tests/slurm).
#
#   tests/slurm/cluster.sh start    install slurm-wlm + munge if missing, write the config,
#                                   start munged, slurmctld and slurmd, wait for the node
#   tests/slurm/cluster.sh stop     stop the three daemons by their PIDs, remove the config
#   tests/slurm/cluster.sh status   sinfo + squeue
#
# Needs root (it writes /etc/slurm/slurm.conf and runs the daemons) and Debian's packages;
# no systemd, cgroups or accounting database: proctrack/linuxproc, task/none, and jobs are
# tracked by slurmctld alone. Everything else lives in $CSE_SLURM_STATE (default
# /tmp/cse-slurm): PID files, logs, spool folders.
#
# The node advertises two GPUs as a generic resource backed by two placeholder device files,
# so `--gpus=1` requests are scheduled (two at a time) and SLURM sets CUDA_VISIBLE_DEVICES
# exactly as on a GPU node; nothing runs on a GPU.
#
# Settings the Snakemake SLURM executor needs on such a cluster (see docs/scale-out.md):
#  - the config must be /etc/slurm/slurm.conf: the executor strips SLURM_CONF before its
#    nested srun, which then reads the default path;
#  - MinJobAge (how long slurmctld remembers a finished job) must be at least 3x the
#    executor's --slurm-init-seconds-before-status-checks, or the executor falls back from
#    squeue to sacct, which without an accounting database never reports completion;
#  - batch_sched_delay=0 and DefMemPerCPU make jobs start within a second.
set -euo pipefail

STATE=${CSE_SLURM_STATE:-/tmp/cse-slurm}
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
MARKER="# written by cse-repro tests/slurm/cluster.sh"
NODE=localhost
# The node claims more than the machine has (nothing enforces it without cgroups) so that the
# SLURM profile's requests (8 CPUs and 32 GB per GPU job) fit unchanged, two jobs at a time.
CPUS=16
MEMORY_MB=65536
GPUS=2

log() { echo "cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v munged >/dev/null; then
        return
    fi
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get"
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >"$STATE/apt.log" 2>&1 \
        || { apt-get update -q >>"$STATE/apt.log" 2>&1 \
             && apt-get install -y -q slurm-wlm munge >>"$STATE/apt.log" 2>&1; } \
        || die "apt-get install slurm-wlm munge failed; see $STATE/apt.log"
}

write_config() {
    if [[ -e $CONF ]] && ! grep -qF "$MARKER" "$CONF"; then
        die "$CONF exists and was not written by this script; refusing to overwrite it"
    fi
    mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" "$STATE/gpu"
    local i
    for i in $(seq 0 $((GPUS - 1))); do
        # character devices aliasing /dev/null: SLURM only accepts devices as GPU files
        [[ -c $STATE/gpu/fake$i ]] || { rm -f "$STATE/gpu/fake$i"; mknod "$STATE/gpu/fake$i" c 1 3; }
    done
    cat >"$CONF" <<EOF
$MARKER
ClusterName=cse-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
MinJobAge=600
KillWait=5
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEMORY_MB Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$CONF_DIR/gres.conf" <<EOF
$MARKER
NodeName=$NODE Name=gpu File=$STATE/gpu/fake[0-$((GPUS - 1))]
EOF
}

# Start a daemon in the foreground of its own session and remember its PID.
spawn() {
    local name=$1
    shift
    setsid "$@" >"$STATE/$name.out" 2>&1 </dev/null &
    echo $! >"$STATE/$name.spawned"
}

running() { [[ -f $STATE/$1.spawned ]] && kill -0 "$(cat "$STATE/$1.spawned")" 2>/dev/null; }

wait_for() {
    local what=$1 seconds=$2
    shift 2
    for _ in $(seq $((seconds * 10))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    die "timed out after ${seconds}s waiting for $what (logs in $STATE)"
}

node_idle() { [[ $(sinfo -h -N -n "$NODE" -o %t 2>/dev/null) == idle ]]; }

start() {
    [[ $(id -u) == 0 ]] || die "must run as root (writes $CONF, runs the SLURM daemons)"
    mkdir -p "$STATE"
    install_packages
    write_config
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    if ! running munged; then
        [[ -s /etc/munge/munge.key ]] || mungekey --create --force
        chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
        spawn munged setpriv --reuid=munge --regid=munge --init-groups munged --foreground
        wait_for "munged" 10 munge -n
    fi
    running slurmctld || spawn slurmctld slurmctld -D -i
    wait_for "slurmctld" 20 scontrol ping
    running slurmd || spawn slurmd slurmd -D -N "$NODE"
    wait_for "node $NODE to be idle" 30 node_idle
    log "SLURM is up: $(sinfo -h -o '%P %a %D %t %G')"
}

no_jobs() { [[ -z $(squeue -h -o %i 2>/dev/null) ]]; }

stop() {
    local name pid jobs
    if running slurmctld; then  # jobs left by a failed test: their processes must end too
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086
            scancel $jobs
            wait_for "the remaining jobs to end" 30 no_jobs
        fi
    fi
    for name in slurmd slurmctld munged; do
        [[ -f $STATE/$name.spawned ]] || continue
        pid=$(cat "$STATE/$name.spawned")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        fi
        rm -f "$STATE/$name.spawned"
    done
    for file in "$CONF" "$CONF_DIR/gres.conf"; do
        if [[ -f $file ]] && grep -qF "$MARKER" "$file"; then rm -f "$file"; fi
    done
    rm -rf "$STATE/ctld" "$STATE/d" "$STATE/gpu"
    log "SLURM stopped"
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) sinfo && squeue ;;
    *) die "usage: $0 start|stop|status" ;;
esac
