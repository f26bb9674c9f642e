//go:build race

package dispatch_test

// raceEnabled: the race detector makes sync.Pool drop items on purpose,
// so allocation counts are meaningless under it.
const raceEnabled = true
