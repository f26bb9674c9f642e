package transport

import "time"

// SetStaleProbeAfter changes when idle connections are probed, for the
// duration of a test.
func SetStaleProbeAfter(d time.Duration) (restore func()) {
	old := staleProbeAfter
	staleProbeAfter = d
	return func() { staleProbeAfter = old }
}
