package redisstore

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFS embed.FS

// script composes lua/lib.lua with one script body. go-redis runs it with
// EVALSHA and falls back to EVAL on NOSCRIPT (after a restart or a SCRIPT
// FLUSH), so the server's script cache is never a precondition.
func script(name string) *redis.Script {
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err)
	}
	body, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(lib) + "\n" + string(body))
}

var (
	scriptAdmit      = script("admit")
	scriptTransition = script("transition")
	scriptHealth     = script("health")
	scriptRemove     = script("remove")
	scriptSetOwner   = script("setowner")
	scriptCounts     = script("counts")
	scriptInventory  = script("inventory")
	scriptExtract    = script("extract")
	scriptSweep      = script("sweep")
	scriptChanges    = script("changes")

	scriptOwnerGrant   = script("owner_grant")
	scriptOwnerRenew   = script("owner_renew")
	scriptOwnerReclaim = script("owner_reclaim")

	scriptLeadAcquire = script("lead_acquire")
	scriptLeadRenew   = script("lead_renew")
	scriptPermit      = script("permit")
	scriptSettle      = script("settle")
	scriptLedger      = script("ledger")
	scriptRateLimit   = script("ratelimit")
	scriptRateRefund  = script("ratelimit_refund")
	scriptHeartbeat   = script("heartbeat")
	scriptWorkers     = script("workers")
)
