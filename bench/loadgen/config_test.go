package loadgen

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr []string // substrings, all required
	}{
		{name: "defaults applied", cfg: Config{URL: "http://127.0.0.1:1/", Requests: 1}},
		{name: "no bound", cfg: Config{URL: "http://127.0.0.1:1/"}, wantErr: []string{"request count or a duration"}},
		{name: "every problem at once", cfg: Config{Mode: "udp", URL: "ftp://x/", Proxy: "socks5://p:1", Concurrency: -1, Rate: -1},
			wantErr: []string{"mode \"udp\"", "scheme must be http or https", "proxy \"socks5://p:1\"", "concurrency", "rate"}},
		{name: "tunnels need a duration", cfg: Config{Mode: ModeTunnels, URL: "http://127.0.0.1:1/", Tunnels: 10},
			wantErr: []string{"needs a duration"}},
		{name: "tunnels need a count", cfg: Config{Mode: ModeTunnels, URL: "http://127.0.0.1:1/", Duration: time.Second},
			wantErr: []string{"tunnels must be"}},
		{name: "duration over the hard bound", cfg: Config{URL: "http://127.0.0.1:1/", Duration: time.Hour, MaxDuration: time.Minute},
			wantErr: []string{"exceeds the hard bound"}},
		{name: "bad pid", cfg: Config{URL: "http://127.0.0.1:1/", Requests: 1, SUTPIDs: []int{0}}, wantErr: []string{"sut pid"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				c := tt.cfg
				if c.Mode != ModeHTTP || c.Concurrency != DefaultConcurrency || c.Timeout != DefaultTimeout ||
					c.MaxDuration != DefaultMaxDuration || c.Method != "GET" || c.Scenario != "http" {
					t.Fatalf("defaults not applied: %+v", c)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate: want an error")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	c := Config{Mode: ModeExtract, URL: "http://127.0.0.1:1/v1/extract", Requests: 1}
	if err := c.Validate(); err != nil || c.Method != "POST" || c.ExtractCount != DefaultExtractCount {
		t.Fatalf("extract defaults: %v, %+v", err, c)
	}
}
