package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/extraction"
)

const fuzzMaxCount = 100

// FuzzExtractRequest: the decoder never panics, classifies every failure
// as a client error (or an oversize body), accepts only valid JSON, and
// everything it accepts is a valid request that survives a round trip
// through the wire form unchanged.
func FuzzExtractRequest(f *testing.F) {
	for _, s := range []string{
		`{"count":1}`,
		extractBodyJSON(3, "allOrNothing"),
		`{"count":1,"filters":{"upstreams":["a","b"],"minRemainingTTLSeconds":86400}}`,
		`{"count":1} `,
		`{"count":1}{}`,
		`{"count":1,"x":1}`,
		`{"count":"1"}`,
		`{"count":1e2}`,
		`{"COUNT":1}`,
		`{"count":1,"count":2}`,
		`{"count":1,"filters":null}`,
		`{"count":1,"filters":{"region":"\u00e9\ud800"}}`,
		`null`, `[]`, ``, `{`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := decodeExtractRequest(bytes.NewReader(data), fuzzMaxCount)
		if err != nil {
			var br *badRequest
			if !errors.As(err, &br) {
				t.Fatalf("error %T %v is not a client error", err, err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted an invalid request: %v", err)
		}
		if req.Count > fuzzMaxCount || req.Filters.MinRemainingTTL < 0 || req.Filters.MinRemainingTTL > maxFilterSeconds*time.Second ||
			req.Filters.MaxHealthCheckAge < 0 || req.Filters.MaxHealthCheckAge > maxFilterSeconds*time.Second ||
			len(req.Filters.Upstreams) > maxFilterUpstreams {
			t.Fatalf("accepted a request out of bounds: %+v", req)
		}
		wire, err := json.Marshal(extractBody{
			Count: req.Count, Fulfillment: string(req.Fulfillment),
			Filters: extractFilters{
				Protocol: string(req.Filters.Protocol), Region: req.Filters.Region, Carrier: req.Filters.Carrier,
				Upstreams:                req.Filters.Upstreams,
				MinRemainingTTLSeconds:   int64(req.Filters.MinRemainingTTL / time.Second),
				MaxHealthCheckAgeSeconds: int64(req.Filters.MaxHealthCheckAge / time.Second),
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeExtractRequest(bytes.NewReader(wire), fuzzMaxCount)
		if err != nil {
			t.Fatalf("re-encoded request %s refused: %v", wire, err)
		}
		if !sameRequest(req, again) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v", req, again)
		}
	})
}

func sameRequest(a, b extraction.Request) bool {
	ua, ub := a.Filters.Upstreams, b.Filters.Upstreams
	a.Filters.Upstreams, b.Filters.Upstreams = nil, nil
	return reflect.DeepEqual(a, b) && slices.Equal(ua, ub)
}

// TestDecodeOversize: the body bound surfaces as *http.MaxBytesError, not
// as a JSON syntax error.
func TestDecodeOversize(t *testing.T) {
	body := []byte(`{"count":1,"filters":{"region":"` + string(bytes.Repeat([]byte("x"), 100)) + `"}}`)
	rec := &captureWriter{header: http.Header{}}
	r := http.MaxBytesReader(rec, readCloser{bytes.NewReader(body)}, 50)
	_, err := decodeExtractRequest(r, fuzzMaxCount)
	var mbe *http.MaxBytesError
	if !errors.As(err, &mbe) {
		t.Fatalf("error %v, want *http.MaxBytesError", err)
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }
