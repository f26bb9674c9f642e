//go:build !linux

package testenv

import (
	"errors"
	"os/exec"
)

// runAs names the system user a child must run as (PostgreSQL refuses root).
type runAs struct{ uid, gid uint32 }

// setChildAttrs supports switching users only on Linux, the one platform the
// tests run as root on.
func setChildAttrs(cmd *exec.Cmd, as *runAs) error {
	if as != nil {
		return errors.New("running a child as another user is only supported on linux")
	}
	return nil
}
