package gateway

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/proxypool/proxypool/engine/domain/worker"
)

// blockingSink holds the flusher inside ReportOutcomes until released.
type blockingSink struct {
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	got     int
}

func (s *blockingSink) ReportOutcomes(b []worker.Outcome) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	s.mu.Lock()
	s.got += len(b)
	s.mu.Unlock()
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A stuck sink fills the bounded queue; further outcomes are dropped and
// counted, and Enqueue never blocks the request path.
func TestOutcomeQueueDropsWhenFull(t *testing.T) {
	s := &blockingSink{entered: make(chan struct{}, 1), release: make(chan struct{})}
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"})
	q := newOutcomeQueue(s, dropped, time.Hour)
	// Fill one batch so the flusher enters the sink and stays there.
	for range OutcomeBatchSize {
		q.Enqueue(worker.Outcome{Success: true})
	}
	<-s.entered
	// Now the channel fills, then everything beyond it is dropped.
	const extra = 100
	done := make(chan struct{})
	go func() {
		for range OutcomeQueueSize + extra {
			q.Enqueue(worker.Outcome{Success: true})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Enqueue blocked on a full queue")
	}
	if got := counterValue(t, dropped); got != extra {
		t.Fatalf("dropped = %v, want %d", got, extra)
	}
	close(s.release)
	q.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got != OutcomeBatchSize+OutcomeQueueSize {
		t.Fatalf("delivered %d, want %d", s.got, OutcomeBatchSize+OutcomeQueueSize)
	}
}
