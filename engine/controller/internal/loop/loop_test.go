package loop

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
)

func TestRun(t *testing.T) {
	cases := []struct {
		name    string
		every   time.Duration
		useWake bool
	}{
		{"woken", time.Hour, true},
		{"ticked", time.Millisecond, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var logs ctltest.LogBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			ctx, cancel := context.WithCancel(context.Background())
			calls := make(chan struct{})
			wake := make(chan struct{})
			var w <-chan struct{}
			if tc.useWake {
				w = wake
			}
			// Two failures, a success, then the shutdown.
			n := 0
			done := make(chan struct{})
			go func() {
				defer close(done)
				Run(ctx, tc.every, w, log, "test step", func(ctx context.Context) error {
					n++
					switch n {
					case 4:
						cancel()
						return ctx.Err() // shutdown: not logged
					case 3:
						calls <- struct{}{}
						return nil
					}
					calls <- struct{}{}
					return errors.New("boom")
				})
			}()
			deadline := time.After(10 * time.Second)
			for range 3 {
				select {
				case <-calls:
				case <-deadline:
					t.Fatal("step not called")
				}
				if tc.useWake {
					select {
					case wake <- struct{}{}:
					case <-done:
					}
				}
			}
			select {
			case <-done:
			case <-deadline:
				t.Fatal("Run did not return after ctx ended")
			}
			if n != 4 {
				t.Fatalf("step ran %d times after cancel, want exactly 4 in all", n)
			}
			// The run of failures is a warning when it starts (the second
			// is debug), and its end is told once.
			out := logs.String()
			if strings.Count(out, "boom") != 1 || strings.Count(out, "level=WARN") != 1 ||
				!strings.Contains(out, `msg="test step: recovered" failures=2`) {
				t.Fatalf("want one warning and one recovery:\n%s", out)
			}
		})
	}
}
