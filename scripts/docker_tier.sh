#!/usr/bin/env bash
# The Docker tier's engine: `docker_tier.sh start STATE_DIR` makes a Docker engine answer, or
# says why none can; `docker_tier.sh stop STATE_DIR` stops the one it started.
#
# start prints one line and exits 0 when an engine answers:   ready <DOCKER_HOST>
#                   or exits 3 when none can be had:          unavailable: <reason>
# An engine that already answers is used as is. Otherwise Debian's docker.io is installed when
# dockerd is missing (as root, with apt-get), and dockerd is started with its state under
# STATE_DIR, without touching the host's network (no bridge, no iptables rules).
set -uo pipefail

action="${1:-}"
state="${2:-}"
if [ -z "$action" ] || [ -z "$state" ]; then
  echo "usage: $0 start|stop STATE_DIR" >&2
  exit 2
fi
mkdir -p "$state"
sock="unix://$state/docker.sock"
pidfile="$state/dockerd.pid"
log="$state/dockerd.log"

unavailable() {
  echo "unavailable: $*"
  exit 3
}

if [ "$action" = stop ]; then
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null
    rm -f "$pidfile"
  fi
  exit 0
fi
[ "$action" = start ] || { echo "unknown action $action" >&2; exit 2; }

if ! command -v docker >/dev/null 2>&1 && ! command -v dockerd >/dev/null 2>&1; then
  :
elif command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1; then
  echo "ready ${DOCKER_HOST:-unix:///var/run/docker.sock}"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    unavailable "dockerd is not installed and cannot be installed here (needs root and apt-get: apt-get install docker.io)"
  fi
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; } >"$state/apt.log" 2>&1; then
    unavailable "apt-get install docker.io failed: $(grep -E '^(E|W):' "$state/apt.log" | tail -1)"
  fi
fi
command -v docker >/dev/null 2>&1 || unavailable "the docker client is missing after installing docker.io"

dockerd --data-root "$state/root" --exec-root "$state/exec" -H "$sock" --pidfile "$pidfile" \
  --bridge=none --iptables=false >"$log" 2>&1 &
started=$!
for _ in $(seq 1 150); do
  if DOCKER_HOST="$sock" timeout 10 docker info >/dev/null 2>&1; then
    echo "ready $sock"
    exit 0
  fi
  kill -0 "$started" 2>/dev/null || break
  sleep 0.2
done
kill "$started" 2>/dev/null
reason=$(grep -E 'level=(fatal|error)|failed to start' "$log" | tail -1)
unavailable "dockerd did not start: ${reason:-$(tail -1 "$log")}"
