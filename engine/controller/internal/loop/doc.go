// Package loop owns the one shape every periodic controller loop shares:
// do the work at once, then again on a tick or a wake-up, until the
// context ends. It exists so that the publisher, the health sweep, the
// pool lifecycle and the controller's maintenance stop and report errors
// the same way.
//
// It must never import another controller package, a store or the
// gateway; it knows nothing of what the step does.
package loop
