//go:build linux

package testenv

import (
	"os/exec"
	"syscall"
)

// runAs names the system user a child must run as (PostgreSQL refuses root).
type runAs struct{ uid, gid uint32 }

// setChildAttrs makes the kernel kill the child if the test binary dies (for
// example on a -timeout panic, when no cleanup runs), so no database servers
// are left behind, and switches the child's user when asked to.
func setChildAttrs(cmd *exec.Cmd, as *runAs) error {
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if as != nil {
		attr.Credential = &syscall.Credential{Uid: as.uid, Gid: as.gid}
	}
	cmd.SysProcAttr = attr
	return nil
}
