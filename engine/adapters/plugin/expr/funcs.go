package expr

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// helper is a custom function: pure, bounded by its input, no I/O.
type helper struct {
	name  string
	fn    func(args ...any) (any, error)
	types []any
}

var helpers = []helper{
	{"urlQueryEscape", func(a ...any) (any, error) { return url.QueryEscape(a[0].(string)), nil }, []any{new(func(string) string)}},
	{"urlPathEscape", func(a ...any) (any, error) { return url.PathEscape(a[0].(string)), nil }, []any{new(func(string) string)}},
	{"addQuery", addQuery, []any{new(func(string, map[string]any) string)}},
	{"splitHostPort", splitHostPort, []any{new(func(string) []string)}},
	{"parseProxyLine", parseProxyLine, []any{new(func(string) map[string]any)}},
	{"parseTime", parseTime, []any{new(func(any) int), new(func(any, string) int)}},
	{"atoi", atoi, []any{new(func(string) int)}},
}

// addQuery sets query parameters on a URL, keys sorted, values escaped.
// Errors never quote the URL: it may carry a key.
func addQuery(a ...any) (any, error) {
	u, err := url.Parse(a[0].(string))
	if err != nil {
		return nil, errors.New("addQuery: invalid url")
	}
	m := a[1].(map[string]any)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	q := u.Query()
	for _, k := range keys {
		s, err := scalarString(m[k])
		if err != nil {
			return nil, fmt.Errorf("addQuery: %s: %w", k, err)
		}
		q.Set(k, s)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func scalarString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case int:
		return strconv.Itoa(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case bool:
		return strconv.FormatBool(x), nil
	}
	return "", fmt.Errorf("value of type %T, want string, number or bool", v)
}

func splitHostPort(a ...any) (any, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(a[0].(string)))
	if err != nil {
		return nil, fmt.Errorf("splitHostPort: %w", err)
	}
	return []string{host, port}, nil
}

// parseProxyLine reads host:port, host:port:user:pass, [v6]:port[:user:pass]
// and user:pass@host:port. A password may contain ':' in the colon form.
func parseProxyLine(a ...any) (any, error) {
	line := strings.TrimSpace(a[0].(string))
	var host, port, user, pass string
	if at := strings.LastIndexByte(line, '@'); at >= 0 {
		cred := line[:at]
		var ok bool
		user, pass, ok = strings.Cut(cred, ":")
		if !ok {
			return nil, errors.New("parseProxyLine: credentials before '@' must be user:pass")
		}
		var err error
		host, port, err = net.SplitHostPort(line[at+1:])
		if err != nil {
			return nil, errors.New("parseProxyLine: want user:pass@host:port")
		}
	} else {
		rest := line
		if strings.HasPrefix(line, "[") {
			end := strings.IndexByte(line, ']')
			if end < 0 || end+1 >= len(line) || line[end+1] != ':' {
				return nil, errors.New("parseProxyLine: want [ipv6]:port")
			}
			host, rest = line[1:end], line[end+2:]
			parts := strings.SplitN(rest, ":", 3)
			switch len(parts) {
			case 1:
				port = parts[0]
			case 3:
				port, user, pass = parts[0], parts[1], parts[2]
			default:
				return nil, errors.New("parseProxyLine: want [ipv6]:port or [ipv6]:port:user:pass")
			}
		} else {
			parts := strings.SplitN(rest, ":", 4)
			switch len(parts) {
			case 2:
				host, port = parts[0], parts[1]
			case 4:
				host, port, user, pass = parts[0], parts[1], parts[2], parts[3]
			default:
				return nil, errors.New("parseProxyLine: want host:port or host:port:user:pass")
			}
		}
	}
	if host == "" {
		return nil, errors.New("parseProxyLine: empty host")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return nil, errors.New("parseProxyLine: port must be 1 to 65535")
	}
	return map[string]any{"host": host, "port": p, "username": user, "password": pass}, nil
}

// localLayouts are zone-less layouts vendors use; they need an offset.
var localLayouts = []string{"2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006/01/02 15:04:05"}

// parseTime returns unix seconds from unix seconds (number or digits),
// RFC 3339, or, given an offset like "+08:00", a zone-less
// "2006-01-02 15:04:05". Empty or nil is 0, meaning "none".
func parseTime(a ...any) (any, error) {
	switch v := a[0].(type) {
	case nil:
		return 0, nil
	case int:
		return v, nil
	case int64:
		return int(v), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e15 {
			return nil, errors.New("parseTime: number out of range")
		}
		return int(v), nil
	case string:
		s := strings.TrimSpace(v)
		if s == "" {
			return 0, nil
		}
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return int(n), nil
		}
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return int(t.Unix()), nil
		}
		if len(a) < 2 {
			return nil, errors.New("parseTime: want unix seconds or RFC 3339 (zone-less times need parseTime(v, \"+08:00\"))")
		}
		zone, err := fixedZone(a[1].(string))
		if err != nil {
			return nil, err
		}
		for _, l := range localLayouts {
			if t, err := time.ParseInLocation(l, s, zone); err == nil {
				return int(t.Unix()), nil
			}
		}
		return nil, errors.New("parseTime: unrecognised time")
	}
	return nil, fmt.Errorf("parseTime: value of type %T", a[0])
}

func atoi(a ...any) (any, error) {
	n, err := strconv.Atoi(strings.TrimSpace(a[0].(string)))
	if err != nil {
		return nil, errors.New("atoi: not an integer")
	}
	return n, nil
}

// fixedZone reads "Z", "UTC", "+08:00" or "+0800". It does not use
// time.Parse, which would pick the machine's Local zone when the offset
// happens to match it: the result must not depend on the host.
func fixedZone(off string) (*time.Location, error) {
	bad := errors.New("parseTime: offset must look like +08:00 or Z")
	if off == "Z" || off == "UTC" {
		return time.UTC, nil
	}
	if len(off) != 5 && len(off) != 6 {
		return nil, bad
	}
	sign := 1
	switch off[0] {
	case '+':
	case '-':
		sign = -1
	default:
		return nil, bad
	}
	hh, mm := off[1:3], off[len(off)-2:]
	if len(off) == 6 && off[3] != ':' {
		return nil, bad
	}
	h, err1 := strconv.Atoi(hh)
	m, err2 := strconv.Atoi(mm)
	if err1 != nil || err2 != nil || h > 14 || m > 59 || !allDigits(hh) || !allDigits(mm) {
		return nil, bad
	}
	return time.FixedZone("", sign*(h*3600+m*60)), nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
