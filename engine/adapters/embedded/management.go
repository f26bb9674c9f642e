package embedded

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/routing"
)

// Management store bounds and defaults.
const (
	// ManagementFile is the database file inside the state directory.
	ManagementFile = "management.db"
	// DefaultLockTimeout is how long Open waits for another process to
	// release the file lock before reporting ErrLocked.
	DefaultLockTimeout = 2 * time.Second
	// DefaultAuditRetention is how many audit entries are kept, newest.
	DefaultAuditRetention = 100_000
	// DefaultRevisionRetention is how many config revisions are kept.
	DefaultRevisionRetention = 1_000
	// maxNameLen bounds upstream and routing names used as keys (bbolt
	// allows 32 KiB; config names are far shorter).
	maxNameLen = 1024
)

// ErrLocked is returned by OpenManagement when another process holds the
// state directory.
var ErrLocked = errors.New("state directory locked by another process")

var (
	bucketUpstreams = []byte("upstreams")
	bucketCursors   = []byte("cursors")
	bucketAudit     = []byte("audit")
	bucketRevisions = []byte("revisions")
)

// ManagementOptions configures OpenManagement. Zero values take defaults.
type ManagementOptions struct {
	LockTimeout       time.Duration
	AuditRetention    int
	RevisionRetention int
	// Now stamps entries that arrive without a time.
	Now func() time.Time
}

// Management is the management store in <stateDir>/management.db. Values
// are JSON so the file stays inspectable with bbolt tooling; audit and
// revision keys are big-endian sequence numbers so a cursor walks them in
// order and retention trims from the front.
type Management struct {
	db        *bolt.DB
	opts      ManagementOptions
	closeOnce sync.Once
	closeErr  error
}

// OpenManagement opens (creating if needed) the store under stateDir.
func OpenManagement(stateDir string, o ManagementOptions) (*Management, error) {
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.AuditRetention <= 0 {
		o.AuditRetention = DefaultAuditRetention
	}
	if o.RevisionRetention <= 0 {
		o.RevisionRetention = DefaultRevisionRetention
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if err := os.MkdirAll(stateDir, 0o750); err != nil {
		return nil, fmt.Errorf("open management store: create state directory: %w", err)
	}
	path := filepath.Join(stateDir, ManagementFile)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: o.LockTimeout})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open management store %s: %w", path, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("open management store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketUpstreams, bucketCursors, bucketAudit, bucketRevisions} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("create bucket %s: %w", b, err)
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open management store %s: %w", path, err)
	}
	return &Management{db: db, opts: o}, nil
}

// unavailable wraps a bbolt failure: the store cannot serve, so the admin
// API answers 503.
func unavailable(what string, err error) error {
	return fmt.Errorf("%s: %w: %w", what, management.ErrUnavailable, err)
}

func checkName(kind, name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("invalid %s name of %d bytes", kind, len(name))
	}
	return nil
}

type upstreamRecord struct {
	Enabled bool `json:"enabled"`
}

// UpstreamEnabled implements management.Store.
func (m *Management) UpstreamEnabled(ctx context.Context, name string) (enabled, set bool, err error) {
	what := fmt.Sprintf("read upstream %q admin state", name)
	if err := ctx.Err(); err != nil {
		return false, false, fmt.Errorf("%s: %w", what, err)
	}
	var rec upstreamRecord
	err = m.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketUpstreams).Get([]byte(name))
		if v == nil {
			return nil
		}
		set = true
		return json.Unmarshal(v, &rec)
	})
	if err != nil {
		return false, false, unavailable(what, err)
	}
	return rec.Enabled, set, nil
}

// SetUpstreamEnabled implements management.Store.
func (m *Management) SetUpstreamEnabled(ctx context.Context, name string, enabled bool) error {
	what := fmt.Sprintf("write upstream %q admin state", name)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := checkName("upstream", name); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	v, err := json.Marshal(upstreamRecord{Enabled: enabled})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := m.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketUpstreams).Put([]byte(name), v)
	}); err != nil {
		return unavailable(what, err)
	}
	return nil
}

// Cursor implements management.Store.
func (m *Management) Cursor(ctx context.Context, name string) (routing.Cursor, error) {
	what := fmt.Sprintf("read routing %q cursor", name)
	if err := ctx.Err(); err != nil {
		return routing.Cursor{}, fmt.Errorf("%s: %w", what, err)
	}
	var c routing.Cursor
	if err := m.db.View(func(tx *bolt.Tx) error {
		var err error
		c, err = readCursor(tx, name)
		return err
	}); err != nil {
		return routing.Cursor{}, unavailable(what, err)
	}
	return c, nil
}

func readCursor(tx *bolt.Tx, name string) (routing.Cursor, error) {
	var c routing.Cursor
	v := tx.Bucket(bucketCursors).Get([]byte(name))
	if v == nil {
		return c, nil
	}
	if err := json.Unmarshal(v, &c); err != nil {
		return c, fmt.Errorf("decode cursor: %w", err)
	}
	return c, nil
}

