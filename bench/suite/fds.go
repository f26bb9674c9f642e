package suite

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// maxFDScan bounds the descriptors looked at per sample.
const maxFDScan = 1 << 20

// fdKinds counts a process's open descriptors by kind.
type fdKinds struct{ total, sockets, pipes int }

// countFDKinds reads /proc/<pid>/fd; zero when it cannot.
func countFDKinds(pid int) fdKinds {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	d, err := os.Open(dir)
	if err != nil {
		return fdKinds{}
	}
	names, _ := d.Readdirnames(maxFDScan)
	d.Close()
	var k fdKinds
	for _, n := range names {
		target, err := os.Readlink(dir + "/" + n)
		if err != nil {
			continue // closed meanwhile
		}
		k.total++
		switch {
		case strings.HasPrefix(target, "socket:"):
			k.sockets++
		case strings.HasPrefix(target, "pipe:"):
			k.pipes++
		}
	}
	return k
}

// watchFDKinds samples every half second until stop closes and returns
// the sample with the most descriptors.
func watchFDKinds(pid int, stop <-chan struct{}) fdKinds {
	var best fdKinds
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if k := countFDKinds(pid); k.total > best.total {
			best = k
		}
		select {
		case <-stop:
			return best
		case <-t.C:
		}
	}
}
