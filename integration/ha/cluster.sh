#!/usr/bin/env bash
# cluster.sh: a throw-away high-availability PostgreSQL 15 cluster on loopback,
# three members managed by Patroni with one etcd, for idem's failover soak.
#
# Usage: HA_DIR=/some/empty/dir cluster.sh COMMAND [ARG]
#
#   up             start etcd and three members from nothing; wait until a
#                  primary takes writes, every replica streams and (in sync
#                  mode) Patroni has published a synchronous standby
#   down           stop everything this directory's cluster started, fast
#                  (SIGKILL to Patroni, immediate shutdown of PostgreSQL),
#                  and remove the cluster's files (HA_KEEP=1 keeps them)
#   status         patronictl list
#   dsn            print the multi-host connection string
#   primary        print the leader's member number (1-3), exit 1 if none
#   wait-healthy   wait until there is a leader, every member streams from
#                  it and (sync mode) a synchronous standby is published
#   kill-primary   kill -9 the leader's postmaster; Patroni lives on and,
#                  with primary_start_timeout 0, fails over at once
#   crash-primary  kill -9 the leader's Patroni and postmaster together (the
#                  node dies; the leader lease must run out); start-member
#                  brings it back
#   switchover     patronictl switchover from the leader to its sync standby
#                  (to any replica in async mode)
#   start-member N start member N's Patroni again (after crash-primary)
#
# Every command that acts on the leader prints one line
# "member=N kind=KIND at_ns=UNIX_NANOSECONDS" on stdout.
#
# Settings (environment):
#   HA_DIR     the cluster's directory (required; created if missing). As
#              root, the postgres OS user must be able to reach it.
#   HA_SYNC    true (default) or false: Patroni's synchronous_mode
#   HA_PGBIN   PostgreSQL 15 binaries (default /usr/lib/postgresql/15/bin)
#
# Ports (loopback only, fixed): PostgreSQL 5441-5443, Patroni REST
# 8441-8443, etcd 2379 (client) and 2380 (peer). The machine's PostgreSQL on
# 5432 is never touched. Needs, on Debian 12:
#   apt-get update && DEBIAN_FRONTEND=noninteractive \
#     apt-get install -y --no-install-recommends patroni etcd-server etcd-client
# `up` exits with status 3 when a package is missing.
set -euo pipefail

N=3
SYNC=${HA_SYNC:-true}
PGBIN=${HA_PGBIN:-/usr/lib/postgresql/15/bin}
SCOPE=idemha
ETCD_CLIENT=2379
ETCD_PEER=2380

die() { echo "cluster.sh: $*" >&2; exit 1; }

[ -n "${HA_DIR:-}" ] || die "set HA_DIR to the cluster's directory"
case "$SYNC" in true | false) ;; *) die "HA_SYNC must be true or false, not '$SYNC'" ;; esac
mkdir -p "$HA_DIR"
BASE=$(cd "$HA_DIR" && pwd)

now_ns() { date +%s%N; }
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
own() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"; }
psql_at() { "$PGBIN/psql" -h 127.0.0.1 -p "544$1" -U postgres -X -Atq "${@:2}" postgres; }

patroni_pid() { # member -> Patroni PID, if it is still ours
	local f="$BASE/pg$1/patroni.pid" p
	[ -f "$f" ] && p=$(cat "$f") && alive "$p" && own "$p" "patroni $BASE/pg$1/patroni.yml" && echo "$p"
}
postmaster_pid() { # member -> postmaster PID, if it is still ours
	local f="$BASE/pg$1/data/postmaster.pid" p
	[ -f "$f" ] && p=$(head -1 "$f") && alive "$p" && own "$p" "$BASE/pg$1/data" && echo "$p"
}

leader() { # print the member whose Patroni answers GET /primary with 200
	local i
	for i in $(seq 1 $N); do
		if curl -fs -m 1 -o /dev/null "http://127.0.0.1:844$i/primary"; then
			echo "$i"
			return 0
		fi
	done
	return 1
}

check_packages() {
	local missing=""
	for c in patroni patronictl etcd etcdctl curl setpriv; do
		command -v "$c" >/dev/null 2>&1 || missing="$missing $c"
	done
	[ -x "$PGBIN/postgres" ] || missing="$missing $PGBIN/postgres"
	if [ -n "$missing" ]; then
		echo "cluster.sh: missing:$missing" >&2
		echo "install with: apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends patroni etcd-server etcd-client (and postgresql-15)" >&2
		exit 3
	fi
}

