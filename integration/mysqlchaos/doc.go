// Package mysqlchaos holds idemmysql's chaos soak, a test that runs only
// with the build tag "chaos". It needs no database of yours: it installs a
// MariaDB data directory in a temporary directory (mariadb-install-db),
// starts mariadbd on it on a free loopback port, and stops it at the end.
// Without mariadb-install-db and mariadbd it skips, unless CI is set, when
// it fails. From the repository's root:
//
//	go test -tags chaos -race -count=1 -v ./integration/mysqlchaos -chaos.duration 30s
//
// Workers send requests whose keys mostly repeat through idemmysql.Do,
// idemmysql.WithIdempotency in the caller's *sql.Tx (both with the
// driver's prepared statements and with interpolateParams=true) and
// idemmysql.ConsumeOnce, and through Do and WithIdempotency on hot keys
// (four workers on the same three keys, so that duplicates queue behind a
// first execution's row lock), retrying each with the same key as a real
// client would. They reach the server through a proxy that reads the MySQL
// protocol and can cut a connection at COMMIT: half the cuts forward the
// COMMIT first, so the transaction commits, half instead of forwarding it,
// so it rolls back, and the client cannot tell which. Meanwhile a chaos
// loop kills the workers' connections on the server (KILL CONNECTION),
// cancels their contexts, opens windows in which the proxy cuts COMMITs,
// and restarts MariaDB twice on the same data directory and port: stopped
// with SIGTERM at a third of the run, with SIGKILL (crash recovery) at two
// thirds; -chaos.restart=false leaves the server up.
//
// A checker then reads the business table, which has no unique key, and
// reports lost acknowledged writes, keys with two effects, effects that no
// request asked for or that differ from the acknowledged value, effects of
// attempts that failed with an error saying nothing committed, and how many
// ambiguous answers (idem.ErrOutcomeUnknown, or a failed COMMIT of the
// caller's own transaction) the retries settled. Any of the first five
// fails the test, as does an ambiguous answer left unsettled.
//
// For a longer soak, raise the duration, and the workers per path with
// -chaos.workers (2 by default; the hot-key paths have two more):
//
//	go test -tags chaos -race -count=1 -v -timeout 30m ./integration/mysqlchaos -chaos.duration 10m -chaos.workers 4
//
// TestCommitCuts checks the two cuts one at a time: the forwarded COMMIT
// committed and Do replays it, the dropped one did not and Do runs fn once.
package mysqlchaos
