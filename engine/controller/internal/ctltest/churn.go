package ctltest

import (
	"context"
	"fmt"
	"time"

	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Churn keeps n AVAILABLE proxies of one upstream in a pool and replaces
// some of them per Step, oldest first, the way the controller does: the
// old ones drain, expire and are removed; as many new ones are admitted,
// checked and become AVAILABLE (owned by Owner when set). It is for
// benchmarks at pool sizes beyond one host's 65,535 ports: keys differ by
// username.
type Churn struct {
	Pool     activitypool.Pool
	Upstream string
	Owner    string
	Now      time.Time
	live     []proxy.ID // FIFO, oldest first
	next     int
}

// Fill admits and checks n proxies in batches of 1,000.
func (c *Churn) Fill(ctx context.Context, n int) error {
	for n > 0 {
		k := min(n, 1000)
		if err := c.add(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// Step replaces the k oldest proxies.
func (c *Churn) Step(ctx context.Context, k int) error {
	k = min(k, len(c.live))
	for _, id := range c.live[:k] {
		for _, e := range [][2]proxy.State{{proxy.StateAvailable, proxy.StateDraining}, {proxy.StateDraining, proxy.StateExpired}} {
			if err := c.Pool.Transition(ctx, id, e[0], e[1], c.Now); err != nil {
				return err
			}
		}
		if err := c.Pool.Remove(ctx, id); err != nil {
			return err
		}
	}
	c.live = append(c.live[:0], c.live[k:]...)
	return c.add(ctx, k)
}

func (c *Churn) add(ctx context.Context, k int) error {
	ps := make([]proxy.Proxy, k)
	for i := range ps {
		c.next++
		key := proxy.Key{Scheme: proxy.SchemeHTTP, Host: "127.0.0.1", Port: uint16(20000 + c.next%20), Username: fmt.Sprintf("u%d", c.next)}
		ps[i] = proxy.Proxy{
			Key: key, Password: "pw", CreatedAt: c.Now, UsableUntil: c.Now.Add(time.Hour),
			ExpiresAt: c.Now.Add(time.Hour + time.Minute), MaxConcurrency: 4, Region: "eu",
		}
	}
	res, err := c.Pool.Admit(ctx, c.Upstream, ps, 0)
	if err != nil {
		return fmt.Errorf("admitting: %w", err)
	}
	for _, id := range res.Added {
		if err := c.Pool.Transition(ctx, id, proxy.StateFetched, proxy.StateChecking, c.Now); err != nil {
			return err
		}
		if err := c.Pool.RecordHealth(ctx, activitypool.Health{ID: id, From: proxy.StateChecking, To: proxy.StateAvailable, CheckedAt: c.Now, Success: true}); err != nil {
			return err
		}
	}
	if c.Owner != "" {
		if err := c.Pool.SetOwner(ctx, res.Added, c.Owner); err != nil {
			return err
		}
	}
	c.live = append(c.live, res.Added...)
	return nil
}

// Live returns the proxies Churn keeps, oldest first.
func (c *Churn) Live() []proxy.ID { return c.live }
