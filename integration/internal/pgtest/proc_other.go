//go:build !linux

package pgtest

import (
	"errors"
	"os/user"
	"syscall"
)

// procAttr gives PgBouncer no special attributes outside Linux; running the
// tests as root there is not supported.
func procAttr(runAs *user.User) (*syscall.SysProcAttr, error) {
	if runAs != nil {
		return nil, errors.New("running pgbouncer for the tests as root is supported on Linux only")
	}
	return nil, nil
}
