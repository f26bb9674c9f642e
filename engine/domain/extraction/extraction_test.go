package extraction

import (
	"errors"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

func TestValidate(t *testing.T) {
	ok := Request{Count: 1, Fulfillment: Partial}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(r *Request){
		"zero count":      func(r *Request) { r.Count = 0 },
		"huge count":      func(r *Request) { r.Count = MaxCount + 1 },
		"bad fulfillment": func(r *Request) { r.Fulfillment = "most" },
		"bad protocol":    func(r *Request) { r.Filters.Protocol = "gopher" },
		"negative ttl":    func(r *Request) { r.Filters.MinRemainingTTL = -time.Second },
		"long key":        func(r *Request) { r.IdempotencyKey = string(make([]byte, 201)) },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r := ok
			mutate(&r)
			if r.Validate() == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestEligible(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base := proxy.Proxy{
		Key: proxy.Key{Scheme: proxy.SchemeHTTP}, State: proxy.StateAvailable, Upstream: "a",
		Region: "eu", Carrier: "c1", ExpiresAt: now.Add(10 * time.Minute), UsableUntil: now.Add(9 * time.Minute),
		LastSuccessAt: now.Add(-time.Minute),
	}
	cases := []struct {
		name   string
		f      Filters
		mutate func(p *proxy.Proxy)
		want   bool
	}{
		{"plain", Filters{}, nil, true},
		{"not available", Filters{}, func(p *proxy.Proxy) { p.State = proxy.StateSuspect }, false},
		{"past usable", Filters{}, func(p *proxy.Proxy) { p.UsableUntil = now }, false},
		{"protocol", Filters{Protocol: proxy.SchemeSOCKS5}, nil, false},
		{"region", Filters{Region: "us"}, nil, false},
		{"carrier", Filters{Carrier: "c2"}, nil, false},
		{"upstream allowed", Filters{Upstreams: []string{"b", "a"}}, nil, true},
		{"upstream not allowed", Filters{Upstreams: []string{"b"}}, nil, false},
		{"ttl enough", Filters{MinRemainingTTL: 10 * time.Minute}, nil, true},
		{"ttl short", Filters{MinRemainingTTL: 11 * time.Minute}, nil, false},
		{"health fresh", Filters{MaxHealthCheckAge: 2 * time.Minute}, nil, true},
		{"health stale", Filters{MaxHealthCheckAge: 30 * time.Second}, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := base
			if tc.mutate != nil {
				tc.mutate(&p)
			}
			if got := tc.f.Eligible(&p, now); got != tc.want {
				t.Fatalf("Eligible = %v", got)
			}
		})
	}
}

func TestInsufficientIsErrInsufficient(t *testing.T) {
	var err error = &InsufficientError{Requested: 3, Available: 1}
	if !errors.Is(err, ErrInsufficient) {
		t.Fatal("errors.Is must see ErrInsufficient")
	}
}
