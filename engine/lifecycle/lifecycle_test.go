package lifecycle

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A NOTIFY_SOCKET owned by the test receives exactly the messages systemd
// would.
func TestNotifierMessages(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	n := NewNotifier(discardLogger())
	n.Ready()
	n.Reloading()
	n.Stopping()
	want := []string{"READY=1", "RELOADING=1\nMONOTONIC_USEC=", "STOPPING=1"}
	buf := make([]byte, 512)
	for _, w := range want {
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %q: %v", w, err)
		}
		if got := string(buf[:k]); !strings.HasPrefix(got, w) {
			t.Fatalf("got %q, want prefix %q", got, w)
		}
	}
}

func TestNotifierWithoutSystemdIsNoop(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	var logged bytes.Buffer
	n := NewNotifier(mustLogger(t, &logged))
	n.Ready()
	n.Watchdog(context.Background()) // returns at once: no watchdog configured
	if logged.Len() != 0 {
		t.Fatalf("no-op notifier logged: %s", logged.String())
	}
}

func TestNewLogger(t *testing.T) {
	var b bytes.Buffer
	l := mustLoggerFmt(t, &b, "warn", "json")
	l.Info("hidden")
	l.Warn("shown")
	if strings.Contains(b.String(), "hidden") || !strings.Contains(b.String(), `"msg":"shown"`) {
		t.Fatalf("level/format not applied: %s", b.String())
	}
	if _, err := NewLogger(&b, "loud", "text"); err == nil {
		t.Fatal("bad level accepted")
	}
	if _, err := NewLogger(&b, "info", "xml"); err == nil {
		t.Fatal("bad format accepted")
	}
}

func discardLogger() *slog.Logger { l, _ := NewLogger(&bytes.Buffer{}, "info", "text"); return l }

func mustLogger(t *testing.T, b *bytes.Buffer) *slog.Logger {
	return mustLoggerFmt(t, b, "debug", "text")
}

func mustLoggerFmt(t *testing.T, b *bytes.Buffer, level, format string) *slog.Logger {
	t.Helper()
	l, err := NewLogger(b, level, format)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
