// Package storetest holds the contract suites every store implementation
// runs: RunPoolContract for activitypool.Pool, RunManagementContract and
// RunManagementPersistence for management.Store. The embedded, Redis and
// PostgreSQL adapters call them from their own tests so that one definition
// of the behaviour (seed 000 §5, §6, §10.2, §12) binds all of them.
//
// It imports testing and the domain packages only; it must never import an
// adapter, so no implementation detail leaks into the contract.
package storetest
