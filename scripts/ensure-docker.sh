#!/usr/bin/env bash
# Sourced by scripts/test.sh and scripts/with-docker.sh (after scripts/exit-hooks.sh): make
# CONVEYOR_TEST_DOCKER_HOST answer, with the suite's test images loaded (tests/support/docker_images.py).
#
# - CONVEYOR_TEST_DOCKER=0 skips the container tests deliberately (pytest's summary says so).
# - A CONVEYOR_TEST_DOCKER_HOST set beforehand (Docker's or Podman's socket) is used as it is.
# - Otherwise a private dockerd runs with its data, exec root, pid file and socket under a temporary
#   directory, and is stopped at exit. It is started so that it changes the host as little as can be:
#   its own bridge (cvyd-*, created here, on a free 10.213.N.0/24) instead of docker0, no iptables/nft
#   rules (--iptables=false), ip_forward left alone (--ip-forward=false), its containers' cgroups under
#   /cvyd-*. What it does change (that bridge, the br-* bridges of networks tests create, the netns and
#   overlay mounts under its directory, its cgroups) is undone at exit, and by the next run when this
#   one was killed before it could (the directory names the shell that owns it).
# Installs docker.io, debootstrap and busybox-static with apt-get when absent and running as root.
# at_exit (scripts/exit-hooks.sh) stops what this starts; a script that did not source it gets it here.
declare -F at_exit >/dev/null || source scripts/exit-hooks.sh

CONVEYOR_DOCKER_PREFIX=/tmp/conveyor-docker.

docker_help() {
  cat >&2 <<'MSG'
The container tests need a Docker engine. Either:
  - run the tests as root on Debian or Ubuntu: scripts/test.sh installs docker.io and starts a private dockerd;
  - or start Docker or Podman yourself and point the tests at its socket, e.g.
      export CONVEYOR_TEST_DOCKER_HOST=unix:///var/run/docker.sock
      export CONVEYOR_TEST_DOCKER_HOST=unix://$XDG_RUNTIME_DIR/podman/podman.sock   (systemctl --user start podman.socket)
    (the test images are built with Debian's debootstrap and busybox-static: see docs/operations.md);
  - or skip them deliberately: CONVEYOR_TEST_DOCKER=0.
MSG
}

docker_engine_answers() {
  .venv/bin/python -m tests.support.docker_images ping --host "$1" >/dev/null 2>&1
}

# The start time of a process (field 22 of /proc/PID/stat), so a reused pid is not taken for its owner.
process_start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  set -- $stat
  echo "${20}"
}

# Whether a process runs (a zombie does not: an engine whose parent is gone may wait long to be reaped).
process_running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# Stop the engine of one directory and undo what it changed; safe to run twice, and on a half-made directory.
cleanup_docker_dir() {
  local dir=$1 BRIDGE="" FORWARD_BEFORE="" pid="" i
  [ -d "$dir" ] || return 0
  # shellcheck disable=SC1091
  [ -f "$dir/state" ] && . "$dir/state"
  pid=$(cat "$dir/dockerd.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && grep -qaF -- "$dir/" "/proc/$pid/cmdline" 2>/dev/null; then
    if command -v docker >/dev/null 2>&1; then
      # Containers and networks first: the engine then removes their netns, veths and br-* bridges itself.
      local sock="unix://$dir/docker.sock" ids
      ids=$(timeout 60 docker -H "$sock" ps -aq 2>/dev/null || true)
      [ -n "$ids" ] && timeout 120 docker -H "$sock" rm -f $ids >/dev/null 2>&1 || true
      timeout 60 docker -H "$sock" network prune -f >/dev/null 2>&1 || true
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 200); do process_running "$pid" || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  # What a killed engine leaves running: its containers' processes (by cgroup), its containerd and shims.
  if [ -n "$BRIDGE" ]; then
    find /sys/fs/cgroup -path "*/$BRIDGE/*" -name cgroup.procs 2>/dev/null | while read -r procs; do
      while read -r child; do kill -KILL "$child" 2>/dev/null || true; done <"$procs"
    done
  fi
  local cmdline
  for cmdline in $(grep -laF -- "$dir/" /proc/[0-9]*/cmdline 2>/dev/null || true); do
    cmdline=${cmdline#/proc/}
    kill -KILL "${cmdline%/cmdline}" 2>/dev/null || true
  done
  # br-<network id> bridges of networks this engine created and could not remove (it was killed).
  local db="$dir/data/network/files/local-kv.db" link
  if [ -f "$db" ]; then
    for link in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep '^br-' || true); do
      if grep -qaF -- "${link#br-}" "$db"; then ip link delete "$link" 2>/dev/null || true; fi
    done
  fi
  # Mounts under the directory (netns files, overlay layers), deepest first.
  awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r | while read -r mount; do
    umount -l "$mount" 2>/dev/null || true
  done
  if [ -n "$BRIDGE" ]; then
    find /sys/fs/cgroup -depth -type d -path "*/$BRIDGE*" -exec rmdir {} \; 2>/dev/null || true
  fi
  [ -n "$BRIDGE" ] && ip link delete "$BRIDGE" 2>/dev/null || true
  if [ -n "$FORWARD_BEFORE" ] && [ "$(cat /proc/sys/net/ipv4/ip_forward)" != "$FORWARD_BEFORE" ]; then
    echo "$FORWARD_BEFORE" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
  fi
  rm -rf "$dir"
}

