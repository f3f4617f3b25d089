package pgtest

import (
	"os/user"
	"strconv"
	"syscall"
)

// procAttr starts PgBouncer in its own process group, so that a ^C to the
// tests reaches it only through Main's cleanup, as runAs when that is set,
// and has it killed if the test binary dies without cleaning up (a panic, a
// -timeout).
func procAttr(runAs *user.User) (*syscall.SysProcAttr, error) {
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if runAs != nil {
		uid, err := strconv.ParseUint(runAs.Uid, 10, 32)
		if err != nil {
			return nil, err
		}
		gid, err := strconv.ParseUint(runAs.Gid, 10, 32)
		if err != nil {
			return nil, err
		}
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return attr, nil
}
