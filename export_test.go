package txlock

// PgLocksOf exposes Key.pgLocks to the external tests.
func PgLocksOf(k Key) (classid, objid uint32, objsubid int) { return k.pgLocks() }

// LockStatement exposes lockStatement to the external tests.
var LockStatement = lockStatement

// QuoteIdent exposes quoteIdent to the external tests.
var QuoteIdent = quoteIdent
var WaitStatement = waitStatement

// Gates reports how many local queues exist.
func Gates() int {
	gates.Lock()
	defer gates.Unlock()
	return len(gates.m)
}

// GateRefs reports how many calls are queued in, or hold the turn of, the
// local queues.
func GateRefs() int {
	gates.Lock()
	defer gates.Unlock()
	n := 0
	for _, g := range gates.m {
		n += g.refs
	}
	return n
}
