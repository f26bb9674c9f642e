package controller

import (
	"errors"

	"github.com/proxypool/proxypool/engine/controller/extraction"
	"github.com/proxypool/proxypool/engine/controller/routing"
)

// Typed errors of the admin and distribution operations. The HTTP layer
// maps them to statuses with errors.Is; a management store outage is
// reported wrapping management.ErrUnavailable (503).
var (
	// ErrUnknownUpstream: no upstream of that name in the configuration (404).
	ErrUnknownUpstream = errors.New("unknown upstream")
	// ErrUnknownRouting: no routing of that name in the configuration (404).
	ErrUnknownRouting = routing.ErrUnknownRouting
	// ErrInvalidSwitch: the routing is not sequential or the index is out
	// of range (400).
	ErrInvalidSwitch = routing.ErrInvalidSwitch
	// ErrInvalidRequest: an extraction request is malformed or exceeds
	// extraction.maxCount (400).
	ErrInvalidRequest = extraction.ErrInvalidRequest
	// ErrRateLimited: the client exceeded extraction.perClientPerMinute
	// (429); the error is a *extraction.RateLimitError with RetryAfter.
	ErrRateLimited = extraction.ErrRateLimited
)
