package txlock

// PgLocksOf exposes Key.pgLocks to the external tests.
func PgLocksOf(k Key) (classid, objid uint32, objsubid int) { return k.pgLocks() }

// LockStatement exposes lockStatement to the external tests.
var LockStatement = lockStatement

// QuoteIdent exposes quoteIdent to the external tests.
var QuoteIdent = quoteIdent

// Queues reports how many local queues exist.
func Queues() int {
	queues.Lock()
	defer queues.Unlock()
	return len(queues.m)
}

// QueueRefs reports how many calls are queued in, or hold the turn of, the
// local queues.
func QueueRefs() int {
	queues.Lock()
	defer queues.Unlock()
	n := 0
	for _, q := range queues.m {
		n += q.refs()
	}
	return n
}
