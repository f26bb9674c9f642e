package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/controller"
	ctlextraction "github.com/proxypool/proxypool/engine/controller/extraction"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/management"
)

// TestExtractControllerErrors: the controller's request and rate-limit
// errors, however wrapped, reach the client as 400 / 429 problems, and
// Retry-After is whole seconds rounded up, at least 1.
func TestExtractControllerErrors(t *testing.T) {
	f := newFixture(t)
	rate := func(d time.Duration) error {
		return fmt.Errorf("extracting: %w", &ctlextraction.RateLimitError{RetryAfter: d})
	}
	tests := []struct {
		name       string
		err        error
		code       int
		typ        string
		retryAfter string // "" means the header must be absent
	}{
		{"invalid request", fmt.Errorf("extracting: %w: count 0 out of range", controller.ErrInvalidRequest), 400, ptBadRequest, ""},
		{"invalid request bare", controller.ErrInvalidRequest, 400, ptBadRequest, ""},
		{"rate limited whole seconds", rate(7 * time.Second), 429, ptRateLimited, "7"},
		{"rate limited rounds up", rate(1500 * time.Millisecond), 429, ptRateLimited, "2"},
		{"rate limited just over", rate(59*time.Second + time.Nanosecond), 429, ptRateLimited, "60"},
		{"rate limited sub-second", rate(100 * time.Millisecond), 429, ptRateLimited, "1"},
		{"rate limited zero wait", rate(0), 429, ptRateLimited, "1"},
		{"rate limited negative wait", rate(-time.Second), 429, ptRateLimited, "1"},
		{"rate limited unwrapped", &ctlextraction.RateLimitError{RetryAfter: 3 * time.Second}, 429, ptRateLimited, "3"},
		{"rate limited sentinel only", fmt.Errorf("extracting: %w", controller.ErrRateLimited), 429, ptRateLimited, "1"},
		{"other errors carry no Retry-After", errors.New("boom"), 500, ptInternal, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f.reset()
			f.ex.err = tc.err
			r := do(t, f.urls[surfaceDistribution], call{
				method: http.MethodPost, path: "/v1/extract", body: `{"count":1}`,
				headers: map[string]string{"X-API-Key": distKey},
			})
			if r.code != tc.code {
				t.Fatalf("status %d, want %d; body %s", r.code, tc.code, r.body)
			}
			if _, n := f.ex.calls(); n != 1 {
				t.Fatalf("extractor called %d times", n)
			}
			p := checkProblem(t, r)
			if p.Type != problemTypeBase+tc.typ {
				t.Errorf("type %q, want %s", p.Type, problemTypeBase+tc.typ)
			}
			if p.Requested != nil || p.Available != nil || p.Errors != nil {
				t.Errorf("problem %s carries 409/422 members", r.body)
			}
			vals := r.header.Values("Retry-After")
			switch {
			case tc.retryAfter == "" && len(vals) != 0:
				t.Errorf("Retry-After = %q, want absent", vals)
			case tc.retryAfter != "" && (len(vals) != 1 || vals[0] != tc.retryAfter):
				t.Errorf("Retry-After = %q, want %q", vals, tc.retryAfter)
			}
			if tc.code == http.StatusTooManyRequests && !strings.Contains(p.Detail, "retry after "+tc.retryAfter+" s") {
				t.Errorf("detail %q does not match Retry-After %s", p.Detail, tc.retryAfter)
			}
			if strings.Contains(string(r.body), "retryAfter") {
				t.Errorf("body leaks the internal retryAfter field: %s", r.body)
			}
		})
	}
}

// TestUnavailableNamesTheStore: a store outage, however wrapped, is a 503
// whose detail names the store in fixed words, never the error's text
// (which may carry an address).
func TestUnavailableNamesTheStore(t *testing.T) {
	addr := "127.0.0.1:6390"
	tests := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("list proxies: %w: dial tcp %s: connection refused", activitypool.ErrUnavailable, addr), "activity pool store is unavailable"},
		{fmt.Errorf("extract: %w", fmt.Errorf("generation %s: %w", addr, activitypool.ErrStateLost)), "activity pool store lost its state"},
		{fmt.Errorf("audit: %w: %s", management.ErrUnavailable, addr), "management store is unavailable"},
		{fmt.Errorf("reading %s: %w", addr, context.DeadlineExceeded), "did not answer in time"},
	}
	for _, tc := range tests {
		p := problemFor(slog.New(slog.DiscardHandler), "op", tc.err)
		if p.Status != http.StatusServiceUnavailable || p.Type != problemTypeBase+ptUnavailable ||
			!strings.Contains(p.Detail, tc.want) || strings.Contains(p.Detail, addr) {
			t.Errorf("%v: got %d %q, want 503 naming %q", tc.err, p.Status, p.Detail, tc.want)
		}
	}
}
