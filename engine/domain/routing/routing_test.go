package routing

import "testing"

func TestMatchesAndFirst(t *testing.T) {
	rules := []Rule{
		{Name: "wild", Hosts: []string{"*.example.com"}},
		{Name: "exact-port", Hosts: []string{"api.test"}, Ports: []uint16{443}},
		{Name: "client", Clients: []string{"alice"}},
		{Name: "catch-all"},
	}
	cases := []struct {
		name string
		q    Request
		want string
	}{
		{"subdomain", Request{Host: "a.example.com", Port: 80}, "wild"},
		{"deep subdomain", Request{Host: "x.y.example.com"}, "wild"},
		{"apex is not *.suffix", Request{Host: "example.com"}, "catch-all"},
		{"suffix lookalike", Request{Host: "badexample.com"}, "catch-all"},
		{"exact host and port", Request{Host: "api.test", Port: 443}, "exact-port"},
		{"exact host wrong port", Request{Host: "api.test", Port: 80}, "catch-all"},
		{"client", Request{Host: "z.org", Client: "alice"}, "client"},
		{"other client", Request{Host: "z.org", Client: "bob"}, "catch-all"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			i := First(rules, &tc.q)
			if i < 0 || rules[i].Name != tc.want {
				t.Fatalf("First = %d, want %s", i, tc.want)
			}
		})
	}
	if First(rules[:3], &Request{Host: "none.org"}) != -1 {
		t.Fatal("no rule should match")
	}
}

func TestAdvance(t *testing.T) {
	none := func(int) bool { return false }
	cases := []struct {
		name   string
		cur    Cursor
		n      int
		policy Exhaustion
		skip   func(int) bool
		want   Cursor
		ok     bool
	}{
		{"next", Cursor{Index: 0, Generation: 4}, 3, Stop, none, Cursor{Index: 1, Generation: 5}, true},
		{"skip disabled", Cursor{Index: 0}, 3, Stop, func(i int) bool { return i == 1 }, Cursor{Index: 2, Generation: 1}, true},
		{"stop at end", Cursor{Index: 2}, 3, Stop, none, Cursor{Index: 2, Generation: 1, Exhausted: true}, true},
		{"already exhausted", Cursor{Index: 2, Exhausted: true}, 3, Stop, none, Cursor{Index: 2, Exhausted: true}, false},
		{"loop wraps", Cursor{Index: 2}, 3, Loop, none, Cursor{Index: 0, Generation: 1}, true},
		{"loop skips disabled", Cursor{Index: 2}, 3, Loop, func(i int) bool { return i == 0 }, Cursor{Index: 1, Generation: 1}, true},
		{"loop all others disabled", Cursor{Index: 1}, 3, Loop, func(i int) bool { return i != 1 }, Cursor{Index: 1}, false},
		{"stayLast stays", Cursor{Index: 2}, 3, StayLast, none, Cursor{Index: 2}, false},
		{"stayLast when rest disabled", Cursor{Index: 0}, 2, StayLast, func(i int) bool { return i == 1 }, Cursor{Index: 0}, false},
		{"empty list", Cursor{}, 0, Loop, none, Cursor{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Advance(tc.cur, tc.n, tc.policy, tc.skip)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("Advance = %+v,%v want %+v,%v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
