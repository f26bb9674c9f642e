package expr

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Bounds of one converted entry.
const (
	maxCredential = 255
	maxLabel      = 128 // region, carrier
	maxTags       = 32
	maxTagKey     = 64
	maxTagValue   = 256
	maxTTL        = 366 * 24 * time.Hour
	// maxUnix is the largest expiresAt accepted as unix seconds (year
	// 5138): a larger number is almost surely milliseconds.
	maxUnix = 1e11
)

// EntryError is a proxy entry the template produced that cannot become a
// candidate. Index is its position in the proxies list; Field is empty when
// the entry as a whole is wrong.
type EntryError struct {
	Index int
	Field string
	Err   error
}

func (e *EntryError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("proxy %d: %v", e.Index, e.Err)
	}
	return fmt.Sprintf("proxy %d: field %s: %v", e.Index, e.Field, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }

// fieldNames are the keys an entry may have, in checking order.
var fieldNames = []string{"scheme", "host", "port", "username", "password", "ttl", "expiresAt", "region", "carrier", "tags"}

var knownField = func() map[string]bool {
	m := make(map[string]bool, len(fieldNames))
	for _, f := range fieldNames {
		m[f] = true
	}
	return m
}()

// toCandidates converts the proxies expression's value: a list of objects.
func toCandidates(v any) ([]proxy.Candidate, error) {
	if v == nil {
		return nil, errors.New("response.proxies returned nil, want a list")
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array {
		return nil, fmt.Errorf("response.proxies returned %T, want a list", v)
	}
	n := rv.Len()
	if n > plugin.MaxProxies {
		return nil, fmt.Errorf("response.proxies returned %d entries, more than %d", n, plugin.MaxProxies)
	}
	out := make([]proxy.Candidate, n)
	for i := 0; i < n; i++ {
		if err := toCandidate(i, rv.Index(i).Interface(), &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func toCandidate(i int, e any, c *proxy.Candidate) error {
	m, ok := asObject(e)
	if !ok {
		return &EntryError{Index: i, Err: fmt.Errorf("entry of type %T, want an object", e)}
	}
	fail := func(field string, err error) error { return &EntryError{Index: i, Field: field, Err: err} }
	present := 0
	for _, f := range fieldNames {
		if _, ok := m[f]; ok {
			present++
		}
	}
	if present != len(m) {
		var unknown []string
		for k := range m {
			if !knownField[k] {
				unknown = append(unknown, k)
			}
		}
		sort.Strings(unknown)
		return fail(unknown[0], errors.New("unknown field"))
	}

	scheme, err := optString(m["scheme"], 16)
	if err != nil {
		return fail("scheme", err)
	}
	c.Scheme = proxy.SchemeHTTP
	if scheme != "" {
		c.Scheme = proxy.Scheme(strings.ToLower(scheme))
		if !c.Scheme.Valid() {
			return fail("scheme", fmt.Errorf("%q, want http, https or socks5", scheme))
		}
	}
	host, err := optString(m["host"], 255)
	if err != nil {
		return fail("host", err)
	}
	if host == "" {
		return fail("host", errors.New("is required"))
	}
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if err := plugin.CheckHost(host); err != nil {
		return fail("host", err)
	}
	c.Host = host
	if c.Port, err = toPort(m["port"]); err != nil {
		return fail("port", err)
	}
	if c.Username, err = optString(m["username"], maxCredential); err != nil {
		return fail("username", err)
	}
	if c.Password, err = optString(m["password"], maxCredential); err != nil {
		return fail("password", err)
	}
	if c.TTL, err = toTTL(m["ttl"]); err != nil {
		return fail("ttl", err)
	}
	if c.ExpiresAt, err = toExpiry(m["expiresAt"]); err != nil {
		return fail("expiresAt", err)
	}
	if c.Region, err = optString(m["region"], maxLabel); err != nil {
		return fail("region", err)
	}
	if c.Carrier, err = optString(m["carrier"], maxLabel); err != nil {
		return fail("carrier", err)
	}
	if c.Tags, err = toTags(m["tags"]); err != nil {
		return fail("tags", err)
	}
	return nil
}

func asObject(e any) (map[string]any, bool) {
	switch m := e.(type) {
	case map[string]any:
		return m, true
	case map[string]string:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out, true
	}
	return nil, false
}

// optString accepts a string or nil (absent), bounded, no control bytes.
func optString(v any, limit int) (string, error) {
	switch s := v.(type) {
	case nil:
		return "", nil
	case string:
		if len(s) > limit {
			return "", fmt.Errorf("longer than %d bytes", limit)
		}
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] == 0x7f {
				return "", errors.New("contains control characters")
			}
		}
		return s, nil
	}
	return "", fmt.Errorf("value of type %T, want string", v)
}

// number reads an integer-valued or fractional number from the numeric
// types expr and encoding/json produce, or from a decimal string.
func number(v any) (float64, bool, error) {
	switch x := v.(type) {
	case nil:
		return 0, false, nil
	case string:
		s := strings.TrimSpace(x)
		if s == "" {
			return 0, false, nil
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false, fmt.Errorf("%q is not a number", truncate(x))
		}
		return f, true, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return 0, false, errors.New("not a finite number")
		}
		return x, true, nil
	case float32:
		return number(float64(x))
	}
	rv := reflect.ValueOf(v)
	switch {
	case rv.CanInt():
		return float64(rv.Int()), true, nil
	case rv.CanUint():
		return float64(rv.Uint()), true, nil
	}
	return 0, false, fmt.Errorf("value of type %T, want a number", v)
}

func toPort(v any) (uint16, error) {
	f, ok, err := number(v)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, errors.New("is required")
	}
	if f != math.Trunc(f) || f < 1 || f > 65535 {
		return 0, fmt.Errorf("%v is not a port in 1..65535", f)
	}
	return uint16(f), nil
}

