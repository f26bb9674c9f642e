package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/routing"
)

// RevisionLister is offered by stores that can list config revisions; the
// suites test it when present, newest first.
type RevisionLister interface {
	ListRevisions(ctx context.Context, limit int) ([]management.Revision, error)
}

// RunManagementContract runs the management-store contract against fresh
// stores made by newStore (one per subtest). The suite may Close a store
// itself, so the factory's cleanup must tolerate a second Close.
//
// The contract, beyond the interface comments:
//   - CompareAndSetCursor refuses (with an error, not ok=false) a next whose
//     generation does not exceed old's.
//   - The store assigns audit and revision IDs, increasing; a zero At is
//     stamped by the store.
//   - ListAudit returns newest first; limit <= 0 means all retained.
//   - A canceled context yields an error wrapping context.Canceled; a closed
//     store yields management.ErrUnavailable.
func RunManagementContract(t *testing.T, newStore func(t *testing.T) management.Store) {
	t.Helper()
	t.Run("UpstreamEnabled", func(t *testing.T) { testUpstreamEnabled(t, newStore(t)) })
	t.Run("Cursor", func(t *testing.T) { testCursor(t, newStore(t)) })
	t.Run("CursorConcurrentSwitchers", func(t *testing.T) { testCursorRace(t, newStore(t)) })
	t.Run("Audit", func(t *testing.T) { testAudit(t, newStore(t)) })
	t.Run("Revisions", func(t *testing.T) { testRevisions(t, newStore(t)) })
	t.Run("CanceledContext", func(t *testing.T) { testCanceled(t, newStore(t)) })
	t.Run("Closed", func(t *testing.T) { testClosed(t, newStore(t)) })
}

func testUpstreamEnabled(t *testing.T, s management.Store) {
	ctx := context.Background()
	check := func(name string, wantEnabled, wantSet bool) {
		t.Helper()
		enabled, set, err := s.UpstreamEnabled(ctx, name)
		if err != nil {
			t.Fatalf("upstream %s: %v", name, err)
		}
		if enabled != wantEnabled || set != wantSet {
			t.Errorf("upstream %s: enabled=%v set=%v, want %v %v", name, enabled, set, wantEnabled, wantSet)
		}
	}
	check("a", false, false)
	for _, step := range []bool{false, true, false} {
		if err := s.SetUpstreamEnabled(ctx, "a", step); err != nil {
			t.Fatal(err)
		}
		check("a", step, true)
	}
	check("b", false, false)
	if err := s.SetUpstreamEnabled(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	check("b", true, true)
	check("a", false, true)
}

func testCursor(t *testing.T, s management.Store) {
	ctx := context.Background()
	get := func(name string) routing.Cursor {
		t.Helper()
		c, err := s.Cursor(ctx, name)
		if err != nil {
			t.Fatalf("cursor %s: %v", name, err)
		}
		return c
	}
	if c := get("r"); c != (routing.Cursor{}) {
		t.Fatalf("unset cursor %+v, want zero", c)
	}
	next := routing.Cursor{Index: 1, Generation: 1}
	if ok, err := s.CompareAndSetCursor(ctx, "r", routing.Cursor{}, next); err != nil || !ok {
		t.Fatalf("first switch: %v, %v", ok, err)
	}
	if c := get("r"); c != next {
		t.Fatalf("cursor %+v, want %+v", c, next)
	}
	// A writer still holding generation 0 loses and changes nothing.
	if ok, err := s.CompareAndSetCursor(ctx, "r", routing.Cursor{}, routing.Cursor{Index: 2, Generation: 1}); err != nil || ok {
		t.Fatalf("stale switch: ok=%v err=%v, want refused", ok, err)
	}
	if c := get("r"); c != next {
		t.Fatalf("stale switch changed the cursor to %+v", c)
	}
	exhausted := routing.Cursor{Index: 1, Generation: 2, Exhausted: true}
	if ok, err := s.CompareAndSetCursor(ctx, "r", next, exhausted); err != nil || !ok {
		t.Fatalf("second switch: %v, %v", ok, err)
	}
	if c := get("r"); c != exhausted {
		t.Fatalf("cursor %+v, want %+v", c, exhausted)
	}
	if _, err := s.CompareAndSetCursor(ctx, "r", exhausted, routing.Cursor{Generation: exhausted.Generation}); err == nil {
		t.Error("a next without a higher generation was accepted")
	}
	if c := get("other"); c != (routing.Cursor{}) {
		t.Errorf("routings share cursors: %+v", c)
	}
}

func testCursorRace(t *testing.T, s management.Store) {
	const (
		switchers   = 32
		generations = 20
	)
	ctx := context.Background()
	for gen := range generations {
		cur, err := s.Cursor(ctx, "seq")
		if err != nil {
			t.Fatal(err)
		}
		if cur.Generation != int64(gen) {
			t.Fatalf("generation %d, want %d", cur.Generation, gen)
		}
		var (
			wg     sync.WaitGroup
			start  = make(chan struct{})
			won    = make([]bool, switchers)
			errs   = make([]error, switchers)
			winner = -1
		)
		for i := range switchers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				won[i], errs[i] = s.CompareAndSetCursor(ctx, "seq", cur, routing.Cursor{Index: i, Generation: cur.Generation + 1})
			}()
		}
		close(start)
		wg.Wait()
		wins := 0
		for i := range switchers {
			if errs[i] != nil {
				t.Fatalf("switcher %d: %v", i, errs[i])
			}
			if won[i] {
				wins++
				winner = i
			}
		}
		if wins != 1 {
			t.Fatalf("generation %d: %d switchers won, want exactly 1", gen, wins)
		}
		after, err := s.Cursor(ctx, "seq")
		if err != nil {
			t.Fatal(err)
		}
		if after.Index != winner || after.Generation != cur.Generation+1 {
			t.Fatalf("cursor %+v, want the winner's {%d %d}", after, winner, cur.Generation+1)
		}
	}
}

