package redisstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// The proxy hash fields (lua/lib.lua FIELDS is the same list in the same
// order). Times are Unix microseconds, "" for the zero time: exact in a
// Lua double, and finer than the millisecond callers rely on.
var fields = []string{"id", "sc", "h", "po", "un", "cv", "pw", "up", "ca", "ex", "uu", "lc", "ls", "lat", "mc", "st", "cf", "rg", "cr", "tg", "ow", "xa", "xc"}

// admitArgs renders one proxy as the 14 admission fields of lua/admit.lua.
func admitArgs(p *proxy.Proxy, id proxy.ID) ([]any, error) {
	tags := ""
	if p.Tags != nil {
		b, err := json.Marshal(p.Tags)
		if err != nil {
			return nil, fmt.Errorf("encode tags: %w", err)
		}
		tags = string(b)
	}
	usable := p.UsableUntil
	if usable.IsZero() {
		usable = p.ExpiresAt
	}
	return []any{
		string(id), string(p.Key.Scheme), p.Key.Host, strconv.Itoa(int(p.Key.Port)), p.Key.Username,
		p.Key.CredentialVersion, p.Password, micros(p.CreatedAt), micros(p.ExpiresAt), micros(usable),
		strconv.FormatInt(p.MaxConcurrency, 10), p.Region, p.Carrier, tags,
	}, nil
}

// decode builds a Proxy from the hash fields by name.
func decode(get func(string) string) (proxy.Proxy, error) {
	port, err := strconv.ParseUint(get("po"), 10, 16)
	if err != nil {
		return proxy.Proxy{}, fmt.Errorf("decode proxy %q: port: %w", get("id"), err)
	}
	st, err := strconv.ParseUint(get("st"), 10, 8)
	if err != nil {
		return proxy.Proxy{}, fmt.Errorf("decode proxy %q: state: %w", get("id"), err)
	}
	lat, _ := strconv.ParseInt(get("lat"), 10, 64)
	mc, _ := strconv.ParseInt(get("mc"), 10, 64)
	cf, _ := strconv.Atoi(get("cf"))
	p := proxy.Proxy{
		ID: proxy.ID(get("id")),
		Key: proxy.Key{
			Scheme: proxy.Scheme(get("sc")), Host: get("h"), Port: uint16(port),
			Username: get("un"), CredentialVersion: get("cv"),
		},
		Password:          get("pw"),
		Upstream:          get("up"),
		CreatedAt:         fromMicros(get("ca")),
		ExpiresAt:         fromMicros(get("ex")),
		UsableUntil:       fromMicros(get("uu")),
		LastCheckedAt:     fromMicros(get("lc")),
		LastSuccessAt:     fromMicros(get("ls")),
		Latency:           time.Duration(lat),
		MaxConcurrency:    mc,
		State:             proxy.State(st),
		ConsecutiveFails:  cf,
		Region:            get("rg"),
		Carrier:           get("cr"),
		Owner:             get("ow"),
		ExtractedAt:       fromMicros(get("xa")),
		ExtractedByClient: get("xc"),
	}
	if tg := get("tg"); tg != "" {
		if err := json.Unmarshal([]byte(tg), &p.Tags); err != nil {
			return proxy.Proxy{}, fmt.Errorf("decode proxy %q: tags: %w", p.ID, err)
		}
	}
	return p, nil
}

func decodeMap(m map[string]string) (proxy.Proxy, error) {
	return decode(func(k string) string { return m[k] })
}

// fieldIndex maps a field name to its position in fields.
var fieldIndex = func() map[string]int {
	m := make(map[string]int, len(fields))
	for i, f := range fields {
		m[f] = i
	}
	return m
}()

// decodeRows parses the rows of an extraction reply, each the fields in
// order (lua/extract.lua).
func decodeRows(rows []any) ([]proxy.Proxy, error) {
	out := make([]proxy.Proxy, 0, len(rows))
	for _, r := range rows {
		vals, ok := r.([]any)
		if !ok || len(vals) < len(fields) {
			return nil, fmt.Errorf("decode extraction result: bad row %v", r)
		}
		p, err := decode(func(k string) string { return toStr(vals[fieldIndex[k]]) })
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// decodePayload parses the length-prefixed records lua/lib.lua encode
// writes (an idempotency record): len(fields) values per proxy, each
// "<length>:<bytes>".
func decodePayload(s string) ([]proxy.Proxy, error) {
	out := []proxy.Proxy{}
	vals := make(map[string]string, len(fields))
	for len(s) > 0 {
		for _, f := range fields {
			i := 0
			for i < len(s) && s[i] != ':' {
				i++
			}
			if i == len(s) {
				return nil, errors.New("decode extraction result: truncated")
			}
			n, err := strconv.Atoi(s[:i])
			if err != nil || n < 0 || i+1+n > len(s) {
				return nil, errors.New("decode extraction result: bad length")
			}
			vals[f] = s[i+1 : i+1+n]
			s = s[i+1+n:]
		}
		p, err := decodeMap(vals)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
