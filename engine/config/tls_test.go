package config

import (
	"os"
	"path/filepath"
	"testing"
)

func TestTLSClientConfig(t *testing.T) {
	tc, err := TLS{Enabled: true}.ClientConfig("db.internal")
	if err != nil || tc.ServerName != "db.internal" || tc.RootCAs != nil {
		t.Fatalf("defaults: %+v, %v", tc, err)
	}
	tc, err = TLS{Enabled: true, ServerName: "other"}.ClientConfig("db.internal")
	if err != nil || tc.ServerName != "other" {
		t.Fatalf("serverName: %v, %v", tc.ServerName, err)
	}
	bad := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (TLS{CAFile: bad}).ClientConfig("h"); err == nil {
		t.Fatal("a CA file without PEM accepted")
	}
	if _, err := (TLS{CAFile: filepath.Join(t.TempDir(), "missing")}).ClientConfig("h"); err == nil {
		t.Fatal("a missing CA file accepted")
	}
}
