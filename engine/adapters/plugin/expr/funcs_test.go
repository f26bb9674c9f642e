package expr

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParseProxyLine(t *testing.T) {
	cases := []struct {
		in      string
		want    string // host port user pass
		wantErr string
	}{
		{"1.2.3.4:80", "1.2.3.4 80  ", ""},
		{" 1.2.3.4:80:u:p ", "1.2.3.4 80 u p", ""},
		{"1.2.3.4:80:u:p:with:colons", "1.2.3.4 80 u p:with:colons", ""},
		{"[2001:db8::1]:8080", "2001:db8::1 8080  ", ""},
		{"[2001:db8::1]:8080:u:p", "2001:db8::1 8080 u p", ""},
		{"u:p@1.2.3.4:80", "1.2.3.4 80 u p", ""},
		{"u:p@[::1]:80", "::1 80 u p", ""},
		{"h.example:443", "h.example 443  ", ""},
		{"1.2.3.4", "", "want host:port"},
		{"1.2.3.4:80:u", "", "want host:port"},
		{":80", "", "empty host"},
		{"1.2.3.4:0", "", "port must be 1 to 65535"},
		{"1.2.3.4:65536", "", "port must be 1 to 65535"},
		{"1.2.3.4:http", "", "port must be 1 to 65535"},
		{"[::1]80", "", "want [ipv6]:port"},
		{"[::1]:80:u", "", "want [ipv6]:port"},
		{"u@1.2.3.4:80", "", "must be user:pass"},
		{"u:p@1.2.3.4", "", "want user:pass@host:port"},
		{"", "", "want host:port"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			v, err := parseProxyLine(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := v.(map[string]any)
			if got := fmt.Sprintf("%v %v %v %v", m["host"], m["port"], m["username"], m["password"]); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseTime(t *testing.T) {
	ref := time.Date(2027, 1, 15, 8, 0, 0, 0, time.UTC).Unix()
	cases := []struct {
		name    string
		args    []any
		want    int64
		wantErr string
	}{
		{"nil", []any{nil}, 0, ""},
		{"empty", []any{" "}, 0, ""},
		{"int", []any{int(ref)}, ref, ""},
		{"float", []any{float64(ref)}, ref, ""},
		{"digits", []any{fmt.Sprint(ref)}, ref, ""},
		{"rfc3339", []any{"2027-01-15T08:00:00Z"}, ref, ""},
		{"rfc3339 offset", []any{"2027-01-15T16:00:00+08:00"}, ref, ""},
		{"local with offset", []any{"2027-01-15 16:00:00", "+08:00"}, ref, ""},
		{"local with compact offset", []any{"2027/01/15 03:00:00", "-0500"}, ref, ""},
		{"local with Z", []any{"2027-01-15T08:00:00", "Z"}, ref, ""},
		{"local without offset", []any{"2027-01-15 16:00:00"}, 0, "zone-less times need"},
		{"bad offset", []any{"2027-01-15 16:00:00", "CST"}, 0, "offset must look like"},
		{"bad offset hours", []any{"2027-01-15 16:00:00", "+25:00"}, 0, "offset must look like"},
		{"garbage", []any{"soon", "+08:00"}, 0, "unrecognised"},
		{"nan", []any{nanValue()}, 0, "out of range"},
		{"bool", []any{true}, 0, "value of type bool"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := parseTime(tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if int64(v.(int)) != tc.want {
				t.Fatalf("got %v, want %d", v, tc.want)
			}
		})
	}
}

func nanValue() float64 {
	zero := 0.0
	return zero / zero
}

func TestAddQueryAndFriends(t *testing.T) {
	got, err := addQuery("https://v.example/p?z=1&a=2", map[string]any{"count": 5, "key": "a b&c", "ratio": 0.5, "on": true})
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://v.example/p?a=2&count=5&key=a+b%26c&on=true&ratio=0.5&z=1"; got != want {
		t.Fatalf("addQuery = %s, want %s", got, want)
	}
	if _, err := addQuery("https://v.example/p", map[string]any{"x": []any{1}}); err == nil {
		t.Fatal("addQuery accepted a list value")
	}
	if _, err := addQuery("http://v.example/%zz?key=SECRET", map[string]any{}); err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("addQuery error must not echo the url: %v", err)
	}
	hp, err := splitHostPort("[::1]:80")
	if err != nil || fmt.Sprint(hp) != "[::1 80]" {
		t.Fatalf("splitHostPort = %v, %v", hp, err)
	}
	if _, err := splitHostPort("nope"); err == nil {
		t.Fatal("splitHostPort accepted a bare host")
	}
	if n, err := atoi(" 42 "); err != nil || n != 42 {
		t.Fatalf("atoi = %v, %v", n, err)
	}
	if _, err := atoi("4x"); err == nil {
		t.Fatal("atoi accepted 4x")
	}
}
