package controller

import (
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Status is the appliance-wide view served by GET /v1/admin/status.
type Status struct {
	Version        string             `json:"version"`
	StartedAt      time.Time          `json:"startedAt"`
	ConfigSource   string             `json:"configSource"`
	ConfigLoadedAt time.Time          `json:"configLoadedAt"`
	Ready          bool               `json:"ready"`
	StorageMode    string             `json:"storageMode"`
	Proxies        map[string]int     `json:"proxies"` // state name -> count
	Upstreams      int                `json:"upstreams"`
	Routings       int                `json:"routings"`
	Snapshot       SnapshotStatus     `json:"snapshot"`
	Extraction     ExtractionCounters `json:"extraction"`
	Workers        []WorkerStatus     `json:"workers"`
	LastReload     *ReloadStatus      `json:"lastReload,omitempty"`
	Storage        StorageStatus      `json:"storage"`

	// LiveWorkers are the fleet's workers with a live heartbeat (cluster
	// storage; absent on embedded storage or when Redis cannot be read).
	LiveWorkers []WorkerHeartbeat `json:"liveWorkers,omitempty"`
}

// StorageStatus says whether the two stores answer. While the activity
// pool store does not, Proxies is empty: its counts are unknown.
type StorageStatus struct {
	ActivityPool StoreStatus `json:"activityPool"`
	Management   StoreStatus `json:"management"`
	// GenerationChanges counts the times the activity pool store (Redis)
	// was found to have lost its state since start; the pool was then
	// refilled from the providers.
	GenerationChanges uint64 `json:"generationChanges"`
}

// StoreStatus is the last probe of one store.
type StoreStatus struct {
	Reachable bool      `json:"reachable"`
	Error     string    `json:"error,omitempty"`
	CheckedAt time.Time `json:"checkedAt"`
}

// CheckerStatus is the health-check queue (seed 000 §18: under backlog
// new and SUSPECT proxies go first and ordinary rechecks slow down).
type CheckerStatus struct {
	QueuedHigh   int   `json:"queuedHigh"`
	QueuedNormal int   `json:"queuedNormal"`
	QueueSize    int   `json:"queueSize"`
	InFlight     int   `json:"inFlight"`
	MaxInFlight  int   `json:"maxInFlight"`
	Dropped      int64 `json:"dropped"`  // ordinary rechecks shed by a full queue
	Refused      int64 `json:"refused"`  // new/SUSPECT checks refused by a full queue (retried)
	Deferred     int64 `json:"deferred"` // ordinary rechecks postponed under backlog
	Backlogged   bool  `json:"backlogged"`
}

// SnapshotStatus describes the last snapshot published to workers.
type SnapshotStatus struct {
	Version     uint64    `json:"version"`
	GeneratedAt time.Time `json:"generatedAt"`
	Proxies     int       `json:"proxies"`
}

// ExtractionCounters are cumulative since start.
type ExtractionCounters struct {
	Requests     int64 `json:"requests"`
	Returned     int64 `json:"returned"`
	Insufficient int64 `json:"insufficient"`
}

// WorkerStatus is one gateway worker as the controller sees it.
type WorkerStatus struct {
	ID              string `json:"id"`
	SnapshotVersion uint64 `json:"snapshotVersion"`
	Active          int64  `json:"active"`
	Reserved        int64  `json:"reserved"`
}

// WorkerHeartbeat is a worker's last heartbeat in the cluster store.
type WorkerHeartbeat struct {
	ID        string            `json:"id"`
	At        time.Time         `json:"at"`
	ExpiresAt time.Time         `json:"expiresAt"`
	Info      map[string]string `json:"info,omitempty"`
}

// ReloadStatus is the outcome of the latest reload attempt.
type ReloadStatus struct {
	At     time.Time `json:"at"`
	OK     bool      `json:"ok"`
	Errors []string  `json:"errors,omitempty"`
}

// UpstreamStatus is one upstream in GET /v1/admin/upstreams.
type UpstreamStatus struct {
	Name           string         `json:"name"`
	Plugin         string         `json:"plugin"`
	Enabled        bool           `json:"enabled"`
	States         map[string]int `json:"states"`
	Managed        int            `json:"managed"`
	Available      int            `json:"available"`
	AvailableSlots int64          `json:"availableSlots"`
	Pending        int            `json:"pending"`
	Fetch          FetchStatus    `json:"fetch"`
}

// FetchStatus is an upstream's provider runtime state.
type FetchStatus struct {
	Calls            int64      `json:"calls"`
	Success          int64      `json:"success"`
	Empty            int64      `json:"empty"`
	DuplicateOnly    int64      `json:"duplicateOnly"`
	Errors           int64      `json:"errors"`
	ConsecutiveEmpty int        `json:"consecutiveEmpty"`
	ConsecutiveError int        `json:"consecutiveErrors"`
	TotalFetched     int64      `json:"totalFetched"`
	LastOutcome      string     `json:"lastOutcome,omitempty"`
	LastError        string     `json:"lastError,omitempty"`
	LastFetchAt      *time.Time `json:"lastFetchAt,omitempty"`
	BackoffUntil     *time.Time `json:"backoffUntil,omitempty"` // set while backing off
	Stopped          string     `json:"stopped,omitempty"`      // why fetching stopped (maxTotal, disabled)
	// Leader: this controller fetches for the upstream (always on embedded
	// storage). LeaderError is a fixed reason it cannot; absent when
	// another controller leads.
	Leader      bool   `json:"leader"`
	LeaderError string `json:"leaderError,omitempty"`
}

// FetchDetail is what the admin view of an upstream does not carry (yet):
// the calls in flight, the maxTotal ledger and a pending depletion.
type FetchDetail struct {
	InFlight     int   `json:"inFlight"`
	MaxTotal     int64 `json:"maxTotal"`     // fetch.maxTotal; 0 = unlimited
	MaxTotalUsed int64 `json:"maxTotalUsed"` // charged against maxTotal
	// DepletionPending: the empty threshold was reached but the routing
	// switch could not be recorded yet (management store down); retried
	// every cycle.
	DepletionPending bool `json:"depletionPending"`
}

// RoutingStatus is one routing in GET /v1/admin/routings.
type RoutingStatus struct {
	Name          string   `json:"name"`
	Strategy      string   `json:"strategy"`
	Upstreams     []string `json:"upstreams"`
	CurrentIndex  int      `json:"currentIndex"` // sequential only; -1 exhausted
	Current       string   `json:"current,omitempty"`
	Generation    int64    `json:"generation"`
	OnUnavailable string   `json:"onUnavailable"`
}

// ProxyView is a proxy without credentials, for the admin listing.
type ProxyView struct {
	ID            proxy.ID   `json:"id"`
	Upstream      string     `json:"upstream"`
	Scheme        string     `json:"scheme"`
	Host          string     `json:"host"`
	Port          uint16     `json:"port"`
	HasAuth       bool       `json:"hasAuth"`
	State         string     `json:"state"`
	Owner         string     `json:"owner,omitempty"`
	ExpiresAt     time.Time  `json:"expiresAt"`
	UsableUntil   time.Time  `json:"usableUntil"`
	LastCheckedAt *time.Time `json:"lastCheckedAt,omitempty"`
	Region        string     `json:"region,omitempty"`
	Carrier       string     `json:"carrier,omitempty"`
}

// ProxyHealth is what the EGRESS and TARGET checks know about a proxy,
// beyond its state.
type ProxyHealth struct {
	// ExitIP and Anonymity (transparent, anonymous, elite) come from the
	// last successful EGRESS check; empty without check.egressURL.
	ExitIP    string `json:"exitIP,omitempty"`
	Anonymity string `json:"anonymity,omitempty"`
	// ExcludedRoutings are the routings whose TARGET check excludes it.
	ExcludedRoutings []string `json:"excludedRoutings,omitempty"`
}