// CompareAndSetCursor implements management.Store in one bbolt write
// transaction, which bbolt serialises: of concurrent switchers holding the
// same old generation exactly one wins. next must carry a higher
// generation than old, or a stale writer could later win against it.
func (m *Management) CompareAndSetCursor(ctx context.Context, name string, old, next routing.Cursor) (bool, error) {
	what := fmt.Sprintf("switch routing %q cursor", name)
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	if err := checkName("routing", name); err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	if next.Generation <= old.Generation {
		return false, fmt.Errorf("%s: next generation %d must exceed %d", what, next.Generation, old.Generation)
	}
	v, err := json.Marshal(next)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	won := false
	if err := m.db.Update(func(tx *bolt.Tx) error {
		cur, err := readCursor(tx, name)
		if err != nil {
			return err
		}
		if cur.Generation != old.Generation {
			return nil
		}
		won = true
		return tx.Bucket(bucketCursors).Put([]byte(name), v)
	}); err != nil {
		return false, unavailable(what, err)
	}
	return won, nil
}

// AppendAudit implements management.Store. The store assigns e.ID; a zero
// At is stamped with the store clock.
func (m *Management) AppendAudit(ctx context.Context, e management.AuditEntry) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("append audit entry: %w", err)
	}
	if e.At.IsZero() {
		e.At = m.opts.Now()
	}
	if err := m.db.Update(func(tx *bolt.Tx) error {
		return appendSeq(tx.Bucket(bucketAudit), m.opts.AuditRetention, func(id int64) ([]byte, error) {
			e.ID = id
			return json.Marshal(e)
		})
	}); err != nil {
		return unavailable("append audit entry", err)
	}
	return nil
}

// ListAudit implements management.Store: newest first; limit <= 0 or
// beyond the retention returns the whole retained log.
func (m *Management) ListAudit(ctx context.Context, limit int) ([]management.AuditEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list audit entries: %w", err)
	}
	out, err := listSeq[management.AuditEntry](m.db, bucketAudit, clampLimit(limit, m.opts.AuditRetention))
	if err != nil {
		return nil, unavailable("list audit entries", err)
	}
	return out, nil
}

// RecordRevision implements management.Store. The store assigns r.ID.
func (m *Management) RecordRevision(ctx context.Context, r management.Revision) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("record config revision: %w", err)
	}
	if r.At.IsZero() {
		r.At = m.opts.Now()
	}
	if err := m.db.Update(func(tx *bolt.Tx) error {
		return appendSeq(tx.Bucket(bucketRevisions), m.opts.RevisionRetention, func(id int64) ([]byte, error) {
			r.ID = id
			return json.Marshal(r)
		})
	}); err != nil {
		return unavailable("record config revision", err)
	}
	return nil
}

// ListRevisions returns the newest revisions first. It is not part of
// management.Store; the contract suite tests it when a store offers it.
func (m *Management) ListRevisions(ctx context.Context, limit int) ([]management.Revision, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list config revisions: %w", err)
	}
	out, err := listSeq[management.Revision](m.db, bucketRevisions, clampLimit(limit, m.opts.RevisionRetention))
	if err != nil {
		return nil, unavailable("list config revisions", err)
	}
	return out, nil
}

// Close implements management.Store. It releases the file lock; further
// calls return the first result.
func (m *Management) Close() error {
	m.closeOnce.Do(func() {
		if err := m.db.Close(); err != nil {
			m.closeErr = fmt.Errorf("close management store: %w", err)
		}
	})
	return m.closeErr
}

func clampLimit(limit, retention int) int {
	if limit <= 0 || limit > retention {
		return retention
	}
	return limit
}

func seqKey(id int64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, uint64(id))
	return k
}

// appendSeq writes the value for the bucket's next sequence and trims the
// oldest keys beyond retention. Keys are only ever deleted from the front,
// so the live range is contiguous and the trim is O(excess).
func appendSeq(b *bolt.Bucket, retention int, encode func(id int64) ([]byte, error)) error {
	seq, err := b.NextSequence()
	if err != nil {
		return fmt.Errorf("next sequence: %w", err)
	}
	id := int64(seq)
	v, err := encode(id)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	if err := b.Put(seqKey(id), v); err != nil {
		return fmt.Errorf("put: %w", err)
	}
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.First() {
		oldest := int64(binary.BigEndian.Uint64(k))
		if id-oldest < int64(retention) {
			break
		}
		if err := c.Delete(); err != nil {
			return fmt.Errorf("trim: %w", err)
		}
	}
	return nil
}

func listSeq[T any](db *bolt.DB, bucket []byte, limit int) ([]T, error) {
	out := []T{}
	err := db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucket).Cursor()
		for k, v := c.Last(); k != nil && len(out) < limit; k, v = c.Prev() {
			var x T
			if err := json.Unmarshal(v, &x); err != nil {
				return fmt.Errorf("decode entry %d: %w", binary.BigEndian.Uint64(k), err)
			}
			out = append(out, x)
		}
		return nil
	})
	return out, err
}

var _ management.Store = (*Management)(nil)