# Directories of earlier runs whose owning shell is gone (killed before its exit hooks ran).
reap_orphaned_docker_dirs() {
  local dir OWNER="" OWNER_START=""
  for dir in "$CONVEYOR_DOCKER_PREFIX"*; do
    [ -d "$dir" ] || continue
    OWNER="" OWNER_START=""
    # shellcheck disable=SC1091
    if [ -f "$dir/state" ]; then
      . "$dir/state"
    elif [ -n "$(find "$dir" -maxdepth 0 -newermt '-1 minute' 2>/dev/null)" ]; then
      continue # another run is creating it right now
    fi
    if [ -n "$OWNER" ] && [ "$(process_start_time "$OWNER" || true)" = "$OWNER_START" ]; then
      continue # its owner is still running
    fi
    echo "== removing the private Docker engine a killed run left in $dir"
    cleanup_docker_dir "$dir"
  done
}

# $1 = with-engine: docker.io too (else only what the images are built from).
install_docker_packages() {
  local packages=() created_policy=0
  if [ "${1:-}" = with-engine ]; then command -v dockerd >/dev/null 2>&1 || packages+=(docker.io); fi
  command -v debootstrap >/dev/null 2>&1 || packages+=(debootstrap)
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "ok installed" || packages+=(busybox-static)
  [ ${#packages[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${packages[*]} (install them, or run as root on Debian/Ubuntu)" >&2
    docker_help
    exit 1
  fi
  echo "== installing ${packages[*]}"
  # The packages' scripts would start a system dockerd and containerd: deny service starts meanwhile.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && created_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q "${packages[@]}" >/dev/null 2>&1; then
    apt-get update -q >/dev/null
    apt-get install -y -q "${packages[@]}" >/dev/null
  fi
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  return 0
}

free_bridge_subnet() {
  local n
  for n in $(seq 0 255); do
    if ! ip -4 route show 2>/dev/null | grep -q "^10\.213\.$n\." && ! ip -4 addr show 2>/dev/null | grep -q " 10\.213\.$n\."; then
      echo "10.213.$n"
      return 0
    fi
  done
  return 1
}

start_private_docker() {
  local dir suffix bridge subnet i
  dir=$(mktemp -d "${CONVEYOR_DOCKER_PREFIX}XXXXXX")
  PRIVATE_DOCKER_DIR=$dir
  at_exit stop_private_docker
  suffix=$(echo "${dir#"$CONVEYOR_DOCKER_PREFIX"}" | tr 'A-Z' 'a-z')
  bridge="cvyd-$suffix"
  subnet=$(free_bridge_subnet) || { echo "no free 10.213.N.0/24 for the test engine's bridge" >&2; exit 1; }
  # The engine's files live in memory: its layers (~200 MB) load faster, and removing them at exit does not
  # wait on the disk (rm -rf of an unpacked Debian image took 25 s on a disk mounted with `discard`).
  # (The state file is written inside it, so a run killed later leaves the file for the next run to find.)
  mount -t tmpfs -o "size=${CONVEYOR_TEST_DOCKER_TMPFS_SIZE:-6g},mode=0700" conveyor-docker "$dir"
  cat >"$dir/state" <<STATE
OWNER=$$
OWNER_START=$(process_start_time $$)
BRIDGE=$bridge
FORWARD_BEFORE=$(cat /proc/sys/net/ipv4/ip_forward)
STATE
  ip link add name "$bridge" type bridge
  ip addr add "$subnet.1/24" dev "$bridge"
  ip link set "$bridge" up
  # In a session of its own: a Ctrl-C meant for the tests must not stop it before its containers are removed.
  setsid dockerd \
    --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" -H "unix://$dir/docker.sock" \
    --bridge "$bridge" --iptables=false --ip-forward=false --cgroup-parent "/$bridge" \
    --containerd-namespace "$bridge" --containerd-plugins-namespace "$bridge-plugins" \
    >"$dir/dockerd.log" 2>&1 </dev/null &
  for i in $(seq 300); do
    docker_engine_answers "unix://$dir/docker.sock" && break
    if ! kill -0 $! 2>/dev/null; then break; fi
    sleep 0.1
  done
  if ! docker_engine_answers "unix://$dir/docker.sock"; then
    echo "the private dockerd did not start; its log ends:" >&2
    tail -20 "$dir/dockerd.log" >&2
    docker_help
    exit 1
  fi
  export CONVEYOR_TEST_DOCKER_HOST="unix://$dir/docker.sock"
  echo "== private Docker engine at $CONVEYOR_TEST_DOCKER_HOST (bridge $bridge, $subnet.0/24)"
}

stop_private_docker() {
  [ -n "${PRIVATE_DOCKER_DIR:-}" ] && cleanup_docker_dir "$PRIVATE_DOCKER_DIR"
  PRIVATE_DOCKER_DIR=""
}

if [ "${CONVEYOR_TEST_DOCKER:-1}" = 0 ]; then
  echo "== CONVEYOR_TEST_DOCKER=0: the container tests are skipped"
elif [ -n "${CONVEYOR_TEST_DOCKER_HOST:-}" ]; then
  if ! docker_engine_answers "$CONVEYOR_TEST_DOCKER_HOST"; then
    echo "no Docker engine answers at CONVEYOR_TEST_DOCKER_HOST=$CONVEYOR_TEST_DOCKER_HOST" >&2
    docker_help
    exit 1
  fi
  echo "== Docker engine at $CONVEYOR_TEST_DOCKER_HOST"
  install_docker_packages
  .venv/bin/python -m tests.support.docker_images ensure --host "$CONVEYOR_TEST_DOCKER_HOST"
else
  [ "$(id -u)" = 0 ] && reap_orphaned_docker_dirs
  install_docker_packages with-engine
  if [ "$(id -u)" != 0 ]; then
    echo "a private dockerd needs root" >&2
    docker_help
    exit 1
  fi
  start_private_docker
  .venv/bin/python -m tests.support.docker_images ensure --host "$CONVEYOR_TEST_DOCKER_HOST"
fi
