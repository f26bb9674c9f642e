package gateway

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/dispatch"
)

// Outcome queue bounds (seed 000 §17.2: reporting is batched, asynchronous
// and bounded, and never pushes back on a request).
const (
	OutcomeQueueSize     = 1024
	OutcomeBatchSize     = 256
	OutcomeFlushInterval = 250 * time.Millisecond
)

// outcomeQueue buffers outcomes in a bounded channel; one goroutine hands
// them to the sink in batches. A full queue drops and counts.
type outcomeQueue struct {
	ch       chan worker.Outcome
	sink     worker.OutcomeSink
	dropped  prometheus.Counter
	interval time.Duration
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

func newOutcomeQueue(sink worker.OutcomeSink, dropped prometheus.Counter, interval time.Duration) *outcomeQueue {
	q := &outcomeQueue{
		ch:       make(chan worker.Outcome, OutcomeQueueSize),
		sink:     sink,
		dropped:  dropped,
		interval: interval,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go q.run()
	return q
}

// Enqueue never blocks: a full queue drops and counts, so reporting can
// never slow a request down (seed 000 §17.2).
func (q *outcomeQueue) Enqueue(o worker.Outcome) {
	select {
	case q.ch <- o:
	default:
		q.dropped.Inc()
	}
}

func (q *outcomeQueue) run() {
	defer close(q.done)
	t := time.NewTicker(q.interval)
	defer t.Stop()
	batch := make([]worker.Outcome, 0, OutcomeBatchSize)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		// The sink owns what it is given: a fresh slice per batch.
		q.sink.ReportOutcomes(batch)
		batch = make([]worker.Outcome, 0, OutcomeBatchSize)
	}
	add := func(o worker.Outcome) {
		if batch = append(batch, o); len(batch) == OutcomeBatchSize {
			flush()
		}
	}
	for {
		select {
		case o := <-q.ch:
			add(o)
		case <-t.C:
			flush()
		case <-q.stop:
			for {
				select {
				case o := <-q.ch:
					add(o)
				default:
					flush()
					return
				}
			}
		}
	}
}

// close flushes what is queued and stops the goroutine.
func (q *outcomeQueue) close() {
	q.once.Do(func() { close(q.stop) })
	<-q.done
}

var _ dispatch.OutcomeQueue = (*outcomeQueue)(nil)
