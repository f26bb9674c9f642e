package main

import (
	"strings"
	"testing"
)

func TestSynthetic(t *testing.T) {
	got, err := synthetic([]string{"127.0.0.1:4001", "127.0.0.1:4002"}, 5, "u", "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 || got[0].Port != 4001 || got[1].Port != 4002 || got[4].Port != 4001 || got[3].Username != "u3" || got[3].Password != "p" {
		t.Fatalf("synthetic = %+v", got)
	}
	seen := map[string]bool{}
	for _, p := range got {
		if seen[p.Username] {
			t.Fatalf("duplicate username %s: unique keys must differ", p.Username)
		}
		seen[p.Username] = true
	}
	tests := []struct {
		name  string
		addrs []string
		count int
		want  string
	}{
		{"no addresses", nil, 5, "at least one address"},
		{"too many", []string{"127.0.0.1:1"}, maxSynthetic + 1, "at least one address"},
		{"not loopback", []string{"10.0.0.1:80"}, 1, "not a loopback IP"},
		{"no port", []string{"127.0.0.1"}, 1, "missing port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := synthetic(tt.addrs, tt.count, "", "")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	if m, err := parseMode("error500"); err != nil || m.String() != "error500" {
		t.Fatalf("parseMode(error500) = %v, %v", m, err)
	}
	if _, err := parseMode("explode"); err == nil {
		t.Fatal("unknown mode: want an error")
	}
}
