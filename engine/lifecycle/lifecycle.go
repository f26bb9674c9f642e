// Package lifecycle owns the process-level plumbing shared by every binary:
// systemd notification (READY, RELOADING, STOPPING, WATCHDOG), signal
// dispatch (SIGHUP reloads, SIGTERM/SIGINT stop) and the slog logger with
// its level and format. It must not import engine components.
package lifecycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// Notifier sends sd_notify messages. Outside systemd (no NOTIFY_SOCKET) every
// call is a no-op.
type Notifier struct{ log *slog.Logger }

// NewNotifier returns a notifier logging failures to log.
func NewNotifier(log *slog.Logger) *Notifier { return &Notifier{log: log} }

func (n *Notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify failed", "state", state, "err", err)
	}
}

// Ready tells systemd the service is up.
func (n *Notifier) Ready() { n.send(daemon.SdNotifyReady) }

// Reloading tells systemd a reload started; MONOTONIC_USEC lets systemd
// order it against the ReloadSignal it sent (Type=notify-reload).
func (n *Notifier) Reloading() {
	n.send(daemon.SdNotifyReloading + "\nMONOTONIC_USEC=" + strconv.FormatInt(monotonicUsec(), 10))
}

// Stopping tells systemd shutdown began.
func (n *Notifier) Stopping() { n.send(daemon.SdNotifyStopping) }

// Status sets the free-form status line shown by systemctl status.
func (n *Notifier) Status(s string) { n.send("STATUS=" + s) }

// Watchdog pings systemd every half WatchdogSec until ctx ends, when the
// unit enables the watchdog.
func (n *Notifier) Watchdog(ctx context.Context) {
	every, err := daemon.SdWatchdogEnabled(false)
	if err != nil || every == 0 {
		return
	}
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.send(daemon.SdNotifyWatchdog)
		}
	}
}

func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano() / 1000
}

// Signals delivers SIGHUP as reload requests and the first SIGTERM or
// SIGINT as a stop; a second stop signal exits at once.
type Signals struct {
	Reload <-chan struct{}
	Stop   <-chan os.Signal
	stop   func()
}

// WatchSignals starts signal delivery.
func WatchSignals() *Signals {
	hup := make(chan os.Signal, 1)
	term := make(chan os.Signal, 2)
	signal.Notify(hup, syscall.SIGHUP)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	reload := make(chan struct{}, 1)
	stop := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-hup:
				// Coalesce: a reload already pending covers this one.
				select {
				case reload <- struct{}{}:
				default:
				}
			case s := <-term:
				select {
				case stop <- s:
				default:
					fmt.Fprintln(os.Stderr, "second stop signal: exiting now")
					os.Exit(1)
				}
			}
		}
	}()
	return &Signals{Reload: reload, Stop: stop, stop: func() {
		signal.Stop(hup)
		signal.Stop(term)
		close(done)
	}}
}

// Close stops signal delivery.
func (s *Signals) Close() { s.stop() }

// NewLogger builds the process logger. Secrets are protected by their type
// (config.Secret implements slog.LogValuer), not by the handler.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}
