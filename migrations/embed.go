// Package migrations holds the PostgreSQL schema of the cluster management
// store (seed 000 §12.1) as numbered goose SQL files, embedded in the
// binaries so `proxy-controller migrate` and storage.postgres.migrateOnStart
// need nothing on disk. The schema holds management state only: never a
// proxy address, credential, lifecycle or extraction record (a test in
// engine/adapters/postgres asserts it).
//
// Files are append-only once released: a change is a new file with its own
// Down section.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
