// Package controller assembles the control plane (seed 000 §3.2): the
// provider supervisor, the health checker and its scheduler, the pool
// lifecycle loop, sequential routing, snapshot distribution and exclusive
// extraction, all behind the domain interfaces (activitypool.Pool,
// management.Store, upstream.Provider, worker.Applier/RuntimeReader). It
// exposes what the HTTP and gRPC adapters call: Extract, Status, the admin
// operations and Reload.
//
// It must never import a concrete store, the gateway or an HTTP adapter;
// cmd wires those in. Each subpackage documents its own metrics; see
// docs/controller.md for the loops and the data flow.
package controller
