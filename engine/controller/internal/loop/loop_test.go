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
			n := 0
			done := make(chan struct{})
			go func() {
				defer close(done)
				Run(ctx, tc.every, w, log, "test step", func(ctx context.Context) error {
					n++
					if n == 3 {
						cancel()
						return ctx.Err() // shutdown: not logged
					}
					calls <- struct{}{}
					return errors.New("boom")
				})
			}()
			deadline := time.After(10 * time.Second)
			for range 2 {
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
			if n != 3 {
				t.Fatalf("step ran %d times after cancel, want exactly 3 in all", n)
			}
			if got := strings.Count(logs.String(), "boom"); got != 2 {
				t.Fatalf("%d errors logged, want 2 (the shutdown one is not):\n%s", got, logs.String())
			}
		})
	}
}