func testAudit(t *testing.T, s management.Store) {
	ctx := context.Background()
	base := time.Now().UTC().Truncate(time.Millisecond)
	for i := range 5 {
		e := management.AuditEntry{At: base.Add(time.Duration(i) * time.Second), Actor: "admin", Action: fmt.Sprintf("action.%d", i), Target: "up", Result: "ok"}
		if err := s.AppendAudit(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListAudit(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("limit 3 returned %d", len(got))
	}
	for i, e := range got {
		want := 4 - i
		if e.Action != fmt.Sprintf("action.%d", want) || !e.At.Equal(base.Add(time.Duration(want)*time.Second)) || e.Actor != "admin" || e.Target != "up" || e.Result != "ok" {
			t.Errorf("entry %d = %+v, want action.%d", i, e, want)
		}
		if e.ID <= 0 || i > 0 && e.ID >= got[i-1].ID {
			t.Errorf("IDs not decreasing newest first: %d after %d", e.ID, got[max(i-1, 0)].ID)
		}
	}
	for _, limit := range []int{0, -1, 100} {
		all, err := s.ListAudit(ctx, limit)
		if err != nil || len(all) != 5 {
			t.Errorf("limit %d returned %d, %v; want 5", limit, len(all), err)
		}
	}
	if err := s.AppendAudit(ctx, management.AuditEntry{Actor: "admin", Action: "stamped"}); err != nil {
		t.Fatal(err)
	}
	latest, err := s.ListAudit(ctx, 1)
	if err != nil || len(latest) != 1 || latest[0].Action != "stamped" || latest[0].At.IsZero() {
		t.Errorf("entry without At: %+v, %v", latest, err)
	}
}

func testRevisions(t *testing.T, s management.Store) {
	ctx := context.Background()
	for i := range 3 {
		if err := s.RecordRevision(ctx, management.Revision{Fingerprint: fmt.Sprintf("fp-%d", i), Source: "/etc/proxypool/proxypool.yaml"}); err != nil {
			t.Fatal(err)
		}
	}
	l, ok := s.(RevisionLister)
	if !ok {
		t.Skip("store does not list revisions")
	}
	got, err := l.ListRevisions(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Fingerprint != "fp-2" || got[1].Fingerprint != "fp-1" || got[0].ID <= got[1].ID || got[0].At.IsZero() || got[0].Source == "" {
		t.Errorf("revisions %+v, want fp-2, fp-1", got)
	}
}

func testCanceled(t *testing.T, s management.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := map[string]func() error{
		"UpstreamEnabled":    func() error { _, _, err := s.UpstreamEnabled(ctx, "a"); return err },
		"SetUpstreamEnabled": func() error { return s.SetUpstreamEnabled(ctx, "a", true) },
		"Cursor":             func() error { _, err := s.Cursor(ctx, "r"); return err },
		"CompareAndSetCursor": func() error {
			_, err := s.CompareAndSetCursor(ctx, "r", routing.Cursor{}, routing.Cursor{Generation: 1})
			return err
		},
		"AppendAudit":    func() error { return s.AppendAudit(ctx, management.AuditEntry{Action: "x"}) },
		"ListAudit":      func() error { _, err := s.ListAudit(ctx, 1); return err },
		"RecordRevision": func() error { return s.RecordRevision(ctx, management.Revision{Fingerprint: "x"}) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context: %v, want context.Canceled", name, err)
		}
	}
	if _, set, err := s.UpstreamEnabled(context.Background(), "a"); err != nil || set {
		t.Errorf("canceled write landed: set=%v err=%v", set, err)
	}
}

func testClosed(t *testing.T, s management.Store) {
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := s.UpstreamEnabled(ctx, "a"); !errors.Is(err, management.ErrUnavailable) {
		t.Errorf("read from a closed store: %v, want ErrUnavailable", err)
	}
	if err := s.SetUpstreamEnabled(ctx, "a", true); !errors.Is(err, management.ErrUnavailable) {
		t.Errorf("write to a closed store: %v, want ErrUnavailable", err)
	}
	if _, err := s.CompareAndSetCursor(ctx, "r", routing.Cursor{}, routing.Cursor{Generation: 1}); !errors.Is(err, management.ErrUnavailable) {
		t.Errorf("cursor switch on a closed store: %v, want ErrUnavailable", err)
	}
}

// RunManagementPersistence checks that state survives Close and a new
// open of the same location. open is called twice with the same dir; a
// networked store may ignore dir but must point both opens at the same
// database.
func RunManagementPersistence(t *testing.T, open func(t *testing.T, dir string) management.Store) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	at := time.Now().UTC().Truncate(time.Millisecond)

	s := open(t, dir)
	mustDo(t, s.SetUpstreamEnabled(ctx, "off", false))
	mustDo(t, s.SetUpstreamEnabled(ctx, "on", true))
	cur := routing.Cursor{Index: 2, Generation: 7, Exhausted: true}
	if ok, err := s.CompareAndSetCursor(ctx, "seq", routing.Cursor{}, cur); err != nil || !ok {
		t.Fatalf("switch: %v, %v", ok, err)
	}
	for i := range 3 {
		mustDo(t, s.AppendAudit(ctx, management.AuditEntry{At: at, Actor: "admin", Action: fmt.Sprintf("a%d", i), Result: "ok"}))
	}
	mustDo(t, s.RecordRevision(ctx, management.Revision{At: at, Fingerprint: "fp-1", Source: "file"}))
	before, err := s.ListAudit(ctx, 0)
	if err != nil || len(before) != 3 {
		t.Fatalf("audit before close %+v, %v", before, err)
	}
	mustDo(t, s.Close())

	s = open(t, dir)
	defer func() { _ = s.Close() }()
	for name, want := range map[string]bool{"off": false, "on": true} {
		enabled, set, err := s.UpstreamEnabled(ctx, name)
		if err != nil || !set || enabled != want {
			t.Errorf("upstream %s after reopen: enabled=%v set=%v err=%v", name, enabled, set, err)
		}
	}
	if _, set, _ := s.UpstreamEnabled(ctx, "never"); set {
		t.Error("an untouched upstream is set after reopen")
	}
	if c, err := s.Cursor(ctx, "seq"); err != nil || c != cur {
		t.Errorf("cursor after reopen %+v, %v; want %+v", c, err, cur)
	}
	audit, err := s.ListAudit(ctx, 0)
	if err != nil || len(audit) != 3 || audit[0].Action != "a2" || !audit[0].At.Equal(at) {
		t.Fatalf("audit after reopen %+v, %v", audit, err)
	}
	// IDs keep increasing across restarts.
	mustDo(t, s.AppendAudit(ctx, management.AuditEntry{Action: "after"}))
	audit, err = s.ListAudit(ctx, 1)
	if err != nil || len(audit) != 1 || audit[0].Action != "after" || audit[0].ID <= maxID(before) {
		t.Errorf("append after reopen %+v, %v", audit, err)
	}
	if l, ok := s.(RevisionLister); ok {
		revs, err := l.ListRevisions(ctx, 0)
		if err != nil || len(revs) != 1 || revs[0].Fingerprint != "fp-1" || !revs[0].At.Equal(at) {
			t.Errorf("revisions after reopen %+v, %v", revs, err)
		}
	}
}

func maxID(es []management.AuditEntry) int64 {
	var m int64
	for _, e := range es {
		m = max(m, e.ID)
	}
	return m
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