check_ports_free() {
	local p busy=""
	for p in $ETCD_CLIENT $ETCD_PEER 5441 5442 5443 8441 8442 8443; do
		if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then busy="$busy $p"; fi
	done
	[ -z "$busy" ] || die "ports already in use on 127.0.0.1:$busy (another cluster running? HA_DIR=... cluster.sh down)"
}

write_config() { # member
	local i=$1 d="$BASE/pg$1"
	mkdir -p "$d/log"
	cat >"$d/patroni.yml" <<EOF
scope: $SCOPE
namespace: /service/
name: pg$i
log:
  level: INFO
restapi:
  listen: 127.0.0.1:844$i
  connect_address: 127.0.0.1:844$i
etcd3:
  hosts: 127.0.0.1:$ETCD_CLIENT
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    primary_start_timeout: 0
    maximum_lag_on_failover: 1048576
    synchronous_mode: $SYNC
    synchronous_mode_strict: false
    synchronous_node_count: 1
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_connections: 100
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 128MB
        wal_retrieve_retry_interval: 500ms
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
    - data-checksums
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:544$i
  connect_address: 127.0.0.1:544$i
  data_dir: $d/data
  bin_dir: $PGBIN
  pgpass: $d/pgpass
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  basebackup:
    - checkpoint: fast
  parameters:
    unix_socket_directories: $d
    shared_buffers: 32MB
    logging_collector: "on"
    log_directory: $d/log
    log_filename: postgresql.log
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
EOF
}

start_member() { # member
	local i=$1 d="$BASE/pg$1"
	[ -f "$d/patroni.yml" ] || die "member $i has no configuration in $d (run up first)"
	[ -z "$(patroni_pid "$i" || true)" ] || die "member $i's Patroni is already running"
	if [ "$(id -u)" = 0 ]; then
		# PostgreSQL refuses to run as root. setpriv execs, so $! is Patroni.
		(cd "$d" && exec env HOME="$d" setpriv --reuid=postgres --regid=postgres --init-groups \
			patroni "$d/patroni.yml" >>"$d/patroni.log" 2>&1 </dev/null) &
	else
		(cd "$d" && exec env HOME="$d" patroni "$d/patroni.yml" >>"$d/patroni.log" 2>&1 </dev/null) &
	fi
	echo $! >"$d/patroni.pid"
}

# healthy: a leader, N-1 members streaming from it, and in sync mode a
# published synchronous standby that is one of them.
healthy() {
	local l n i
	l=$(leader) || return 1
	n=$(psql_at "$l" -c "select count(*) from pg_stat_replication where state = 'streaming' and application_name ~ '^pg[0-9]+\$'" 2>/dev/null) || return 1
	[ "${n:-0}" -ge $((N - 1)) ] || return 1
	for i in $(seq 1 $N); do # Patroni agrees: every other member runs as a replica
		[ "$i" = "$l" ] || curl -fs -m 1 -o /dev/null "http://127.0.0.1:844$i/replica" || return 1
	done
	[ "$SYNC" = true ] || { echo "$l"; return 0; }
	for i in $(seq 1 $N); do
		if [ "$i" != "$l" ] && curl -fs -m 1 -o /dev/null "http://127.0.0.1:844$i/sync"; then
			echo "$l"
			return 0
		fi
	done
	return 1
}

wait_healthy() { # timeout seconds
	local end=$(($(date +%s) + $1)) l
	while [ "$(date +%s)" -lt "$end" ]; do
		if l=$(healthy); then
			echo "healthy: leader pg$l"
			return 0
		fi
		sleep 0.1
	done
	echo "cluster.sh: not healthy after $1 s" >&2
	patronictl -c "$BASE/pg1/patroni.yml" list >&2 || true
	return 1
}

cmd_up() {
	check_packages
	check_ports_free
	[ ! -e "$BASE/etcd" ] || die "$BASE already holds a cluster (cluster.sh down first)"
	if [ "$(id -u)" = 0 ]; then
		id postgres >/dev/null 2>&1 || die "running as root, but there is no postgres OS user to run PostgreSQL as"
		setpriv --reuid=postgres --regid=postgres --init-groups test -x "$BASE" -a -r "$BASE" ||
			die "the postgres OS user cannot reach $BASE: make it and every directory above it searchable (chmod o+x)"
	fi
	local t0
	t0=$(now_ns)
	mkdir -p "$BASE/etcd"
	etcd --name e1 --data-dir "$BASE/etcd/data" \
		--listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
		--initial-cluster "e1=http://127.0.0.1:$ETCD_PEER" --initial-cluster-state new --initial-cluster-token "$SCOPE" \
		>"$BASE/etcd/etcd.log" 2>&1 </dev/null &
	echo $! >"$BASE/etcd/pid"
	local ok=""
	for _ in $(seq 150); do
		if ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$ETCD_CLIENT" endpoint health >/dev/null 2>&1; then ok=1; break; fi
		sleep 0.1
	done
	[ -n "$ok" ] || { tail -20 "$BASE/etcd/etcd.log" >&2; die "etcd not healthy after 15 s"; }
	local i
	for i in $(seq 1 $N); do write_config "$i"; done
	[ "$(id -u)" != 0 ] || chown -R postgres:postgres "$BASE"/pg*
	for i in $(seq 1 $N); do start_member "$i"; done
	if ! wait_healthy 120; then
		for i in $(seq 1 $N); do echo "--- pg$i patroni.log" >&2; tail -15 "$BASE/pg$i/patroni.log" >&2; done
		exit 1
	fi
	echo "up after $((($(now_ns) - t0) / 1000000)) ms (synchronous_mode: $SYNC)"
}

cmd_down() {
	local i p pats="" pms="" e=""
	for i in $(seq 1 $N); do
		p=$(patroni_pid "$i" || true)
		[ -z "$p" ] || pats="$pats $p"
		p=$(postmaster_pid "$i" || true)
		[ -z "$p" ] || pms="$pms $p"
	done
	[ -z "$pats" ] || kill -KILL $pats 2>/dev/null || true
	[ -z "$pms" ] || kill -QUIT $pms 2>/dev/null || true # immediate shutdown
	for _ in $(seq 100); do
		local a=0
		for p in $pats $pms; do alive "$p" && a=1; done
		[ $a = 0 ] && break
		sleep 0.1
	done
	for p in $pats $pms; do alive "$p" && kill -KILL "$p" 2>/dev/null || true; done
	if [ -f "$BASE/etcd/pid" ] && e=$(cat "$BASE/etcd/pid") && alive "$e" && own "$e" "--data-dir $BASE/etcd/data"; then
		kill -TERM "$e"
		for _ in $(seq 50); do alive "$e" || break; sleep 0.1; done
		alive "$e" && kill -KILL "$e" 2>/dev/null || true
	fi
	if [ "${HA_KEEP:-}" != 1 ]; then
		rm -rf "$BASE/etcd" "$BASE"/pg[0-9] "$BASE/switchover.log"
	fi
	echo "down"
}

cmd_kill_primary() {
	local l p
	l=$(leader) || die "no leader"
	p=$(postmaster_pid "$l") || die "no postmaster for the leader pg$l"
	kill -KILL "$p"
	echo "member=$l kind=postmaster-kill at_ns=$(now_ns)"
}

cmd_crash_primary() {
	local l p m
	l=$(leader) || die "no leader"
	p=$(patroni_pid "$l") || die "no Patroni for the leader pg$l"
	m=$(postmaster_pid "$l") || die "no postmaster for the leader pg$l"
	kill -KILL "$p" "$m"
	echo "member=$l kind=node-crash at_ns=$(now_ns)"
}

cmd_switchover() {
	local l c="" i
	l=$(leader) || die "no leader"
	for i in $(seq 1 $N); do
		[ "$i" != "$l" ] || continue
		if [ "$SYNC" != true ] || curl -fs -m 1 -o /dev/null "http://127.0.0.1:844$i/sync"; then c=$i; break; fi
	done
	[ -n "$c" ] || die "no candidate for a switchover from pg$l"
	local at
	at=$(now_ns)
	patronictl -c "$BASE/pg1/patroni.yml" switchover --leader "pg$l" --candidate "pg$c" --force "$SCOPE" >"$BASE/switchover.log" 2>&1 ||
		{ cat "$BASE/switchover.log" >&2; die "switchover from pg$l to pg$c failed"; }
	echo "member=$l kind=switchover at_ns=$at"
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) patronictl -c "$BASE/pg1/patroni.yml" list ;;
dsn) echo "postgres://postgres@127.0.0.1:5441,127.0.0.1:5442,127.0.0.1:5443/postgres?target_session_attrs=read-write&connect_timeout=2&sslmode=disable" ;;
primary) leader ;;
wait-healthy) wait_healthy "${2:-120}" ;;
kill-primary) cmd_kill_primary ;;
crash-primary) cmd_crash_primary ;;
switchover) cmd_switchover ;;
start-member)
	case "${2:-}" in 1 | 2 | 3) start_member "$2"; echo "started pg$2" ;; *) die "start-member needs a member number, 1 to $N" ;; esac
	;;
*) die "usage: HA_DIR=DIR cluster.sh up|down|status|dsn|primary|wait-healthy [SECONDS]|kill-primary|crash-primary|switchover|start-member N" ;;
esac
