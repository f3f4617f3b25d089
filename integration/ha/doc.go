// Package ha holds idem's failover soak, a test that runs only with the
// build tag "ha": it starts a PostgreSQL 15 cluster of its own, three
// members managed by Patroni with one etcd, all on loopback, and fails its
// primary over while workers write through idem.Do, idem.WithIdempotency in
// transactions of their own, the HTTP middleware and lease mode. Run it from the
// repository's root, as an ordinary user or as root (PostgreSQL refuses to
// run as root, so Patroni then runs as the postgres OS user):
//
//	go test -tags ha -race -count=1 -v ./integration/ha -ha.duration 60s
//
// It needs Debian's patroni, etcd-server and etcd-client packages and the
// PostgreSQL 15 binaries in /usr/lib/postgresql/15/bin:
//
//	apt-get update && DEBIAN_FRONTEND=noninteractive \
//	    apt-get install -y --no-install-recommends patroni etcd-server etcd-client
//
// Without them the test skips, unless the environment variable CI is set,
// when it fails. The cluster takes the loopback ports 5441-5443
// (PostgreSQL), 8441-8443 (Patroni's REST API), 2379 and 2380 (etcd) and
// lives in the test's temporary directory; the machine's own PostgreSQL is
// not touched. cluster.sh, next to the test, starts and stops it and fails
// its primary over; it also works by hand:
//
//	HA_DIR=/tmp/idem-ha integration/ha/cluster.sh up
//	HA_DIR=/tmp/idem-ha integration/ha/cluster.sh status
//	HA_DIR=/tmp/idem-ha integration/ha/cluster.sh down
//
// Patroni runs with synchronous_mode on (-ha.sync=false turns it off, as
// HA_SYNC=false does for a cluster started by hand), a leader lease of 10 s, a one-second loop and
// primary_start_timeout 0, so that a killed postmaster is failed over at
// once rather than restarted in place.
//
// The workers connect with one multi-host connection string
// (target_session_attrs=read-write, every member, connect_timeout=2), two
// per mode (-ha.workers spreads them), and send requests whose keys partly
// repeat, retrying each with the same key
// until it is acknowledged, as a real client would. Meanwhile the test
// fails the primary over -ha.failovers times, cycling through a kill -9 of
// the primary's postmaster (Patroni lives on and promotes the synchronous
// standby), a crash of the whole node (Patroni and postmaster killed
// together; the leader lease runs out, then the node is started again) and
// a planned switchover, and waits each time for the old primary to rejoin
// as a replica. A checker then reads, on the final primary, the effects
// table, which has no unique constraint, and reports lost acknowledged
// writes, duplicates, how many ambiguous answers (idem.ErrOutcomeUnknown)
// the retries settled, the longest time without an acknowledgement, and
// every distinct error the callers saw, with counts. It also fails on an
// error that Do reported as definite (nothing committed) when the same
// request's retry then replayed while no other request had touched the
// key: that attempt had committed after all. Records and business rows
// commit together, so it also fails on a record without its business row
// or a row without its record. With -ha.sync=false acknowledged writes may
// be lost in a failover: the soak counts them, checks that each loss is
// whole, and retries each lost key, which must run once. Callers of Do
// and of the middleware must see no error but idem.ErrOutcomeUnknown (Do
// retries the rest on a fresh connection, idem.RetryPolicy.Outage). In
// lease mode, a downstream service refuses fencing tokens below one it has
// seen, one holder in twenty stalls past its one-second lease while
// another request of its key arrives, and the soak fails if a holder of
// attempt n completes after attempt n+1 was claimed, or (synchronous mode)
// if a key's claimed attempts ever go down. -ha.kinds picks the failover
// kinds to cycle through.
//
//	go test -tags ha -race -count=1 -v ./integration/ha -ha.duration 60s -ha.sync=false
package ha
