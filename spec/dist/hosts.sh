#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# spec/dist/hosts.sh — two hosts on one machine for spec/l2l/dist_faults_spec.lua: two network
# namespaces, each with its own address, joined by a veth pair (a cable between them), so
# that ranks in them talk over a real link that can be cut, not over loopback.
#   hosts.sh up NAME      makes NAME-a (10.231.0.1) and NAME-b (10.231.0.2), the link up
#   hosts.sh cut NAME     takes the link down (on host a's side: the cable pulled)
#   hosts.sh down NAME    removes both namespaces and the link
#   hosts.sh agent HOST COMMAND...   what mpirun runs to start a daemon on HOST (its
#             plm_rsh_agent, in place of ssh): COMMAND in HOST's namespace; the namespaces'
#             name comes from L2L_HOSTS (mpirun passes its environment on); the daemon's
#             own output goes to $TMPDIR/<NAME>-daemon-<HOST>.log
# Needs root (CAP_NET_ADMIN) and iproute2; `up` says why it cannot and exits 3 then.
set -uo pipefail

A=10.231.0.1 B=10.231.0.2
cmd=${1:-}
case $cmd in
  up)
    name=${2:?hosts.sh up NAME}
    command -v ip >/dev/null || { echo "iproute2's ip is not installed"; exit 3; }
    ip netns add "$name-a" 2>/dev/null || { echo "cannot make a network namespace (not root?)"; exit 3; }
    ip netns add "$name-b" &&
      ip link add "$name-va" type veth peer name "$name-vb" &&
      ip link set "$name-va" netns "$name-a" && ip link set "$name-vb" netns "$name-b" &&
      ip -n "$name-a" addr add $A/24 dev "$name-va" && ip -n "$name-b" addr add $B/24 dev "$name-vb" &&
      ip -n "$name-a" link set lo up && ip -n "$name-b" link set lo up &&
      ip -n "$name-a" link set "$name-va" up && ip -n "$name-b" link set "$name-vb" up || {
        echo "could not join the namespaces by a veth pair"; "$0" down "$name"; exit 3; }
    # the link is up when both ends say so (a veth's carrier comes up with its peer)
    for _ in $(seq 100); do
      if ip -n "$name-a" link show "$name-va" | grep -q LOWER_UP &&
         ip -n "$name-b" link show "$name-vb" | grep -q LOWER_UP; then exit 0; fi
      sleep 0.05
    done
    echo "the veth link did not come up"; "$0" down "$name"; exit 3 ;;
  cut)
    name=${2:?hosts.sh cut NAME}
    ip -n "$name-a" link set "$name-va" down ;;
  down)
    # what is left in them first (a daemon of OpenMPI's can outlive its job on a host cut
    # off: seen once in two runs), then the namespaces
    name=${2:?hosts.sh down NAME}
    for ns in "$name-a" "$name-b"; do
      pids=$(ip netns pids "$ns" 2>/dev/null)
      [[ -n $pids ]] && kill -9 $pids 2>/dev/null
      ip netns del "$ns" 2>/dev/null
    done
    exit 0 ;;
  agent)
    host=${2:?hosts.sh agent HOST COMMAND}; shift 2
    case $host in
      "$A") ns=${L2L_HOSTS:?}-a ;;
      "$B") ns=${L2L_HOSTS:?}-b ;;
      *) echo "hosts.sh agent: no host $host here" >&2; exit 1 ;;
    esac
    # (the daemon's own stdout and stderr to a file, not mpirun's: the ranks' output goes
    # to mpirun over the link, and a daemon that outlives its job must not hold a reader
    # of mpirun's output open)
    exec ip netns exec "$ns" sh -c "$*" > "${TMPDIR:-/tmp}/$L2L_HOSTS-daemon-$host.log" 2>&1 ;;
  *)
    echo "usage: hosts.sh up|cut|down NAME, or hosts.sh agent HOST COMMAND..." >&2; exit 2 ;;
esac