// toTTL reads seconds (number or numeric string) or an expr duration.
// Absent, "" and 0 mean "not given".
func toTTL(v any) (time.Duration, error) {
	if d, ok := v.(time.Duration); ok {
		if d < 0 || d > maxTTL {
			return 0, fmt.Errorf("%s out of range 0..%s", d, maxTTL)
		}
		return d, nil
	}
	f, _, err := number(v)
	if err != nil {
		return 0, err
	}
	if f < 0 || f > maxTTL.Seconds() {
		return 0, fmt.Errorf("%v seconds out of range 0..%v", f, maxTTL.Seconds())
	}
	return time.Duration(f * float64(time.Second)), nil
}

// toExpiry reads RFC 3339 or unix seconds. Absent, "" and 0 mean "not
// given".
func toExpiry(v any) (time.Time, error) {
	switch x := v.(type) {
	case time.Time:
		return x, nil
	case string:
		s := strings.TrimSpace(x)
		if s == "" {
			return time.Time{}, nil
		}
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t, nil
		}
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			return time.Time{}, fmt.Errorf("%q is neither RFC 3339 nor unix seconds", truncate(x))
		}
	}
	f, _, err := number(v)
	if err != nil {
		return time.Time{}, err
	}
	if f == 0 {
		return time.Time{}, nil
	}
	if f < 0 || f > maxUnix {
		return time.Time{}, fmt.Errorf("%v out of range for unix seconds (milliseconds?)", f)
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), nil
}

func toTags(v any) (map[string]string, error) {
	if v == nil {
		return nil, nil
	}
	m, ok := asObject(v)
	if !ok {
		return nil, fmt.Errorf("value of type %T, want an object of strings", v)
	}
	if len(m) > maxTags {
		return nil, fmt.Errorf("more than %d tags", maxTags)
	}
	out := make(map[string]string, len(m))
	for k, tv := range m {
		if k == "" || len(k) > maxTagKey {
			return nil, fmt.Errorf("tag key must be 1 to %d bytes", maxTagKey)
		}
		s, err := optString(tv, maxTagValue)
		if err != nil {
			return nil, fmt.Errorf("tag %s: %w", truncate(k), err)
		}
		out[k] = s
	}
	return out, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
