package sticky_test

import (
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/gateway/sticky"
)

const hour = int64(3600e9)

func TestCacheBasics(t *testing.T) {
	c := sticky.New(10)
	c.Put("alice", "s", "p1", 100, 0)
	tests := []struct {
		name         string
		client, sess string
		now          int64
		want         proxy.ID
		ok           bool
	}{
		{"hit", "alice", "s", 50, "p1", true},
		{"other client", "bob", "s", 50, "", false},
		{"other session", "alice", "t", 50, "", false},
		{"expired at usable_until", "alice", "s", 100, "", false},
		{"expired binding was removed", "alice", "s", 50, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := c.Get(tc.client, tc.sess, tc.now)
			if id != tc.want || ok != tc.ok {
				t.Fatalf("Get = %q %v, want %q %v", id, ok, tc.want, tc.ok)
			}
		})
	}
	t.Run("delete only the same proxy", func(t *testing.T) {
		c.Put("alice", "s", "p2", hour, 0)
		c.Delete("alice", "s", "p1")
		if id, _ := c.Get("alice", "s", 1); id != "p2" {
			t.Fatal("delete for an old proxy removed a newer binding")
		}
		c.Delete("alice", "s", "p2")
		if _, ok := c.Get("alice", "s", 1); ok {
			t.Fatal("not deleted")
		}
	})
	t.Run("refused puts", func(t *testing.T) {
		c.Put("alice", "", "p1", hour, 0)
		c.Put("alice", strings.Repeat("x", sticky.MaxSessionLen+1), "p1", hour, 0)
		c.Put("alice", "late", "p1", 10, 10)
		if c.Len() != 0 {
			t.Fatalf("len = %d", c.Len())
		}
	})
}

func TestCacheBoundAndLRU(t *testing.T) {
	for _, max := range []int{1, 7, 16, 100, 1000} {
		t.Run(strconv.Itoa(max), func(t *testing.T) {
			c := sticky.New(max)
			for i := range 5 * max {
				c.Put("c", strconv.Itoa(i), "p", hour, 0)
				// Keep session 0 hot: it must survive every eviction.
				if _, ok := c.Get("c", "0", 1); !ok && max > 16 {
					t.Fatalf("hot session evicted after %d puts", i)
				}
			}
			if n := c.Len(); n > max {
				t.Fatalf("len %d over the bound %d", n, max)
			}
		})
	}
}

func TestCacheConcurrent(t *testing.T) {
	c := sticky.New(64)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				s := strconv.Itoa(i % 100)
				c.Put("c"+strconv.Itoa(w), s, "p", hour, 0)
				c.Get("c"+strconv.Itoa(w), s, 1)
				if i%7 == 0 {
					c.Delete("c"+strconv.Itoa(w), s, "p")
				}
			}
		}()
	}
	wg.Wait()
	if c.Len() > 64 {
		t.Fatalf("len %d over bound", c.Len())
	}
}

func TestCacheAllocatesNothing(t *testing.T) {
	c := sticky.New(1000)
	c.Put("alice", "hot", "p1", hour, 0)
	sessions := make([]string, 2000)
	for i := range sessions {
		sessions[i] = "s" + strconv.Itoa(i)
	}
	i := 0
	allocs := testing.AllocsPerRun(5000, func() {
		c.Get("alice", "hot", 1)
		c.Get("alice", "missing", 1)
		// Insert with eviction once full.
		c.Put("alice", sessions[i%len(sessions)], "p2", hour, 0)
		i++
	})
	if allocs != 0 {
		t.Fatalf("Get/Put allocate %.2f per run", allocs)
	}
}

func BenchmarkCacheGet(b *testing.B) {
	c := sticky.New(10000)
	for i := range 10000 {
		c.Put("client", "s"+strconv.Itoa(i), "p", hour, 0)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Get("client", "s42", 1)
		}
	})
}
