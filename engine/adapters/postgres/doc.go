// Package pgstore is the cluster management store on PostgreSQL (SPEC §5,
// seed 000 §12.1, §12.3, §14): config revisions with an HMAC-SHA-256
// fingerprint of the full configuration, upstream admin state, routing
// cursors switched by compare-and-set, the admin audit log, and the
// management outbox written in the same transaction as every management
// change (upstream admin state, routing cursor, config revision), with a
// NOTIFY on OutboxChannel at commit so other controllers wake up.
//
// It implements management.Store and passes the same contract suite as the
// embedded bbolt store (engine/adapters/storetest). Every failure of the
// server (unreachable, timed out, closed pool) wraps
// management.ErrUnavailable so the admin API answers 503; a canceled
// context also wraps context.Canceled.
//
// The schema is in migrations/ (goose SQL files embedded in the binary);
// Migrator applies and rolls them back, `proxy-controller migrate` drives
// it, and Open can apply them when storage.postgres.migrateOnStart is set.
// Migrations of one schema are serialised by a PostgreSQL advisory lock
// derived from the schema name.
//
// Nothing about individual proxies, their credentials, lifecycles, worker
// ownership or extractions is ever written here: that is Redis's
// (engine/adapters/redis). A test asserts the schema has no such column.
//
// Bounds: MaxConns connections, ConnectTimeout per connection, OpTimeout per
// operation, audit and revision retention trimmed in the writing
// transaction, ListAudit/ReadOutbox limits.
//
// This package must never import the Redis client, net/http, the gateway or
// the controller: it depends on the domain contracts, engine/config and
// migrations/ only.
package pgstore
