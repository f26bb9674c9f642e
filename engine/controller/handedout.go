package controller

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/proxypool/proxypool/engine/controller/provider"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// maxHandedOut bounds the extracted proxies handedOut remembers; when it
// is full the one expiring soonest is forgotten first.
const maxHandedOut = 100_000

// handedOut remembers the proxies this process extracted until they
// expire. The activity pool store refuses to admit them again while it
// keeps their EXTRACTED entries, but once it lost its state (Redis
// restarted empty) it cannot, and a vendor may well hand the same proxy
// out again: this memory refuses it, so a proxy still in a client's hands
// is never handed to another. It knows only this process's extractions.
type handedOut struct {
	mu    sync.Mutex
	max   int
	until map[proxy.ID]time.Time
	order expiries // min-heap on until; may hold stale entries
}

type expiry struct {
	id    proxy.ID
	until time.Time
}

type expiries []expiry

func (e expiries) Len() int           { return len(e) }
func (e expiries) Less(i, j int) bool { return e[i].until.Before(e[j].until) }
func (e expiries) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *expiries) Push(x any)        { *e = append(*e, x.(expiry)) }
func (e *expiries) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

func newHandedOut(n int) *handedOut { return &handedOut{max: n, until: map[proxy.ID]time.Time{}} }

// add remembers ps until their ExpiresAt.
func (h *handedOut) add(ps []proxy.Proxy, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.forget(func(e expiry) bool { return !now.Before(e.until) })
	for i := range ps {
		if !now.Before(ps[i].ExpiresAt) {
			continue
		}
		h.forget(func(expiry) bool { return len(h.until) >= h.max })
		h.until[ps[i].ID] = ps[i].ExpiresAt
		heap.Push(&h.order, expiry{ps[i].ID, ps[i].ExpiresAt})
	}
}

// forget drops the soonest-expiring entries while drop says so.
func (h *handedOut) forget(drop func(expiry) bool) {
	for h.order.Len() > 0 && drop(h.order[0]) {
		e := heap.Pop(&h.order).(expiry)
		if h.until[e.id].Equal(e.until) {
			delete(h.until, e.id)
		}
	}
}

// taken reports whether id was handed out and has not expired.
func (h *handedOut) taken(id proxy.ID, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.until[id]
	return ok && now.Before(until)
}

// admitFilter is the activity pool as the provider runtimes see it: a
// candidate this process handed out counts as a duplicate and never
// reaches the store.
type admitFilter struct {
	activitypool.Pool
	out *handedOut
	now func() time.Time
}

func (f admitFilter) Admit(ctx context.Context, up string, ps []proxy.Proxy, maxSize int) (activitypool.AdmitResult, error) {
	now := f.now()
	keep := make([]proxy.Proxy, 0, len(ps))
	for i := range ps {
		id := ps[i].ID
		if id == "" {
			id = proxy.MakeID(ps[i].Key)
		}
		if !f.out.taken(id, now) {
			keep = append(keep, ps[i])
		}
	}
	refused := len(ps) - len(keep)
	if len(keep) == 0 {
		return activitypool.AdmitResult{Duplicates: refused}, nil
	}
	res, err := f.Pool.Admit(ctx, up, keep, maxSize)
	res.Duplicates += refused
	return res, err
}

var _ provider.Store = admitFilter{}
